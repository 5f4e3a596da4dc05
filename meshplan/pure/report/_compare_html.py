"""A comparison as one self-contained HTML page: inline CSS and SVG only, no scripts, nothing fetched.

The header facts, the ranked table (the best option highlighted, options where nothing
fits greyed), the two plots (:func:`~meshplan.pure.report.compare_svgs`: step time and
cost per million tokens against devices, one line per device kind), and the verdict lines.

Example:
  >>> from meshplan.pure.compare import CompareOption, build_comparison
  >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 2**30, 2**31, 2.0, 8192, .4)
  >>> page = compare_html(build_comparison("gpt2", 8, 1024, [a]))
  >>> page.startswith("<!DOCTYPE html>"), "<script" in page, page.count('class="compare-plot"')
  (True, False, 1)
"""

from __future__ import annotations

import html

from meshplan.pure.compare import Comparison
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.report._html import PAGE_CSS
from meshplan.pure.report._compare_facts import compare_header, compare_rows, compare_verdicts, shown_columns
from meshplan.pure.report._compare_svg import compare_svgs

__all__ = ["COMPARE_CSS", "compare_html"]

COMPARE_CSS = PAGE_CSS + """.meshplan .scroll { overflow-x: auto; }
.meshplan table.compare { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 0.88em; }
.meshplan table.compare th, .meshplan table.compare td { padding: 0.25em 0.5em; border-bottom: 1px solid #e5e5e5;
  white-space: nowrap; text-align: left; }
.meshplan table.compare th { background: #f4f4f6; font-weight: 600; }
.meshplan table.compare td.num, .meshplan table.compare th.num { text-align: right; }
.meshplan table.compare tr.best td { background: #eef6ee; font-weight: 600; }
.meshplan table.compare tr.nofit td { color: #999; }
.meshplan .plots { display: flex; flex-wrap: wrap; gap: 1em 2em; }
.meshplan .plots svg { display: block; }
.meshplan ul.verdicts { padding-left: 1.2em; }
.meshplan .note { color: #555; font-size: 0.9em; }
"""
"""The page's stylesheet, scoped to ``.meshplan``."""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def compare_html(comparison: Comparison, *, title: str | None = None) -> str:
    """The comparison as a complete HTML document.

    Args:
      comparison: what :func:`~meshplan.compare_clusters` returned.
      title: the page title (default ``"meshplan compare: <model>"``).

    Raises:
      MeshplanTypeError: ``comparison`` is not a Comparison.
    """
    if not isinstance(comparison, Comparison):
        raise MeshplanTypeError(f"comparison={comparison!r:.60} must be a Comparison.")
    c = comparison
    name = title if isinstance(title, str) else f"meshplan compare: {c.model}"
    facts = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in compare_header(c))
    cols = shown_columns(c)
    head = "".join(f'<th class="{"num" if col.right else ""}">{_e(col.title)}</th>' for col in cols)
    best = c.best
    body = []
    for o, row in zip(c.options, compare_rows(c), strict=True):
        klass = "best" if best is not None and o is best else "" if o.fits else "nofit"
        tip = f' title="{_e(o.note)}"' if o.note else ""
        cells = "".join(f'<td class="{"num" if col.right else ""}">{_e(row[col.key])}</td>' for col in cols)
        body.append(f'<tr class="{klass}"{tip}>{cells}</tr>')
    step, cost = compare_svgs(c)
    plots = step + (cost or '<p class="note">cost plot: give --price KIND=USD_PER_DEVICE_HOUR to draw it.</p>')
    verdicts = "".join(f"<li>{_e(line)}</li>" for line in compare_verdicts(c))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(name)}</title><style>{COMPARE_CSS}</style></head><body>"
            f'<div class="meshplan"><h1>{_e(name)}</h1><dl class="facts">{facts}</dl>'
            f'<h2>Ranked options</h2><div class="scroll"><table class="compare"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>'
            f'<h2>Against devices</h2><div class="plots">{plots}</div>'
            f'<h2>Verdicts</h2><ul class="verdicts">{verdicts}</ul></div></body></html>\n')
