"""Plan reports for the renderer tests: a search result with given compiled peaks and pipeline layouts."""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.pure.report import PlanReport
from meshplan.pure.search import PipelineSearch, SearchResult
from meshplan.pure.verify import PlanVerification, VerifyRow


def report(result: SearchResult, compiled: Mapping[str, tuple[int, str]] | None = None,
           pipelines: PipelineSearch | None = None) -> PlanReport:
    """``result`` as a report whose verification compiled ``compiled`` (mesh text -> (peak, compiler))."""
    if not compiled:
        return PlanReport(result, pipelines=pipelines)
    rows, removed = [], []
    for cand in result.candidates:
        if cand.text not in compiled:
            continue
        peak, compiler = compiled[cand.text]
        over = peak > result.request.budget
        row = VerifyRow(cand.text, cand.rank, cand.memory.total, result.request.budget, "8 x test",
                        peak_bytes=peak, status="over budget" if over else "exact", compiler=compiler)
        (removed if over else rows).append(row)
    checked = PlanVerification(tuple(rows), tuple(removed), sorted({c for _, c in compiled.values()})[0], "", 1.0)
    return PlanReport(result, verification=checked, pipelines=pipelines)
