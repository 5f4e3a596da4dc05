"""``meshplan plan``'s pipeline section: the ranked ``pp`` layouts with their schedule and bubble.

A small table of its own (the main ranking's renderer is :mod:`meshplan.cli._render`): every figure comes
from :func:`meshplan.pure.search.search_pipelines`; nothing here decides anything.
"""

from __future__ import annotations

from typing import Any

from meshplan.pure import SearchResult
from meshplan.pure._format import fmt_bytes
from meshplan.pure.search import PipelineSearch

__all__ = ["render_pipeline_verification", "render_pipelines"]


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


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

    best = result.best.step.step_s if result.candidates and result.best.step is not None else None
    table = Table(title=f"Pipeline layouts (pp outermost; {len(found.candidates)} shown)")
    # By rank: pp over the network and inside each node can give the same mesh text.
    compiled = {} if verified is None else {r.rank: r for r in verified.rows}
    names = ("#", "mesh", "pp over", "schedule", "micro-batches", "bubble", "layers/stage", "memory/device",
             *(("XLA peak",) if compiled else ()), "step time", "vs best unpipelined")
    for name in names:
        table.add_column(name, justify="left" if name in ("mesh", "pp over", "schedule") else "right")
    for c in found.candidates:
        pipe, step = c.pipeline, c.step
        if pipe is None or step is None:
            continue  # every pipeline candidate carries both; a hand-made result may not
        where = "network" if c.dcn_shape[0] == c.axis_sizes[0] else "node"
        sched = pipe.schedule + (f" v={pipe.virtual}" if pipe.virtual > 1 else "")
        layers = sorted(set(pipe.layers))
        ratio = "" if best is None else f"{step.step_s / best:.2f}x"
        peak = (_verified_cell(compiled[c.rank]) if c.rank in compiled else "-",) if compiled else ()
        table.add_row(str(c.rank), c.text, where, sched, str(pipe.micro_batches), f"{pipe.bubble:.1%}",
                      "/".join(map(str, layers)), fmt_bytes(c.memory.total), *peak, _seconds(step.step_s), ratio)
    console.print(table)
    if found.candidates and found.candidates[0].step is not None and best is not None:
        top = found.candidates[0]
        assert top.step is not None
        ahead = sum(1 for c in result.candidates if c.step is not None and c.step.step_s < top.step.step_s)
        where = (f"would rank #{ahead + 1} among" if ahead < len(result.candidates)
                 else f"is slower than all {ahead} of")
        console.print(f"best pipeline layout {top.text} ({_seconds(top.step.step_s)}, estimated) {where} the "
                      f"unpipelined meshes shown; why: {top.verdict}")
    for line in found.left_out:
        console.print(f"  - {line}")


def render_pipeline_verification(checked: Any, console: Any) -> None:
    """One line per compiled pipeline layout: XLA's peak beside the estimate, which schedule compiled, or why
    it was not verified (a :class:`~meshplan.PlanVerification` from
    :func:`~meshplan.facade._verify_pipeline.verify_pipelines`).

    Example:
      >>> import io
      >>> from rich.console import Console
      >>> from meshplan.facade._verify_row import PlanVerification, VerifyRow
      >>> row = VerifyRow("pp=2,fsdp=4", 1, 3 << 30, 8 << 30, "8 x XLA:CPU", peak_bytes=4 << 30,
      ...                 schedule="1f1b m=4", compiled_schedule="circular v=1 m=4", note="compiled as ...")
      >>> console = Console(width=200, record=True, file=io.StringIO())
      >>> render_pipeline_verification(PlanVerification((row,), (), "XLA:CPU", "", 1.0), console)
      >>> print(console.export_text().strip())
      pipeline #1 pp=2,fsdp=4 (1f1b m=4): exact: compiled peak 4.0 GiB, estimate 3.0 GiB (circular v=1 m=4); compiled as ...
    """
    if checked.note and not checked.compiler:  # no compiler: one line says how to get exact figures
        console.print(f"pipeline memory: {checked.note}", markup=False)
        return
    for r in checked.rows:
        est = "-" if r.analytic_bytes is None else fmt_bytes(r.analytic_bytes)
        head = f"pipeline #{r.rank} {r.mesh} ({r.schedule})"
        if r.status in ("exact", "over budget") and r.peak_bytes is not None:
            over = f"; over the {fmt_bytes(r.budget_bytes)} budget" if r.peak_bytes > r.budget_bytes else ""
            what = f"; {r.note}" if r.note else ""
            console.print(f"{head}: {r.status}: compiled peak {fmt_bytes(r.peak_bytes)}, estimate {est} "
                          f"({r.compiled_schedule}){over}{what}", markup=False)
        else:
            console.print(f"{head}: {r.summary()}", markup=False)
    if checked.compiler and any(r.peak_bytes is not None for r in checked.rows):
        console.print(f"pipeline peaks: the pipelined step compiled by {checked.compiler}.", markup=False)
    if checked.note:
        console.print(f"pipeline note: {checked.note}", markup=False)
