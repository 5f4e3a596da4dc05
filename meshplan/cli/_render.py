"""Drawing search results and device grids for people: rich tables, and a PNG via matplotlib.

Nothing here decides anything: layouts come from
:func:`meshplan.pure.layout_device_ids` (the same code ``create_mesh`` uses)
and every figure from the :class:`~meshplan.pure.SearchResult`.
matplotlib is imported only inside :func:`write_png` (the optional ``png`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshplan.pure import (
    Cluster,
    HybridMeshShape,
    MeshCandidate,
    SearchResult,
    layout_device_ids,
)
from meshplan.pure._format import fmt_bytes
from meshplan.pure.search import (
    Spread,
    axis_domain_counts,
    calibration_spread,
    describe_spread,
    peak_bounds,
)
from meshplan.pure.cost._step_memory import CALIBRATIONS, calibration_key

__all__ = ["device_grid", "render_mesh", "render_plan", "write_png"]

_COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
_MAX_CELLS = 512


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


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


def render_plan(result: SearchResult, console: Any, notes: Sequence[str] = ()) -> None:
    """Print a search result: the ranking, what was left out, and the chosen mesh in detail.

    ``notes`` are sentences about how the model is priced (``pricing_notes``), printed under the header.
    """
    from rich.table import Table

    req, best = result.request, result.best
    c = req.cluster
    n = sum(g.count * math.prod(g.shape) for g in best.groups)
    size = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"
    head = (f"[bold]meshplan plan[/bold]: {req.model} ({size} params, {req.param_dtype}) on {c.text} "
            f"({c.num_devices} x {c.device.name}, {c.num_nodes} hosts x {c.devices_per_node}; "
            f"budget {fmt_bytes(req.budget)}/device = HBM less {req.headroom:.0%})")
    console.print(head)
    opt = f"{req.optimizer_copies} {req.optimizer_dtype} optimizer copies"
    grads = req.param_dtype if req.grad_dtype == "param" else req.grad_dtype
    console.print(f"step: batch {req.batch} x seq {req.seq}; {opt}; grads {grads}; axes {', '.join(req.axes)}; "
                  f"rule {req.rule}")
    console.print(f"priced: {req.recipe.describe()}; params, grads and optimizer exact, activations calibrated "
                  f"against {CALIBRATIONS[calibration_key(req.recipe)].source} (set with --remat, --attention, "
                  "--optimizer, --weight-dtype, --micro-batches, --vocab-tiles); "
                  f"{describe_spread(req.recipe)}")
    for note in notes:
        console.print(f"model: {note}")
    table = Table(title=f"Ranked meshes ({result.num_fitting} of {result.num_candidates} fit; top "
                        f"{len(result.candidates)})")
    numbers = ("#", "memory/device", "micro-batches", "step time", "MFU", "exposed comm", "step comm")
    for col in ("#", "mesh", f"ICI (per {c.ici_domain_name})", f"DCN (across {c.ici_domain_name}s)", "memory/device",
                "micro-batches", "step time", "MFU", "exposed comm", "step comm", "verdict"):
        table.add_column(col, justify="right" if col in numbers else "left")
    priced = c.device.peak_bf16_flops is not None  # else compute is not priced and no MFU is claimed
    for cand in result.candidates:
        st = cand.step
        table.add_row(str(cand.rank), cand.text, _shape(cand, cand.ici_shape), _shape(cand, cand.dcn_shape),
                      fmt_bytes(cand.memory.total), "-" if st is None else str(st.micro_batches),
                      "-" if st is None else _seconds(st.step_s),
                      "-" if st is None or not priced else f"{st.mfu:.1%}",
                      "-" if st is None else _seconds(st.exposed_s),
                      _seconds(cand.step_comm_s), _headline(cand.verdict))
    console.print(table)
    found = calibration_spread(req.recipe)
    spread = None if found is None else found[1]
    margin = _margin(result, spread)
    if margin:
        console.print(margin)
    if result.rejected:
        over = Table(title="Leanest meshes over the memory budget")
        for col in ("mesh", "memory/device", "verdict"):
            over.add_column(col)
        for cand in result.rejected:
            over.add_row(cand.text, fmt_bytes(cand.memory.total), cand.verdict)
        console.print(over)
    if result.rejections:
        console.print("[bold]Left out[/bold]:")
        for r in result.rejections:
            what = "mesh" if r.count == 1 else "meshes"
            console.print(f"  - {r.example} [dim]({r.count} {what}, {r.kind})[/dim]")
    _render_chosen(best, c, console, spread)


def _margin(result: SearchResult, spread: Spread | None) -> str:
    """Which ranked meshes that fit would not at the highest ratio recorded for these coefficients
    (:func:`~meshplan.pure.search.peak_bounds`); ``""`` when every one would, or none is recorded."""
    if spread is None:
        return ""
    tight = [f"#{c.rank}" for c in result.candidates
             if c.memory.fits and peak_bounds(c.memory, spread)[1] > c.memory.budget]
    if not tight:
        return ""
    return (f"With the calibrated part at its highest recorded ratio ({spread.high:.2f}x), {', '.join(tight)} would "
            f"not fit the {fmt_bytes(result.request.budget)} budget: --verify K compiles the top K and shows "
            "XLA's own peak.")


def _headline(verdict: str) -> str:
    """A verdict's first clause ("rank 2: +0.4% step time vs best"): the figures in its parentheses are
    already columns of the table, and the best mesh's are printed in full below it."""
    return verdict.split(" (", 1)[0]


def _shape(cand: MeshCandidate, parts: Sequence[int]) -> str:
    shown = [f"{n}={p}" for n, p in zip(cand.axis_names, parts, strict=True) if p > 1]
    return ",".join(shown) or "1"


def _render_chosen(best: MeshCandidate, cluster: Cluster, console: Any, spread: Spread | None) -> None:
    from rich.table import Table

    unit = cluster.ici_domain_name
    console.print(f"\n[bold]Chosen mesh[/bold]: {best.text}")
    for name, size, i, d in zip(best.axis_names, best.axis_sizes, best.ici_shape, best.dcn_shape, strict=True):
        where = (f"inside one {unit}" if d == 1 else f"across {d} {unit}s" if i == 1
                 else f"{i} per {unit} x {d} {unit}s")
        console.print(f"  {name:<4} = {size:<5} ICI {i} x DCN {d}  ({where})")
    console.print(f"  meshplan.create_mesh(axis_dims={best.axis_sizes}, axis_names={best.axis_names}, "
                  f"dcn_mesh_dims={best.dcn_shape})")
    if best.activations is not None:  # the splits the activation memory assumed: the step applies them
        console.print("  batch and activation specs the memory assumes (best.training_layout; "
                      "apply with jax.lax.with_sharding_constraint):")
        for t in best.activations.tensors:
            console.print(f"    {t.name:<9} {str(t.shape):<20} {t.spec}")
    m = best.memory
    mem = Table(title="Memory per device (fullest device)")
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    grads = "grads" if m.grads_live else "grads (not yet live at the peak)"
    peak = f"peak, {m.phase} phase" if m.phase else "total"
    for label, value in (("params (exact)", m.params), (f"{grads} (exact)", m.grads),
                         ("optimizer (exact)", m.optimizer), (f"{m.label('activations')} (calibrated)", m.activations),
                         (peak, m.total)):
        mem.add_row(label, fmt_bytes(value))
    if spread is not None:
        low, high = peak_bounds(m, spread)
        mem.add_row(f"peak at the recorded spread ({spread.low:.2f}-{spread.high:.2f}x the calibrated part)",
                    f"{fmt_bytes(low)} - {fmt_bytes(high)}")
    mem.add_row("budget", fmt_bytes(m.budget))
    console.print(mem)
    if best.step is not None and cluster.device.peak_bf16_flops is None:
        console.print(f"Predicted step: {_seconds(best.step.step_s)} of exposed communication; compute not priced "
                      f"(no peak FLOP/s for {cluster.device.name!r}: DeviceSpec(peak_bf16_flops=...))")
    elif best.step is not None:
        st = best.step
        console.print(f"Predicted step: {_seconds(st.step_s)} = compute {_seconds(st.compute_s)} "
                      f"({st.flops:.3g} FLOPs/device at {st.efficiency:.0%} of peak) + exposed communication "
                      f"{_seconds(st.exposed_s)}; {st.tokens_per_s:,.0f} tokens/s/device, MFU {st.mfu:.1%} "
                      "(set with --efficiency; --rank comm orders by communication alone)")
    comm = Table(title=f"Step communication (alpha-beta estimate): {_seconds(best.step_comm_s)}")
    cols = ("collective", "axes", "link", "bytes/call", "calls", "time", "hidden", "exposed")
    for col in cols:
        comm.add_column(col, justify="left" if col in cols[:3] else "right")
    for term in best.comm:
        comm.add_row(term.what, "+".join(term.axes), term.link, fmt_bytes(term.nbytes), str(term.calls),
                     _seconds(term.seconds), "-" if term.hidden is None else _seconds(term.hidden),
                     "-" if term.exposed is None else _seconds(term.exposed))
    console.print(comm)
    groups = Table(title="Parameter groups")
    for col in ("pattern", "shape", "count", "spec", "reason"):
        groups.add_column(col)
    for g in best.groups:
        spec = "P(" + ", ".join(repr(e) for e in g.spec) + ")"
        groups.add_row(g.pattern, f"{g.shape} {g.dtype}", str(g.count), spec, g.reason)
    console.print(groups)


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
