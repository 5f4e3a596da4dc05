"""``meshplan plan``'s pipeline section: the ranked ``pp`` layouts with their schedule and bubble.

A small table of its own (the main ranking's renderer is :mod:`meshplan.cli._render`): its cells, the
sentence under it and the left-out lines come from :mod:`meshplan.pure.search._pipeline_summary`, which the
markdown and HTML reports lay out too; nothing here decides anything.
"""

from __future__ import annotations

from typing import Any

from meshplan.pure import SearchResult
from meshplan.pure.search import PipelineSearch
from meshplan.pure.search._pipeline_summary import (
    PIPELINE_COLUMNS,
    pipeline_headline,
    pipeline_rows,
)

__all__ = ["render_pipelines"]


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

    table = Table(title=f"Pipeline layouts (pp outermost; {len(found.candidates)} shown)")
    for col in PIPELINE_COLUMNS:
        table.add_column(col.title, justify="right" if col.numeric else "left")
    for row in pipeline_rows(found, result):
        table.add_row(*(row[col.key] for col in PIPELINE_COLUMNS))
    console.print(table)
    headline = pipeline_headline(found, result)
    if headline is not None:
        console.print(headline)
    for line in found.left_out:
        console.print(f"  - {line}")
