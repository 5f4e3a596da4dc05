"""Inline SVG bars of a serving plan's rows: each device's memory (weights, KV cache in use, KV cache free,
the engine's reserve, what it leaves untaken) against its HBM, and a decode step's terms. Pure string building;
every shape carries a ``<title>``.

Example:
  >>> from meshplan.pure.serve import plan_serving
  >>> row = plan_serving("llama3.1-8b", "H100", context=8192, concurrency=8).best
  >>> svg = memory_bar(row, 80 * 10**9)
  >>> svg.startswith("<svg") and "weights" in svg
  True
"""

from __future__ import annotations

import html
import math

from meshplan.pure._check import as_count
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.serve._result import ServeRow
from meshplan.pure.serve._time import StepTime

__all__ = ["SERVE_MEMORY_COLORS", "SERVE_STEP_COLORS", "memory_bar", "step_bar"]

SERVE_MEMORY_COLORS: dict[str, str] = {"weights": "#4e79a7", "KV in use": "#e15759", "KV free": "#f4b6b7",
                                       "engine reserve": "#bab0ac", "not taken": "#eeeeee"}
"""The fill of each part of a memory bar (and of its legend)."""

SERVE_STEP_COLORS: dict[str, str] = {"reads / FLOPs": "#8c9bab", "collectives": "#b07aa1",
                                     "per-layer overhead": "#edc948"}
"""The fill of each part of a step bar."""

_WIDTH = 440


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _rect(x: float, w: float, fill: str, title: str) -> str:
    return (f'<rect x="{x:.1f}" y="4" width="{max(w, 0):.1f}" height="18" fill="{fill}">'
            f"<title>{_e(title)}</title></rect>")


def memory_bar(row: ServeRow, hbm_bytes: int, *, compiled_peak: int | None = None) -> str:
    """One device's memory for ``row`` against its ``hbm_bytes``; a marker at XLA's compiled peak when given."""
    if not isinstance(row, ServeRow):
        raise MeshplanTypeError(f"row={row!r:.60} must be a ServeRow (a ServePlan's rows).")
    hbm_bytes = as_count(hbm_bytes, "hbm_bytes", maximum=2**50, error=PlanError)
    if compiled_peak is not None:
        compiled_peak = as_count(compiled_peak, "compiled_peak", minimum=0, maximum=2**60, error=PlanError)
    used = row.kv.cache_bytes(row.sequences, row.context) if row.sequences else 0
    fraction = row.budget.fraction if row.budget.fraction is not None else 1.0
    taken = int(fraction * hbm_bytes)
    parts = [("weights", row.weights.total), ("KV in use", used),
             ("KV free", max(0, row.budget.kv_bytes - used)), ("engine reserve", row.budget.reserved_bytes),
             ("not taken", max(0, hbm_bytes - taken))]
    scale = _WIDTH / max(hbm_bytes, sum(b for _, b in parts), 1)
    x, shapes = 0.0, []
    for name, nbytes in parts:
        if nbytes <= 0:
            continue
        shapes.append(_rect(x, nbytes * scale, SERVE_MEMORY_COLORS[name], f"{name}: {fmt_bytes(nbytes)}"))
        x += nbytes * scale
    if compiled_peak is not None:
        px = min(compiled_peak * scale, _WIDTH + 60)
        shapes.append(f'<line x1="{px:.1f}" y1="0" x2="{px:.1f}" y2="26" stroke="#000" stroke-width="2">'
                      f"<title>{_e(f'XLA compiled peak {fmt_bytes(compiled_peak)}')}</title></line>")
    label = f"{fmt_bytes(row.weights.total + used)} of {fmt_bytes(hbm_bytes)}"
    shapes.append(f'<text x="{_WIDTH + 6}" y="18" font-size="11">{_e(label)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH + 120}" height="26" role="img" '
            f'aria-label="{_e(label)}">' + "".join(shapes) + "</svg>")


def step_bar(step: StepTime, *, scale_s: float | None = None) -> str:
    """A step's terms on a common scale (``scale_s``: the seconds the full width stands for)."""
    if not isinstance(step, StepTime):
        raise MeshplanTypeError(f"step={step!r:.60} must be a StepTime (a ServeRow's decode or prefill).")
    if scale_s is not None and (isinstance(scale_s, bool) or not isinstance(scale_s, (int, float))
                                or not -1e300 < scale_s < 1e300 or not math.isfinite(scale_s) or scale_s < 0):
        raise PlanError(f"scale_s={scale_s!r:.40} must be a finite number of seconds >= 0, or None.")
    body = max(step.memory_s, step.compute_s)
    full = scale_s if scale_s else step.seconds
    scale = _WIDTH / max(full, 1e-12)
    which = "reads" if step.memory_s >= step.compute_s else "FLOPs"
    parts = [("reads / FLOPs", body, f"{which}: {body * 1e3:.2f} ms (reads {step.memory_s * 1e3:.2f}, FLOPs "
                                      f"{step.compute_s * 1e3:.2f})"),
             ("collectives", step.collective_s, f"collectives: {step.collective_s * 1e3:.2f} ms"),
             ("per-layer overhead", step.overhead_s, f"per-layer overhead: {step.overhead_s * 1e3:.2f} ms")]
    x, shapes = 0.0, []
    for name, seconds, title in parts:
        if seconds <= 0:
            continue
        shapes.append(_rect(x, seconds * scale, SERVE_STEP_COLORS[name], title))
        x += seconds * scale
    label = f"{step.seconds * 1e3:.1f} ms ({step.bound}-bound)"
    shapes.append(f'<text x="{min(x, _WIDTH) + 6}" y="18" font-size="11">{_e(label)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH + 160}" height="26" role="img" '
            f'aria-label="{_e(label)}">' + "".join(shapes) + "</svg>")
