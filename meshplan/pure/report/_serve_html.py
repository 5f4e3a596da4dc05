"""A serving plan as one self-contained HTML page (or a notebook fragment): inline CSS and SVG, no scripts,
nothing fetched. The summary's facts (:mod:`._serve_summary`), the ranked table, per layout a memory bar and a
decode-step bar (:mod:`._serve_svg`), and the command for the best layout.

Example:
  >>> from meshplan.pure.serve import plan_serving
  >>> page = serve_html(plan_serving("llama3.1-8b", "1x8xH100", context=8192, concurrency=64))
  >>> page.startswith("<!DOCTYPE html>"), "<script" in page, page.count('class="layout"')
  (True, False, 4)
"""

from __future__ import annotations

import html

from meshplan.pure.report._html import PAGE_CSS
from meshplan.pure.report._serve_summary import (
    SERVE_COLUMNS,
    Compiled,
    check_plan,
    serve_header,
    serve_headline,
    serve_notes,
    serve_rows,
)
from meshplan.pure.report._serve_svg import SERVE_MEMORY_COLORS, SERVE_STEP_COLORS, memory_bar, step_bar
from meshplan.pure.serve._result import ServePlan

__all__ = ["SERVE_CSS", "serve_html"]

SERVE_CSS = PAGE_CSS + """.meshplan .scroll { overflow-x: auto; }
.meshplan table.ranked { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 0.88em; }
.meshplan table.ranked th, .meshplan table.ranked td { padding: 0.25em 0.5em; border-bottom: 1px solid #e5e5e5;
  white-space: nowrap; text-align: left; }
.meshplan table.ranked th { background: #f4f4f6; font-weight: 600; }
.meshplan table.ranked td.num, .meshplan table.ranked th.num { text-align: right; }
.meshplan table.ranked tr.best td { background: #eef6ee; font-weight: 600; }
.meshplan .layout { margin: 0.8em 0 1.1em; }
.meshplan .layout h3 { font-size: 1em; margin: 0 0 0.2em; }
.meshplan .bar-title { font-size: 0.8em; color: #666; text-transform: uppercase; letter-spacing: 0.04em; }
.meshplan .legend span { display: inline-block; margin-right: 1.1em; font-size: 0.9em; }
.meshplan .legend i { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.3em;
  vertical-align: -0.1em; border-radius: 2px; }
.meshplan pre { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; padding: 0.7em 0.9em;
  overflow-x: auto; font-size: 0.9em; }
.meshplan .note { color: #555; font-size: 0.9em; }
"""
"""The page's stylesheet; every rule is scoped to ``.meshplan``."""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _legend(colors: dict[str, str]) -> str:
    return ('<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{_e(n)}</span>'
                                           for n, c in colors.items()) + "</p>")


def _body(plan: ServePlan, compiled: Compiled) -> str:
    facts = "".join(f"<dt>{_e(label)}</dt><dd>{_e(fact)}</dd>" for label, fact in serve_header(plan))
    head = "".join(f'<th class="{"num" if c.numeric else ""}">{_e(c.title)}</th>' for c in SERVE_COLUMNS)
    body = []
    for row, cells in zip(plan.rows, serve_rows(plan, compiled), strict=True):
        cls = ' class="best"' if row is plan.best else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="{"num" if c.numeric else ""}">{_e(cells[c.key])}</td>'
                                           for c in SERVE_COLUMNS) + "</tr>")
    hbm = plan.request.cluster.device.hbm_bytes
    scale = max((r.decode.seconds for r in plan.rows if r.decode is not None), default=0.0)
    layouts = []
    for i, row in enumerate(plan.rows, 1):
        peak = compiled.get(row.mesh, (None, ""))[0]
        bars = [f'<div class="bar-title">memory per device</div>{memory_bar(row, hbm, compiled_peak=peak)}']
        if row.decode is not None:
            bars.append(f'<div class="bar-title">decode step ({row.sequences} sequences)</div>'
                        f"{step_bar(row.decode, scale_s=scale)}")
        why = f'<p class="note">{_e(row.why)}</p>' if row.why else ""
        layouts.append(f'<div class="layout"><h3>#{i} {_e(row.mesh)}</h3>{"".join(bars)}{why}</div>')
    notes = "".join(f"<li>{_e(n)}</li>" for n in serve_notes(plan))
    best = plan.best
    command = (f"<h2>Serve {_e(best.mesh)}</h2><p>The command for one replica "
               f"({best.layout.replicas} in all):</p><pre>{_e(chr(10).join(best.command))}</pre>"
               if best is not None else f"<h2>No layout serves as asked</h2><p>{_e(plan.answer)}</p>")
    return "".join([
        f"<h1>{_e(serve_headline(plan))}</h1>", f'<dl class="facts">{facts}</dl>',
        "<h2>Ranked layouts</h2>", f'<div class="scroll"><table class="ranked"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>",
        f'<ul class="note">{notes}</ul>' if notes else "",
        "<h2>Memory and time per layout</h2>", _legend(SERVE_MEMORY_COLORS), _legend(SERVE_STEP_COLORS),
        "".join(layouts), command,
    ])


def serve_html(plan: ServePlan, *, compiled: Compiled | None = None, fragment: bool = False) -> str:
    """The plan as HTML.

    Args:
      plan: what :func:`~meshplan.pure.serve.plan_serving` returned.
      compiled: mesh text -> (XLA's compiled peak of the decode step, which compiler and version).
      fragment: a ``<div>`` with its own scoped ``<style>`` (a notebook) instead of a whole page.

    Returns:
      A self-contained HTML document (or fragment).
    """
    plan = check_plan(plan)
    body = _body(plan, dict(compiled or {}))
    if fragment:
        return f'<div class="meshplan"><style>{SERVE_CSS}</style>{body}</div>'
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(serve_headline(plan))}'
            f"</title><style>{SERVE_CSS}body {{ margin: 1.5em 2em; background: #fff; }}</style></head>"
            f'<body><main class="meshplan">{body}</main></body></html>\n')
