"""What the subcommands share: argument types refused in argparse's words, and the error a command raises
for a problem with the user's files or options.

Example:
  >>> positive("8"), sizes("tp=8,fsdp=4")
  (8, {'tp': 8, 'fsdp': 4})
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["MAX_COUNT", "UserError", "fraction", "params_ref", "positive", "sizes"]

MAX_COUNT = 10**12
"""Far beyond any batch, sequence or count a plan prices; keeps arithmetic sane."""


class UserError(Exception):
    """A problem with the user's files or options found by the command line itself (exit 1)."""


def sizes(text: str) -> dict[str, int]:
    """``"tp=8,fsdp=4"`` -> ``{"tp": 8, "fsdp": 4}`` (an argparse ``type=``: a bad token is exit 2).

    Example:
      >>> sizes("dp=2")
      {'dp': 2}
    """
    out: dict[str, int] = {}
    for token in text.split(","):
        name, sep, size = token.strip().partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{token.strip()!r} is not name=size (e.g. tp=8) with size >= 1")
        if name.strip() in out:
            raise argparse.ArgumentTypeError(f"axis {name.strip()!r} given twice")
        out[name.strip()] = int(size)
    return out


def positive(text: str) -> int:
    """An argparse ``type=``: an integer in ``[1, MAX_COUNT]``.

    Example:
      >>> positive(" 12 ")
      12
    """
    digits = text.strip()
    # isascii: "²".isdigit() is True but int("²") fails; the length bound keeps int() from a 5000-digit string.
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 13 or not 1 <= int(digits) <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer in [1, {MAX_COUNT}]")
    return int(digits)


def params_ref(text: str) -> tuple[str, str]:
    """An argparse ``type=`` for ``--params MODULE:ATTR`` (:func:`meshplan.cli._params.params_ref`)."""
    from meshplan.cli._params import params_ref as parse  # lazily: the module imports numpy

    return parse(text)


def fraction(what: str, *, zero: bool = False, one: bool = True) -> Callable[[str], float]:
    """An argparse ``type=``: a number in ``(0, 1]`` (``zero=True`` admits 0, ``one=False`` refuses 1).

    Example:
      >>> fraction("peak FLOP/s")("0.4")
      0.4
      >>> fraction("HBM", zero=True, one=False)("1")
      Traceback (most recent call last):
      ...
      argparse.ArgumentTypeError: '1' must be a fraction of HBM in [0, 1)
    """
    interval = f"{'[' if zero else '('}0, 1{']' if one else ')'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value >= 0 if zero else value > 0
        high_ok = value <= 1 if one else value < 1
        if not (low_ok and high_ok):
            raise argparse.ArgumentTypeError(f"{text!r} must be a fraction of {what} in {interval}")
        return value

    return parse
