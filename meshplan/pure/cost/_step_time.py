"""Step time: compute plus the communication that does not fit under it.

A step runs its layers' compute (:mod:`meshplan.pure.cost._flops`, at the
device's peak bf16 FLOP/s times an efficiency) while the collectives of
:mod:`meshplan.pure.cost._param_collectives` and :mod:`meshplan.pure.cost._activation_collectives`
run beside it where the schedule allows (FSDP / ZeRO-3 prefetching, XLA's async collectives and
latency-hiding scheduler):

- **forward window** (one per layer, the layer's forward compute): the
  parameter all-gathers of the *next* layer (prefetch). Layer 1's gather has
  nothing to hide under and is exposed whole;
- **backward window** (one per layer, the layer's backward compute, recompute
  included): the backward all-gathers of the next layer, the gradient
  reduce-scatters and data-parallel all-reduces of the layer just finished.
  The last layer's gradient collectives run after the compute ends: exposed;
- **critical path**: tp and sp activation collectives and ep all-to-alls sit
  between the matmuls that produce and consume them: exposed whole (XLA:TPU's
  collective matmul can hide tp all-gathers; not modelled).

**Gradient accumulation** (``m`` micro-batches, :func:`accumulate`): the
FLOPs are the same; each micro-batch runs its own forward and backward, so
the activation collectives (tp / sp / ep) are ``m`` times as many calls of
``1 / m`` the bytes, and the parameter all-gathers and gradient syncs repeat
``m`` times: XLA reduce-scatters / all-reduces each micro-batch's gradients
inside the accumulation loop (the gradients carry the parameters' sharding)
and gathers the weights again in each (XLA:TPU, fsdp=8 with 2 micro-batches:
every gather and gradient reduce-scatter twice). XLA:GPU all-reduces the
accumulated gradients once, after the loop (read from its HLO for 1x8xH200),
so with ``backend="gpu"`` a gradient all-reduce keeps its one call per step
(its reduce-scatters stay in the loop). XLA:CPU hoists the loop-invariant
forward gathers out of the loop; that is said by
:func:`~meshplan.pure.cost._xla_collectives.xla_collectives` and not priced here
(XLA:CPU is a check, not a target). The windows are the same layers' compute,
summed over the micro-batches.

**FP8 weight matmuls** (``fp8_peak_flops`` given: a ``matmul_dtype="float8"`` recipe,
:mod:`meshplan.pure.cost._matmul_dtype`): the weight matmuls of the step and of each window
(:attr:`~meshplan.pure.cost._flops.StepFlops.weight_matmuls`, ``weight_forward``, ``weight_backward``) run at
``fp8_peak_flops x efficiency x FP8_EFFICIENCY_RATIO``, the rest at ``peak_flops x efficiency``.

Within a window, what exceeds the compute is exposed, shared among the
collectives in proportion to their seconds. That is the **prefetch rule** (the best case, bar the first and last
layer), kept where no rule was fitted to compiled programs (XLA:TPU, XLA:CPU). Given an ``overlap``
(:func:`~meshplan.pure.cost._overlap.overlap_rule`: XLA:GPU's, fitted to compiled schedules), every layer's
forward and backward window is priced by that rule instead (:func:`~meshplan.pure.cost.window_exposure`:
a share of the gradient syncs exposed whatever the compute, the rest hidden under a share of the window), with no
special first or last layer: the compiled programs have none. ``step = compute + exposed``;
MFU = model FLOPs (no recompute, no MoE padding) / (step x devices x peak), the bf16 peak
even when the weight matmuls run in FP8 (so MFU compares with bf16 runs and published figures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from meshplan.pure._check import as_choice, as_count, as_instance, as_real, as_sequence, as_str
from meshplan.pure._fields import MAX_COUNT, as_efficiency, as_seconds, as_size, optional
from meshplan.pure.errors import PlanError
from meshplan.pure.cost._flops import StepFlops
from meshplan.pure.cost._matmul_dtype import FP8_EFFICIENCY_RATIO
from meshplan.pure.cost._overlap import OverlapRule, shares
from meshplan.pure.cost._placement import Pending

__all__ = ["CommExposure", "StepTime", "accumulate", "overlap_class", "step_seconds", "step_time"]


def overlap_class(what: str, kind: str) -> str:
    """Where a collective runs: ``"gather"`` (prefetched), ``"grads"`` (under the backward) or ``"critical"``.

    Example:
      >>> overlap_class("fsdp all-gather of params (fwd + bwd)", "all-gather")
      'gather'
      >>> overlap_class("tp all-reduce of activations (2 fwd + 2 bwd per layer)", "all-reduce")
      'critical'
    """
    if kind == "all-gather" and "of params" in what:
        return "gather"
    if "of grads" in what:
        return "grads"
    return "critical"


def accumulate(pending: Sequence[Pending], micro_batches: int, *, backend: str = "tpu") -> list[Pending]:
    """The step's collectives with ``micro_batches`` gradient-accumulation steps (see the module docstring).

    ``pending`` holds the step's :class:`~meshplan.pure.cost._placement.Pending` collectives for the
    whole batch in one pass (:func:`~meshplan.pure.cost._placement.price` prices them). ``backend`` is
    the compiler the step is priced for (``"tpu"``, ``"gpu"`` or ``"cpu"``): XLA:GPU syncs the accumulated
    gradients once.

    Example:
      >>> pending = [Pending("tp all-reduce of activations", "all-reduce", ("tp",), 800, 4, 8, 1),
      ...            Pending("fsdp all-gather of params (fwd + bwd)", "all-gather", ("fsdp",), 100, 2, 8, 1),
      ...            Pending("dp all-reduce of grads", "all-reduce", ("dp",), 100, 1, 1, 2)]
      >>> [(p.nbytes, p.calls) for p in accumulate(pending, 4)]
      [(200.0, 16), (100, 8), (100, 4)]
      >>> [(p.nbytes, p.calls) for p in accumulate(pending, 4, backend="gpu")][2]
      (100, 1)
    """
    m = as_count(micro_batches, "micro_batches", error=PlanError)
    backend = as_choice(backend, "backend", ("cpu", "gpu", "tpu"), error=PlanError)
    if m == 1:
        return list(pending)
    out = []
    for what, kind, axes, nbytes, calls, ici, dcn in pending:
        where = overlap_class(what, kind)
        if where == "critical":
            out.append(Pending(what, kind, axes, nbytes / m, calls * m, ici, dcn))
        elif backend == "gpu" and kind == "all-reduce" and where == "grads":
            # XLA:GPU all-reduces the accumulated gradients once, after the micro-batch loop (1x8xH200's HLO:
            # llama dp=2,fsdp=4 with 2 micro-batches all-reduces 247,048 B, as with one).
            out.append(Pending(what, kind, axes, nbytes, calls, ici, dcn))
        else:  # parameter gathers and gradient syncs: again in every micro-batch
            out.append(Pending(what, kind, axes, nbytes, calls * m, ici, dcn))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class CommExposure:
    """Seconds of one collective term hidden under compute and exposed on the step's critical path."""

    what: str
    hidden: float
    exposed: float


@dataclasses.dataclass(frozen=True, slots=True)
class StepTime:
    """Predicted time of one training step on one mesh (see the module docstring).

    Attributes:
      compute_s: seconds of compute per device.
      exposed_s: seconds of communication not hidden under compute.
      step_s: ``compute_s + exposed_s``.
      tokens_per_s: tokens per second per device.
      mfu: model FLOPs utilisation against the bf16 peak, FP8 steps too (0 when the device's peak is unknown).
      terms: hidden and exposed seconds per collective term, in the terms' order.
    """

    compute_s: float
    exposed_s: float
    step_s: float
    tokens_per_s: float
    mfu: float
    terms: tuple[CommExposure, ...]

    @property
    def hidden_s(self) -> float:
        """Seconds of communication hidden under compute."""
        return float(sum(t.hidden for t in self.terms))


def _share(seconds: Sequence[float], window: float) -> list[float]:
    """Exposed part of each collective sharing a window of ``window`` seconds (proportional)."""
    total = sum(seconds)
    over = max(0.0, total - window)
    return [over * s / total if total > 0 else 0.0 for s in seconds]


def step_time(flops: StepFlops, terms: Sequence[tuple[str, str, float]], *, layers: int, tokens: int,
              devices: int, peak_flops: float | None, efficiency: float,
              fp8_peak_flops: float | None = None, overlap: OverlapRule | None = None) -> StepTime:
    """Step time of one mesh from its FLOPs and its priced collectives.

    Args:
      flops: the step's FLOPs (:func:`~meshplan.pure.cost._flops.step_flops`).
      terms: ``(what, kind, seconds)`` per collective term (as :class:`~meshplan.pure.cost.CommTerm`).
      layers: layers per step (the collectives are fused per layer).
      tokens: global tokens per step; devices: devices in the mesh.
      peak_flops: the device's dense bf16 FLOP/s (``None``: unknown, compute counts 0 s).
      efficiency: fraction of the peak the matmuls sustain.
      fp8_peak_flops: the device's dense FP8 FLOP/s when the weight matmuls run in FP8 (the module
        docstring); ``None``: every matmul at ``peak_flops``.
      overlap: the rule each layer window's parameter collectives follow (``None``: the prefetch rule; see the
        module docstring).

    Returns:
      A :class:`StepTime`.

    Raises:
      MeshplanTypeError: ``flops`` is not a StepFlops, ``terms`` not a sequence of sequences, a count not an
        int, a rate not a number.
      PlanError: a term that is not ``(what, kind, seconds >= 0)``, a count below 1, a negative or infinite
        rate, an ``efficiency`` outside ``(0, 1]``.

    Example:
      >>> f = StepFlops(6e15, 0.0, 0.0, 1e15, 4e12, 8e12, 4e13)
      >>> t = step_time(f, [("fsdp all-gather of params (fwd + bwd)", "all-gather", 0.2),
      ...                   ("tp all-reduce of activations", "all-reduce", 0.1)],
      ...               layers=80, tokens=2**20, devices=8, peak_flops=1e15, efficiency=0.5)
      >>> round(t.compute_s, 3), round(t.exposed_s, 4), [round(x.exposed, 4) for x in t.terms]
      (2.0, 0.1025, [0.0025, 0.1])
      >>> from meshplan.pure.cost._overlap import overlap_rule
      >>> round(step_time(f, [("fsdp reduce-scatter of grads", "reduce-scatter", 0.2)], layers=80, tokens=2**20,
      ...                 devices=8, peak_flops=1e15, efficiency=0.5, overlap=overlap_rule("gpu")).exposed_s, 3)
      0.172
      >>> f8 = StepFlops(6e15, 0.0, 0.0, 1e15, 4e12, 8e12, 4e13, weight_matmuls=6e14, weight_forward=2e12,
      ...                weight_backward=5e12)
      >>> step_time(f8, [], layers=80, tokens=2**20, devices=8, peak_flops=1e15, efficiency=0.5,
      ...           fp8_peak_flops=2e15).compute_s  # 4e14 / 5e14 + 6e14 / (2e15 x 0.5 x 0.75)
      1.6
    """
    flops = as_instance(flops, "flops", StepFlops, example="step_flops(model, sizes, batch=8, seq=4096)")
    terms = _terms(terms, "terms")
    layers, devices = as_size(layers, "layers"), as_size(devices, "devices")
    tokens = as_count(tokens, "tokens", maximum=MAX_COUNT**2, error=PlanError)  # batch x seq
    peak_flops, fp8_peak_flops = (optional(_flop_rate)(v, name) for v, name in (
        (peak_flops, "peak_flops"), (fp8_peak_flops, "fp8_peak_flops")))
    efficiency = as_efficiency(efficiency, "efficiency")
    if overlap is not None:
        overlap = as_instance(overlap, "overlap", OverlapRule, example='overlap_rule("gpu")')
    compute, exposed = _exposure(flops, terms, [t[2] for t in terms], layers, peak_flops, efficiency,
                                 fp8_peak_flops, overlap)
    out = tuple(CommExposure(t[0], max(0.0, t[2] - e), e) for t, e in zip(terms, exposed, strict=True))
    exp = float(sum(exposed))
    step = compute + exp
    mfu = flops.model / devices / (step * peak_flops) if peak_flops and step > 0 else 0.0
    return StepTime(compute, exp, step, tokens / devices / step if step > 0 else 0.0, mfu, out)


def _terms(value: Any, what: str) -> tuple[tuple[str, str, float], ...]:
    """``(what, kind, seconds)`` per collective term, each checked: two str and seconds >= 0."""
    out = []
    for i, term in enumerate(as_sequence(value, what)):
        item = as_sequence(term, f"{what}[{i}]")
        if len(item) != 3:
            raise PlanError(f"{what}[{i}]={item!r:.80} must be a (what, kind, seconds) triple, such as "
                            "('tp all-reduce of activations', 'all-reduce', 0.1).")
        out.append((as_str(item[0], f"{what}[{i}][0]"), as_str(item[1], f"{what}[{i}][1]"),
                    as_seconds(item[2], f"{what}[{i}][2]")))
    return tuple(out)


def _flop_rate(value: Any, what: str) -> float:
    """A device's FLOP/s: a finite number >= 0 (0: unknown, as None)."""
    return as_real(value, what, allow_zero=True, error=PlanError)


def step_seconds(flops: StepFlops, terms: Sequence[Sequence[Any]], seconds: Sequence[float], *, layers: int,
                 peak_flops: float | None, efficiency: float, fp8_peak_flops: float | None = None,
                 overlap: OverlapRule | None = None) -> float:
    """``step_time(...).step_s`` (the same float) without the per-term records.

    The search ranks a few hundred meshes by their step and shows a few: the records of the
    others (a :class:`CommExposure` per collective term) were a tenth of its objects.

    Args:
      terms: per collective term, a tuple starting ``(what, kind, ...)`` (the search's unpriced
        terms, :func:`accumulate`'s items).
      seconds: each term's seconds (Python floats).
      layers, peak_flops, efficiency, fp8_peak_flops, overlap: as for :func:`step_time` (unchecked: the
        search's own values).

    Example:
      >>> f = StepFlops(6e15, 0.0, 0.0, 1e15, 4e12, 8e12, 4e13)
      >>> terms = [("fsdp all-gather of params (fwd + bwd)", "all-gather", 0.2)]
      >>> kw = dict(layers=80, peak_flops=1e15, efficiency=0.5)
      >>> step_seconds(f, terms, [0.2], **kw) == step_time(f, terms, tokens=2**20, devices=8, **kw).step_s
      True
    """
    compute, exposed = _exposure(flops, terms, seconds, layers, peak_flops, efficiency, fp8_peak_flops, overlap)
    return compute + float(sum(exposed))


def _seconds(total: float, fp8: float, rate: float, fp8_rate: float) -> float:
    """Seconds of ``total`` FLOPs at ``rate`` FLOP/s, the ``fp8`` of them at ``fp8_rate`` instead (0: none;
    then exactly ``total / rate``, so a bf16 step's figures do not move by a rounding)."""
    if not rate:
        return 0.0
    return total / rate if not fp8_rate else (total - fp8) / rate + fp8 / fp8_rate


def _exposure(flops: StepFlops, terms: Sequence[Sequence[Any]], seconds: Sequence[float], layers: int,
              peak_flops: float | None, efficiency: float,
              fp8_peak_flops: float | None = None,
              overlap: OverlapRule | None = None) -> tuple[float, list[float]]:
    """(compute seconds, exposed seconds of each term): the overlap of the module docstring; ``terms[k]``
    starts ``(what, kind)`` and takes ``seconds[k]``."""
    rate = 0.0 if not peak_flops else peak_flops * efficiency
    fast = 0.0 if not fp8_peak_flops else fp8_peak_flops * efficiency * FP8_EFFICIENCY_RATIO
    compute = _seconds(flops.per_device, flops.weight_matmuls, rate, fast)
    fwd = _seconds(flops.layer_forward, flops.weight_forward, rate, fast)
    bwd = _seconds(flops.layer_backward, flops.weight_backward, rate, fast)
    n = max(layers, 1)
    exposed = [0.0] * len(terms)
    gathers: list[int] = []
    grads: list[int] = []
    for k, t in enumerate(terms):
        where = overlap_class(t[0], t[1])
        if where == "gather":
            gathers.append(k)
        elif where == "grads":
            grads.append(k)
        else:
            exposed[k] = seconds[k]
    # Per layer: half of each gather's calls run in the forward, half in the backward.
    g_layer = [seconds[k] / 2 / n for k in gathers]
    r_layer = [seconds[k] / n for k in grads]
    if overlap is not None:  # every layer's two windows alike (the fitted rule has no first or last layer)
        fwd_g, _ = shares(g_layer, [], fwd, overlap)
        bwd_g, bwd_r = shares(g_layer, r_layer, bwd, overlap)
        for j, k in enumerate(gathers):
            exposed[k] = min(seconds[k], n * (fwd_g[j] + bwd_g[j]))
        for j, k in enumerate(grads):
            exposed[k] = min(seconds[k], n * bwd_r[j])
        return compute, exposed
    fwd_over = _share(g_layer, fwd)
    bwd_over = _share(g_layer + r_layer, bwd)
    for j, k in enumerate(gathers):
        # The first layer's gather (forward and backward) has no earlier compute to hide under.
        first = 2 * g_layer[j]
        exposed[k] = min(seconds[k], first + (n - 1) * (fwd_over[j] + bwd_over[j]))
    for j, k in enumerate(grads):
        last = r_layer[j]  # the last layer's gradients sync after the compute ends
        exposed[k] = min(seconds[k], last + (n - 1) * bwd_over[len(gathers) + j])
    return compute, exposed
