"""The terminal the commands print to: a rich console as wide as the terminal (wide for pipes)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["make_console"]


def make_console() -> Console:
    """A rich console as wide as the terminal; pipes get 160 columns so tables are not folded to 80.

    Example:
      >>> make_console().width > 0
      True
    """
    from rich.console import Console  # lazily: `meshplan plan --json` never needs rich

    return Console(width=shutil.get_terminal_size((160, 40)).columns)
