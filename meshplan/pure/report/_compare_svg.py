"""A comparison's two plots as inline SVG: step time and cost per million tokens against devices.

One line per device kind (its fitting options, fewest devices first), a marker per
option with a ``<title>`` tooltip, log-2 device axis (sizes double), linear value
axis from 0. Pure string building, no scripts: the page renders the same anywhere.
The cost plot is drawn only when some option has a price.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

from meshplan.pure.compare import Comparison, CompareOption
from meshplan.pure.errors import MeshplanTypeError

__all__ = ["KIND_COLORS", "compare_svgs", "kind_color", "line_plot"]

KIND_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
               "#9c755f", "#bab0ac")
"""One colour per device kind, in the kinds' sorted order (the palette the plan report's bars use)."""

_W, _H = 520, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 110, 24, 40


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def kind_color(index: int) -> str:
    """The colour of the ``index``-th device kind (sorted by name).

    Example:
      >>> kind_color(0), kind_color(10) == kind_color(0)
      ('#4e79a7', True)
    """
    return KIND_COLORS[index % len(KIND_COLORS)]


def _ticks(high: float) -> list[float]:
    """About five round ticks from 0 to at least ``high``."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(high / step)) + 1)]


def line_plot(title: str, unit: str, series: dict[str, list[tuple[int, float, str]]],
              fmt: Callable[[float], str]) -> str:
    """One plot: for each series name, (devices, value, tooltip) points joined by a line.

    Args:
      title: the plot's heading (drawn inside the picture).
      unit: the value axis' label.
      series: device kind -> its points, any order (drawn fewest devices first).
      fmt: how a value axis tick is written.

    Returns:
      An ``<svg>`` element (``class="compare-plot"``); a sentence in a ``<p>`` when there is nothing to draw.

    Example:
      >>> svg = line_plot("step time", "s", {"H100": [(8, 2.0, "1x8xH100"), (16, 1.1, "2x8xH100")]}, str)
      >>> svg.startswith("<svg"), svg.count("<circle"), "<script" in svg
      (True, 2, False)
    """
    points = [p for pts in series.values() for p in pts]
    if not points:
        return f'<p class="note">{_e(title)}: no option fits, nothing to draw.</p>'
    devs = sorted({p[0] for p in points})
    lo, hi = math.log2(devs[0]), math.log2(devs[-1])
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    top = max(p[1] for p in points) * 1.08
    ticks = _ticks(top)
    vmax = ticks[-1] or 1.0
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(n: int) -> float:
        return _LEFT + (math.log2(n) - lo) / (hi - lo) * pw

    def y(v: float) -> float:
        return _TOP + ph - v / vmax * ph

    out = [f'<svg class="compare-plot" xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
           f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(title)}">',
           f'<text x="{_LEFT}" y="15" font-size="13" font-weight="600" fill="#222">{_e(title)}</text>']
    for t in ticks:
        out.append(f'<line x1="{_LEFT}" y1="{y(t):.1f}" x2="{_LEFT + pw}" y2="{y(t):.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{_LEFT - 6}" y="{y(t) + 4:.1f}" font-size="10" text-anchor="end" '
                   f'fill="#555">{_e(fmt(t))}</text>')
    for n in devs:
        out.append(f'<line x1="{x(n):.1f}" y1="{_TOP + ph}" x2="{x(n):.1f}" y2="{_TOP + ph + 4}" stroke="#555"/>'
                   f'<text x="{x(n):.1f}" y="{_TOP + ph + 16}" font-size="10" text-anchor="middle" '
                   f'fill="#555">{n}</text>')
    out.append(f'<text x="{_LEFT + pw / 2:.1f}" y="{_H - 6}" font-size="11" text-anchor="middle" fill="#333">'
               f'devices (log scale)</text>'
               f'<text x="14" y="{_TOP + ph / 2:.1f}" font-size="11" text-anchor="middle" fill="#333" '
               f'transform="rotate(-90 14 {_TOP + ph / 2:.1f})">{_e(unit)}</text>'
               f'<line x1="{_LEFT}" y1="{_TOP + ph}" x2="{_LEFT + pw}" y2="{_TOP + ph}" stroke="#555"/>'
               f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + ph}" stroke="#555"/>')
    for i, (kind, pts) in enumerate(sorted(series.items())):
        color = kind_color(i)
        pts = sorted(pts)
        if len(pts) > 1:
            path = " ".join(f"{x(n):.1f},{y(v):.1f}" for n, v, _ in pts)
            out.append(f'<polyline class="series" points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for n, v, tip in pts:
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(v):.1f}" r="4" fill="{color}"><title>{_e(tip)}</title>'
                       "</circle>")
        ly = _TOP + 14 + i * 16
        out.append(f'<rect x="{_LEFT + pw + 12}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{_LEFT + pw + 26}" y="{ly}" font-size="11" fill="#222">{_e(kind)}</text>')
    out.append("</svg>")
    return "".join(out)


def _series(comparison: Comparison, value: Callable[[CompareOption], float | None],
            tip: Callable[[CompareOption], str]) -> dict[str, list[tuple[int, float, str]]]:
    out: dict[str, list[tuple[int, float, str]]] = {}
    for o in comparison.options:
        v = value(o) if o.fits else None
        if v is not None:
            out.setdefault(o.device, []).append((o.devices, v, tip(o)))
    return out


def compare_svgs(comparison: Comparison) -> tuple[str, str | None]:
    """The step-time plot and (with prices) the cost plot, each an ``<svg>`` string.

    Raises:
      MeshplanTypeError: ``comparison`` is not a Comparison.

    Example:
      >>> from meshplan.pure.compare import build_comparison
      >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 1, 2, 2.0, 8192, .4)
      >>> step, cost = compare_svgs(build_comparison("gpt2", 8, 1024, [a]))
      >>> step.count("<circle"), cost
      (1, None)
    """
    if not isinstance(comparison, Comparison):
        raise MeshplanTypeError(f"comparison={comparison!r:.60} must be a Comparison.")
    batch = "one global batch" if comparison.batch is not None else "each option's own batch"
    step = line_plot(f"step time against devices (estimate, {batch})", "seconds per step",
                     _series(comparison, lambda o: o.step_s,
                             lambda o: f"{o.cluster}: {o.step_s:.3g} s per step ({o.mesh})"),
                     lambda v: f"{v:g}")
    if not any(o.price_per_device_hour is not None for o in comparison.options):
        return step, None
    cost = line_plot("cost per million tokens against devices (your prices)", "USD per million tokens",
                     _series(comparison, lambda o: o.cost_per_million_tokens,
                             lambda o: f"{o.cluster}: ${o.cost_per_million_tokens:.3g} per million tokens"),
                     lambda v: f"{v:g}")
    return step, cost
