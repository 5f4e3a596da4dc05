"""How much of a layer's parameter collectives a compiled step leaves exposed: the overlap rule, fitted.

A training step runs each layer twice, a forward and a backward (recompute included); each run is a *window* of
``W`` seconds of compute. In it run the layer's parameter all-gathers (``G`` seconds on their link, alone) and, in
the backward, its gradient reduce-scatters and all-reduces (``R`` seconds). The rule (:class:`OverlapRule`)::

    exposed = a_g G + a_r R + max(0, (1 - a_g) G + (1 - a_r) R - b W)

- ``a_g``: the share of a layer's gathers issued with no compute in front of their first use (XLA gathers a
  layer's weights inside that layer's iteration of the scanned loop, the first ones right before the first
  matmul): exposed however long the window;
- ``a_r``: the share of its gradient syncs issued after its last backward matmul (XLA:GPU combines a layer's
  gradients into one reduce-scatter at the end of the loop body; the step waits for it before the next
  iteration): exposed likewise;
- ``b``: the share of the window's compute the rest can hide under (each gather is issued about one matmul
  ahead of its use, not a layer ahead; each sync runs under the matmuls still to come).

Every layer is such a window: the compiled programs have no special first gather or last reduce-scatter, each
layer's are (``a_g``, ``a_r``). With ``a_g = a_r = 0, b = 1`` it is the rule the screen used before (hidden
whenever compute is longer).

**Fitted** (:data:`OVERLAP_FIT`) for XLA:GPU on the compiled programs of ``benchmarks/bench_overlap_grid.py``
(31 rows, ``benchmarks/data/overlap_grid.jsonl``: Llama 3 8B and 70B and Mixtral 8x7B cut to 2 layers at their real
widths, on 1, 2, 4 and 8 nodes of 8 H100s, fsdp inside and across nodes, dp x fsdp, fsdp x tp, 1K to 8K tokens per
device): each case's reference step as ``meshplan plan --verify`` compiles it (layers scanned, remat full, XLA's
default options), its schedule simulated (:func:`~meshplan.pure.cost.simulate_schedule`), its parameter
all-gathers and gradient syncs summed per layer window (those outside the layer loops, the embedding's and the
data-parallel all-reduce XLA:GPU issues after the loop, spread over the layers as the screen spreads them);
least squares over a grid of ``(a_g, a_r, b)`` (steps of 0.02, 0.02 and 0.02) on the exposed seconds as a share of the
simulated step. Fit: ``a_g = 0``, ``a_r = 0.86``, ``b = 0.64``; the rule's step within 0.94-1.07x of the simulated
one on every row (median 1.5%), where the best case ("hidden whenever compute is longer", the screen's rule before)
is 0.77-0.99x (median 8.7%). Held out by model (70B fitted on the others) the step is within 10% (median 2.3%).
The layer loops alone fit ``(0, 0.80, 0.48)``. What the programs show: XLA:GPU issues each layer's gathers
a matmul ahead of their use and hides them when the window is long enough, but combines a layer's gradients into
one reduce-scatter at the end of its loop body, which the next iteration waits for: gradient syncs are mostly
exposed. Fitted on XLA's default flags; stacks that pipeline their reduce-scatters
(``--xla_gpu_enable_pipelined_reduce_scatter``, NCCL user buffers) expose less.

XLA:TPU has no rule. Its grid (``benchmarks/data/overlap_grid_tpu.jsonl``, 9 compiles) fits ``(0.4, 0.08,
0.62)`` on its 6 single-slice rows: weight gathers partly exposed, gradient syncs hidden, the mirror of XLA:GPU. Six
rows leave nothing to hold out, and checked against MaxText's three v6e-256 runs the fit moved them 1-2 points
further from the published steps, so it was not adopted. :func:`overlap_rule` gives ``None`` for XLA:TPU and the
step keeps the prefetch rule of :mod:`meshplan.pure.cost._step_time`. XLA:CPU (a check) likewise.

Example:
  >>> rule = OverlapRule(0.1, 0.5, 0.8)
  >>> round(rule.exposed(1.0, 0.0, 10.0), 6), round(rule.exposed(1.0, 2.0, 1.0), 6)
  (0.1, 2.2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from meshplan.pure._check import as_choice, as_instance, as_real, as_sequence
from meshplan.pure._fields import as_seconds
from meshplan.pure.errors import PlanError

__all__ = ["OVERLAP_FIT", "OverlapRule", "overlap_rule", "window_exposure"]


def _fraction(value: float, what: str) -> float:
    x = as_real(value, what, allow_zero=True, error=PlanError)
    if x > 1:
        raise PlanError(f"{what}={x:g} must be a fraction in [0, 1].")
    return x


@dataclasses.dataclass(frozen=True, slots=True)
class OverlapRule:
    """The overlap of one window (see the module docstring): ``a_g``, ``a_r`` and ``b``.

    Attributes:
      gather_exposed: ``a_g``, the share of a window's gathers exposed whatever its compute.
      grads_exposed: ``a_r``, the share of its gradient syncs exposed whatever its compute.
      compute_share: ``b``, the share of its compute the rest hides under (>= 0; may exceed 1 in a fit).

    Raises:
      PlanError: a share outside ``[0, 1]`` (``compute_share``: below 0 or not finite).

    Example:
      >>> OverlapRule(0.0, 0.0, 1.0).exposed(3.0, 1.0, 2.0)  # the best case: max(0, G + R - W)
      2.0
    """

    gather_exposed: float
    grads_exposed: float
    compute_share: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "gather_exposed", _fraction(self.gather_exposed, "gather_exposed"))
        object.__setattr__(self, "grads_exposed", _fraction(self.grads_exposed, "grads_exposed"))
        object.__setattr__(self, "compute_share",
                           as_real(self.compute_share, "compute_share", allow_zero=True, error=PlanError))

    def exposed(self, gathers: float, grads: float, compute: float) -> float:
        """Exposed seconds of a window of ``compute`` seconds holding ``gathers`` and ``grads`` seconds of
        collectives (each >= 0): between ``a_g G + a_r R`` and ``G + R``.

        Example:
          >>> OverlapRule(0.2, 1.0, 0.5).exposed(1.0, 1.0, 1.0)  # 0.2 + 1.0 + max(0, 0.8 - 0.5)
          1.5
        """
        gathers, grads, compute = (as_seconds(v, name) for v, name in ((gathers, "gathers"), (grads, "grads"),
                                                                       (compute, "compute")))
        fixed = self.gather_exposed * gathers + self.grads_exposed * grads
        rest = (gathers - self.gather_exposed * gathers) + (grads - self.grads_exposed * grads)
        return fixed + max(0.0, rest - self.compute_share * compute)


OVERLAP_FIT: dict[str, OverlapRule] = {
    "gpu": OverlapRule(0.0, 0.86, 0.64),
}
"""The rule per compiler (``TrainingRecipe.compiler``) where one was fitted, as the module docstring says.
Estimates: within 0.94-1.07x of the simulated compiled step on the rows fitted."""


def overlap_rule(backend: str = "gpu") -> OverlapRule | None:
    """The fitted :class:`OverlapRule` of ``backend`` (``"gpu"``, ``"tpu"`` or ``"cpu"``); ``None`` where none was
    fitted (XLA:TPU, XLA:CPU: the step keeps the prefetch rule).

    Raises:
      PlanError: an unknown backend.

    Example:
      >>> overlap_rule("gpu") == OVERLAP_FIT["gpu"], overlap_rule("tpu")
      (True, None)
    """
    return OVERLAP_FIT.get(as_choice(backend, "backend", ("cpu", "gpu", "tpu"), error=PlanError))


def window_exposure(gathers: Sequence[float], grads: Sequence[float], compute: float,
                    rule: OverlapRule) -> tuple[list[float], list[float]]:
    """Exposed seconds of each collective sharing one window (see the module docstring).

    Each collective's share: its fixed part (``a_g`` or ``a_r`` of its seconds) and of what the window's
    compute cannot hide, a part in proportion to the rest of its seconds. The shares sum to
    :meth:`OverlapRule.exposed` of the sums, and each lies between its fixed part and its seconds.

    Args:
      gathers: seconds of each parameter all-gather in the window (>= 0).
      grads: seconds of each gradient sync in the window (>= 0).
      compute: the window's compute seconds (>= 0).
      rule: the :class:`OverlapRule`.

    Returns:
      ``(exposed of each gather, exposed of each sync)``, in the arguments' order.

    Example:
      >>> g, r = window_exposure([1.0, 1.0], [2.0], 1.5, OverlapRule(0.0, 0.5, 1.0))
      >>> g, r
      ([0.5, 0.5], [1.5])
    """
    rule = as_instance(rule, "rule", OverlapRule, example='overlap_rule("gpu")')
    gathers, grads = (tuple(as_seconds(v, f"{name}[{i}]") for i, v in enumerate(as_sequence(xs, name)))
                      for xs, name in ((gathers, "gathers"), (grads, "grads")))
    return shares(gathers, grads, as_seconds(compute, "compute"), rule)


def shares(gathers: Sequence[float], grads: Sequence[float], compute: float,
           rule: OverlapRule) -> tuple[list[float], list[float]]:
    """:func:`window_exposure` unchecked: the step prices every mesh of a search with it, on its own figures."""
    a_g, a_r, b = rule.gather_exposed, rule.grads_exposed, rule.compute_share
    rest_g = [s - a_g * s for s in gathers]
    rest_r = [s - a_r * s for s in grads]
    rest = sum(rest_g) + sum(rest_r)
    over = max(0.0, rest - b * compute)
    frac = over / rest if rest > 0 else 0.0
    return ([a_g * s + frac * x for s, x in zip(gathers, rest_g, strict=True)],
            [a_r * s + frac * x for s, x in zip(grads, rest_r, strict=True)])
