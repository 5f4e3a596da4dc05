"""``meshplan plan``'s pipeline section: the ranked ``pp`` layouts with their schedule and bubble.

A small table of its own (the main ranking's renderer is :mod:`meshplan.cli._render`): its cells, the
sentence under it and the left-out lines come from :mod:`meshplan.pure.report._pipeline_summary`, which the
markdown and HTML reports lay out too; nothing here decides anything.
"""

from __future__ import annotations

from typing import Any

from meshplan.pure import SearchResult
from meshplan.pure._format import fmt_bytes
from meshplan.pure.search import PipelineSearch
from meshplan.pure.report._pipeline_summary import (
    PIPELINE_COLUMNS,
    pipeline_headline,
    pipeline_layouts,
    pipeline_rows,
)

__all__ = ["render_pipeline_verification", "render_pipelines"]


def _verified_cell(row: Any) -> str:
    if row.status in ("exact", "over budget") and row.peak_bytes is not None:
        return f"{row.status} {fmt_bytes(row.peak_bytes)}"
    return row.status


def render_pipelines(found: PipelineSearch, result: SearchResult, console: Any, *, verified: Any = None) -> None:
    """Print the pipeline layouts next to the unpipelined ranking of ``result``; with ``verified`` (a
    :class:`~meshplan.PlanVerification` of them) a column of XLA's compiled peaks.

    Example:
      >>> import io
      >>> from rich.console import Console
      >>> from meshplan.pure import search_meshes
      >>> from meshplan.pure.search import search_pipelines
      >>> result = search_meshes("llama3-8b", "4x8xH100", batch=64, seq=4096, top_k=1)
      >>> found = search_pipelines("llama3-8b", "4x8xH100", batch=64, seq=4096, top_k=1)
      >>> console = Console(width=200, record=True, file=io.StringIO())
      >>> render_pipelines(found, result, console)
      >>> "bubble" in console.export_text()
      True
    """
    from rich.table import Table

    table = Table(title=f"Pipeline layouts (pp outermost; {len(found.candidates)} shown)")
    # By rank: pp over the network and inside each node can give the same mesh text.
    compiled = {} if verified is None else {r.rank: r for r in verified.rows}
    columns = [(col.key, col.title, col.numeric) for col in PIPELINE_COLUMNS]
    if compiled:
        at = next(i for i, (key, _, _) in enumerate(columns) if key == "memory") + 1
        columns.insert(at, ("xla", "XLA peak", True))
    for _, title, numeric in columns:
        table.add_column(title, justify="right" if numeric else "left")
    for c, row in zip(pipeline_layouts(found), pipeline_rows(found, result), strict=True):
        cells = {**row, "xla": _verified_cell(compiled[c.rank]) if c.rank in compiled else "-"}
        table.add_row(*(cells[key] for key, _, _ in columns))
    console.print(table)
    headline = pipeline_headline(found, result)
    if headline is not None:
        console.print(headline)
    for line in found.left_out:
        console.print(f"  - {line}")


def render_pipeline_verification(checked: Any, console: Any) -> None:
    """One line per compiled pipeline layout: XLA's peak beside the estimate, which schedule compiled, or why
    it was not verified (a :class:`~meshplan.PlanVerification` from
    :func:`~meshplan.facade.verify._pipelines.verify_pipelines`).

    Example:
      >>> import io
      >>> from rich.console import Console
      >>> from meshplan.pure.verify._rows import PlanVerification, VerifyRow
      >>> row = VerifyRow("pp=2,fsdp=4", 1, 3 << 30, 8 << 30, "8 x XLA:CPU", peak_bytes=4 << 30,
      ...                 schedule="1f1b m=4", compiled_schedule="circular v=1 m=4", note="compiled as ...")
      >>> console = Console(width=200, record=True, file=io.StringIO())
      >>> render_pipeline_verification(PlanVerification((row,), (), "XLA:CPU", "", 1.0), console)
      >>> print(console.export_text().strip())
      pipeline pp=2,fsdp=4 (1f1b m=4): exact: compiled peak 4.0 GiB against the estimate 3.0 GiB (compiled: circular v=1 m=4); compiled as ...
    """
    if checked.note and not checked.compiler:  # no compiler: one line says how to get exact figures
        console.print(f"pipeline memory: {checked.note}", markup=False)
        return
    for r in checked.rows:
        est = "-" if r.analytic_bytes is None else fmt_bytes(r.analytic_bytes)
        head = f"pipeline {r.mesh} ({r.schedule})"
        if r.status in ("exact", "over budget") and r.peak_bytes is not None:
            run = "" if r.run_high_bytes is None else f"; a run on the GPU up to {fmt_bytes(r.run_high_bytes)}"
            over = f"{run}; over the {fmt_bytes(r.budget_bytes)} budget" if r.fits is False else run
            # Name the compiled schedule only where it is not the row's own (a Megatron row compiled as circular).
            what = f" (compiled: {r.compiled_schedule}){over}; {r.note}" if r.note else over
            console.print(f"{head}: {r.status}: compiled peak {fmt_bytes(r.peak_bytes)} against the estimate {est}"
                          f"{what}", markup=False)
        else:
            console.print(f"{head}: {r.summary()}", markup=False)
    if checked.compiler and any(r.peak_bytes is not None for r in checked.rows):
        console.print(f"pipeline peaks: the pipelined step compiled by {checked.compiler}.", markup=False)
    if checked.note:
        console.print(f"pipeline note: {checked.note}", markup=False)
