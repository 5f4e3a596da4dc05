"""What the mesh search prices, each quantity memoized by exactly what it reads of a mesh.

A search scores every mesh of a cluster (~1300 on 4096 devices), bounds most of them and prices a few hundred;
most of what it prices repeats from mesh to mesh. :class:`Pricing` holds one memo per priced quantity, each
keyed by what its function reads (a test holds each function to its key, so a memo never answers for a mesh
it would price otherwise):

- the step's FLOPs and its step with no collectives (:meth:`Pricing.flops`, :meth:`Pricing.compute_s`): by
  ``(tp, dp, fsdp)``, fsdp as :func:`~meshplan.pure.cost._flops.fsdp_read` reads it (tests/pure/search/
  test_search.py and tests/pure/cost/test_flops.py);
- the activation floor and the parts of the step's peak (:meth:`Pricing.activation_floor`,
  :meth:`Pricing.peak`): by ``(tp, sp, dp*fsdp*ep, micro-batches)``, and the output head's layout;
- the head's layout (:meth:`Pricing.head`): by the plan and the sizes of the axes its spec uses;
- a plan's parameter collectives before the mesh's sizes are read (:func:`~meshplan.pure.cost.
  _param_collectives.param_tables`): by the plan and which operands XLA:TPU gathers, and those operands
  (the batch axes of the head's, the embedding's and the experts' splits) by the plan.

The search driver (:mod:`meshplan.pure.search._search`) enumerates, bounds, prunes and ranks; it asks this
object for every figure. A :class:`Pricing` belongs to one search request: its memos are the request's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cluster._topology import tpu_topology
from meshplan.pure.cost._activation_collectives import activation_terms
from meshplan.pure.cost._estimates import MemoryBreakdown
from meshplan.pure.cost._flops import StepFlops, default_efficiency, fsdp_read, step_flops
from meshplan.pure.cost._gathered_operand import HeadLayout, gathers_hidden, gathers_tokens, head_layout, \
    vocab_batch_axes
from meshplan.pure.cost._matmul_dtype import fp8_peak
from meshplan.pure.cost._overlap import overlap_rule
from meshplan.pure.cost._param_collectives import ParamTables, param_tables, table_terms
from meshplan.pure.cost._placement import BATCH_AXES, AxisPlacement, Pending
from meshplan.pure.cost._recipe import TrainingRecipe
from meshplan.pure.cost._step_memory import (
    CALIBRATIONS,
    ActivationParts,
    StepMemory,
    activation_floor,
    activation_parts,
    calibration_key,
    layer_dims,
    price_state,
)
from meshplan.pure.cost._step_time import StepTime, accumulate, step_seconds, step_time
from meshplan.pure.cost._tpu_terms import TOKEN_REMATS, expert_token_terms, hidden_state_terms, whole_slice_sums
from meshplan.pure.errors import ClusterError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.search._groups import LeafGroups, PlanEval
from meshplan.pure.search._result import SearchRequest
from meshplan.pure.specs._dtypes import canonical_dtype, dtype_storage_bytes
from meshplan.pure.specs._geometry import spec_axes

__all__ = ["FlopsKey", "PeakKey", "PlanKey", "Pricing", "v5p_slice_chips"]

PlanKey: TypeAlias = tuple[Any, ...]
"""A plan's key: the sizes of the axes its rule reads (the search plans once per key)."""

FlopsKey: TypeAlias = tuple[int, int, int]
"""``(tp, dp, fsdp)``: what :func:`~meshplan.pure.cost._flops.step_flops` reads of a mesh, fsdp as
:func:`~meshplan.pure.cost._flops.fsdp_read` reads it."""

PeakKey: TypeAlias = tuple[int, int, int, int]
"""``(tp, sp, dp*fsdp*ep, micro-batches)``: what the activation floor and the step's peak read of a mesh."""


def v5p_slice_chips(cluster: Cluster) -> int | None:
    """The chips of one slice of a v5p ``cluster`` whose chip grid spans all three dims (2x2x2 and up), else
    None (see :func:`~meshplan.pure.cost._tpu_terms.whole_slice_sums`).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> v5p_slice_chips(parse_cluster("v5p-16")), v5p_slice_chips(parse_cluster("v5e-8"))
      (8, None)
    """
    if cluster.device.name != "v5p":
        return None
    try:
        topology = tpu_topology(cluster)
    except ClusterError:  # a slice size with no TPU shape: nothing read
        return None
    return topology.chips_per_slice if len(topology.grid) == 3 and min(topology.grid) >= 2 else None


class Pricing:
    """The priced quantities of one search request, each memoized by what it reads (see the module docstring).

    Example:
      >>> from meshplan.pure.search import search_meshes
      >>> search_meshes("llama3-8b", "1x8xH100", batch=8, seq=2048, top_k=1).best.text  # priced by a Pricing
      'fsdp=8'
    """

    __slots__ = ("req", "model", "groups", "dims", "act_itemsize", "efficiency", "fp8_peak", "loss_gather",
                 "slice_chips", "overlap", "head_group", "embed_group", "expert_groups", "_recipes", "_flops", "_compute",
                 "_floors", "_parts", "_tables", "_vocab_axes", "_expert_axes", "_embed_split", "_head_axes",
                 "_heads")

    def __init__(self, req: SearchRequest, model: ModelSpec, groups: LeafGroups) -> None:
        self.req, self.model, self.groups = req, model, groups
        self.dims = layer_dims(model, capacity_factor=req.recipe.capacity_factor)
        self.act_itemsize = dtype_storage_bytes(canonical_dtype(req.param_dtype)) if req.param_dtype != "mixed" else 2
        device = req.cluster.device
        self.efficiency = (default_efficiency(device.ici_scope, model.hidden_size) if req.efficiency is None
                           else req.efficiency)
        # The FP8 peak the weight matmuls run at (None: bf16; search_meshes refused a device without one).
        self.fp8_peak = fp8_peak(device, req.recipe.matmul_dtype)
        self.overlap = overlap_rule(req.recipe.compiler)  # the compiled programs' overlap where fitted
        self.loss_gather = CALIBRATIONS[calibration_key(req.recipe)].loss_gather
        # Chips of one v5p slice whose grid spans all three dims (XLA:TPU all-reduces gradient sums over it
        # whole: whole_slice_sums); None elsewhere.
        self.slice_chips = v5p_slice_chips(req.cluster) if req.recipe.compiler == "tpu" else None
        # The output head's group (the embedding when tied) and the input embedding's: how a plan splits
        # them decides what XLA gathers for the loss and the lookup (meshplan.pure.cost._gathered_operand); None
        # when the tree names none. The memory model reads the head's where its calibration does
        # (Calibration.loss_gather), the comm model both on XLA:TPU.
        self.head_group, self.embed_group = (next((g for g, first in enumerate(groups.first)
                                                   if groups.roles.get(first) == role
                                                   and self.dims.vocab in groups.infos[g].shape), None)
                                             for role in ("head", "embed"))
        # The routed experts' groups (see _token_axes).
        self.expert_groups = tuple(g for g, first in enumerate(groups.first) if groups.roles.get(first) == "experts")
        self._recipes: dict[int, TrainingRecipe] = {req.recipe.micro_batches: req.recipe}
        # FlopsKey -> the step's FLOPs, and the step with no collectives.
        self._flops: dict[FlopsKey, StepFlops] = {}
        self._compute: dict[FlopsKey, float] = {}
        # PeakKey -> the activation floor: a 4096-device search bounds ~1000 meshes with a few dozen keys.
        self._floors: dict[PeakKey, int] = {}
        # PeakKey and the head's layout -> activation_parts (~1000 peaks of a search have ~100 distinct ones).
        self._parts: dict[tuple[int, int, int, int, HeadLayout | None], ActivationParts] = {}
        # (plan, gathers hidden states for the head, for the embedding, dispatched tokens, embedding looked up
        # on its shard) -> param_tables of the plan: ~190 meshes listed have ~70 plans (DeepSeek-V3 on 4096 GPUs).
        self._tables: dict[tuple[PlanKey, bool, bool, bool, bool], ParamTables] = {}
        # plan -> the batch axes its (head, embedding) vocabulary is split over (see _hidden_axes)
        self._vocab_axes: dict[PlanKey, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        # plan -> the batch axes its experts' intermediate dim is split over (None: split otherwise)
        self._expert_axes: dict[PlanKey, tuple[str, ...] | None] = {}
        self._embed_split: dict[PlanKey, bool] = {}  # plan -> vocabulary over tp, hidden over fsdp
        self._head_axes: dict[PlanKey, tuple[str, ...]] = {}  # plan -> the axes of its head's spec
        self._heads: dict[tuple[PlanKey, tuple[int, ...]], HeadLayout] = {}  # see head

    def recipe(self, micro_batches: int) -> TrainingRecipe:
        """The request's recipe with ``micro_batches`` accumulation steps."""
        found = self._recipes.get(micro_batches)
        if found is None:
            found = self._recipes[micro_batches] = dataclasses.replace(self.req.recipe, micro_batches=micro_batches)
        return found

    # --- compute --------------------------------------------------------------------------------------------

    def _flops_key(self, mesh: Mapping[str, int]) -> FlopsKey:
        tp = mesh.get("tp", 1)
        return tp, mesh.get("dp", 1), fsdp_read(self.model, tp, mesh.get("fsdp", 1))

    def flops(self, mesh: Mapping[str, int]) -> StepFlops:
        """The step's FLOPs on ``mesh``, by its :data:`FlopsKey`."""
        key = self._flops_key(mesh)
        found = self._flops.get(key)
        if found is None:
            req = self.req
            found = self._flops[key] = step_flops(self.model, mesh, batch=req.batch, seq=req.seq,
                                                  remat=req.recipe.remat, attention=req.recipe.attention,
                                                  moe_dispatch=req.recipe.moe_dispatch,
                                                  capacity_factor=req.recipe.capacity_factor)
        return found

    def step_s(self, mesh: Mapping[str, int], terms: Sequence[Pending], seconds: Sequence[float]) -> float:
        """The step (compute + exposed communication) on ``mesh`` with these collectives and their seconds."""
        return step_seconds(self.flops(mesh), terms, seconds, layers=max(self.model.num_layers, 1),
                            peak_flops=self.req.cluster.device.peak_bf16_flops, efficiency=self.efficiency,
                            fp8_peak_flops=self.fp8_peak, overlap=self.overlap)

    def compute_s(self, mesh: Mapping[str, int]) -> float:
        """The step on ``mesh`` with no collectives (its compute: a floor of its step), by its :data:`FlopsKey`."""
        key = self._flops_key(mesh)
        found = self._compute.get(key)
        if found is None:
            found = self._compute[key] = self.step_s(mesh, (), ())
        return found

    def step_time(self, mesh: Mapping[str, int], pending: Sequence[Pending], seconds: Sequence[float]) -> StepTime:
        """:meth:`step_s` with a record per collective (for the meshes shown)."""
        req = self.req
        terms = [(p.what, p.kind, float(t)) for p, t in zip(pending, seconds, strict=True)]
        return step_time(self.flops(mesh), terms, layers=max(self.model.num_layers, 1),
                         tokens=req.batch * req.seq, devices=req.cluster.num_devices,
                         peak_flops=req.cluster.device.peak_bf16_flops, efficiency=self.efficiency,
                         fp8_peak_flops=self.fp8_peak, overlap=self.overlap)

    # --- memory ---------------------------------------------------------------------------------------------

    def activation_floor(self, key: PeakKey) -> int:
        """:func:`~meshplan.pure.cost._step_memory.activation_floor` of a mesh with this :data:`PeakKey`."""
        floor = self._floors.get(key)
        if floor is None:
            floor = self._floors[key] = activation_floor(self.peak(key, 0, 0, 0, 0))
        return floor

    def peak(self, key: PeakKey, params: int, grads: int, optimizer: int, gathered: int,
             head: HeadLayout | None = None) -> StepMemory:
        """:func:`~meshplan.pure.cost._step_memory.step_memory` of a plan with these state bytes on a mesh with
        this :data:`PeakKey` and output-head layout, without re-checking what the search built."""
        recipe = self.recipe(key[3])
        parts = self._parts.get((*key, head))
        if parts is None:
            tp, sp, ways, _ = key
            parts = self._parts[(*key, head)] = activation_parts(self.dims, recipe, tp=tp, sp=sp, ways=ways,
                                                                 batch=self.req.batch, seq=self.req.seq, head=head)
        return price_state(self.dims, recipe, parts, params=params, grads=grads, optimizer=optimizer,
                           gathered=gathered)

    def memory(self, plan: PlanEval, gathered: int, key: PeakKey, head: HeadLayout | None = None) -> MemoryBreakdown:
        """The step's peak (see :mod:`meshplan.pure.cost._step_memory`) of ``plan`` on a mesh with this
        :data:`PeakKey`, whose plan's ``gathered`` bytes are split over axes of size > 1 and whose output head
        is laid out as ``head``; the state alone without activations."""
        budget = self.req.budget
        if not self.req.activations:
            return MemoryBreakdown.trusted(plan.param_bytes, plan.grad_bytes, plan.optimizer_bytes, 0, budget)
        step = self.peak(key, plan.param_bytes, plan.grad_bytes, plan.optimizer_bytes, gathered, head)
        peak, phase = step.peak, step.peak_phase
        live = phase != "forward"
        state = plan.param_bytes + plan.optimizer_bytes + (plan.grad_bytes if live else 0)
        return MemoryBreakdown.trusted(plan.param_bytes, plan.grad_bytes, plan.optimizer_bytes, peak - state,
                                       budget, phase, live)

    def head(self, plan_key: PlanKey, plan: PlanEval, mesh: Mapping[str, int]) -> HeadLayout | None:
        """:func:`~meshplan.pure.cost._gathered_operand.head_layout` of the plan's head group on ``mesh`` where
        the memory model reads it (else None), which reads the mesh only through the sizes of the axes the
        head's spec uses: memoized by the plan and those sizes (a 4096-device search asks ~600 meshes of
        ~200 plans)."""
        g = self.head_group
        if g is None or not self.loss_gather:
            return None
        axes = self._head_axes.get(plan_key)
        if axes is None:
            axes = self._head_axes[plan_key] = spec_axes(plan.specs[g])
        memo = (plan_key, tuple([mesh.get(a, 1) for a in axes]))
        found = self._heads.get(memo)
        if found is None:
            found = self._heads[memo] = head_layout(plan.specs[g], self.groups.infos[g].shape, mesh,
                                                    vocab=self.dims.vocab)
        return found

    # --- collectives ----------------------------------------------------------------------------------------

    def param_pending(self, plan_key: PlanKey, plan: PlanEval, mesh: Mapping[str, int], placement: AxisPlacement,
                      micro_batches: int) -> list[Pending]:
        """The parameter collectives of one step of ``plan`` on ``mesh`` (placed so), with its micro-batches, not
        yet priced: a step's collectives are these, then :meth:`activation_pending`'s."""
        req, recipe = self.req, self.req.recipe
        head_axes, embed_axes, expert_axes = self._gathered_axes(plan_key, plan, mesh, micro_batches)
        # param_terms, its mesh-independent half once per plan (and which operands XLA gathers).
        on_shard = self._embed_on_shard(plan_key, plan, mesh)
        memo = (plan_key, bool(head_axes), bool(embed_axes), bool(expert_axes), on_shard)
        tables = self._tables.get(memo)
        if tables is None:
            tables = self._tables[memo] = param_tables(plan.traffic, req.axes, backend=recipe.compiler,
                                                       remat=recipe.remat, hidden_head=bool(head_axes),
                                                       hidden_embed=bool(embed_axes),
                                                       tokens_experts=bool(expert_axes), embed_on_shard=on_shard)
        pending = table_terms(tables, placement, mesh, layers=max(self.model.num_layers, 1))
        if head_axes or embed_axes:
            pending += hidden_state_terms(self.model, mesh, placement, batch=req.batch, seq=req.seq,
                                          itemsize=self.act_itemsize, head_axes=head_axes, embed_axes=embed_axes)
        if expert_axes:
            pending += expert_token_terms(self.model, mesh, placement, batch=req.batch, seq=req.seq,
                                          itemsize=self.act_itemsize, axes=expert_axes, remat=recipe.remat,
                                          moe_dispatch=recipe.moe_dispatch, capacity_factor=recipe.capacity_factor)
        if self.slice_chips is not None:
            pending = whole_slice_sums(pending, mesh, chips=self.slice_chips)
        return accumulate(pending, micro_batches, backend=recipe.compiler)

    def activation_pending(self, mesh: Mapping[str, int], placement: AxisPlacement,
                           micro_batches: int) -> list[Pending]:
        """The activation collectives of one step on ``mesh``, with its micro-batches, not yet priced
        (accumulate maps each collective on its own, so the two halves are accumulated apart)."""
        req, recipe = self.req, self.req.recipe
        pending = activation_terms(self.model, mesh, placement, batch=req.batch, seq=req.seq,
                                   itemsize=self.act_itemsize, remat=recipe.remat,
                                   residual_split=recipe.residual_split, backend=recipe.compiler,
                                   moe_dispatch=recipe.moe_dispatch, capacity_factor=recipe.capacity_factor)
        return accumulate(pending, micro_batches, backend=recipe.compiler)

    def _gathered_axes(self, plan_key: PlanKey, plan: PlanEval, mesh: Mapping[str, int], micro_batches: int
                       ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The batch axes over which XLA:TPU gathers, on ``mesh``, the hidden states for the output head
        and for the input embedding instead of their tables, and the dispatched tokens instead of the routed
        experts' weights (``()``: it gathers the weights; see :mod:`meshplan.pure.cost._gathered_operand`).
        Other compilers were not read; nor tied tables, nor experts beside ep or tp or under remat dots."""
        if self.req.recipe.compiler != "tpu":
            return (), (), ()
        head_axes, embed_axes = self._hidden_axes(plan_key, plan, mesh, micro_batches)
        return head_axes, embed_axes, self._token_axes(plan_key, plan, mesh, micro_batches)

    def _embed_on_shard(self, plan_key: PlanKey, plan: PlanEval, mesh: Mapping[str, int]) -> bool:
        """Whether XLA:TPU looks the token ids up in the input embedding's shard on ``mesh`` instead of
        gathering it: the plan splits its vocabulary over tp and its hidden dim over fsdp, and fsdp != tp
        (equal, XLA permutes the shard: see ``activation_terms``)."""
        tp, fsdp = mesh.get("tp", 1), mesh.get("fsdp", 1)
        if self.req.recipe.compiler != "tpu" or self.embed_group is None or tp == 1 or fsdp in (1, tp):
            return False
        found = self._embed_split.get(plan_key)
        if found is None:
            g = self.embed_group
            shape, entries = self.groups.infos[g].shape, tuple(plan.specs[g])
            entries += (None,) * (len(shape) - len(entries))
            named = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in entries]
            v = 0 if shape[0] == self.dims.vocab else 1
            found = self._embed_split[plan_key] = (len(shape) == 2 and "tp" in named[v] and "fsdp" in named[1 - v]
                                                   and not plan.traffic.tied)
        return found

    def _token_axes(self, plan_key: PlanKey, plan: PlanEval, mesh: Mapping[str, int], micro_batches: int
                    ) -> tuple[str, ...]:
        """See :meth:`_gathered_axes`: the experts' storage axes where XLA:TPU gathers the dispatched tokens."""
        model, recipe = self.model, self.req.recipe
        if (not self.expert_groups or recipe.remat not in TOKEN_REMATS or mesh.get("ep", 1) > 1
                or mesh.get("tp", 1) > 1):
            return ()
        if plan_key not in self._expert_axes:
            self._expert_axes[plan_key] = self._expert_split(plan)
        axes = self._expert_axes[plan_key]
        if not axes:
            return ()
        if math.prod(mesh.get(a, 1) for a in axes) == 1:
            return ()
        return axes if gathers_tokens(batch=self.req.batch // micro_batches, seq=self.req.seq,
                                      top_k=model.num_experts_per_tok, experts=model.num_experts,
                                      width=model.moe_intermediate_size, moe_dispatch=recipe.moe_dispatch,
                                      capacity_factor=recipe.capacity_factor) else ()

    def _expert_split(self, plan: PlanEval) -> tuple[str, ...] | None:
        """The batch axes every routed expert's leaf splits its intermediate dim over, and no other dim
        (``None`` when the leaves differ or split another dim, or another axis)."""
        width, found = self.model.moe_intermediate_size, None
        for g in self.expert_groups:
            shape, entries = self.groups.infos[g].shape, tuple(plan.specs[g])
            axes: tuple[str, ...] = ()
            for d, entry in zip(shape, entries + (None,) * (len(shape) - len(entries)), strict=True):
                named = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
                if named and (d != width or any(a not in BATCH_AXES for a in named)):
                    return None
                axes += named
            if found is not None and axes != found:
                return None
            found = axes
        return found

    def _hidden_axes(self, plan_key: PlanKey, plan: PlanEval, mesh: Mapping[str, int], micro_batches: int
                     ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """See :meth:`_gathered_axes`: the head's and the embedding's (untied tables only)."""
        if plan.traffic.tied:
            return (), ()
        axes = self._vocab_axes.get(plan_key)
        if axes is None:
            head_axes, embed_axes = (
                () if g is None else vocab_batch_axes(plan.specs[g], self.groups.infos[g].shape, vocab=self.dims.vocab)
                for g in (self.head_group, self.embed_group))
            axes = self._vocab_axes[plan_key] = (head_axes, embed_axes)
        head_axes, embed_axes = axes
        if not head_axes and not embed_axes:
            return (), ()
        # The batch's tokens per micro-batch against the vocabulary (the loss in vocab_tiles chunks).
        tokens = self.req.batch * self.req.seq / micro_batches
        out = []
        for g, found, t in ((self.head_group, head_axes, tokens / self.req.recipe.vocab_tiles),
                            (self.embed_group, embed_axes, tokens)):
            layout = None if g is None or not found else head_layout(plan.specs[g], self.groups.infos[g].shape,
                                                                     mesh, vocab=self.dims.vocab)
            out.append(found if gathers_hidden(layout, tokens=t, vocab=self.dims.vocab) else ())
        return out[0], out[1]
