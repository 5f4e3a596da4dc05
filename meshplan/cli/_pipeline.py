"""``meshplan plan``'s pipeline section: the ranked ``pp`` layouts with their schedule and bubble.

A small table of its own (the main ranking's renderer is :mod:`meshplan.cli._render`): every figure comes
from :func:`meshplan.pure.search.search_pipelines`; nothing here decides anything.
"""

from __future__ import annotations

from typing import Any

from meshplan.pure import SearchResult
from meshplan.pure._format import fmt_bytes
from meshplan.pure.search import PipelineSearch

__all__ = ["render_pipelines"]


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def render_pipelines(found: PipelineSearch, result: SearchResult, console: Any) -> None:
    """Print the pipeline layouts next to the unpipelined ranking of ``result``.

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
    for name in ("#", "mesh", "pp over", "schedule", "micro-batches", "bubble", "layers/stage",
                 "memory/device", "step time", "vs best unpipelined"):
        table.add_column(name, justify="right" if name in ("#", "micro-batches", "bubble", "memory/device",
                                                          "step time", "vs best unpipelined") else "left")
    for c in found.candidates:
        pipe, step = c.pipeline, c.step
        if pipe is None or step is None:
            continue  # every pipeline candidate carries both; a hand-made result may not
        where = "network" if c.dcn_shape[0] == c.axis_sizes[0] else "node"
        sched = pipe.schedule + (f" v={pipe.virtual}" if pipe.virtual > 1 else "")
        layers = sorted(set(pipe.layers))
        ratio = "" if best is None else f"{step.step_s / best:.2f}x"
        table.add_row(str(c.rank), c.text, where, sched, str(pipe.micro_batches), f"{pipe.bubble:.1%}",
                      "/".join(map(str, layers)), fmt_bytes(c.memory.total), _seconds(step.step_s), ratio)
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
