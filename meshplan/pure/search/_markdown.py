"""A search result's summary as GitHub-flavoured markdown, ready to paste into a pull request.

The same facts as the terminal summary (:mod:`meshplan.pure.search._summary`): the header, the ranked
table, the pipeline layouts when given (:mod:`meshplan.pure.search._pipeline_summary`), the chosen mesh and
the lines to type.

Example:
  >>> from meshplan.pure import search_meshes
  >>> text = plan_markdown(search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2))
  >>> text.splitlines()[0]
  '### meshplan plan: gpt2 on 2x4xH100'
  >>> "| # | mesh | memory/device |" in text
  True
"""

from __future__ import annotations

import html
from collections.abc import Mapping

from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.search._pipeline_search import PipelineSearch
from meshplan.pure.search._pipeline_summary import (
    PIPELINE_COLUMNS,
    check_pipelines,
    pipeline_headline,
    pipeline_rows,
    pipelines_intro,
)
from meshplan.pure.search._result import SearchResult
from meshplan.pure.search._summary import (
    RANK_COLUMNS,
    create_mesh_call,
    header_facts,
    maxtext_flags,
    memory_range,
    range_text,
    ranked_rows,
    seconds,
)

__all__ = ["plan_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a pipe would end the cell


def _inline(text: str) -> str:
    """Free text (a reason, a verdict) as one line of markdown that stays text: no newline that could start
    a heading or a table, no raw HTML tag (``<`` is an entity, which markdown shows as ``<``), no pipe."""
    return _cell(html.escape(" ".join(text.split()), quote=False))


def _pipelines(found: PipelineSearch, result: SearchResult) -> list[str]:
    """The "Pipeline layouts" section: a sentence, the table (if any layout fits), the fastest against the
    unpipelined meshes, and the left-out lines."""
    lines = [f"**Pipeline layouts**: {_inline(pipelines_intro(found, result))}"]
    rows = pipeline_rows(found, result)
    if rows:
        lines += ["", "| " + " | ".join(c.title for c in PIPELINE_COLUMNS) + " |",
                  "|" + "|".join("--:" if c.numeric else ":--" for c in PIPELINE_COLUMNS) + "|"]
        lines += ["| " + " | ".join(_inline(row[c.key]) for c in PIPELINE_COLUMNS) + " |" for row in rows]
    headline = pipeline_headline(found, result)
    if headline is not None:
        lines += ["", _inline(headline[0].upper() + headline[1:]) + "."]
    if found.left_out:
        lines += ["", f"Left out ({len(found.left_out)}):", "", *(f"- {_inline(r)}" for r in found.left_out)]
    return lines


def plan_markdown(result: SearchResult, *, compiled: Mapping[str, tuple[int, str]] | None = None,
                  budget_source: str = "--headroom", pipelines: PipelineSearch | None = None) -> str:
    """The summary as markdown: a heading, the facts as a list, the ranked table, the pipeline layouts (when
    ``pipelines`` is given: what :func:`~meshplan.pure.search.search_pipelines` found for the same request),
    the chosen mesh and a python block with the ``create_mesh`` call. ``compiled``: mesh text -> (XLA's
    compiled peak, which compiler and version) for the meshes verified, shown as exact. Without
    ``pipelines`` the text is exactly what it was before pipelines were shown."""
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult (search_meshes(...)), not "
                                f"{type(result).__name__}.")
    found = None if pipelines is None else check_pipelines(pipelines)
    req, best = result.request, result.best
    lines = [f"### meshplan plan: {req.model} on {req.cluster.text}", ""]
    lines += [f"- **{label}**: {_cell(fact)}" for label, fact in header_facts(result, budget_source=budget_source)]
    by = "step time" if req.rank_by == "time" else "communication"
    lines += ["", (f"**Ranked meshes**: {result.num_fitting} of {result.num_candidates} fit; top "
                  f"{len(result.candidates)} by predicted {by}."), ""]
    lines.append("| " + " | ".join(c.title for c in RANK_COLUMNS) + " |")
    lines.append("|" + "|".join("--:" if c.numeric else ":--" for c in RANK_COLUMNS) + "|")
    for row in ranked_rows(result, compiled):
        lines.append("| " + " | ".join(_cell(row[c.key]) for c in RANK_COLUMNS) + " |")
    for mesh, (_, source) in sorted((compiled or {}).items()):
        lines.append(f"\n`{mesh}`: exact = XLA's compiled peak ({_cell(source)}).")
    if found is not None:
        lines += ["", *_pipelines(found, result)]
    bounds = memory_range(result, best)
    mem = f"{fmt_bytes(best.memory.total)} of the {fmt_bytes(best.memory.budget)} budget (estimate" + (
        ")" if bounds is None else f", range {range_text(bounds)})")
    step = "" if best.step is None else f"; step {seconds(best.step.step_s)} (estimate)"
    lines += ["", f"**Chosen mesh**: `{best.text}`: {mem}{step}", "", "```python",
              *create_mesh_call(best, width=100), "```", "", f"MaxText: `{maxtext_flags(best)}`", ""]
    left = sum(r.count for r in result.rejections)
    lines.append(f"<sub>{len(result.rejected)} leanest meshes over the budget and {left} meshes left out: "
                 "`meshplan plan ... --detail` lists them.</sub>")
    return "\n".join(lines) + "\n"
