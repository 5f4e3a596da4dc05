"""``--html FILE``: write the pure HTML renderings (:func:`meshplan.pure.search.plan_html`,
:func:`~meshplan.pure.search.mesh_html`) to a file, and say where on stderr.

The pages are built in the pure core; this module only does the I/O, so a file that cannot be
written is a clear error (exit 1), never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from meshplan.pure import Cluster, HybridMeshShape, SearchResult
from meshplan.pure.search import PipelineSearch, mesh_html, plan_html

__all__ = ["HtmlWriteError", "write_mesh_html", "write_plan_html"]


class HtmlWriteError(Exception):
    """The report could not be written (the CLI exits 1 with this message)."""


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise HtmlWriteError(f"cannot write --html {path!r}: {err.strerror}") from None
    # stderr: stdout stays the plan itself (a table, markdown or JSON for a pipe).
    print(f"meshplan: wrote {path}", file=sys.stderr)


def write_plan_html(path: str, result: SearchResult, *, compiled: Mapping[str, tuple[int, str]] | None = None,
                    budget_source: str = "--headroom", pipelines: PipelineSearch | None = None) -> None:
    """Write the plan's report to ``path`` (``compiled``: the verified meshes' exact peaks; ``pipelines``: the
    pipeline layouts found for the same request, shown after the ranked table)."""
    _write(path, plan_html(result, compiled=compiled, budget_source=budget_source, pipelines=pipelines))


def write_mesh_html(path: str, cluster: Cluster, names: Sequence[str], hybrid: HybridMeshShape) -> None:
    """Write a mesh's device grid to ``path``."""
    _write(path, mesh_html(cluster, names, hybrid))
