"""A plan in a notebook: :func:`show` wraps a report (or a bare search result) in an object Jupyter displays
as the HTML report, or as its markdown summary where HTML is not shown.

Example:
  >>> from meshplan.pure.search import search_meshes
  >>> shown = show(search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2))
  >>> shown._repr_html_().startswith('<div class="meshplan">'), shown._repr_markdown_().startswith("### meshplan")
  (True, True)
"""

from __future__ import annotations

import dataclasses

from meshplan.pure.report._html import plan_html
from meshplan.pure.report._markdown import plan_markdown
from meshplan.pure.report._report import PlanReport, as_report
from meshplan.pure.search import SearchResult

__all__ = ["Shown", "show"]


@dataclasses.dataclass(frozen=True, slots=True)
class Shown:
    """A report that Jupyter displays: ``_repr_html_`` is the HTML report (a fragment with scoped styles),
    ``_repr_markdown_`` the markdown summary."""

    report: PlanReport

    def _repr_html_(self) -> str:
        return plan_html(self.report, fragment=True)

    def _repr_markdown_(self) -> str:
        return plan_markdown(self.report)


def show(report: PlanReport | SearchResult) -> Shown:
    """``report`` (or a search result) as an object a notebook displays as the plan's HTML report.

    Raises:
      MeshplanTypeError: ``report`` is neither a :class:`PlanReport` nor a search result.
    """
    return Shown(as_report(report))
