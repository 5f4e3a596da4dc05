"""Drawing plans and device grids for people in a terminal: rich tables, and a PNG via matplotlib.

Nothing here decides anything: layouts come from
:func:`meshplan.pure.layout_device_ids` (the same code ``create_mesh`` uses)
and every figure and sentence from the :class:`~meshplan.pure.report.PlanReport` and its facts
(:mod:`meshplan.pure.report._summary`, ``_verified``, ``_pipeline_summary``), which markdown and HTML lay out
too.
matplotlib is imported only inside :func:`write_png` (the optional ``png`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshplan.cli._fit_table import fact_grid, fitted_table
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster import Cluster
from meshplan.pure.mesh import HybridMeshShape, layout_device_ids
from meshplan.pure.report import PlanReport
from meshplan.pure.cost import Spread, axis_domain_counts, peak_bounds
from meshplan.pure.report._summary import (
    chosen_mesh,
    compiled_step_line,
    compiled_step_text,
    create_mesh_call,
    header_facts,
    maxtext_flags,
    memory_range,
    range_text,
    ranked_rows,
    seconds,
    shown_columns,
    spread_of,
    ties_line,
)
from meshplan.pure.report._verified import lowering_line, pipeline_verification_lines, verification_lines
from meshplan.pure.search import SearchResult
from meshplan.pure.verify import CompiledStep

__all__ = ["device_grid", "ranked_table", "render_footer", "render_mesh", "render_pipeline_summary", "render_plan",
           "write_png"]

_COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
_MAX_CELLS = 512


def device_grid(cluster: Cluster, hybrid: HybridMeshShape) -> np.ndarray:
    """The mesh as device ids on ``cluster``, laid out as ``create_mesh`` lays out real devices.

    Device ``i`` sits on host ``i // devices_per_node`` and, on TPUs, in slice
    ``i // devices_per_slice``; the granules are hosts (GPUs) or slices (TPUs).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> device_grid(parse_cluster("2x4xH100"), HybridMeshShape((1, 4), (2, 1))).tolist()
      [[0, 1, 2, 3], [4, 5, 6, 7]]
    """
    return layout_device_ids(cluster.device_infos(), hybrid)


def render_plan(report: PlanReport, console: Any, *, detail: bool = False) -> None:
    """Print a plan, summary first: the header facts, the ranked table (compiled peaks marked exact), the
    chosen mesh and the lines to type; what verification removed or could not check; the pipeline layouts and
    their compiled peaks; and the footer saying what ``--detail`` adds. ``detail=True`` prints the workings
    (:func:`meshplan.cli._detail.render_detail`), the verification table and the pipeline table instead.

    No line is longer than the console: the ranked table drops its lowest-priority columns (see
    :data:`~meshplan.pure.report._summary.RANK_COLUMNS`) until it fits instead of wrapping a cell.
    """
    result, compiled = report.result, dict(report.compiled)
    console.print(f"[bold]meshplan plan[/bold]: {result.request.model} on {result.request.cluster.text}")
    facts = header_facts(result, budget_source=report.budget_source)
    console.print(fact_grid([*facts, *(("note", note) for note in report.notes)]), crop=False)
    req = result.request
    console.print(f"\n[bold]Ranked meshes[/bold]: {result.num_fitting} of {result.num_candidates} fit, "
                  f"top {len(result.candidates)} by predicted "
                  f"{'step time' if req.rank_by == 'time' else 'communication'}")
    console.print(ranked_table(result, console.width, compiled, report.compiled_steps))
    ties = ties_line(result)
    if ties:
        console.print(ties, markup=False)
    by_source: dict[str, list[str]] = {}
    for cand in result.candidates:  # rank order; one line per compiler, not per mesh
        if cand.text in compiled:
            by_source.setdefault(compiled[cand.text][1], []).append(f"#{cand.rank}")
    for source, ranks in sorted(by_source.items()):
        console.print(f"exact ({', '.join(ranks)}): XLA's compiled peak, {source}", markup=False)
    timed = compiled_step_line(result, report.compiled_steps)
    if timed:
        console.print(timed, markup=False)
    found = spread_of(result)
    margin = _margin(result, None if found is None else found[1])
    if margin:
        console.print(margin)
    _render_chosen(result, console, compiled, report.compiled_steps)
    if detail:
        from meshplan.cli._detail import render_detail, render_verification

        render_detail(result, console)
        if report.verification is not None:  # the table lists what the summary's lines say, and more
            render_verification(report.verification, console, title="Verified: the reference step compiled")
            _print_lines(console, [line for line in (lowering_line(report),) if line])
    else:
        _print_lines(console, verification_lines(report))
    if report.pipelines is None and report.pipeline_note:
        console.print(f"pipeline layouts: {report.pipeline_note}", markup=False)
    if report.pipelines is not None:
        if detail:
            from meshplan.cli._pipeline import render_pipelines

            render_pipelines(report.pipelines, result, console)
        else:  # the summary gives the fastest layout in one line; its table is part of --detail
            render_pipeline_summary(report.pipelines, result, console)
    _print_lines(console, pipeline_verification_lines(report))
    if not detail:
        render_footer(result, console, pipelines=report.pipelines is not None)


def _print_lines(console: Any, lines: Sequence[str]) -> None:
    for line in lines:
        console.print(line, markup=False)


def render_footer(result: SearchResult, console: Any, *, pipelines: bool = False) -> None:
    """The summary's last line: what ``--detail`` adds, with counts."""
    over, left = len(result.rejected), sum(r.count for r in result.rejections)
    hidden = [f"{n} {'mesh' if n == 1 else 'meshes'} {what}" for n, what in
              ((over, "over the budget"), (left, "left out, with the reasons")) if n]
    hidden.append("the collective table, parameter groups" + (", pipeline layouts" if pipelines else "")
                  + " and assumptions in full")
    console.print(f"\n[dim]--detail adds: {'; '.join(hidden)}.[/dim]")


def render_pipeline_summary(found: Any, result: SearchResult, console: Any) -> None:
    """One line for the pipeline layouts (a :class:`~meshplan.pure.search.PipelineSearch`): the fastest one
    against the best unpipelined mesh; ``--detail`` prints their table (:mod:`meshplan.cli._pipeline`)."""
    from meshplan.pure.report._pipeline_summary import pipeline_layouts, pipeline_rows

    layouts = pipeline_layouts(found)
    if not layouts:
        console.print("\n[bold]Pipelined[/bold] (pp outermost): no layout fits"
                      + (f" ({found.left_out[0]})" if found.left_out else ""))
        return
    # The table's own cells (the same step, bubble and ratio the --detail table and the reports show).
    row = pipeline_rows(found, result)[0]
    versus = f", {row['versus']} the best unpipelined step" if row["versus"] else ""
    console.print(f"\n[bold]Pipelined[/bold] (pp outermost): best {layouts[0].text}, {row['step']} "
                  f"(estimate), bubble {row['bubble']}{versus}; --detail lists "
                  f"{len(found.candidates)} layout{'s' if len(found.candidates) != 1 else ''}.")


def ranked_table(result: SearchResult, width: int, compiled: Mapping[str, tuple[int, str]] | None = None,
                 steps: Mapping[str, CompiledStep] | None = None) -> Any:
    """The ranked meshes as a rich table no wider than ``width``: cells never wrap; columns of lower
    priority are dropped until it fits (the mesh, memory, step and verdict always stay)."""
    rows = ranked_rows(result, compiled, steps)
    return fitted_table(rows, shown_columns(rows), width)


def _margin(result: SearchResult, spread: Spread | None) -> str:
    """Which ranked meshes that fit would not at the highest ratio recorded for these coefficients
    (:func:`~meshplan.pure.cost.peak_bounds`); ``""`` when every one would, or none is recorded."""
    if spread is None:
        return ""
    tight = [f"#{c.rank}" for c in result.candidates
             if c.memory.fits and peak_bounds(c.memory, spread)[1] > c.memory.budget]
    if not tight:
        return ""
    req = result.request
    check = ("the reference step runs the einsum MoE dispatch only, so a dropless plan has no compiled check"
             if req.moe_layers and req.recipe.moe_dispatch != "einsum" else
             "--verify K compiles the top K for XLA's own peak")
    return (f"tight: at the highest recorded ratio ({spread.high:.2f}x), {', '.join(tight)} would not fit the "
            f"{fmt_bytes(req.budget)} budget; {check}.")


def _render_chosen(result: SearchResult, console: Any, compiled: Mapping[str, tuple[int, str]],
                   steps: Mapping[str, CompiledStep]) -> None:
    best, over = chosen_mesh(result, compiled)
    c = result.request.cluster
    unit = c.ici_domain_name
    console.print(f"\n[bold]Chosen mesh[/bold]: {best.text}"
                  + (f" (compiled over the budget: {', '.join(o.text for o in over)})" if over else ""))
    if best.text in compiled:
        peak, source = compiled[best.text]
        compiler = source.split(" (")[0]  # its versions are on the line under the table
        console.print(f"  memory {fmt_bytes(peak)} of the {fmt_bytes(best.memory.budget)} budget (exact, {compiler})",
                      markup=False)
    else:
        bounds = memory_range(result, best)
        rng = "" if bounds is None else f", range {range_text(bounds)}"
        console.print(f"  memory {fmt_bytes(best.memory.total)} of the {fmt_bytes(best.memory.budget)} budget "
                      f"(estimate{rng})")
    if best.text in steps:
        estimate = None if best.step is None else best.step.step_s
        console.print(f"  step   {compiled_step_text(steps[best.text], estimate)}", markup=False)
    elif best.step is not None:
        console.print(f"  step   {seconds(best.step.step_s)} (estimate)")
    for name, size, i, d in zip(best.axis_names, best.axis_sizes, best.ici_shape, best.dcn_shape, strict=True):
        if size == 1:
            continue
        where = (f"inside one {unit}" if d == 1 else f"across {d} {unit}s" if i == 1
                 else f"{i} per {unit} x {d} {unit}s")
        console.print(f"  {name:<4} = {size:<5} {where}")
    console.print("[bold]To build it[/bold]:")
    for line in create_mesh_call(best, width=console.width - 4):
        console.print(f"  {line}", highlight=False, soft_wrap=False)
    flags = maxtext_flags(best).split()
    line = "  MaxText:"
    for flag in flags:  # break between flags, never inside one
        if len(line) + 1 + len(flag) > console.width and line.strip():
            console.print(line, highlight=False)
            line = "   "
        line += " " + flag
    console.print(line, highlight=False)


def render_mesh(cluster: Cluster, names: Sequence[str], hybrid: HybridMeshShape, console: Any) -> np.ndarray:
    """Print the device grid of a mesh on ``cluster`` and which axes cross hosts/slices; return the ids."""
    from rich.table import Table

    ids = device_grid(cluster, hybrid)
    sizes = ids.shape
    unit = cluster.ici_domain_name
    tpu = cluster.device.ici_scope == "slice"
    console.print(f"[bold]{cluster.text}[/bold]: {cluster.num_devices} devices, {cluster.num_nodes} hosts x "
                  f"{cluster.devices_per_node}" + (f", {cluster.num_slices} slices" if tpu else "")
                  + f"; mesh {', '.join(f'{n}={s}' for n, s in zip(names, sizes, strict=True))} "
                  f"(ICI {hybrid.ici_mesh_shape}, DCN {hybrid.dcn_mesh_shape})")
    spans = axis_domain_counts(ids, cluster.ici_domain_size)
    hosts = axis_domain_counts(ids, cluster.devices_per_node)
    for name, size, span, host in zip(names, sizes, spans, hosts, strict=True):
        where = f"inside one {unit} (ICI)" if span == 1 else f"spans {span} {unit}s (DCN)"
        extra = f", {host} hosts" if tpu and host > 1 else ""
        console.print(f"  {name} ({size}): each group {where}{extra}")
    if ids.size > _MAX_CELLS:
        console.print(f"  (grid of {ids.size} devices not drawn; use --png for a picture)")
        return ids
    rows = ids.reshape(-1, sizes[-1]) if ids.ndim > 1 else ids.reshape(1, -1)
    outer = [n for n in names[:-1]]
    table = Table(title=f"Device grid: rows = {', '.join(outer) or '-'}; columns = {names[-1]} "
                        f"(cell: device id / host" + (" / slice" if tpu else "") + ")")
    table.add_column("row")
    for k in range(rows.shape[1]):
        table.add_column(f"{names[-1]}={k}", justify="center")
    outer_shape = sizes[:-1]
    for r, row in enumerate(rows):
        coords = np.unravel_index(r, outer_shape) if outer_shape else ()
        label = " ".join(f"{n}={int(c)}" for n, c in zip(outer, coords, strict=True)) or "-"
        cells = []
        for dev in row:
            host = int(dev) // cluster.devices_per_node
            color = _COLORS[host % len(_COLORS)]
            where = f"h{host}" + (f"/s{int(dev) // cluster.devices_per_slice}" if tpu else "")
            cells.append(f"[{color}]{int(dev)} {where}[/{color}]")
        table.add_row(label, *cells)
    console.print(table)
    return ids


def write_png(path: str, cluster: Cluster, names: Sequence[str], ids: np.ndarray) -> None:
    """Draw the device grid to ``path``: one cell per device, coloured by host, labelled by id.

    Raises:
      ImportError: matplotlib is not installed (``pip install 'meshplan[png]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("--png needs matplotlib, which is not installed; install it with "
                          "pip install 'meshplan[png]' (or pip install matplotlib).") from err
    grid = ids.reshape(-1, ids.shape[-1]) if ids.ndim > 1 else ids.reshape(1, -1)
    hosts = grid // cluster.devices_per_node
    rows, cols = grid.shape
    fig, ax = plt.subplots(figsize=(min(2 + cols * 0.6, 40), min(1.5 + rows * 0.5, 40)))
    ax.imshow(hosts, cmap="tab20", aspect="auto")
    if grid.size <= 4096:
        for (r, col), dev in np.ndenumerate(grid):
            ax.text(col, r, str(int(dev)), ha="center", va="center", fontsize=7)
    if cols <= 64:
        ax.set_xticks(range(cols))
    if rows <= 64:
        ax.set_yticks(range(rows))
    ax.set_xlabel(f"{names[-1]} ({ids.shape[-1]})")
    ax.set_ylabel(" x ".join(f"{n} ({s})" for n, s in zip(names[:-1], ids.shape[:-1], strict=True)) or "-")
    ax.set_title(f"{cluster.text}: device ids, coloured by host ({math.prod(ids.shape)} devices)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
