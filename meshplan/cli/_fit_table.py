"""The terminal's two tables: the facts a summary leads with, and a ranked table no wider than the terminal.

:func:`fact_grid` lays out ``(label, fact)`` pairs (the plan's, the comparison's and the serving plan's headers).
:func:`fitted_table` shows ranked rows: cells never wrap; columns of lower priority are dropped until it fits.
The plan's ranked meshes, the comparison's options and the serving layouts are all shown this way. Each column
has a ``priority`` (1: always kept; the highest number is dropped first, the last such column first) and a
``title`` and ``key`` into the rows.

Example:
  >>> import dataclasses
  >>> @dataclasses.dataclass
  ... class Col:
  ...     key: str
  ...     title: str
  ...     priority: int
  ...     numeric: bool = False
  >>> cols = [Col("mesh", "mesh", 1), Col("note", "a long note", 2)]
  >>> [c.header for c in fitted_table([{"mesh": "fsdp=8", "note": "x" * 40}], cols, 20).columns]
  ['mesh']
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["fact_grid", "fitted_table"]


def fact_grid(facts: Iterable[tuple[str, str]]) -> Any:
    """A rich grid of ``(label, fact)`` rows, the labels bold and never wrapped (print it with ``crop=False``)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column()
    for label, fact in facts:
        grid.add_row(label, fact)
    return grid


def fitted_table(rows: Sequence[Mapping[str, str]], columns: Sequence[Any], width: int, *,
                 right: Callable[[Any], bool] = lambda col: bool(col.numeric)) -> Any:
    """``rows`` as a rich ``Table`` of ``columns`` no wider than ``width`` (see the module docstring); ``right``
    says which columns are right-aligned (default: the numeric ones)."""
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    probe = Console(width=max(width, 1), file=io.StringIO(), color_system=None)  # measures, never prints
    keep = list(columns)
    while True:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
        for col in keep:
            table.add_column(col.title, justify="right" if right(col) else "left", no_wrap=True)
        for row in rows:
            table.add_row(*(row[col.key] for col in keep))
        needed = Measurement.get(probe, probe.options.update(width=10_000), table).maximum
        droppable = [c for c in keep if c.priority > 1]
        if needed <= width or not droppable:
            return table
        lowest = max(c.priority for c in droppable)
        # Drop the last column of the lowest priority first (the plan's split columns go before its MFU).
        keep.remove([c for c in droppable if c.priority == lowest][-1])
