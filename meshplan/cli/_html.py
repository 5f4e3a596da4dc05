"""``--html FILE``: write the pure HTML renderings (:func:`meshplan.pure.report.plan_html`,
:func:`~meshplan.pure.report.mesh_html`) to a file, and say where on stderr.

The pages are built in the pure core; this module only does the I/O, so a file that cannot be
written is a clear error (exit 1), never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from meshplan.pure.cluster import Cluster
from meshplan.pure.mesh import HybridMeshShape
from meshplan.pure.report import PlanReport, mesh_html, plan_html

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


def write_plan_html(path: str, report: PlanReport) -> None:
    """Write the plan's report to ``path``: the same facts as the terminal, compiled peaks and pipeline
    layouts included."""
    _write(path, plan_html(report))


def write_mesh_html(path: str, cluster: Cluster, names: Sequence[str], hybrid: HybridMeshShape) -> None:
    """Write a mesh's device grid to ``path``."""
    _write(path, mesh_html(cluster, names, hybrid))
