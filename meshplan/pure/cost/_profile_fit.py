"""Fits of a machine profile's timings to the figures the cost model prices with.

Three fits, each pure and deterministic (no randomness, ties broken by order):

- **links** (:func:`fit_link`): each timed collective is ``a x alpha + b x B / bw`` with ``a`` and ``b`` the cost
  model's own ring factors for its kind and group size (read off
  :func:`~meshplan.pure.cost._collective_time.collective_time` itself, and ``1, 1`` for a permute, as
  :func:`~meshplan.pure.cost._placement.price` prices one), so the fitted :class:`~meshplan.pure.cluster.Link`
  is the one that best explains the timings *under the model that will use it*. Least squares on the relative
  error (every row counts alike, small messages too), ``alpha >= 0``; a link whose timings do not grow with the
  bytes has no bandwidth to fit and is refused.
- **matmuls** (:func:`fit_matmuls`): the bf16 efficiency ``rate / peak`` of the whole matmuls (``tp = 1``) at each
  hidden size the profile timed, and the catalogue's curve form ``e_max x h / (h + w0)``
  (:data:`~meshplan.pure.cost._flops.DEFAULT_EFFICIENCY`) fitted to them by least squares on ``log`` efficiency.
  A hidden size the profile timed is priced at its measured figure; another one on the curve. ``peak`` is the
  catalogue's bf16 peak, or where the device has none (a CPU) the fastest matmul timed (a measured rate, not a
  datasheet peak: efficiencies are then relative to it).
- **steps** (:func:`fit_steps`): one factor ``r``, the ratio of the efficiency whole training steps sustain to the
  matmul benchmark's (a step also runs attention, norms, the optimizer, launches: ``r < 1`` is expected), fitted
  to ``meshplan measure`` rows (``compute at peak / (e x r) + exposed = measured``, least squares on ``log``);
  each row's leave-one-out error is the check that comes with the fit.

Example:
  >>> from meshplan.pure.cluster import CollectiveTiming
  >>> rows = [CollectiveTiming("intra", "all-reduce", 4, b, 6 * 1e-5 + 1.5 * b / 1e10) for b in (2**20, 2**24)]
  >>> fit = fit_link(rows, "intra")
  >>> round(fit.bandwidth / 1e9, 3), round(fit.latency * 1e6, 3)
  (10.0, 10.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshplan.pure._check import as_choice, as_count, as_real, as_sequence
from meshplan.pure._fields import as_size
from meshplan.pure.cluster._link import Link
from meshplan.pure.cluster._profile import LINK_KINDS, PROFILE_COLLECTIVES, CollectiveTiming, MatmulTiming, StepTiming
from meshplan.pure.cost._collective_time import collective_time
from meshplan.pure.errors import MeshplanTypeError, ProfileError

__all__ = ["LinkFit", "MatmulFit", "StepFit", "fit_link", "fit_matmuls", "fit_steps", "ring_terms"]


def _rows(rows: Any, cls: type[Any]) -> list[Any]:
    items = list(as_sequence(rows, "rows"))
    if not all(isinstance(r, cls) for r in items):
        raise MeshplanTypeError(f"rows must be {cls.__name__} records.")
    return items


def ring_terms(kind: str, n: int) -> tuple[float, float]:
    """``(a, b)`` of one call of ``kind`` over ``n`` devices: seconds ``= a x latency + b x bytes / bandwidth``.

    Example:
      >>> ring_terms("all-reduce", 4), ring_terms("collective-permute", 8)
      ((6.0, 1.5), (1.0, 1.0))
    """
    kind = as_choice(kind, "kind", PROFILE_COLLECTIVES, error=ProfileError)
    n = as_count(n, "n", maximum=2**31, error=ProfileError)
    if kind == "collective-permute":
        return 1.0, 1.0
    a = float(collective_time(kind, 0, n, Link(1.0, 1.0)))  # type: ignore[arg-type]
    b = float(collective_time(kind, 1, n, Link(1.0, 0.0)))  # type: ignore[arg-type]
    return a, b


@dataclasses.dataclass(frozen=True, slots=True)
class LinkFit:
    """A :class:`~meshplan.pure.cluster.Link` fitted to timed collectives.

    Attributes:
      link: ``"intra"`` or ``"inter"``.
      kind: the collective kind fitted, or ``"all"`` (every kind together: what the plan prices).
      latency: seconds per ring step (alpha).
      bandwidth: bytes per second per device, one direction.
      rows: timings fitted.
      max_error: the largest ``|ln(fitted / measured)|`` over them.
    """

    link: str
    kind: str
    latency: float
    bandwidth: float
    rows: int
    max_error: float

    def as_link(self) -> Link:
        """The cost model's :class:`~meshplan.pure.cluster.Link`."""
        return Link(self.bandwidth, self.latency)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)


def fit_link(rows: Sequence[CollectiveTiming], link: str, kind: str | None = None) -> LinkFit:
    """Fit ``alpha`` and ``bandwidth`` to the timings of ``link`` (of one ``kind``, or all together).

    Raises:
      ProfileError: fewer than two timings of distinct sizes on that link, or timings that do not grow with
        the bytes (no bandwidth to fit).
      MeshplanTypeError: rows that are not :class:`~meshplan.pure.cluster.CollectiveTiming`.
    """
    rows = _rows(rows, CollectiveTiming)
    link = as_choice(link, "link", LINK_KINDS, error=ProfileError)
    kind = None if kind is None else as_choice(kind, "kind", PROFILE_COLLECTIVES, error=ProfileError)
    mine = [r for r in rows if r.link == link and (kind is None or r.kind == kind)]
    what = f"{link} link" + (f" ({kind})" if kind else "")
    if len({(r.kind, r.devices, r.nbytes) for r in mine}) < 2 or len({r.nbytes for r in mine}) < 2:
        raise ProfileError(f"the {what} has {len(mine)} timings of {len({r.nbytes for r in mine})} sizes; a "
                           "latency and a bandwidth need at least two sizes.")
    terms = np.array([ring_terms(r.kind, r.devices) for r in mine])
    t = np.array([r.seconds for r in mine])
    nbytes = np.array([float(r.nbytes) for r in mine])
    # Relative error: divide each row by its time, so a 1 KiB and a 1 GiB message weigh alike.
    x = np.stack([terms[:, 0] / t, terms[:, 1] * nbytes / t], axis=1)
    ones = np.ones(len(mine))
    (alpha, beta), *_ = np.linalg.lstsq(x, ones, rcond=None)
    if not beta > 0 or not math.isfinite(beta):  # time falling (or flat) with the bytes: no bandwidth in it
        raise ProfileError(f"the {what}'s timings do not grow with the bytes moved; time larger buffers.")
    if alpha < 0:  # the constrained optimum lies on alpha = 0
        alpha = 0.0
        beta = float(x[:, 1] @ ones / (x[:, 1] @ x[:, 1]))
    fitted = terms[:, 0] * alpha + terms[:, 1] * nbytes * beta
    error = float(np.max(np.abs(np.log(np.maximum(fitted, 1e-30) / t))))
    return LinkFit(link, kind or "all", float(alpha), float(1.0 / beta), len(mine), error)


@dataclasses.dataclass(frozen=True, slots=True)
class MatmulFit:
    """The bf16 matmul efficiency a profile measured, and the curve through it.

    Attributes:
      peak: the FLOP/s efficiencies are fractions of.
      peak_source: ``"catalogue"`` or ``"fastest matmul timed"`` (no datasheet peak known).
      points: ``(hidden, efficiency)`` per hidden size timed, whole matmuls (``tp = 1``) only.
      e_max, w0: the curve ``e_max x h / (h + w0)`` through them, ``e_max <= 1`` (``w0 = 0``: flat, one
        hidden size).
      fp8_ratio: FP8 over bf16 rate at the same shapes (``None``: no FP8 timed); reported, not priced (the
        cost model reads :data:`~meshplan.pure.cost._matmul_dtype.FP8_EFFICIENCY_RATIO`).
    """

    peak: float
    peak_source: str
    points: tuple[tuple[int, float], ...]
    e_max: float
    w0: float
    fp8_ratio: float | None = None

    def at(self, hidden: int) -> float:
        """The efficiency of a model of this hidden size: the measured point, else the curve; at most 1."""
        hidden = as_size(hidden, "hidden")
        for h, e in self.points:
            if h == hidden:
                return min(e, 1.0)
        return min(self.e_max * hidden / (hidden + self.w0), 1.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        out = dataclasses.asdict(self)
        out["points"] = [list(p) for p in self.points]
        return out


def _curve(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(e_max, w0)`` minimising the squared log error over ``points`` (w0 on a grid, then refined)."""
    h = np.array([float(p[0]) for p in points])
    log_e = np.log(np.array([p[1] for p in points]))

    def cost(w0: float) -> tuple[float, float]:
        shift = np.log1p(w0 / h)
        # e_max <= 1: no curve may promise more than the peak (the squared error is convex in log e_max, so
        # the bounded optimum is the clipped one).
        log_emax = min(float(np.mean(log_e + shift)), 0.0)
        return float(np.sum((log_e - log_emax + shift) ** 2)), math.exp(log_emax)

    if len(points) < 2:
        return min(math.exp(float(log_e[0])), 1.0), 0.0
    grid = [0.0, *np.geomspace(1.0, 1e6, 241).tolist()]
    best = min(range(len(grid)), key=lambda i: (cost(grid[i])[0], i))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    for _ in range(60):  # golden section inside the best bracket
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (lo, b) if cost(a)[0] <= cost(b)[0] else (a, hi)
    w0 = min((grid[best], (lo + hi) / 2), key=lambda w: (cost(w)[0], w))
    return cost(w0)[1], w0


def fit_matmuls(rows: Sequence[MatmulTiming], peak: float | None) -> MatmulFit | None:
    """The matmul efficiency of a profile's timings (``None``: no whole bf16 matmul timed).

    Args:
      rows: the profile's matmul timings.
      peak: the device's bf16 peak FLOP/s (``None``: unknown; the fastest timing stands in).

    Example:
      >>> rows = [MatmulTiming("sweep", h, 1, 4096, h, 4 * h, "bfloat16", 2 * 4096 * h * 4 * h / r)
      ...         for h, r in ((1024, 3e14), (4096, 6e14))]
      >>> fit = fit_matmuls(rows, 1e15)
      >>> fit.points, round(fit.at(2048), 3)
      (((1024, 0.3), (4096, 0.6)), 0.45)
    """
    rows = _rows(rows, MatmulTiming)
    peak = None if peak is None else as_real(peak, "peak", error=ProfileError)
    whole = [r for r in rows if r.dtype == "bfloat16" and r.tp == 1]
    if not whole:
        return None
    source = "catalogue"
    if peak is None:
        peak, source = max(r.rate for r in rows if r.dtype == "bfloat16"), "fastest matmul timed"
    by_hidden: dict[int, list[MatmulTiming]] = {}
    for r in whole:
        by_hidden.setdefault(r.hidden, []).append(r)
    points = tuple((h, sum(r.flops for r in rs) / sum(r.seconds for r in rs) / peak)
                   for h, rs in sorted(by_hidden.items()))
    e_max, w0 = _curve(points)
    return MatmulFit(float(peak), source, points, e_max, w0, _fp8_ratio(rows))


def _fp8_ratio(rows: Sequence[MatmulTiming]) -> float | None:
    """FP8 over bf16 rate, FLOP-weighted over the shapes timed in both."""
    def shape(r: MatmulTiming) -> tuple[str, int, int, int, int, int]:
        return (r.label, r.hidden, r.tp, r.m, r.k, r.n)

    bf16 = {shape(r): r for r in rows if r.dtype == "bfloat16"}
    pairs = [(bf16[shape(r)], r) for r in rows if r.dtype != "bfloat16" and shape(r) in bf16]
    if not pairs:
        return None
    return sum(b.seconds for b, _ in pairs) / sum(f.seconds for _, f in pairs)


@dataclasses.dataclass(frozen=True, slots=True)
class StepFit:
    """The factor between whole steps' efficiency and the matmul benchmark's, fitted to measured steps.

    Attributes:
      scale: ``r``: steps are priced at ``r x`` the matmul efficiency.
      rows: measured steps fitted.
      max_error: the largest ``|ln(fitted / measured)|`` over them (the fit).
      loo_max_error: the same, each row predicted by the factor fitted to the others (the check; ``None``
        with one row).
    """

    scale: float
    rows: int
    max_error: float
    loo_max_error: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)


def _usable(rows: Sequence[StepTiming]) -> list[StepTiming]:
    return [r for r in rows if r.measured_step_s and r.predicted_compute_s and r.efficiency
            and r.predicted_exposed_s is not None]


def _scale(rows: Sequence[StepTiming], efficiency_at: Callable[[int], float]) -> float:
    peak_s = np.array([r.predicted_compute_s * r.efficiency for r in rows])  # type: ignore[operator]
    base = np.array([efficiency_at(r.hidden) for r in rows])
    exposed = np.array([r.predicted_exposed_s for r in rows], dtype=float)
    target = np.log(np.array([r.measured_step_s for r in rows], dtype=float))

    def cost(u: float) -> float:
        return float(np.sum((np.log(peak_s / (base * math.exp(u)) + exposed) - target) ** 2))

    # r in [1e-4, 100]: a step at a ten-thousandth of its matmuls' rate, or a hundred times it, is a broken
    # measurement, not a factor. Pricing caps the efficiency at 1 whatever r says.
    grid = np.linspace(math.log(1e-4), math.log(100.0), 500).tolist()
    best = min(range(len(grid)), key=lambda i: (cost(grid[i]), i))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    for _ in range(60):
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (lo, b) if cost(a) <= cost(b) else (a, hi)
    return math.exp((lo + hi) / 2)


def _errors(rows: Sequence[StepTiming], efficiency_at: Callable[[int], float], scale: float) -> list[float]:
    out = []
    for r in rows:
        fitted = r.predicted_compute_s * r.efficiency / (efficiency_at(r.hidden) * scale) + r.predicted_exposed_s  # type: ignore[operator]
        out.append(abs(math.log(fitted / r.measured_step_s)))  # type: ignore[operator]
    return out


def fit_steps(rows: Sequence[StepTiming], efficiency_at: Callable[[int], float]) -> StepFit | None:
    """Fit the step factor ``r`` to measured steps (``None``: no row with a measured step and a priced compute).

    Args:
      rows: ``meshplan measure`` rows (:class:`~meshplan.pure.cluster.StepTiming`).
      efficiency_at: the profile's matmul efficiency per hidden size (:meth:`MatmulFit.at`).

    Example:
      >>> row = StepTiming("m", 64, "fsdp=8", 8, 32, 3, 0.2, 0.19, 0.21, None, "", 0.1, 0.1, 0.0, 0.5, 10,
      ...                  None)
      >>> round(fit_steps([row], lambda h: 0.5).scale, 3)  # 0.05 s at the peak took 0.2 s: half of 0.5
      0.5
    """
    rows = _rows(rows, StepTiming)
    if not callable(efficiency_at):
        raise MeshplanTypeError(f"efficiency_at={efficiency_at!r:.60} must be a function of the hidden size.")
    usable = _usable(rows)
    if not usable:
        return None
    scale = _scale(usable, efficiency_at)
    loo = None
    if len(usable) > 1:
        loo = max(_errors([r], efficiency_at, _scale([o for o in usable if o is not r], efficiency_at))[0]
                  for r in usable)
    return StepFit(scale, len(usable), max(_errors(usable, efficiency_at, scale)), loo)
