"""A serving plan as markdown (a pull request, an issue, a notebook): the summary's facts, the ranked table,
the notes and the command, from :mod:`._serve_summary`.

Example:
  >>> from meshplan.pure.serve import plan_serving
  >>> text = serve_markdown(plan_serving("llama3.1-8b", "1x8xH100", context=8192, concurrency=64))
  >>> text.splitlines()[0], "```bash" in text
  ('### meshplan serve: llama3.1-8b on 1x8xH100 with vLLM', True)
"""

from __future__ import annotations

from meshplan.pure.report._serve_summary import (
    SERVE_COLUMNS,
    Compiled,
    check_plan,
    serve_header,
    serve_headline,
    serve_notes,
    serve_rows,
)
from meshplan.pure.serve._result import ServePlan

__all__ = ["serve_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def serve_markdown(plan: ServePlan, *, compiled: Compiled | None = None) -> str:
    """The plan as markdown.

    Args:
      plan: what :func:`~meshplan.pure.serve.plan_serving` returned.
      compiled: mesh text -> (XLA's compiled peak of the decode step, which compiler and version).

    Returns:
      Markdown text ending in a newline.
    """
    plan = check_plan(plan)
    lines = [f"### {serve_headline(plan)}", "", "| | |", "|---|---|"]
    lines += [f"| **{label}** | {_cell(fact)} |" for label, fact in serve_header(plan)]
    fitting = sum(r.meets_limits for r in plan.rows)
    lines += ["", f"#### Ranked layouts: {fitting} of {len(plan.rows)} fit and meet the limits, by tokens/s per device",
              "", "| " + " | ".join(c.title for c in SERVE_COLUMNS) + " |",
              "|" + "|".join("---:" if c.numeric else "---" for c in SERVE_COLUMNS) + "|"]
    for row in serve_rows(plan, compiled):
        lines.append("| " + " | ".join(_cell(row[c.key]) for c in SERVE_COLUMNS) + " |")
    done = dict(compiled or {})
    sources = sorted({source for mesh, (_, source) in done.items() if any(r.mesh == mesh for r in plan.rows)})
    if sources:
        lines += ["", "exact: XLA's compiled peak of meshplan's reference decode step, " + "; ".join(sources)]
    notes = serve_notes(plan)
    if notes:
        lines += [""] + [f"- {_cell(n)}" for n in notes]
    best = plan.best
    if best is not None:
        lines += ["", f"#### Serve {best.mesh} ({best.layout.replicas} "
                      f"{'replica' if best.layout.replicas == 1 else 'replicas'}; the command for one)", "",
                  "```bash", *best.command, "```"]
    return "\n".join(lines) + "\n"
