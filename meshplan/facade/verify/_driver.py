"""One driver for every verification: jobs, then the compile cache, then worker subprocesses, then rows.

Plan verification (:func:`~meshplan.facade.verify.verify_plan`), pipeline verification
(:func:`~meshplan.facade.verify.verify_pipelines`) and ``meshplan check``
(:func:`~meshplan.facade.verify.check_layout`) each say what to compile as :class:`Compile` items (a job and
the estimate row its outcome fills); :func:`compile_rows` reads what the cache holds, compiles the rest side
by side in worker subprocesses (:func:`~meshplan.facade.verify._worker.run_jobs`), stores what the compiler
gave, and turns every outcome into a row with the one conversion (:func:`~meshplan.pure.verify.outcome_row`).
Progress goes to ``stream`` as each compile starts and ends.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence
from typing import TextIO

from meshplan.facade.verify import _cache
from meshplan.facade.verify._jobs import CompileJob
from meshplan.facade.verify._worker import run_jobs
from meshplan.pure.verify import CompileOutcome, VerifyRow, outcome_row

__all__ = ["Compile", "compile_rows"]


@dataclasses.dataclass(frozen=True)
class Compile:
    """One compile the driver runs, and the row it fills.

    Attributes:
      job: what to compile.
      base: the mesh's row before compiling (its estimate); the outcome's figures fill it.
      name: how progress lines name the row (``"fsdp=8"``, ``"pipeline pp=2,fsdp=4"``).
      starting: the progress line when the compile starts (``"compiling the reference step of ..."``).
      compiled_schedule, note: a pipelined step's schedule and what its peak checks (kept on rows with a
        compiled figure).
    """

    job: CompileJob
    base: VerifyRow
    name: str
    starting: str
    compiled_schedule: str = ""
    note: str = ""


def compile_rows(items: Sequence[Compile], *, compiler: str, stream: TextIO, cache: bool = True,
                 timeout_s: float = 600.0, parallel: int | None = None,
                 executor: concurrent.futures.Executor | None = None) -> list[VerifyRow]:
    """Compile ``items`` (cache first, then workers side by side); one row per item, in order.

    Args:
      items: what to compile.
      compiler: the compiler's name and versions, as rows label their figures.
      stream: progress lines.
      cache: read and write the compile cache (:func:`~meshplan.facade.verify._cache.cache_dir`).
      timeout_s: the most one compile may take, worker start included.
      parallel: compiles side by side (default: one per core).
      executor: run the compiles there (a Dask cluster's executor:
        :func:`~meshplan.facade.verify.dask_executor`); the outcomes come back and are cached here.

    Returns:
      Each item's row: exact, over budget or not verified (a crash, a timeout: the reason).

    Example:
      >>> compile_rows([], compiler="XLA:CPU", stream=None)
      []
    """
    if not items:
        return []
    keys = [_cache.job_key(item.job) for item in items] if cache else []
    rows: list[VerifyRow | None] = [None] * len(items)
    todo: list[int] = []
    for i, item in enumerate(items):
        hit = _cache.load_outcome(keys[i]) if cache else None
        if hit is None:
            todo.append(i)
            stream.write(f"meshplan: {item.starting} ...\n")
            continue
        rows[i] = _row(item, hit, compiler, cached=True)
        stream.write(f"meshplan: {item.name}: {rows[i].describe()} (cached)\n")  # type: ignore[union-attr]
    stream.flush()

    def done(k: int, outcome: CompileOutcome) -> None:
        item = items[todo[k]]
        stream.write(f"meshplan: {item.name}: {_row(item, outcome, compiler, cached=False).describe()} in "
                     f"{outcome.seconds:.1f} s\n")
        stream.flush()

    outcomes = run_jobs([items[i].job for i in todo], parallel=parallel, timeout_s=timeout_s, on_done=done,
                        executor=executor)
    for i, outcome in zip(todo, outcomes, strict=True):
        rows[i] = _row(items[i], outcome, compiler, cached=False)
        if cache:
            _cache.store_outcome(keys[i], outcome)
    return [r for r in rows if r is not None]


def _row(item: Compile, outcome: CompileOutcome, compiler: str, *, cached: bool) -> VerifyRow:
    return outcome_row(item.base, outcome, compiler=compiler, cached=cached,
                       compiled_schedule=item.compiled_schedule, note=item.note)
