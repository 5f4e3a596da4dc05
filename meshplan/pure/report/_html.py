"""A plan as one self-contained HTML page (or a notebook fragment): inline CSS and SVG only.

No scripts, no external fonts, images or styles: the page opens the same from a pull request attachment,
a chat upload or a laptop with no network. It shows the summary's facts
(:mod:`meshplan.pure.report._summary`): the header, the ranked table, per ranked mesh a memory bar
(params, grads, optimizer, activations against the budget, the estimate's range, the compiled peak where
verified) and a step-time bar (compute, then each collective's exposed seconds), what verification adds
(:mod:`meshplan.pure.report._verified`: the meshes removed, the rows not verified and why), the pipeline
layouts when searched (:mod:`meshplan.pure.report._pipeline_summary`'s table, each row with a bar of its step
and bubble against the best unpipelined step, the left-out lines collapsed) and their compiled peaks, the
chosen mesh's device grid coloured by axis group with hosts (and slices) outlined, and the lines to type.

Example:
  >>> from meshplan.pure import search_meshes
  >>> page = plan_html(search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2))
  >>> page.startswith("<!DOCTYPE html>"), "<script" in page, page.count('class="candidate"')
  (True, False, 2)
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from meshplan.pure._check import as_flag
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.report._pipeline_summary import (
    PIPELINE_COLUMNS,
    best_unpipelined_s,
    pipeline_headline,
    pipeline_layouts,
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
    ranked_rows,
    shown_columns,
    ties_line,
)
from meshplan.pure.report._svg import (
    BUBBLE_COLOR,
    MEMORY_COLORS,
    bubble_bar,
    check_grid_args,
    device_grid_svg,
    memory_bar,
    step_bar,
)
from meshplan.pure.report._verified import pipeline_verification_lines, verification_lines
from meshplan.pure.search import MeshCandidate, PipelineSearch, SearchResult
from meshplan.pure.verify import CompiledStep

__all__ = ["CSS", "mesh_html", "plan_html"]

PAGE_CSS = """
.meshplan { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f;
  max-width: 1240px; line-height: 1.4; }
.meshplan h1 { font-size: 1.5em; margin: 0.2em 0 0.4em; }
.meshplan h2 { font-size: 1.15em; margin: 1.4em 0 0.4em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meshplan dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 0.15em 1em; margin: 0; }
.meshplan dl.facts dt { font-weight: 600; color: #555; }
.meshplan dl.facts dd { margin: 0; }
"""
"""The style every meshplan page starts with (the plan's, the comparison's, the serving plan's): font,
headings, the facts list."""

CSS = PAGE_CSS + """.meshplan table.ranked { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 0.88em; }
.meshplan .scroll { overflow-x: auto; }
.meshplan table.ranked th, .meshplan table.ranked td { padding: 0.25em 0.5em; border-bottom: 1px solid #e5e5e5;
  white-space: nowrap; text-align: left; }
.meshplan table.ranked th { background: #f4f4f6; font-weight: 600; }
.meshplan table.ranked td.num, .meshplan table.ranked th.num { text-align: right; }
.meshplan table.ranked tr.best td { background: #eef6ee; font-weight: 600; }
.meshplan .candidate { margin: 0.8em 0 1.1em; }
.meshplan .candidate h3 { font-size: 1em; margin: 0 0 0.2em; }
.meshplan .candidate .bars { display: flex; flex-wrap: wrap; gap: 0 2em; }
.meshplan .candidate .bar-title { font-size: 0.8em; color: #666; text-transform: uppercase; letter-spacing: 0.04em; }
.meshplan .candidate svg { display: block; margin: 0.1em 0; }
.meshplan .legend span { display: inline-block; margin-right: 1.1em; font-size: 0.9em; }
.meshplan .legend i { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.3em;
  vertical-align: -0.1em; border-radius: 2px; }
.meshplan .device-grid { display: flex; flex-wrap: wrap; gap: 0.5em 1.6em; align-items: flex-start; }
.meshplan .device-grid .grid-legend { flex-basis: 100%; margin: 0; color: #555; }
.meshplan figure.axis-panel { margin: 0; }
.meshplan figure.axis-panel figcaption { font-size: 0.9em; margin-bottom: 0.2em; }
.meshplan pre { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; padding: 0.7em 0.9em;
  overflow-x: auto; font-size: 0.9em; }
.meshplan .note { color: #555; font-size: 0.9em; }
"""
"""The report's stylesheet; every rule is scoped to ``.meshplan`` so a notebook's own styles are untouched."""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _ranked_table(result: SearchResult, compiled: Mapping[str, tuple[int, str]],
                  steps: Mapping[str, CompiledStep]) -> str:
    rows = ranked_rows(result, compiled, steps)
    cols = shown_columns(rows)
    head = "".join(f'<th class="{"num" if c.numeric else ""}">{_e(c.title)}</th>' for c in cols)
    body = []
    for row in rows:
        cells = "".join(f'<td class="{"num" if c.numeric else ""}">{_e(row[c.key])}</td>' for c in cols)
        body.append(f'<tr class="{"best" if row["rank"] == "1" else ""}">{cells}</tr>')
    return (f'<div class="scroll"><table class="ranked"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            "</tbody></table></div>")


def _legend(result: SearchResult) -> str:
    names = ["params", "grads", "optimizer", "activations"]
    parts = "".join(f'<span><i style="background:{MEMORY_COLORS[n]}"></i>{n}</span>' for n in names)
    extra = ('<span>&#9474;&#8212;&#9474; estimate range</span><span style="color:#c00">- - budget</span>'
             '<span>&#9646; compiled peak (verified)</span>')
    step = ('<span><i style="background:#8c9bab"></i>compute</span><span>then the exposed (not hidden) '
            "communication of each collective, one colour each (hover for its name)</span>")
    del result
    return f'<p class="legend">Memory: {parts}{extra}</p><p class="legend">Step: {step}</p>'


def _candidates(result: SearchResult, compiled: Mapping[str, tuple[int, str]]) -> str:
    slowest = max((c.step.step_s for c in result.candidates if c.step is not None), default=0.0)
    out = []
    for cand in result.candidates:
        bounds = memory_range(result, cand)
        verified = compiled.get(cand.text)
        how = (f"compiled peak {fmt_bytes(verified[0])} (exact, {verified[1]})" if verified is not None else
               f"estimate, range {range_text(bounds)}" if bounds is not None else "estimate")
        out.append(f'<div class="candidate" id="rank-{cand.rank}"><h3>#{cand.rank} {_e(cand.text)}: '
                   f"{_e(fmt_bytes(cand.memory.total))} per device ({_e(how)})</h3>")
        out.append('<div class="bars"><div><div class="bar-title">memory per device</div>'
                   f"{memory_bar(cand.memory, bounds=bounds, compiled=verified)}</div>")
        if cand.step is not None:
            out.append('<div><div class="bar-title">step time</div>'
                       f"{step_bar(cand.step, cand.comm, scale_s=slowest)}</div>")
        out.append("</div></div>")
    return "".join(out)


def _pipelines(found: PipelineSearch, result: SearchResult) -> str:
    """The "Pipeline layouts" section: a sentence, the table with a step-and-bubble bar per layout, the
    fastest against the unpipelined meshes, and the left-out lines in a collapsed ``<details>``."""
    out = [f'<h2 id="pipelines">Pipeline layouts</h2><p>{_e(pipelines_intro(found, result))}</p>']
    layouts, rows = pipeline_layouts(found), pipeline_rows(found, result)
    best = best_unpipelined_s(result)
    if rows:
        slowest = max([c.step.step_s for c in layouts if c.step is not None] + [best or 0.0])
        cols = PIPELINE_COLUMNS
        # Headers may wrap (the ranked table's never do) so the bars fit beside the cells in the page width.
        head = "".join(f'<th class="{"num" if c.numeric else ""}" style="white-space:normal">{_e(c.title)}</th>'
                       for c in cols)
        body = []
        for row, cand in zip(rows, layouts, strict=True):
            assert cand.step is not None and cand.pipeline is not None  # pipeline_layouts keeps only these
            cells = "".join(f'<td class="{"num" if c.numeric else ""}">{_e(row[c.key])}</td>' for c in cols)
            bar = bubble_bar(cand.step, cand.pipeline.bubble, scale_s=slowest, reference_s=best)
            body.append(f'<tr class="pipeline">{cells}<td>{bar}</td></tr>')
        out.append(f'<div class="scroll"><table class="ranked pipelines"><thead><tr>{head}<th>step and bubble</th>'
                   f'</tr></thead><tbody>{"".join(body)}</tbody></table></div>')
        out.append(f'<p class="legend"><span><i style="background:#8c9bab"></i>stage work and boundary sends</span>'
                   f'<span><i style="background:{BUBBLE_COLOR}"></i>bubble</span>'
                   + ('<span style="color:#c00">- - best unpipelined step</span>' if best is not None else "")
                   + "</p>")
    headline = pipeline_headline(found, result)
    if headline is not None:
        out.append(f'<p class="note">{_e(headline[0].upper() + headline[1:])}.</p>')
    if found.left_out:
        n = len(found.left_out)
        items = "".join(f"<li>{_e(line)}</li>" for line in found.left_out)
        out.append(f'<details class="left-out"><summary>{n} pp placement{"s" if n != 1 else ""} left out, and '
                   f"why</summary><ul>{items}</ul></details>")
    return "".join(out)


def _snippets(best: MeshCandidate) -> str:
    code = "\n".join(["import meshplan", "", *create_mesh_call(best, width=88)])
    layout = ""
    if best.activations is not None:
        rows = "\n".join(f"{t.name:<9} {t.shape!s:<22} {t.spec}" for t in best.activations.tensors)
        layout = (f'<p class="note">Batch and activation specs the memory assumes (best.training_layout; apply '
                  f"with jax.lax.with_sharding_constraint):</p><pre>{_e(rows)}</pre>")
    return (f"<h2>To build it</h2><pre class=\"create-mesh\">{_e(code)}</pre>"
            f'<p class="note">MaxText command-line overrides:</p><pre class="maxtext">{_e(maxtext_flags(best))}</pre>'
            f"{layout}")


def _notes(lines: Sequence[str], cls: str) -> str:
    return "".join(f'<p class="note {cls}">{_e(line)}</p>' for line in lines)


def _body(report: PlanReport) -> str:
    result, compiled, pipelines = report.result, dict(report.compiled), report.pipelines
    req, best = result.request, chosen_mesh(result, compiled)[0]
    facts = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>"
                    for k, v in (*header_facts(result, budget_source=report.budget_source),
                                 *(("note", n) for n in report.notes)))
    left = sum(r.count for r in result.rejections)
    over = "".join(f"<li>{_e(c.text)}: {_e(c.verdict)}</li>" for c in result.rejected)
    reasons = "".join(f"<li>{_e(r.example)} ({r.count} mesh{'es' if r.count != 1 else ''}, {_e(r.kind)})</li>"
                      for r in result.rejections)
    exact = "".join(f'<p class="note exact">{_e(mesh)}: exact = XLA\'s compiled peak ({_e(source)}).</p>'
                    for mesh, (_, source) in sorted(compiled.items()))
    exact += _notes([t for t in (compiled_step_line(result, report.compiled_steps),) if t], "compiled-step")
    no_pipelines = (f'<h2 id="pipelines">Pipeline layouts</h2><p class="note">{_e(report.pipeline_note)}.</p>'
                    if pipelines is None and report.pipeline_note else "")
    by = "step time" if req.rank_by == "time" else "communication"
    return "".join([
        f"<h1>meshplan plan: {_e(req.model)} on {_e(req.cluster.text)}</h1>",
        f'<dl class="facts">{facts}</dl>',
        (f"<h2>Ranked meshes</h2><p>{result.num_fitting} of {result.num_candidates} meshes fit; the top "
        f"{len(result.candidates)} by predicted {by}.</p>"),
        _ranked_table(result, compiled, report.compiled_steps), _notes([t for t in (ties_line(result),) if t], "ties"), exact,
        _notes(verification_lines(report), "verification"),
        _pipelines(pipelines, result) if pipelines is not None else no_pipelines,
        _notes(pipeline_verification_lines(report), "pipeline-verification"),
        "<h2>Memory and step time per mesh</h2>", _legend(result), _candidates(result, compiled),
        f"<h2>Chosen mesh: {_e(best.text)}</h2>",
        device_grid_svg(req.cluster, best.axis_names, best.hybrid),
        _snippets(best),
        (f"<h2>Left out</h2><p>{len(result.rejected)} leanest meshes over the budget and {left} meshes left out "
        f"for these reasons:</p><ul>{over}{reasons}</ul>"),
    ])


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{CSS}body {{ margin: 1.5em 2em; background: #fff; }}</style></head>"
            f'<body><main class="meshplan">{body}</main></body></html>\n')


def plan_html(report: PlanReport | SearchResult, *, fragment: bool = False) -> str:
    """The plan as HTML.

    Args:
      report: a :class:`~meshplan.pure.report.PlanReport` (the ranked meshes, their compiled peaks, the
        pipeline layouts and theirs), or a bare search result (its estimates alone).
      fragment: a ``<div>`` with its own scoped ``<style>`` (for a notebook) instead of a whole page.

    Returns:
      A self-contained HTML document (or fragment): inline CSS and SVG, no scripts, nothing fetched.

    Raises:
      MeshplanTypeError: ``report`` is neither a report nor a search result, or ``fragment`` not a bool.
    """
    report, fragment = as_report(report), as_flag(fragment, "fragment")
    body = _body(report)
    if fragment:
        return f'<div class="meshplan"><style>{CSS}</style>{body}</div>'
    return _page(f"meshplan plan: {report.result.request.model} on {report.result.request.cluster.text}", body)


def mesh_html(cluster: Cluster, names: Sequence[str], hybrid: HybridMeshShape) -> str:
    """One page drawing a mesh's device grid on ``cluster`` (``meshplan show-mesh --html``).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> page = mesh_html(parse_cluster("2x4xH100"), ("dp", "tp"), HybridMeshShape((1, 4), (2, 1)))
      >>> page.count('class="device"')
      16
    """
    names = check_grid_args(cluster, names, hybrid)
    sizes = ", ".join(f"{n}={i * d}" for n, i, d in zip(names, hybrid.ici_mesh_shape, hybrid.dcn_mesh_shape,
                                                          strict=True))
    title = f"{cluster.text}: mesh {sizes}"
    body = (f"<h1>{_e(title)}</h1><p>{cluster.num_devices} devices, {cluster.num_nodes} hosts x "
            f"{cluster.devices_per_node}; ICI {_e(hybrid.ici_mesh_shape)}, DCN {_e(hybrid.dcn_mesh_shape)}.</p>"
            + device_grid_svg(cluster, names, hybrid))
    return _page(title, body)
