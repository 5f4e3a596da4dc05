"""Progress on stderr for work that takes more than a moment: a large mesh search, verification compiles.

``with progress("searching meshes") as p: ...`` shows a transient spinner (and a bar with a count when
``total`` is given) on stderr, and nothing at all when stderr is not a terminal (a pipe, a CI log, a test)
or when ``quiet`` is set (``--json``: a script reads stdout and wants no noise). stdout is never touched,
so ``meshplan plan ... > plan.txt`` holds only the plan.

For the verification compiles, one step per mesh::

    with progress("compiling the reference step", total=len(meshes), quiet=args.format == "json") as p:
        for mesh in meshes:
            p.update(f"compiling {mesh}")
            ...
            p.advance()
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["Progress", "progress"]


class Progress:
    """The handle :func:`progress` yields: move the bar on and say what is being done now.

    A handle for a silent progress does nothing, so callers never test whether it shows.

    Example:
      >>> with progress("work", total=2, quiet=True) as p:
      ...     p.update("first")
      ...     p.advance()
      >>> p.completed
      1
    """

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task
        self.completed = 0

    def advance(self, steps: int = 1) -> None:
        """Count ``steps`` more done."""
        self.completed += steps
        if self._bar is not None:
            self._bar.advance(self._task, steps)

    def update(self, description: str) -> None:
        """Say what is being done now (replaces the description)."""
        if self._bar is not None:
            self._bar.update(self._task, description=description)


@contextlib.contextmanager
def progress(description: str, *, total: int | None = None, quiet: bool = False,
             stream: TextIO | None = None) -> Iterator[Progress]:
    """A transient progress display on ``stream`` (stderr) while the block runs.

    Args:
      description: what is being done ("searching meshes").
      total: steps in all, for a bar and a count; ``None`` shows a spinner and the elapsed time only.
      quiet: show nothing (``--json`` runs).
      stream: where to draw (default ``sys.stderr``); nothing is drawn unless it is a terminal.
    """
    out = sys.stderr if stream is None else stream
    if quiet or not out.isatty():
        yield Progress()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    from rich.progress import Progress as RichProgress

    with RichProgress(*columns, console=Console(file=out), transient=True) as bar:
        yield Progress(bar, bar.add_task(description, total=total))
