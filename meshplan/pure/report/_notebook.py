"""A plan in a notebook: :func:`show` wraps a report (or a bare search result, or a serving plan) in an object
Jupyter displays as the HTML report, or as its markdown summary where HTML is not shown. The plans themselves
are data; their renderers live here, above them, so nothing below the report imports it.

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
from meshplan.pure.report._serve_html import serve_html
from meshplan.pure.report._serve_markdown import serve_markdown
from meshplan.pure.search import SearchResult
from meshplan.pure.serve import ServePlan

__all__ = ["Shown", "show"]


@dataclasses.dataclass(frozen=True, slots=True)
class Shown:
    """A plan that Jupyter displays: ``_repr_html_`` is the HTML report (a fragment with scoped styles),
    ``_repr_markdown_`` the markdown summary."""

    report: PlanReport | ServePlan

    def _repr_html_(self) -> str:
        if isinstance(self.report, ServePlan):
            return serve_html(self.report, fragment=True)
        return plan_html(self.report, fragment=True)

    def _repr_markdown_(self) -> str:
        if isinstance(self.report, ServePlan):
            return serve_markdown(self.report)
        return plan_markdown(self.report)


def show(report: PlanReport | SearchResult | ServePlan) -> Shown:
    """``report`` (a training plan's report, a bare search result, or a serving plan) as an object a notebook
    displays as the plan's HTML report.

    Raises:
      MeshplanTypeError: ``report`` is none of those (the message names what was given).
    """
    return Shown(report if isinstance(report, ServePlan) else as_report(report))
