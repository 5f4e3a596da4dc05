"""Inline SVG pictures of a plan: a memory bar, a step-time bar and a device grid, as strings.

Pure string building (no I/O, no scripts, no fonts fetched): the HTML report and a notebook's
``_repr_html_`` embed the same pictures. Every text drawn is escaped, and every shape carries a
``<title>`` so hovering names the figure behind it.

Example:
  >>> from meshplan.pure.cost import MemoryBreakdown
  >>> svg = memory_bar(MemoryBreakdown(2**30, 2**30, 2**31, 2**31, 2**33))
  >>> svg.startswith("<svg") and "budget 8.0 GiB" in svg
  True
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np

from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cost._estimates import CommTerm, MemoryBreakdown, StepEstimate
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.mesh._layout import layout_device_ids

__all__ = ["BUBBLE_COLOR", "MEMORY_COLORS", "axis_color", "bubble_bar", "check_grid_args", "device_grid_svg",
           "memory_bar", "step_bar"]

MEMORY_COLORS: dict[str, str] = {"params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#59a14f",
                                 "activations": "#e15759"}
"""The fill of each part of a memory bar (and of its legend)."""

BUBBLE_COLOR = "#f1ce63"
"""The fill of a pipeline step's bubble (its idle share) in :func:`bubble_bar` and its legend."""

_COMM_COLORS = ("#b07aa1", "#ff9da7", "#9c755f", "#edc948", "#76b7b2", "#bab0ac")
_WIDTH = 440  # drawing width of a bar, in px; a label may run past it into the 520 px picture
_COMPUTE = "#8c9bab"
_MAX_GRID = 4096  # devices drawn one cell each; bigger meshes get a sentence instead


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def axis_color(index: int) -> str:
    """The fill of axis group ``index``: hues spread around the colour wheel in golden-angle steps, so
    neighbouring groups differ however many there are.

    Example:
      >>> axis_color(0), axis_color(1)
      ('hsl(210, 60%, 70%)', 'hsl(348, 60%, 70%)')
    """
    return f"hsl({round(210 + index * 137.508) % 360}, 60%, 70%)"


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str, cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return (f'<rect{klass} x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{fill}">'
            f"<title>{_e(title)}</title></rect>")


def memory_bar(memory: MemoryBreakdown, *, bounds: tuple[int, int] | None = None,
               compiled: tuple[int, str] | None = None) -> str:
    """The fullest device's bytes as one stacked bar against the budget.

    Args:
      memory: a candidate's :class:`~meshplan.pure.cost.MemoryBreakdown`.
      bounds: the range the recorded compiles put the peak in (a bracket over the bar), if known.
      compiled: XLA's compiled peak and which compiler said so (a solid marker), where verified.

    Returns:
      An ``<svg class="memory-bar">`` element.
    """
    if not isinstance(memory, MemoryBreakdown):
        raise MeshplanTypeError(f"memory={memory!r:.80} must be a MemoryBreakdown, not {type(memory).__name__}.")
    parts = [("params", memory.params, "exact"), ("grads", memory.grads if memory.grads_live else 0, "exact"),
             ("optimizer", memory.optimizer, "exact"), ("activations", memory.activations, "estimate")]
    top = max(memory.budget, memory.total, bounds[1] if bounds else 0, compiled[0] if compiled else 0, 1)
    scale = _WIDTH / (top * 1.04)
    out = [('<svg class="memory-bar" xmlns="http://www.w3.org/2000/svg" width="520" height="64" '
           'viewBox="0 0 520 64" role="img" aria-label="memory per device">')]
    x = 0.0
    for name, value, how in parts:
        w = value * scale
        out.append(_rect(x, 14, w, 22, MEMORY_COLORS[name], f"{memory.label(name)}: {fmt_bytes(value)} ({how})",
                         f"part-{name}"))
        x += w
    if bounds is not None:  # the estimate's range: a bracket under the bar
        lo, hi = bounds[0] * scale, bounds[1] * scale
        out.append(f'<g class="range" stroke="#333" stroke-width="1.5"><title>{_e(f"estimate range {fmt_bytes(bounds[0])} - {fmt_bytes(bounds[1])}")}</title>'
                   f'<line x1="{lo:.1f}" y1="41" x2="{hi:.1f}" y2="41"/><line x1="{lo:.1f}" y1="37" x2="{lo:.1f}" '
                   f'y2="45"/><line x1="{hi:.1f}" y1="37" x2="{hi:.1f}" y2="45"/></g>')
    if compiled is not None:
        cx = compiled[0] * scale
        out.append(f'<g class="compiled"><title>{_e(f"compiled peak {fmt_bytes(compiled[0])} ({compiled[1]})")}'
                   f'</title><line x1="{cx:.1f}" y1="8" x2="{cx:.1f}" y2="42" stroke="#000" stroke-width="3"/></g>')
    bx = memory.budget * scale
    out.append(f'<g class="budget"><line x1="{bx:.1f}" y1="4" x2="{bx:.1f}" y2="46" stroke="#c00" '
               f'stroke-width="2" stroke-dasharray="4 2"/><text x="{min(bx, _WIDTH - 60):.1f}" y="60" '
               f'font-size="11" fill="#c00">budget {_e(fmt_bytes(memory.budget))}</text></g>')
    out.append(f'<text x="2" y="60" font-size="11" fill="#333">peak {_e(fmt_bytes(memory.total))}'
               f'{" at the " + _e(memory.phase) + " phase" if memory.phase else ""}</text>')
    out.append("</svg>")
    return "".join(out)


def step_bar(step: StepEstimate, comm: Sequence[CommTerm], *, scale_s: float | None = None) -> str:
    """A predicted step as one bar: compute, then each collective's exposed (not hidden) seconds.

    Args:
      step: the candidate's :class:`~meshplan.pure.cost.StepEstimate`.
      comm: its collectives (their ``exposed`` seconds are drawn).
      scale_s: the seconds the full width stands for (the slowest step shown, so bars compare).

    Returns:
      An ``<svg class="step-bar">`` element.
    """
    if not isinstance(step, StepEstimate):
        raise MeshplanTypeError(f"step={step!r:.80} must be a StepEstimate, not {type(step).__name__}.")
    full = max(scale_s or 0.0, step.step_s, 1e-12)
    scale = _WIDTH / (full * 1.04)
    out = [('<svg class="step-bar" xmlns="http://www.w3.org/2000/svg" width="520" height="54" viewBox="0 0 520 54" '
           'role="img" aria-label="step time">')]
    out.append(_rect(0, 14, step.compute_s * scale, 22, _COMPUTE,
                     f"compute {step.compute_s:.3g} s (estimate, {step.efficiency:.0%} of peak)", "part-compute"))
    x = step.compute_s * scale
    exposed = [t for t in comm if t.exposed]
    for i, term in enumerate(exposed):
        w = (term.exposed or 0.0) * scale
        out.append(_rect(x, 14, w, 22, _COMM_COLORS[i % len(_COMM_COLORS)],
                         f"{term.what} ({'+'.join(term.axes)}, {term.link}): {term.exposed:.3g} s exposed of "
                         f"{term.seconds:.3g} s", "part-comm"))
        x += w
    out.append(f'<text x="2" y="49" font-size="11" fill="#333">step {_s(step.step_s)} = compute '
               f"{_s(step.compute_s)} + exposed communication {_s(step.exposed_s)}</text></svg>")
    return "".join(out)


def bubble_bar(step: StepEstimate, bubble: float, *, scale_s: float | None = None,
               reference_s: float | None = None) -> str:
    """A pipelined step as one small bar: the stages' work and sends, then the bubble, against a reference.

    Args:
      step: the pipeline layout's :class:`~meshplan.pure.cost.StepEstimate`.
      bubble: the schedule's idle share of the step (:attr:`~meshplan.pure.cost.PipelinePlan.bubble`), in [0, 1].
      scale_s: the seconds the full width stands for (the slowest step shown, so bars compare).
      reference_s: the best unpipelined mesh's step, drawn as a dashed line (``None``: no line).

    Returns:
      An ``<svg class="bubble-bar">`` element.

    Example:
      >>> from meshplan.pure.cost import StepEstimate
      >>> svg = bubble_bar(StepEstimate(0.8, 0.2, 1.0, 0.4, 1.0, 0.4), 0.1, reference_s=0.9)
      >>> 'class="part-bubble"' in svg, "bubble 10.0% of the step" in svg, 'class="reference"' in svg
      (True, True, True)
    """
    if not isinstance(step, StepEstimate):
        raise MeshplanTypeError(f"step={step!r:.80} must be a StepEstimate, not {type(step).__name__}.")
    if not isinstance(bubble, (int, float)) or not 0 <= bubble <= 1:
        raise PlanError(f"bubble={bubble!r:.80} must be a share of the step in [0, 1].")
    width = 150
    full = max(scale_s or 0.0, step.step_s, reference_s or 0.0, 1e-12)
    scale = width / (full * 1.04)
    idle = bubble * step.step_s
    out = [(f'<svg class="bubble-bar" xmlns="http://www.w3.org/2000/svg" width="{width}" height="18" '
            f'viewBox="0 0 {width} 18" role="img" aria-label="step and bubble">')]
    out.append(_rect(0, 3, (step.step_s - idle) * scale, 12, _COMPUTE,
                     f"stage work and boundary sends {_s(step.step_s - idle)} (estimate)", "part-work"))
    out.append(_rect((step.step_s - idle) * scale, 3, idle * scale, 12, BUBBLE_COLOR,
                     f"bubble {bubble:.1%} of the step, {_s(idle)}: stages idle while the pipeline fills and "
                     "drains", "part-bubble"))
    if reference_s is not None:
        rx = reference_s * scale
        out.append(f'<g class="reference"><title>{_e(f"best unpipelined step {_s(reference_s)}")}</title>'
                   f'<line x1="{rx:.1f}" y1="0" x2="{rx:.1f}" y2="18" stroke="#c00" stroke-width="2" '
                   'stroke-dasharray="3 2"/></g>')
    out.append("</svg>")
    return "".join(out)


def check_grid_args(cluster: object, names: object, hybrid: object) -> tuple[str, ...]:
    """Refuse what is not a cluster, axis names and a hybrid shape of the same rank; return the names.

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> check_grid_args(parse_cluster("2x4xH100"), ["dp", "tp"], HybridMeshShape((1, 4), (2, 1)))
      ('dp', 'tp')
    """
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.80} must be a Cluster, not {type(cluster).__name__}.")
    if not isinstance(hybrid, HybridMeshShape):
        raise MeshplanTypeError(f"hybrid={hybrid!r:.80} must be a HybridMeshShape (candidate.hybrid), not "
                                f"{type(hybrid).__name__}.")
    if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise MeshplanTypeError(f"names={names!r:.80} must be a sequence of axis names (str).")
    if len(names) != len(hybrid.ici_mesh_shape):
        raise PlanError(f"names={list(names)} has {len(names)} axes; hybrid {hybrid.ici_mesh_shape} x "
                        f"{hybrid.dcn_mesh_shape} has {len(hybrid.ici_mesh_shape)}: give one name per axis.")
    return tuple(names)


def _grid_2d(ids: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, str, str]:
    """The mesh's device ids as rows x columns, and what the rows and columns are."""
    sizes = ids.shape
    real = [i for i, s in enumerate(sizes) if s > 1]
    if not real:
        return ids.reshape(1, 1), "-", "-"
    squeezed = ids.reshape([sizes[i] for i in real])
    rname = [f"{names[i]}={sizes[i]}" for i in real[:-1]]
    cname = f"{names[real[-1]]}={sizes[real[-1]]}"
    if len(real) == 1 and sizes[real[0]] > 16:  # one long axis: fold it into rows, in order
        n = sizes[real[0]]
        cols = max(d for d in range(1, 17) if n % d == 0)
        return squeezed.reshape(n // cols, cols), f"{cname}, {cols} per row", cname
    return squeezed.reshape(-1, squeezed.shape[-1]), " x ".join(rname) or "-", cname


def device_grid_svg(cluster: Cluster, names: Sequence[str], hybrid: HybridMeshShape) -> str:
    """The mesh's devices as ``create_mesh`` lays them out: one small grid per axis, each cell coloured by the
    axis group it belongs to (devices of one colour run that axis's collectives together), hosts outlined in
    black and, on multi-slice TPUs, slices in red.

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> svg = device_grid_svg(parse_cluster("2x4xH100"), ("dp", "tp"), HybridMeshShape((1, 4), (2, 1)))
      >>> svg.count('class="device"'), svg.count('class="axis-panel"')
      (16, 2)
    """
    names = check_grid_args(cluster, names, hybrid)
    ids = layout_device_ids(cluster.device_infos(), hybrid)
    if ids.size > _MAX_GRID:
        return (f'<p class="grid-note">The grid of {ids.size} devices is not drawn (more than {_MAX_GRID}); '
                f"the axes' ICI / DCN split is in the table above.</p>")
    sizes = ids.shape
    coords = np.indices(sizes).reshape(len(sizes), -1).T  # mesh coordinates of each cell, in ids' order
    position = {int(d): tuple(int(c) for c in coords[k]) for k, d in enumerate(ids.reshape(-1))}
    grid, rows_are, cols_are = _grid_2d(ids, names)
    nrow, ncol = grid.shape
    cell = max(10, min(28, 520 // max(ncol, 1)))
    per_host, per_slice = cluster.devices_per_node, cluster.devices_per_slice
    panels = []
    for axis, name in enumerate(names):
        if sizes[axis] == 1:
            continue
        others = [a for a in range(len(sizes)) if a != axis]
        strides = [math.prod(sizes[b] for b in others[j + 1:]) for j in range(len(others))]
        count = math.prod(sizes[a] for a in others)
        w, h = ncol * cell + 2, nrow * cell + 2
        out = [(f'<figure class="axis-panel"><figcaption><b>{_e(name)}</b> ({sizes[axis]}): '
               f"{count} group{'s' if count != 1 else ''} of {sizes[axis]}</figcaption>"
               f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
               f'role="img" aria-label="{_e(name)} groups">')]
        for (r, c), dev in np.ndenumerate(grid):
            d = int(dev)
            pos = position[d]
            group = sum(pos[a] * s for a, s in zip(others, strides, strict=True))
            where = ", ".join(f"{n}={p}" for n, p in zip(names, pos, strict=True))
            title = f"device {d}, host {d // per_host}" + (
                f", slice {d // per_slice}" if cluster.num_slices > 1 else "") + f"; {where}"
            out.append(f'<rect class="device" x="{1 + c * cell}" y="{1 + r * cell}" width="{cell}" height="{cell}" '
                       f'fill="{axis_color(group)}" stroke="#fff" stroke-width="0.5"><title>{_e(title)}'
                       "</title></rect>")
            if cell >= 20:
                out.append(f'<text x="{1 + c * cell + cell / 2:.1f}" y="{1 + r * cell + cell / 2 + 3.5:.1f}" '
                           f'font-size="9" text-anchor="middle" fill="#222">{d}</text>')
        out.append(_outlines(grid, per_host, cell, "host-edge", "#000", 2))
        if cluster.num_slices > 1:
            out.append(_outlines(grid, per_slice, cell, "slice-edge", "#c00", 3))
        out.append("</svg></figure>")
        panels.append("".join(out))
    legend = (f'<p class="grid-legend">rows: {_e(rows_are)}; columns: {_e(cols_are)}. Black lines outline hosts'
              + (", red lines slices" if cluster.num_slices > 1 else "") + ".</p>")
    return f'<div class="device-grid">{legend}{"".join(panels)}</div>'


def _outlines(grid: np.ndarray, per: int, cell: int, cls: str, color: str, width: float) -> str:
    """Lines on every cell edge between two devices of different hosts (or slices), and round the grid."""
    owner = grid // per
    nrow, ncol = grid.shape
    segs = []
    for r in range(nrow):
        for c in range(ncol):
            x, y = 1 + c * cell, 1 + r * cell
            if c + 1 == ncol or owner[r, c + 1] != owner[r, c]:
                segs.append(f"M{x + cell} {y}v{cell}")
            if c == 0:
                segs.append(f"M{x} {y}v{cell}")
            if r + 1 == nrow or owner[r + 1, c] != owner[r, c]:
                segs.append(f"M{x} {y + cell}h{cell}")
            if r == 0:
                segs.append(f"M{x} {y}h{cell}")
    return f'<path class="{cls}" d="{"".join(segs)}" stroke="{color}" stroke-width="{width}" fill="none"/>'
