"""A plan's summary as GitHub-flavoured markdown, ready to paste into a pull request.

The same facts as the terminal summary (:mod:`meshplan.pure.report._summary`): the header, the ranked
table with its compiled peaks, what verification adds (:mod:`meshplan.pure.report._verified`), the pipeline
layouts when searched (:mod:`meshplan.pure.report._pipeline_summary`) and their compiled peaks, the chosen
mesh and the lines to type.

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

from meshplan.pure._format import fmt_bytes
from meshplan.pure.report._pipeline_summary import (
    PIPELINE_COLUMNS,
    pipeline_headline,
    pipeline_rows,
    pipelines_intro,
)
from meshplan.pure.report._report import PlanReport, as_report
from meshplan.pure.report._summary import (
    create_mesh_call,
    header_facts,
    maxtext_flags,
    memory_range,
    range_text,
    chosen_mesh,
    compiled_step_line,
    compiled_step_text,
    ranked_rows,
    seconds,
    shown_columns,
    ties_line,
)
from meshplan.pure.report._verified import pipeline_verification_lines, verification_lines
from meshplan.pure.search import PipelineSearch, SearchResult

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


def plan_markdown(report: PlanReport | SearchResult) -> str:
    """The summary as markdown: a heading, the facts as a list, the ranked table (compiled peaks marked
    exact), what verification removed or could not check, the pipeline layouts and their compiled peaks (when
    the report has them), the chosen mesh and a python block with the ``create_mesh`` call.

    Raises:
      MeshplanTypeError: ``report`` is neither a :class:`~meshplan.pure.report.PlanReport` nor a search result.
    """
    report = as_report(report)
    result, compiled, found = report.result, report.compiled, report.pipelines
    req, best = result.request, chosen_mesh(result, compiled)[0]
    lines = [f"### meshplan plan: {req.model} on {req.cluster.text}", ""]
    lines += [f"- **{label}**: {_cell(fact)}" for label, fact in header_facts(result,
                                                                            budget_source=report.budget_source)]
    lines += [f"- **note**: {_cell(note)}" for note in report.notes]
    by = "step time" if req.rank_by == "time" else "communication"
    lines += ["", (f"**Ranked meshes**: {result.num_fitting} of {result.num_candidates} fit; top "
                  f"{len(result.candidates)} by predicted {by}."), ""]
    rows = ranked_rows(result, compiled, report.compiled_steps)
    cols = shown_columns(rows)
    lines.append("| " + " | ".join(c.title for c in cols) + " |")
    lines.append("|" + "|".join("--:" if c.numeric else ":--" for c in cols) + "|")
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[c.key]) for c in cols) + " |")
    ties = ties_line(result)
    if ties:
        lines.append(f"\n{_inline(ties)}")
    for mesh, (_, source) in sorted(compiled.items()):
        lines.append(f"\n`{mesh}`: exact = XLA's compiled peak ({_cell(source)}).")
    timed = compiled_step_line(result, report.compiled_steps)
    if timed:
        lines.append(f"\n{_inline(timed)}")
    lines += [f"\n{_inline(line)}" for line in verification_lines(report)]
    if found is not None:
        lines += ["", *_pipelines(found, result)]
    elif report.pipeline_note:
        lines += ["", f"Pipeline layouts: {_inline(report.pipeline_note)}."]
    lines += [f"\n{_inline(line)}" for line in pipeline_verification_lines(report)]
    bounds = memory_range(result, best)
    mem = f"{fmt_bytes(best.memory.total)} of the {fmt_bytes(best.memory.budget)} budget (estimate" + (
        ")" if bounds is None else f", range {range_text(bounds)})")
    steps = report.compiled_steps
    step = ("" if best.step is None else f"; step {seconds(best.step.step_s)} (estimate)") if best.text not in steps \
        else f"; step {compiled_step_text(steps[best.text], None if best.step is None else best.step.step_s)}"
    lines += ["", f"**Chosen mesh**: `{best.text}`: {mem}{step}", "", "```python",
              *create_mesh_call(best, width=100), "```", "", f"MaxText: `{maxtext_flags(best)}`", ""]
    left = sum(r.count for r in result.rejections)
    lines.append(f"<sub>{len(result.rejected)} leanest meshes over the budget and {left} meshes left out: "
                 "`meshplan plan ... --detail` lists them.</sub>")
    return "\n".join(lines) + "\n"
