"""How an MoE layer's tokens reach their experts, and what that costs: the one place the cost models ask.

A :class:`~meshplan.pure.cost.TrainingRecipe` names the dispatch (``moe_dispatch``, :data:`MOE_DISPATCHES`);
the FLOPs (:mod:`meshplan.pure.cost._flops`), the activation memory (:mod:`meshplan.pure.cost._step_memory`)
and the collectives (:mod:`meshplan.pure.cost._activation_collectives`) read it through :class:`MoeDispatch`, never
by its name:

- ``"einsum"`` (the default): GShard's capacity-based dispatch, what meshplan's reference step runs
  (``meshplan.facade.verify._reference_model.moe``) and MaxText with ``sparse_matmul: False`` (its
  ``mixtral_8x7b_dropped`` benchmark config sets ``megablox: False``, ``sparse_matmul: False``,
  ``capacity_factor: 1.25``). Each sequence's tokens fill ``capacity = ceil(top_k x s x cf / E)`` slots per
  expert (``cf`` = :data:`CAPACITY_FACTOR`; tokens past it are dropped) through a one-hot dispatch einsum and
  come back through a combine einsum, both ``(b, s, E, capacity)``. The experts run on every slot, empty ones
  too (padding FLOPs); each einsum costs ``2 x tokens x E x capacity x hidden`` FLOPs, ``O(top_k x s^2)`` per
  sequence; the fp32 routing tensors grow like ``s x s``; the all-to-alls move every slot.
- ``"dropless"``: grouped GEMMs over exactly the routed tokens. DeepSeek-V3 trains without dropping a token
  (report sec. 2.1.2; DeepGEMM, DeepEP), as do MaxText's default ``sparse_matmul: True`` (megablox /
  ``ragged_dot``, ``capacity_factor: -1``), Megatron-LM's grouped-GEMM MoE and MegaBlocks. The tokens are
  sorted by expert (a permutation: data movement, no FLOPs counted) and each expert multiplies its own rows.
  Nothing is padded, no dispatch or combine einsum runs, and no ``s x s`` tensor is kept: the router keeps its
  top-k indices and weights, ``b x s x top_k``, under a thousandth of a layer's activations and not priced.
  The experts' activations hold exactly ``top_k`` rows per token and the all-to-alls carry exactly the routed
  tokens.

**Balance.** Dropless is priced at capacity factor 1, the mean load: every expert gets ``top_k x s / E`` rows
of each sequence. A real router is imbalanced: the busiest expert (and the device holding it) gets more, the
step waits for it, and its buffers are larger (MaxText sizes its ragged buffers for the worst case by default,
``ragged_buffer_factor: -1``; DeepEP sizes them from the counts it exchanges first). Chosen: the mean, so a
dropless figure is that of a perfectly balanced router (DeepSeek-V3's auxiliary-loss-free bias keeps its load
near even); the busiest expert's excess is not priced.

**Memory calibration.** The activation coefficients (:data:`~meshplan.pure.cost._step_memory.CALIBRATIONS`)
were fitted to XLA's compiles of the einsum step. A dropless figure is the same model with the routing terms
removed and the experts' widths at factor 1, not a fit to a dropless compile: meshplan's reference step has
none, so ``meshplan plan`` does not compile a dropless plan.

Example:
  >>> MoeDispatch("einsum").rows(top_k=2, seq=4096, experts=8)     # 8 experts x 1280 slots
  10240
  >>> MoeDispatch("dropless").rows(top_k=2, seq=4096, experts=8)   # 2 x 4096 routed rows
  8192
"""

from __future__ import annotations

import dataclasses
import math

from meshplan.pure._check import as_choice, as_count, as_real
from meshplan.pure._fields import MAX_COUNT, as_size
from meshplan.pure.errors import PlanError

__all__ = ["CAPACITY_FACTOR", "MOE_DISPATCHES", "MoeDispatch"]

MOE_DISPATCHES: tuple[str, ...] = ("einsum", "dropless")
"""How an MoE layer dispatches its tokens: GShard's capacity einsums (the reference step's) or grouped GEMMs
over the routed tokens (see the module docstring)."""

CAPACITY_FACTOR: float = 1.25
"""The einsum dispatch's expert capacity over the even share of tokens (the reference step's and MaxText's)."""


@dataclasses.dataclass(frozen=True, slots=True)
class MoeDispatch:
    """What one MoE layer's dispatch costs (see the module docstring).

    Attributes:
      kind: one of :data:`MOE_DISPATCHES`.
      capacity_factor: the einsum dispatch's capacity over the even share (read by ``"einsum"`` only:
        a dropless dispatch has no capacity).

    Raises:
      PlanError: an unknown ``kind`` (naming the valid ones) or a ``capacity_factor`` that is not a finite
        number > 0; MeshplanTypeError: a ``kind`` that is not a str.

    Example:
      >>> MoeDispatch("dropless").einsums, MoeDispatch().einsums, MoeDispatch("dropless").width_factor
      (0, 1, 1.0)
      >>> MoeDispatch("sparse")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.PlanError: moe_dispatch='sparse' must be one of ('einsum', 'dropless').
    """

    kind: str = "einsum"
    capacity_factor: float = CAPACITY_FACTOR

    def __post_init__(self) -> None:
        as_choice(self.kind, "moe_dispatch", MOE_DISPATCHES, error=PlanError)
        object.__setattr__(self, "capacity_factor", as_real(self.capacity_factor, "capacity_factor",
                                                            error=PlanError))

    @property
    def einsums(self) -> int:
        """1 where the dispatch and combine einsums run (and keep their ``s x s`` routing tensors), else 0: a
        multiplier of their terms."""
        return 1 if self.kind == "einsum" else 0

    @property
    def width_factor(self) -> float:
        """Expert rows per routed token, as the memory model prices the experts' activations (no rounding):
        the capacity factor (einsum), 1 (dropless)."""
        return self.capacity_factor if self.kind == "einsum" else 1.0

    def rows(self, *, top_k: int, seq: int, experts: int) -> int:
        """Expert rows one sequence of ``seq`` tokens fills, over all experts: ``experts x capacity``
        with ``capacity = max(1, ceil(top_k x seq x cf / experts))`` (einsum: empty slots included), or
        ``top_k x seq`` (dropless: the routed tokens). What the experts compute on and the all-to-alls move.

        Example:
          >>> MoeDispatch().rows(top_k=8, seq=4096, experts=256), MoeDispatch("dropless").rows(top_k=8, seq=4096,
          ...                                                                                 experts=256)
          (40960, 32768)
        """
        k, s, e = as_size(top_k, "top_k"), as_size(seq, "seq"), as_size(experts, "experts")
        if self.kind == "dropless":
            return k * s
        return e * max(1, math.ceil(k * s * self.capacity_factor / e))

    def routing(self, top_k: int) -> float:
        """fp32 routing elements per token per token of its sequence (GShard's ``(b, s, E, capacity)``
        tensors: ``top_k x cf``); 0 for dropless (the router's ``b x s x top_k`` indices are not priced)."""
        k = as_count(top_k, "top_k", minimum=0, maximum=MAX_COUNT, error=PlanError)  # 0: a dense layer's
        return k * self.capacity_factor * self.einsums
