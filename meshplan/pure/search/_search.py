"""Mesh search: how should this model be laid out on that cluster, and will it fit?

:func:`search_meshes` enumerates every way to factor the cluster's device
count over the mesh axes (``dp, fsdp, ep, sp, tp``, outermost first; pipeline
parallelism is not modelled), prices each mesh and ranks those that fit.

1. **Prune per axis** before combining: ``tp`` must divide the attention
   heads and (by default) stay inside one ICI domain; ``ep`` must divide the
   expert count (and is 1 for dense models); ``sp`` must divide the sequence;
   batch axes must divide the batch; a user's fixed sizes are kept as given.
   Each excluded value is reported with the number of meshes it removes.
2. **Combine** the surviving values into meshes multiplying to the device
   count; the batch axes together must divide the batch.
3. **Place the DCN split** in bandwidth order: dp takes as many ICI domains
   as it can (``gcd(dp, domains)``), then fsdp, ep, sp; never tp (or ep) when
   it must stay inside a domain. This is the lexicographic walk (b) of
   :func:`~meshplan.pure.split_over_granules`, without its rule (a) (one axis
   takes every domain when it can), which would put fsdp or ep across nodes
   while dp stays inside. A mesh whose domains cannot all be placed is
   rejected. The result carries the DCN shape, so
   ``create_mesh(axis_dims, axis_names, dcn_mesh_dims=dcn_shape)`` rebuilds it.
4. **Plan** the parameters with the rule (default
   :class:`~meshplan.pure.AxisKindRule`), once per distinct sizes
   of the axes the rule reads (see :mod:`meshplan.pure.search._groups`), and
   count params, grads and optimizer copies per device exactly; price the
   step's peak (:mod:`meshplan.pure.cost._step_memory`: phases priced for the
   ``recipe``, activations calibrated); reject meshes above the budget
   (``hbm * (1 - headroom)``). A mesh with a weight axis (fsdp, ep, tp) of
   size > 1 that splits no parameter is rejected with the rule's reason for
   the largest such leaf: it would only replicate while paying the axis's
   collectives, and must never be ranked silently.
5. **Price** a training step's collectives (:mod:`meshplan.pure.cost._step_collectives`)
   and its compute (:mod:`meshplan.pure.cost._flops`; an FP8 recipe's weight matmuls at the FP8
   peak, :mod:`meshplan.pure.cost._matmul_dtype`), overlap them
   (:mod:`meshplan.pure.cost._step_time`) and rank by predicted step time
   (``rank="comm"``: by communication seconds alone), then by memory, then by
   the axis sizes (a total, deterministic order). Only meshes that can be
   shown are priced: fitting ones in the order of their step with no
   collectives until that floor exceeds the ``top_k``-th best step, and the
   over-budget ones that can be among the ``top_k`` leanest; the rest are counted.

If nothing fits, :class:`~meshplan.pure.PlanError` says by how much the
leanest mesh misses and which larger cluster of the same devices would fit.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from meshplan.pure._check import as_count, as_flag, as_int, as_real, as_sequence, as_str
from meshplan.pure._format import fmt_bytes
from meshplan.pure._types import PyTree
from meshplan.pure.errors import ClusterError, MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec, build_params, get_preset
from meshplan.pure.rules._axis_kind import AxisKindRule
from meshplan.pure.rules._base import Rule, reads_axes, rule_name
from meshplan.pure.rules._check_tree import check_rule
from meshplan.pure.cost._estimates import MemoryBreakdown, StepEstimate
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.cluster._cluster import Cluster, parse_cluster
from meshplan.pure.cluster._devices import DEVICE_SPECS
from meshplan.pure.cost._gathered_operand import gathers_hidden, gathers_tokens, vocab_batch_axes
from meshplan.pure.search._groups import (
    LeafGroups,
    PlanEval,
    Planner,
    param_groups,
    state_bytes,
)
from meshplan.pure.search._result import Rejection, SearchRequest, SearchResult
from meshplan.pure.search._space import (
    axis_problem,
    batch_problem,
    combinations,
    divisors,
    mesh_count,
    mesh_text,
    num_factorizations,
    Placer,
    unit,
)
from meshplan.pure.cost._recipe import OPTIMIZER_COPIES, TrainingRecipe
from meshplan.pure.cost._step_collectives import (
    AXIS_ORDER,
    BATCH_AXES,
    AxisPlacement,
    ParamTables,
    Pending,
    TOKEN_REMATS,
    activation_terms,
    expert_token_terms,
    hidden_state_terms,
    param_tables,
    price,
    step_activations,
    table_terms,
    to_terms,
    whole_slice_sums,
)
from meshplan.pure.cost._step_memory import (
    CALIBRATIONS,
    ActivationParts,
    HeadLayout,
    StepMemory,
    activation_floor,
    activation_parts,
    calibration_key,
    head_layout,
    layer_dims,
    price_state,
)
from meshplan.pure.cluster._topology import tpu_topology
from meshplan.pure.cost._flops import StepFlops, default_efficiency, fsdp_read, step_flops
from meshplan.pure.cost._matmul_dtype import fp8_peak
from meshplan.pure.cost._step_time import StepTime, accumulate, overlap_class, step_seconds, step_time
from meshplan.pure.specs._dtypes import canonical_dtype, dtype_storage_bytes
from meshplan.pure.specs._geometry import spec_axes
from meshplan.pure.specs._training import TrainingState
from meshplan.pure.specs._tree import tree_facts

__all__ = ["WEIGHT_AXES", "search_meshes"]

WEIGHT_AXES: tuple[str, ...] = ("fsdp", "ep", "tp")
"""Axes that exist to split parameters: a mesh where one of size > 1 splits none is rejected.
(dp and sp split the batch and the sequence, never weights.)"""

_SCALES = (2, 4, 8, 16, 32, 64)
# A mesh is skipped when a lower bound of its step is above the top_k-th best times this: the bound and the
# step sum the same floats in different groupings, so a hair of slack keeps float rounding from ever
# skipping a mesh that ties.
_SLACK = 1 + 1e-9


@dataclasses.dataclass(slots=True)
class _Scored:
    sizes: tuple[int, ...]
    plan_key: tuple[Any, ...]
    memory: MemoryBreakdown
    micro_batches: int = 1  # gradient-accumulation steps (chosen per mesh or fixed)
    # Both set when priced (_price_steps): most meshes are never priced.
    placement: AxisPlacement | None = None
    pending: Sequence[Pending] = ()
    seconds: Any = 0.0  # filled in by one vectorized pricing pass over every mesh
    # Compute + exposed communication, from the same pass: the step ranked (step_seconds), and its
    # whole StepTime (a record per collective term) only for the meshes shown (_Search.timed).
    step_s: float = 0.0
    time: StepTime | None = None
    # Seconds of each pending collective, from that pass (numpy's elementwise arithmetic gives each
    # the same value whatever else is priced with it, so candidates reuse them).
    term_seconds: Sequence[float] = ()
    # Its activation collectives and their seconds, when priced before the rest (_critical_steps).
    activations: list[Pending] | None = None
    activation_seconds: Sequence[float] = ()


def _v5p_slice_chips(cluster: Cluster) -> int | None:
    """The chips of one slice of a v5p ``cluster`` whose chip grid spans all three dims (2x2x2 and up), else
    None (see :func:`~meshplan.pure.cost._step_collectives.whole_slice_sums`)."""
    if cluster.device.name != "v5p":
        return None
    try:
        topology = tpu_topology(cluster)
    except ClusterError:  # a slice size with no TPU shape: nothing read
        return None
    return topology.chips_per_slice if len(topology.grid) == 3 and min(topology.grid) >= 2 else None


def _no_detail() -> str:
    return ""


def _text(names: tuple[str, ...], sizes: tuple[int, ...]) -> str:
    return mesh_text(dict(zip(names, sizes, strict=True)))


class _Search:
    """One search: the canonical request, the leaf groups and the plan cache."""

    def __init__(self, req: SearchRequest, model: ModelSpec, groups: LeafGroups, rule: Rule) -> None:
        self.req, self.model, self.rule = req, model, rule
        self.groups = groups  # built once per tree and rule (the larger clusters' searches reuse them)
        self.reads = reads_axes(rule)
        self.plans: dict[tuple[Any, ...], PlanEval] = {}
        self.act_itemsize = dtype_storage_bytes(canonical_dtype(req.param_dtype)) if req.param_dtype != "mixed" else 2
        # req.optimizer_copies counts the master weights among the copies; they are fp32 whatever the
        # moments' dtype (a bf16-moment optimizer's master copy is 4 bytes, not 2).
        master = int(req.recipe.master_weights)
        self.state = TrainingState(None if req.grad_dtype == "param" else canonical_dtype(req.grad_dtype),
                                   canonical_dtype(req.optimizer_dtype), req.optimizer_copies - master,
                                   master_copies=master)
        self.state_total = state_bytes(self.groups, self.state)
        self.planner = Planner(self.groups, rule, state=self.state)
        self.dims = layer_dims(model)
        # The output head's group (the embedding when tied) and the input embedding's: how a plan splits
        # them decides what XLA gathers for the loss and the lookup (meshplan.pure.cost._gathered_operand); None
        # when the tree names none. The memory model reads the head's where its calibration does
        # (Calibration.loss_gather), the comm model both on XLA:TPU.
        self.head_group, self.embed_group = (next((g for g, first in enumerate(groups.first)
                                                   if groups.roles.get(first) == role
                                                   and self.dims.vocab in groups.infos[g].shape), None)
                                             for role in ("head", "embed"))
        self.loss_gather = CALIBRATIONS[calibration_key(req.recipe)].loss_gather
        # plan key -> the batch axes its (head, embedding) vocabulary is split over (see _gathered_axes)
        self.vocab_axes: dict[tuple[Any, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}
        # The routed experts' groups, and per plan key the batch axes their intermediate dim is split over
        # (None: split otherwise; see _gathered_axes).
        self.expert_groups = tuple(g for g, first in enumerate(groups.first) if groups.roles.get(first) == "experts")
        self.expert_axes: dict[tuple[Any, ...], tuple[str, ...] | None] = {}
        self.embed_split: dict[tuple[Any, ...], bool] = {}  # plan key -> vocabulary over tp, hidden over fsdp
        # Chips of one v5p slice whose grid spans all three dims (XLA:TPU all-reduces gradient sums over it
        # whole: whole_slice_sums); None elsewhere.
        self.slice_chips = _v5p_slice_chips(req.cluster) if req.recipe.compiler == "tpu" else None
        self.head_axes: dict[tuple[Any, ...], tuple[str, ...]] = {}  # plan key -> the axes of its head's spec
        self.heads: dict[tuple[Any, ...], HeadLayout] = {}  # see _head
        # The bound-pruned meshes and their bounds (two lists: ~700 pairs would be as many more objects).
        self.bounded: list[tuple[int, ...]] = []
        self.bounded_at: list[float] = []
        self.placer = Placer(req.axes, req)
        # The FLOPs per device depend on the mesh through its device count, tp, dp and fsdp alone, fsdp
        # only where it divides tp (tests/pure/search/test_search.py and tests/pure/cost/test_flops.py hold step_flops to
        # that): cached by (tp, dp, fsdp_read(model, tp, fsdp)).
        self.flops: dict[tuple[int, int, int], StepFlops] = {}
        self.floors_s: dict[tuple[int, int, int], float] = {}  # the same key -> the step with no collectives
        self.tp_index = req.axes.index("tp") if "tp" in req.axes else None
        self.dp_index = req.axes.index("dp") if "dp" in req.axes else None
        self.fsdp_index = req.axes.index("fsdp") if "fsdp" in req.axes else None
        self.sp_index = req.axes.index("sp") if "sp" in req.axes else None
        self.batch_index = tuple(i for i, a in enumerate(req.axes) if a in BATCH_AXES)
        # Positions of the rule's axes among the mesh's (an axis the mesh lacks has size 1).
        self.reads_index = None if self.reads is None else tuple(
            req.axes.index(a) for a in self.reads if a in req.axes)
        self.rejected: dict[str, list[Any]] = {}  # kind -> [meshes, the first one's detail]
        self.budget = req.budget  # a property of properties, read several times per mesh
        device = req.cluster.device
        self.efficiency = (default_efficiency(device.ici_scope, model.hidden_size) if req.efficiency is None
                           else req.efficiency)
        # The FP8 peak the weight matmuls run at (None: bf16; search_meshes refused a device without one).
        self.fp8_peak = fp8_peak(device, req.recipe.matmul_dtype)
        self.recipes: dict[int, TrainingRecipe] = {req.recipe.micro_batches: req.recipe}
        # (tp, sp, dp*fsdp*ep, micro-batches) -> the activation floor: price_step reads the mesh only
        # through those, and a 4096-device search bounds ~1000 meshes with a few dozen distinct keys.
        self.floors: dict[tuple[int, int, int, int], int] = {}
        # The same key and the head's layout -> activation_parts.
        self.parts: dict[tuple[int, int, int, int, HeadLayout | None], ActivationParts] = {}
        self.micro_counts: dict[int, list[int]] = {}  # per-replica batch -> counts (asked twice per mesh)
        # plan key -> param_tables of its plan: ~190 meshes listed have ~70 plans (DeepSeek-V3 on 4096 GPUs).
        self.tables: dict[tuple[Any, ...], ParamTables] = {}

    def recipe(self, micro_batches: int) -> TrainingRecipe:
        """The request's recipe with ``micro_batches`` accumulation steps."""
        found = self.recipes.get(micro_batches)
        if found is None:
            found = self.recipes[micro_batches] = dataclasses.replace(self.req.recipe, micro_batches=micro_batches)
        return found

    def _counts(self, per_replica: int) -> list[int]:
        """Micro-batch counts to try on a mesh with this per-replica batch (``batch / (dp*fsdp*ep)``), fewest
        first: its divisors (``request.choose_micro_batches``), else the recipe's count when it divides
        (else none)."""
        found = self.micro_counts.get(per_replica)
        if found is None:
            m = self.req.recipe.micro_batches
            found = self.micro_counts[per_replica] = (divisors(per_replica) if self.req.choose_micro_batches
                                                      else [m] if per_replica % m == 0 else [])
        return found

    def _flops_key(self, s: _Scored) -> tuple[int, int, int]:
        tp = s.sizes[self.tp_index] if self.tp_index is not None else 1
        return (tp, s.sizes[self.dp_index] if self.dp_index is not None else 1,
                fsdp_read(self.model, tp, s.sizes[self.fsdp_index]) if self.fsdp_index is not None else 1)

    def _flops(self, s: _Scored) -> StepFlops:
        """The step's FLOPs on ``s``'s mesh (see ``self.flops``)."""
        key = self._flops_key(s)
        found = self.flops.get(key)
        if found is None:
            req = self.req
            found = self.flops[key] = step_flops(self.model, dict(zip(req.axes, s.sizes, strict=True)),
                                                 batch=req.batch, seq=req.seq, remat=req.recipe.remat,
                                                 attention=req.recipe.attention,
                                                 moe_dispatch=req.recipe.moe_dispatch)
        return found

    def timed(self, s: _Scored) -> StepTime:
        """Compute + exposed communication of one priced mesh, per collective too (kept on ``s``)."""
        if s.time is None:
            req = self.req
            terms = [(p[0], p[1], float(t)) for p, t in zip(s.pending, s.term_seconds, strict=True)]
            s.time = step_time(self._flops(s), terms, layers=max(self.model.num_layers, 1),
                               tokens=req.batch * req.seq, devices=req.cluster.num_devices,
                               peak_flops=req.cluster.device.peak_bf16_flops, efficiency=self.efficiency,
                               fp8_peak_flops=self.fp8_peak)
        return s.time

    def _step_seconds(self, s: _Scored, terms: Sequence[Pending], seconds: Sequence[float]) -> float:
        """``timed(s).step_s`` of ``s`` with these collectives and their seconds, without the records."""
        return step_seconds(self._flops(s), terms, seconds, layers=max(self.model.num_layers, 1),
                            peak_flops=self.req.cluster.device.peak_bf16_flops, efficiency=self.efficiency,
                            fp8_peak_flops=self.fp8_peak)

    def plan(self, sizes: dict[str, int]) -> tuple[tuple[Any, ...], PlanEval]:
        key = tuple(sizes.items()) if self.reads is None else tuple([sizes.get(a, 1) for a in self.reads])
        found = self.plans.get(key)
        if found is None:
            found = self.plans[key] = self.planner(sizes)
        return key, found

    def run(self) -> tuple[list[_Scored], list[_Scored], list[Rejection], int, int]:
        """Price every mesh: (the fitting meshes that can rank in the ``top_k``, priced; the over-budget
        ones that can be among the ``top_k`` leanest, priced; rejections; meshes enumerated; meshes
        that fit)."""
        req, names = self.req, self.req.axes
        n = req.cluster.num_devices
        fixed = dict(req.fixed)
        rejections: list[Rejection] = []
        values: list[list[int]] = []
        for axis in names:
            keep = []
            for v in ([fixed[axis]] if axis in fixed else divisors(n)):
                why = axis_problem(axis, v, req, self.model)
                if why is None:
                    keep.append(v)
                else:
                    rejections.append(Rejection(axis, num_factorizations(n // v, len(names) - 1), why))
            values.append(keep)
        combos = combinations(values, n)
        fits: list[_Scored] = []
        over: list[_Scored] = []
        counts = self.rejected
        for sizes in combos:
            kind, detail = self._score(names, sizes, fits, over)
            if kind:
                found = counts.get(kind)
                if found is None:  # the first rejection of each kind is the example: only it is written out
                    counts[kind] = [1, detail()]
                else:
                    found[0] += 1
        for kind in ("batch", "dcn", "rule", "idle", "memory"):
            if kind in counts:
                rejections.append(Rejection(kind, counts[kind][0], counts[kind][1]))
        self._fill_leanest(over)
        over = self._leanest(over)
        return self._contenders(fits, over), over, rejections, len(combos), len(fits)

    def _place(self, s: _Scored) -> AxisPlacement:
        """``s``'s :class:`AxisPlacement`, made when first needed (most meshes are never priced)."""
        if s.placement is None:
            dcn = self.placer.split(s.sizes)
            assert dcn is not None  # its domains were placed before it was scored
            s.placement = self.placer.placement(s.sizes, dcn)
        return s.placement

    def _price_steps(self, scored: list[_Scored]) -> None:
        """List and price the collectives of ``scored`` (one vectorized pass) and their step times."""
        self._pass(scored, [])

    def _pass(self, whole: list[_Scored], bound: list[_Scored], floors: Sequence[float] = ()) -> list[float]:
        """One vectorized pricing pass (its numpy set-up costs as much as a few hundred collectives): the
        step times of ``whole`` (their activation collectives priced by an earlier pass are taken as they
        are), and of ``bound`` (whose :meth:`_floor` are ``floors``) the activation collectives, kept on
        each mesh with their seconds, and the step with its critical-path ones alone (see
        :meth:`_contenders`), returned."""
        lists = []  # per mesh, the collectives priced here: whole, then bound
        for s in whole:
            placement = self._place(s)
            terms = self._param_pending(s, placement)
            if s.activations is None:
                terms += self._activation_pending(s, placement)
            lists.append(terms)
        for s in bound:
            acts = s.activations = self._activation_pending(s, self._place(s))
            lists.append(acts)
        seconds = price([p for terms in lists for p in terms], self.req.cluster).tolist()  # Python floats
        start = 0
        for s, terms in zip(whole, lists[:len(whole)], strict=True):
            stop = start + len(terms)
            if s.activations is None:
                s.pending, s.term_seconds = terms, seconds[start:stop]
            else:
                # numpy's elementwise arithmetic gives a term the same seconds whatever is priced with it.
                s.pending, s.term_seconds = terms + s.activations, seconds[start:stop] + s.activation_seconds
            s.step_s = self._step_seconds(s, s.pending, s.term_seconds)
            # Summed in term order with Python floats: identical on every platform and run.
            s.seconds = float(sum(s.term_seconds))
            start = stop
        steps = []
        for s, terms, floor in zip(bound, lists[len(whole):], floors, strict=True):
            stop = start + len(terms)
            s.activation_seconds = seconds[start:stop]
            # The step with these alone: its compute, and the critical ones exposed whole (_step_time).
            steps.append(floor + sum(t for p, t in zip(terms, s.activation_seconds, strict=True)
                                     if overlap_class(p[0], p[1]) == "critical"))
            start = stop
        return steps

    def _contenders(self, fits: list[_Scored], over: list[_Scored]) -> list[_Scored]:
        """The fitting meshes that can rank in the ``top_k``, priced; the others are only counted. The
        over-budget meshes ``over`` (all shown) are priced in the first pass.

        Ranked by step time, no mesh's step is faster than its step with no collectives (its
        compute, :meth:`_floor`; a test holds step_time to that), nor than its *critical step*, its
        step with its critical-path collectives alone (tp / sp activation collectives, ep
        all-to-alls: :func:`~meshplan.pure.cost._step_time.overlap_class`; nothing hides those,
        and the others only add exposed seconds >= 0 to the same compute; a test holds the bound).
        The ``top_k`` least floors are priced first, for a ``top_k``-th best step to cut at; then
        each pass gives the next floors not above that step (in floor order: ``top_k``, then twice
        as many, and so on) their critical step, listing and pricing only their activation
        collectives (the cheaper half), and prices whole the meshes bounded so far with the least
        critical steps not above it (``top_k``, then twice as many, ...): one vectorized pass for
        both, whose numpy set-up costs as much as a few hundred collectives. It ends when every
        mesh left has a floor or a critical step, so a step, strictly above the ``top_k``-th best
        step, which can only fall: none can rank. For Mixtral on 4096 GPUs the 505 of 685 fitting
        meshes with tp > 1 (whose replicated work alone outlasts the best steps) were listed,
        priced and timed for nothing; the critical steps then spare the parameter collectives of
        about half the rest (on 4096 GPUs, priced whole: DeepSeek-V3 93 of the 184 meshes whose
        floor passes, Mixtral 101 of 180, Llama-3-8B 43 of 277, Llama-3-70B 21 of 162; GPT-2, whose
        steps are mostly parameter collectives, 199 of 227). Ranked by communication, every mesh is
        priced.
        """
        k = self.req.top_k
        if self.req.rank_by != "time" or len(fits) <= k:
            self._price_steps(fits + over)
            return fits
        floor = [self._floor(s) for s in fits]
        order = sorted(range(len(fits)), key=lambda i: (floor[i], fits[i].sizes))
        floors = [floor[i] for i in order]  # ascending
        # The least floors priced whole (a k-th best step to cut at), the next ones bounded.
        priced, bound = [fits[i] for i in order[:k]], [fits[i] for i in order[k:3 * k]]
        steps = self._pass(priced + over, bound, floors[k:3 * k])
        best = sorted(s.step_s for s in priced)  # the k least step times priced so far, ascending
        # Bounded meshes not yet priced whose critical step can still rank: (critical step, sizes, mesh).
        waiting: list[tuple[float, tuple[int, ...], _Scored]] = []
        start, size, batch = 3 * k, 4 * k, k
        while True:
            bar = best[-1] * _SLACK
            for s, t in zip(bound, steps, strict=True):
                if t <= bar:
                    heapq.heappush(waiting, (t, s.sizes, s))
            # Each pass bounds the next floors that can still rank and prices the least waiting.
            stop = bisect.bisect_right(floors, bar, lo=start, hi=min(start + size, len(floors)))
            bound = [fits[i] for i in order[start:stop]]
            chunk: list[_Scored] = []
            while waiting and waiting[0][0] <= bar and len(chunk) < batch:
                chunk.append(heapq.heappop(waiting)[2])
            if not chunk and not bound:
                return priced
            steps = self._pass(chunk, bound, floors[start:stop])
            priced += chunk
            best = sorted(best + [s.step_s for s in chunk])[:k]
            if bound:
                start, size = stop, 2 * size
            if chunk:
                batch *= 2

    def _floor(self, s: _Scored) -> float:
        """``s``'s step with no collectives (its compute), which reads the mesh only through its FLOPs."""
        key = self._flops_key(s)
        found = self.floors_s.get(key)
        if found is None:
            found = self.floors_s[key] = self._step_seconds(s, (), ())
        return found

    def _score(self, names: tuple[str, ...], sizes: tuple[int, ...], fits: list[_Scored],
               over: list[_Scored]) -> tuple[str, Callable[[], str]]:
        """Reject or price one mesh: ``(kind, detail)``, the detail written only when asked (the first of its kind
        becomes the rejection's example; formatting every one cost more than pricing). Most of ~1300 meshes
        stop here: their sizes are read by index, and a mesh dict and a detail closure are made only when
        used (fewer objects, fewer garbage collections)."""
        req = self.req
        ways = 1
        for i in self.batch_index:
            ways *= sizes[i]
        if req.batch % ways:
            return "batch", _no_detail if "batch" in self.rejected else (
                lambda: f"{_text(names, sizes)}: dp*fsdp*ep={ways} does not divide batch={req.batch}")
        counts = self._counts(req.batch // ways)
        if not counts:
            return "batch", _no_detail if "batch" in self.rejected else (
                lambda: (f"{_text(names, sizes)}: micro_batches={req.recipe.micro_batches} does not divide "
                         f"the per-replica batch {req.batch // ways} (batch / dp*fsdp*ep)"))
        dcn = self.placer.split(sizes)
        if dcn is None:
            where = unit(req.cluster)
            return "dcn", _no_detail if "dcn" in self.rejected else (
                lambda: (f"{_text(names, sizes)}: the {req.cluster.num_ici_domains} {where}s cannot all be "
                         f"spread over the axes allowed across {where}s (tp/ep kept inside a {where})"))
        budget = self.budget
        state = self._state_bound_of(sizes)
        tp = 1 if self.tp_index is None else sizes[self.tp_index]
        sp = 1 if self.sp_index is None else sizes[self.sp_index]
        bound = self._lower_bound(state, tp, sp, ways, counts[0])
        over_at_fewest = bound > budget
        if bound > budget and len(counts) > 1 and state <= budget:
            # More micro-batches shrink the activations (not the state): the bound at the most of them decides.
            bound = self._lower_bound(state, tp, sp, ways, counts[-1])
        if bound > budget:
            # Every leaf shards over at most the axes the rule reads, so no plan can beat this. An
            # over-budget mesh is shown at its leanest (the most micro-batches): _fill_leanest orders
            # by the bound there (the bound at the fewest is no bound of that total).
            self.bounded_at.append(self._lower_bound(state, tp, sp, ways, counts[-1]))
            self.bounded.append(sizes)
            return "memory", _no_detail if "memory" in self.rejected else (
                lambda: f"{_text(names, sizes)}: >= {fmt_bytes(bound)}/device > {fmt_bytes(req.budget)} budget")
        return self._exact(dict(zip(names, sizes, strict=True)), sizes, fits, over, ways=ways, counts=counts,
                           over_at_fewest=over_at_fewest)

    def _state_bound_of(self, sizes: tuple[int, ...]) -> float:
        """Params + grads + optimizer per device can be no less than this (every leaf split over the rule's
        axes), on the mesh with these sizes (mesh order)."""
        if self.reads_index is None:
            return 0.0
        split = 1
        for i in self.reads_index:
            split *= sizes[i]
        return self.state_total / split

    def _lower_bound(self, state: float, tp: int, sp: int, ways: int, micro_batches: int) -> float:
        """:func:`~meshplan.pure.cost._step_memory.lower_bound` of a mesh with this :meth:`_state_bound_of`, tp, sp and
        dp*fsdp*ep, its activation floor cached by what it reads."""
        if self.reads is None:
            return 0.0
        if not self.req.activations:
            return state
        return state + self._activation_floor(tp, sp, ways, micro_batches)

    def _activation_floor(self, tp: int, sp: int, ways: int, micro_batches: int) -> int:
        """:func:`~meshplan.pure.cost._step_memory.activation_floor` on a mesh with this tp, sp and
        dp*fsdp*ep, cached by what it reads (the step's activations, so only when they are priced)."""
        key = (tp, sp, ways, micro_batches)
        floor = self.floors.get(key)
        if floor is None:
            floor = self.floors[key] = activation_floor(self._price(key, 0, 0, 0, 0))
        return floor

    def _over_at(self, state: int, tp: int, sp: int, ways: int, micro_batches: int) -> bool:
        """Whether a plan whose params + grads + optimizer are ``state`` bytes is over the budget at this
        many micro-batches, known without pricing its peak: the backward phase holds that state and the
        activation floor at least (the peak is no less; a test holds lower_bound below the peak)."""
        return self.req.activations and state + self._activation_floor(tp, sp, ways, micro_batches) > self.budget

    def _price(self, key: tuple[int, int, int, int], params: int, grads: int, optimizer: int,
               gathered: int, head: HeadLayout | None = None) -> StepMemory:
        """:func:`~meshplan.pure.cost._step_memory.step_memory` without re-checking what the search built."""
        recipe = self.recipe(key[3])
        parts = self.parts.get((*key, head))
        if parts is None:  # what the peak reads of the mesh: ~1000 peaks of a search have ~100 distinct ones
            tp, sp, ways, _ = key
            parts = self.parts[(*key, head)] = activation_parts(self.dims, recipe, tp=tp, sp=sp, ways=ways,
                                                                batch=self.req.batch, seq=self.req.seq, head=head)
        return price_state(self.dims, recipe, parts, params=params, grads=grads, optimizer=optimizer,
                           gathered=gathered)

    def _exact(self, mesh: dict[str, int], sizes: tuple[int, ...], fits: list[_Scored], over: list[_Scored], *,
               ways: int, counts: list[int], over_at_fewest: bool = False) -> tuple[str, Callable[[], str]]:
        """Plan and fit one mesh (its dp*fsdp*ep is ``ways``, its micro-batch counts to try ``counts``);
        ``over_at_fewest``: its memory bound at the fewest micro-batches is over the budget (so is its
        peak there, which is then not priced)."""
        req = self.req
        key, plan = self.plan(mesh)
        if plan.error is not None:
            error = plan.error
            return "rule", _no_detail if "rule" in self.rejected else (lambda: f"{mesh_text(mesh)}: {error}")
        idle = [a for a in WEIGHT_AXES if mesh.get(a, 1) > 1 and a not in plan.axes_used]
        if idle:  # written out only for the example: it reads the plan's reasons
            return "idle", _no_detail if "idle" in self.rejected else (
                lambda: f"{mesh_text(mesh)}: {self._idle(mesh, plan, idle)}")
        m = counts[0]
        # What the step's peak reads of the mesh, once for every micro-batch count tried.
        gathered = sum(nbytes for axes, nbytes in plan.gather if any(mesh.get(x, 1) > 1 for x in axes))
        head = None if self.head_group is None or not self.loss_gather else self._head(key, plan, mesh)
        tp, sp = mesh.get("tp", 1), mesh.get("sp", 1)
        state = plan.param_bytes + plan.grad_bytes + plan.optimizer_bytes
        # A count the plan is over the budget at (its bound says so) is not priced when another is tried
        # anyway: pricing it would say "does not fit" and change nothing.
        memory = (None if len(counts) > 1 and (over_at_fewest or self._over_at(state, tp, sp, ways, m))
                  else self._memory(plan, gathered, tp, sp, ways, m, head))
        if memory is None or (not memory.fits and len(counts) > 1):
            # The fewest micro-batches that fit: check the most first (the leanest; a mesh that fits at none is
            # reported there), then bisect: from 2 on, the peak only falls as the count grows (the activations
            # shrink, the fp32 accumulator stays).
            m, memory = counts[-1], self._memory(plan, gathered, tp, sp, ways, counts[-1], head)
            lo, hi = 1, len(counts) - 1  # counts[hi] fits; find the first that does in counts[lo:hi + 1]
            while memory.fits and lo < hi:
                mid = (lo + hi) // 2
                if self._over_at(state, tp, sp, ways, counts[mid]):
                    lo = mid + 1
                    continue
                trial = self._memory(plan, gathered, tp, sp, ways, counts[mid], head)
                if trial.fits:
                    hi, m, memory = mid, counts[mid], trial
                else:
                    lo = mid + 1
        scored = _Scored(sizes, key, memory, m)  # collectives listed if it can rank (_contenders)
        if memory.fits:
            fits.append(scored)
            return "", _no_detail
        over.append(scored)  # its collectives are listed only if it is among the leanest (see _leanest)
        return "memory", _no_detail if "memory" in self.rejected else (
            lambda: f"{mesh_text(mesh)}: {fmt_bytes(memory.total)}/device > {fmt_bytes(req.budget)} budget")

    def _head(self, key: tuple[Any, ...], plan: PlanEval, mesh: dict[str, int]) -> HeadLayout:
        """:func:`~meshplan.pure.cost._step_memory.head_layout` of the plan's head group on this mesh, which
        reads the mesh only through the sizes of the axes the head's spec uses: memoized by the plan (``key``)
        and those sizes (a 4096-device search asks ~600 meshes of ~200 plans)."""
        g = self.head_group
        assert g is not None  # asked only when the tree has a head
        axes = self.head_axes.get(key)
        if axes is None:
            axes = self.head_axes[key] = spec_axes(plan.specs[g])
        memo = (key, tuple([mesh.get(a, 1) for a in axes]))
        found = self.heads.get(memo)
        if found is None:
            found = self.heads[memo] = head_layout(plan.specs[g], self.groups.infos[g].shape, mesh,
                                                   vocab=self.dims.vocab)
        return found

    def _param_pending(self, s: _Scored, placement: AxisPlacement) -> list[Pending]:
        """The parameter collectives of one step on ``s``'s mesh (placed so), with its micro-batches, not yet
        priced: a step's collectives are these, then :meth:`_activation_pending`'s."""
        mesh = dict(zip(self.req.axes, s.sizes, strict=True))
        recipe = self.req.recipe
        head_axes, embed_axes, expert_axes = self._gathered_axes(s, mesh)
        # param_terms, its mesh-independent half once per plan (and which operands XLA gathers).
        on_shard = self._embed_on_shard(s, mesh)
        memo = (s.plan_key, bool(head_axes), bool(embed_axes), bool(expert_axes), on_shard)
        tables = self.tables.get(memo)
        if tables is None:
            tables = self.tables[memo] = param_tables(self.plans[s.plan_key].traffic, self.req.axes,
                                                      backend=recipe.compiler, remat=recipe.remat,
                                                      hidden_head=bool(head_axes), hidden_embed=bool(embed_axes),
                                                      tokens_experts=bool(expert_axes), embed_on_shard=on_shard)
        pending = table_terms(tables, placement, mesh, layers=max(self.model.num_layers, 1))
        if head_axes or embed_axes:
            pending += hidden_state_terms(self.model, mesh, placement, batch=self.req.batch, seq=self.req.seq,
                                          itemsize=self.act_itemsize, head_axes=head_axes, embed_axes=embed_axes)
        if expert_axes:
            pending += expert_token_terms(self.model, mesh, placement, batch=self.req.batch, seq=self.req.seq,
                                          itemsize=self.act_itemsize, axes=expert_axes, remat=recipe.remat,
                                          moe_dispatch=recipe.moe_dispatch)
        if self.slice_chips is not None:
            pending = whole_slice_sums(pending, mesh, chips=self.slice_chips)
        return accumulate(pending, s.micro_batches, backend=recipe.compiler)

    def _gathered_axes(self, s: _Scored, mesh: dict[str, int]
                       ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The batch axes over which XLA:TPU gathers, on ``s``'s mesh, the hidden states for the output head
        and for the input embedding instead of their tables, and the dispatched tokens instead of the routed
        experts' weights (``()``: it gathers the weights; see :mod:`meshplan.pure.cost._gathered_operand`).
        Other compilers were not read; nor tied tables, nor experts beside ep or tp or under remat dots."""
        if self.req.recipe.compiler != "tpu":
            return (), (), ()
        plan = self.plans[s.plan_key]
        head_axes, embed_axes = self._hidden_axes(s, mesh, plan)
        return head_axes, embed_axes, self._token_axes(s, mesh, plan)

    def _embed_on_shard(self, s: _Scored, mesh: dict[str, int]) -> bool:
        """Whether XLA:TPU looks the token ids up in the input embedding's shard on ``s``'s mesh instead of
        gathering it: the plan splits its vocabulary over tp and its hidden dim over fsdp, and fsdp != tp
        (equal, XLA permutes the shard: see ``activation_terms``)."""
        tp, fsdp = mesh.get("tp", 1), mesh.get("fsdp", 1)
        if self.req.recipe.compiler != "tpu" or self.embed_group is None or tp == 1 or fsdp in (1, tp):
            return False
        found = self.embed_split.get(s.plan_key)
        if found is None:
            g = self.embed_group
            shape, entries = self.groups.infos[g].shape, tuple(self.plans[s.plan_key].specs[g])
            entries += (None,) * (len(shape) - len(entries))
            named = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in entries]
            v = 0 if shape[0] == self.dims.vocab else 1
            found = self.embed_split[s.plan_key] = (len(shape) == 2 and "tp" in named[v] and "fsdp" in named[1 - v]
                                                    and not self.plans[s.plan_key].traffic.tied)
        return found

    def _token_axes(self, s: _Scored, mesh: dict[str, int], plan: PlanEval) -> tuple[str, ...]:
        """See :meth:`_gathered_axes`: the experts' storage axes where XLA:TPU gathers the dispatched tokens."""
        model, recipe = self.model, self.req.recipe
        if (not self.expert_groups or recipe.remat not in TOKEN_REMATS or mesh.get("ep", 1) > 1
                or mesh.get("tp", 1) > 1):
            return ()
        if s.plan_key not in self.expert_axes:
            self.expert_axes[s.plan_key] = self._expert_split(plan)
        axes = self.expert_axes[s.plan_key]
        if not axes:
            return ()
        if math.prod(mesh.get(a, 1) for a in axes) == 1:
            return ()
        return axes if gathers_tokens(batch=self.req.batch // s.micro_batches, seq=self.req.seq,
                                      top_k=model.num_experts_per_tok, experts=model.num_experts,
                                      width=model.moe_intermediate_size, moe_dispatch=recipe.moe_dispatch) else ()

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

    def _hidden_axes(self, s: _Scored, mesh: dict[str, int], plan: PlanEval
                     ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """See :meth:`_gathered_axes`: the head's and the embedding's (untied tables only)."""
        if plan.traffic.tied:
            return (), ()
        axes = self.vocab_axes.get(s.plan_key)
        if axes is None:
            head_axes, embed_axes = (
                () if g is None else vocab_batch_axes(plan.specs[g], self.groups.infos[g].shape, vocab=self.dims.vocab)
                for g in (self.head_group, self.embed_group))
            axes = self.vocab_axes[s.plan_key] = (head_axes, embed_axes)
        head_axes, embed_axes = axes
        if not head_axes and not embed_axes:
            return (), ()
        # The batch's tokens per micro-batch against the vocabulary (the loss in vocab_tiles chunks).
        tokens = self.req.batch * self.req.seq / s.micro_batches
        out = []
        for g, found, t in ((self.head_group, head_axes, tokens / self.req.recipe.vocab_tiles),
                            (self.embed_group, embed_axes, tokens)):
            layout = None if g is None or not found else head_layout(plan.specs[g], self.groups.infos[g].shape,
                                                                     mesh, vocab=self.dims.vocab)
            out.append(found if gathers_hidden(layout, tokens=t, vocab=self.dims.vocab) else ())
        return out[0], out[1]

    def _activation_pending(self, s: _Scored, placement: AxisPlacement) -> list[Pending]:
        """The activation collectives of one step on ``s``'s mesh, with its micro-batches, not yet priced
        (accumulate maps each collective on its own, so the two halves are accumulated apart)."""
        recipe = self.req.recipe
        pending = activation_terms(self.model, dict(zip(self.req.axes, s.sizes, strict=True)), placement,
                                   batch=self.req.batch, seq=self.req.seq, itemsize=self.act_itemsize,
                                   remat=recipe.remat, residual_split=recipe.residual_split, backend=recipe.compiler,
                                   moe_dispatch=recipe.moe_dispatch)
        return accumulate(pending, s.micro_batches, backend=recipe.compiler)

    def _leanest(self, over: list[_Scored]) -> list[_Scored]:
        """The over-budget meshes that can be among the ``top_k`` leanest, the only ones shown.

        They are ranked by (total, communication seconds, sizes): all with a total up to the
        ``top_k``-th smallest (ties included) can be, no other can. Listing and pricing the
        collectives of the hundreds of others cost a fifth of a search and changed nothing.
        """
        k = self.req.top_k
        if len(over) <= k:
            return over
        cut = sorted(s.memory.total for s in over)[k - 1]
        return [s for s in over if s.memory.total <= cut]

    def _memory(self, plan: PlanEval, gathered: int, tp: int, sp: int, ways: int,
                micro_batches: int, head: HeadLayout | None = None) -> MemoryBreakdown:
        """The step's peak (see :mod:`meshplan.pure.cost._step_memory`) on a mesh with this tp, sp and
        dp*fsdp*ep, whose plan's ``gathered`` bytes are split over axes of size > 1 and whose output head
        is laid out as ``head``; the state alone without activations."""
        if not self.req.activations:
            return MemoryBreakdown.trusted(plan.param_bytes, plan.grad_bytes, plan.optimizer_bytes, 0, self.budget)
        step = self._price((tp, sp, ways, micro_batches), plan.param_bytes, plan.grad_bytes, plan.optimizer_bytes,
                           gathered, head)
        peak, phase = step.peak, step.peak_phase
        live = phase != "forward"
        state = plan.param_bytes + plan.optimizer_bytes + (plan.grad_bytes if live else 0)
        return MemoryBreakdown.trusted(plan.param_bytes, plan.grad_bytes, plan.optimizer_bytes, peak - state,
                                       self.budget, phase, live)

    def _idle(self, mesh: dict[str, int], plan: PlanEval, idle: list[str]) -> str:
        """Why the mesh has weight axes of size > 1 that split no parameter (``idle``, mesh order).

        Such a mesh only replicates over that axis while paying its collectives (and a
        ranked ``tp=8`` plan whose weights are all replicated misleads), so it is rejected
        with the reason the rule gave for the largest leaf.
        """
        infos = self.groups.infos
        reasons = ["no opinion; replicated" if d is None else d.reason for d in plan.decisions]
        # The largest leaf whose reason speaks of the axis says best why it is idle.
        word = re.compile(rf"\b{re.escape(idle[0])}\b")
        biggest = max(range(len(infos)), default=None,
                      key=lambda g: (bool(word.search(reasons[g])), math.prod(infos[g].shape), -g))
        example = ""
        if biggest is not None:
            example = (f"; e.g. leaf {self.groups.paths.path(self.groups.first[biggest])!r} "
                       f"{infos[biggest].shape}: {reasons[biggest]}")
        sizes = ", ".join(f"{a}={mesh[a]}" for a in idle)
        return (f"{sizes} split{'s' if len(idle) == 1 else ''} no parameter under rule "
                f"{rule_name(self.rule)!r}{example}. Such a mesh only replicates the weights over "
                f"{'that axis' if len(idle) == 1 else 'those axes'}; name the layers to split with a "
                "rule (--rules / rule=PathRule(...)) or leave the axis out")

    def _fill_leanest(self, over: list[_Scored]) -> None:
        """Plan exactly the bound-pruned meshes that could be among the ``top_k`` leanest over budget."""
        bounds, meshes = self.bounded_at, self.bounded
        k = self.req.top_k
        least: list[int] = []  # the k least totals over budget so far, ascending
        seen = 0
        for i in sorted(range(len(meshes)), key=lambda i: (bounds[i], meshes[i])):
            for s in over[seen:]:  # what the last _exact added
                bisect.insort(least, s.memory.total)
                del least[k:]
            seen = len(over)
            if len(least) >= k and bounds[i] > least[k - 1]:  # strictly: a mesh at the bound may tie
                break
            sizes = meshes[i]
            ways = math.prod(sizes[j] for j in self.batch_index)
            self._exact(dict(zip(self.req.axes, sizes, strict=True)), sizes, [], over, ways=ways,
                        counts=self._counts(self.req.batch // ways))

    def candidate(self, s: _Scored, verdict: str, rank: int | None) -> MeshCandidate:
        groups = param_groups(self.groups, self.plans[s.plan_key], self.rule)
        p = s.placement
        assert p is not None  # a mesh shown was priced, so placed
        time = self.timed(s)
        terms = tuple(t.with_exposed(e.exposed) for t, e in zip(to_terms(s.pending, s.term_seconds), time.terms,
                                                                  strict=True))
        # The specs the activation memory was charged for, so the plan can apply them.
        acts = step_activations(self.model, dict(zip(p.names, s.sizes, strict=True)), batch=self.req.batch,
                                seq=self.req.seq, itemsize=self.req.recipe.compute_itemsize,
                                residual_split=self.req.recipe.residual_split)
        step = StepEstimate(time.compute_s, time.exposed_s, time.tokens_per_s, time.mfu, self._flops(s).per_device,
                            self.efficiency, s.micro_batches)
        return MeshCandidate(p.names, s.sizes, p.ici, p.dcn, s.memory, terms, verdict, rank, groups,
                             activations=acts, step=step)


def _verdict(s: _Scored, best: _Scored, rank: int, budget: int, rank_by: str = "comm") -> str:
    room = f"{fmt_bytes(s.memory.total)} of {fmt_bytes(budget)} budget"
    if s.micro_batches > 1:
        room += f" with {s.micro_batches} micro-batches"
    if rank_by == "time" and s.time is not None and best.time is not None:
        t = s.time
        worst = max(t.terms, key=lambda e: e.exposed, default=None)
        exposed = (f"; most exposed: {worst.what} {worst.exposed:.3g} s"
                   if worst is not None and worst.exposed > 0 else "")
        assert s.placement is not None  # a mesh shown was priced, so placed
        device = s.placement.cluster.device
        if device.peak_bf16_flops is None:
            # No peak FLOP/s for this device: compute is not priced, so neither a compute
            # time nor an MFU is claimed; the step is its exposed communication alone.
            what = (f"{t.step_s:.3g} s of exposed communication; compute not priced: no peak FLOP/s for "
                    f"{device.name!r}{exposed}")
        else:
            what = (f"{t.step_s:.3g} s = compute {t.compute_s:.3g} s + exposed communication {t.exposed_s:.3g} s "
                    f"(hidden {t.hidden_s:.3g} s), MFU {t.mfu:.0%}{exposed}")
        if rank == 1:
            return f"best: fastest predicted step ({what}); {room}"
        extra = f"{(t.step_s / best.step_s - 1) * 100:+.1f}%" if best.step_s > 0 else f"+{t.step_s:.3g} s"
        return f"rank {rank}: {extra} step time vs best ({what}); {room}"
    top = max(to_terms(s.pending, s.term_seconds), key=lambda t: t.seconds, default=None)
    largest = f"; largest: {top.what} {top.seconds:.3g} s" if top is not None and top.seconds > 0 else ""
    if rank == 1:
        return f"best: least step communication ({s.seconds:.3g} s{largest}); {room}"
    extra = f"{(s.seconds / best.seconds - 1) * 100:+.0f}%" if best.seconds > 0 else f"+{s.seconds:.3g} s"
    return f"rank {rank}: {extra} communication vs best ({s.seconds:.3g} s{largest}); {room}"


def _canonical_axes(axes: Sequence[str] | None, model: ModelSpec) -> tuple[str, ...]:
    if axes is None:
        return tuple(a for a in AXIS_ORDER if a != "ep" or model.is_moe)
    if isinstance(axes, str):
        axes = [a.strip() for a in axes.split(",") if a.strip()]
    names = [as_str(a, f"axes[{i}]") for i, a in enumerate(as_sequence(axes, "axes"))]
    unknown = [a for a in names if a not in AXIS_ORDER]
    repeated = sorted({a for a in names if names.count(a) > 1})
    if unknown or repeated or not names:
        raise PlanError(f"axes={names!r}: unknown {unknown}, repeated {repeated}; use a non-empty subset of "
                        f"{list(AXIS_ORDER)} (pipeline parallelism is not modelled).")
    return tuple(a for a in AXIS_ORDER if a in names)


def _canonical_fixed(fixed: Mapping[str, int] | None, axes: tuple[str, ...], n: int) -> tuple[tuple[str, int], ...]:
    if fixed is None:
        return ()
    if not isinstance(fixed, Mapping):
        raise MeshplanTypeError(f"fixed={fixed!r} must be a mapping axis -> size, e.g. {{'tp': 8}}.")
    problems = []
    out = {}
    for axis, size in fixed.items():
        v = as_int(size, f"fixed[{axis!r}]")
        if axis not in axes:
            problems.append(f"{axis}={v}: {axis!r} is not one of the searched axes {list(axes)}")
        elif v < 1 or n % v:
            problems.append(f"{axis}={v} must be >= 1 and divide the {n} devices")
        out[axis] = v
    if problems:
        raise PlanError("fixed axes: " + "; ".join(problems) + ".")
    return tuple((a, out[a]) for a in axes if a in out)


_MAX_COUNT = 10**12  # batch, seq, top_k: far beyond any real step, small enough for exact float arithmetic


def _positive(value: Any, name: str) -> int:
    return as_count(value, name, maximum=_MAX_COUNT, error=PlanError)


def search_meshes(
    model: str | ModelSpec,
    cluster: str | Cluster,
    *,
    params: PyTree = None,
    dtype: Any = jnp.bfloat16,
    axes: Sequence[str] | None = None,
    fixed: Mapping[str, int] | None = None,
    rule: Rule | None = None,
    batch: int | None = None,
    seq: int | None = None,
    headroom: float = 0.1,
    optimizer_copies: int = 2,
    master_weights: bool = False,
    grad_dtype: Any = None,
    optimizer_dtype: Any = jnp.float32,
    activations: bool = True,
    tp_within_domain: bool = True,
    ep_within_domain: bool = False,
    top_k: int = 5,
    recipe: TrainingRecipe | None = None,
    efficiency: float | None = None,
    rank: str = "time",
    micro_batches: int | None = None,
) -> SearchResult:
    """Rank the meshes of ``cluster`` for training ``model`` (see the module docstring).

    Args:
      model: a preset name (``"llama3-70b"``) or a :class:`~meshplan.pure.ModelSpec`.
      cluster: a :class:`~meshplan.pure.Cluster` or its text (``"8x8xH100"``, ``"v5p-256"``).
      params: the parameter shape tree (default: the preset / ``build_params(model)`` in ``dtype``).
      dtype: parameter dtype when ``params`` is not given.
      axes: the mesh axes to search, a subset of ``dp, fsdp, ep, sp, tp`` (default:
        all but ``ep`` for dense models); the mesh keeps them in that order.
      fixed: sizes to keep, e.g. ``{"tp": 8}``.
      rule: a pure rule for the parameter specs (default: ``AxisKindRule.for_model(model)``).
      batch: global batch in sequences (default: one per device).
      seq: tokens per sequence (default 4096, or the model's position limit).
      headroom: fraction of HBM kept free for the runtime and temporaries.
      optimizer_copies: fp32 parameter-shaped optimizer copies (Adam: 2).
      master_weights: add an fp32 master copy of the weights.
      grad_dtype: gradient dtype (default: the parameter's).
      optimizer_dtype: dtype of the optimizer copies.
      activations: price the step's peak (activations by phase, see
        :mod:`meshplan.pure.cost._step_memory`) in the fit; ``False`` counts the state only.
      tp_within_domain, ep_within_domain: keep tp / ep inside one ICI domain.
      top_k: how many fitting (and how many over-budget) meshes to return.
      recipe: the training step priced (:class:`~meshplan.pure.search.TrainingRecipe`: remat,
        attention, dtypes, optimizer, micro-batches); when given, its weight dtype, optimizer
        copies, master weights and gradient/optimizer dtypes replace ``dtype``,
        ``optimizer_copies``, ``master_weights``, ``grad_dtype`` and ``optimizer_dtype``.
      efficiency: fraction of the device's peak bf16 FLOP/s the step's matmuls sustain (default
        per device kind and hidden size, :func:`~meshplan.pure.cost._flops.default_efficiency`); with a
        ``recipe`` whose ``matmul_dtype`` is ``"float8"`` the weight matmuls sustain
        :data:`~meshplan.pure.cost._matmul_dtype.FP8_EFFICIENCY_RATIO` times it of the FP8 peak.
      rank: ``"time"`` ranks by predicted step time (compute + exposed communication, see
        :mod:`meshplan.pure.cost._step_time`); ``"comm"`` by communication seconds alone.
      micro_batches: gradient-accumulation steps. ``None`` (default) chooses per mesh the fewest
        (the largest micro-batch) whose step peak fits, among the divisors of the mesh's per-replica
        batch (``batch / (dp*fsdp*ep)``), priced with :func:`~meshplan.pure.cost._step_time.accumulate`;
        a count fixes it (meshes whose per-replica batch it does not divide are rejected). A ``recipe``
        with ``micro_batches > 1`` fixes it too.

    Returns:
      A :class:`~meshplan.pure.SearchResult`, best mesh first.

    Raises:
      PlanError: nothing fits (with how much is missing and a cluster that
        fits), no mesh meets the constraints, bad options, or an FP8 recipe on a
        device with no FP8 peak.
      ClusterError: a cluster text that does not parse.
      MeshplanTypeError: options of the wrong type.

    Example:
      >>> result = search_meshes("llama3-8b", "2x8xH100", batch=16, seq=4096)
      >>> result.best.text, result.best.dcn_shape
      ('dp=8,fsdp=2', (2, 1, 1, 1))
      >>> result.best.memory.fits
      True
    """
    if recipe is not None and not isinstance(recipe, TrainingRecipe):
        raise MeshplanTypeError(f"recipe={recipe!r:.80} must be a TrainingRecipe or None.")
    if recipe is not None:
        # The recipe describes the whole step: its weight dtype, state copies and dtypes win.
        dtype, optimizer_copies, master_weights = recipe.weight_dtype, OPTIMIZER_COPIES[recipe.optimizer], \
            recipe.master_weights
        grad_dtype, optimizer_dtype = recipe.grad_dtype, recipe.optimizer_dtype
    if isinstance(model, str):
        preset = get_preset(model, dtype=dtype)
        spec = preset.spec
        params = preset.params if params is None else params
    elif isinstance(model, ModelSpec):
        spec = model
        params = build_params(spec, dtype=dtype) if params is None else params
    else:
        raise MeshplanTypeError(f"model={model!r} must be a preset name or a ModelSpec.")
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(clus, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r} must be a Cluster or a string such as '8x8xH100'.")
    names = _canonical_axes(axes, spec)
    if as_real(headroom, "headroom", allow_zero=True, error=PlanError) >= 1:
        raise PlanError(f"headroom={headroom!r} must be a fraction in [0, 1).")
    copies = as_count(optimizer_copies, "optimizer_copies", minimum=0, error=PlanError)
    flags = {name: as_flag(value, name) for name, value in (
        ("master_weights", master_weights), ("activations", activations),
        ("tp_within_domain", tp_within_domain), ("ep_within_domain", ep_within_domain))}
    grad_dt = None if grad_dtype is None else canonical_dtype(grad_dtype, what="grad_dtype")
    opt_dt = canonical_dtype(optimizer_dtype, what="optimizer_dtype")
    facts = tree_facts(params)
    dtypes = sorted({str(d) for d in {i.dtype for i in facts.infos if i is not None}})
    if not dtypes:
        raise PlanError(f"params={params!r:.80} holds no arrays (no leaf has a shape and dtype); pass the "
                        "parameter tree (arrays or ShapeDtypeStructs), or None for the model's own.")
    rule = AxisKindRule.for_model(spec) if rule is None else rule
    if not callable(rule):
        raise MeshplanTypeError(f"rule={rule!r} is not a rule; pass a pure rule such as AxisKindRule() or None.")
    check_rule(rule, params, names)  # before any mesh: a wrong rule fails by name, not as "no mesh fits"
    weights = dtypes[0] if len(dtypes) == 1 else "bfloat16"
    if recipe is None:
        optimizer = {2: "adamw", 1: "sgd", 0: "adafactor"}.get(copies, "adamw")
        recipe = TrainingRecipe(weight_dtype=weights, grad_dtype=None if grad_dt is None else str(grad_dt),
                                optimizer=optimizer, optimizer_dtype=str(opt_dt),
                                master_weights=flags["master_weights"])
    else:
        recipe = dataclasses.replace(recipe, weight_dtype=weights)
    if recipe.backend is None:  # the cluster's compiler: its lowering and its calibration
        recipe = dataclasses.replace(recipe, backend="tpu" if clus.device.ici_scope == "slice" else "gpu")
    fp8_peak(clus.device, recipe.matmul_dtype)  # an FP8 recipe needs FP8 units: refused before any mesh
    if recipe.device is None and clus.device.name in DEVICE_SPECS:
        # The accelerator picks its generation's memory coefficients where it has some (calibration_key).
        recipe = dataclasses.replace(recipe, device=clus.device.name)
    choose = micro_batches is None and recipe.micro_batches == 1
    if micro_batches is not None:
        recipe = dataclasses.replace(recipe, micro_batches=_positive(micro_batches, "micro_batches"))
    req = SearchRequest(
        model=spec.name, cluster=clus, axes=names, fixed=_canonical_fixed(fixed, names, clus.num_devices),
        batch=clus.num_devices if batch is None else _positive(batch, "batch"),
        seq=min(4096, spec.max_position_embeddings or 4096) if seq is None else _positive(seq, "seq"),
        param_dtype=dtypes[0] if len(dtypes) == 1 else "mixed",
        grad_dtype="param" if grad_dt is None else str(grad_dt),
        optimizer_copies=copies + int(flags["master_weights"]), optimizer_dtype=str(opt_dt),
        activations=flags["activations"], headroom=float(headroom), tp_within_domain=flags["tp_within_domain"],
        ep_within_domain=flags["ep_within_domain"], rule=rule_name(rule), top_k=_positive(top_k, "top_k"),
        recipe=recipe, efficiency=efficiency, rank_by=rank, choose_micro_batches=choose,
        moe_layers=spec.num_moe_layers)
    why = batch_problem(req.batch, clus.num_devices, names, dict(req.fixed))
    if why is not None:
        raise PlanError(why)
    return _run(req, spec, LeafGroups.build(facts, rule), rule, batch_given=batch is not None, suggest=True)


def _run(req: SearchRequest, model: ModelSpec, groups: LeafGroups, rule: Rule, *, batch_given: bool,
         suggest: bool) -> SearchResult:
    search = _Search(req, model, groups, rule)
    fits, over, rejections, total, num_fitting = search.run()
    if req.rank_by == "time":
        fits.sort(key=lambda s: (s.step_s, s.memory.total, s.sizes))
    else:
        fits.sort(key=lambda s: (s.seconds, s.memory.total, s.sizes))
    over.sort(key=lambda s: (s.memory.total, s.seconds, s.sizes))
    if not fits:
        raise PlanError(_nothing_fits(search, over, rejections, batch_given, suggest))
    k = req.top_k
    for s in fits[:k] + over[:k]:  # the meshes shown: their collectives' exposure too
        search.timed(s)
    ranked = tuple(search.candidate(s, _verdict(s, fits[0], r + 1, req.budget, req.rank_by), r + 1)
                   for r, s in enumerate(fits[:k]))
    rejected = tuple(
        search.candidate(s, f"rejected: {fmt_bytes(s.memory.total)}/device > {fmt_bytes(req.budget)} budget "
                            f"({s.memory.parts()})", None)
        for s in over[:k])
    return SearchResult(req, ranked, rejected, tuple(rejections), total, num_fitting)


def _nothing_fits(search: _Search, over: list[_Scored], rejections: list[Rejection], batch_given: bool,
                  suggest: bool) -> str:
    req = search.req
    c = req.cluster
    where = f"{req.model} on {c.text} ({c.num_devices} x {c.device.name})"
    if not over:
        why = "; ".join(f"{r.example} ({mesh_count(r.count)})" for r in rejections) or "no axis values left"
        return (f"no mesh for {where} over axes {list(req.axes)} meets the constraints: {why}. Relax the "
                "fixed sizes, the axes, the batch or the sequence length.")
    lean = over[0]
    text = mesh_text(dict(zip(req.axes, lean.sizes, strict=True)))
    short = lean.memory.total - req.budget
    msg = (f"{where} does not fit: the leanest mesh ({text}) needs {lean.memory.describe()} per device, "
           f"{fmt_bytes(short)} over the budget of {fmt_bytes(req.budget)} ({c.device.name} HBM less "
           f"{req.headroom:.0%} headroom).")
    if suggest:
        bigger = _fitting_cluster(search, batch_given)
        msg += (f" It fits on {bigger.text!r} ({bigger.num_devices} devices)." if bigger is not None else
                f" No cluster up to {_SCALES[-1]}x larger fits; reduce the batch, sequence or optimizer state.")
    return msg


def _fitting_cluster(search: _Search, batch_given: bool) -> Cluster | None:
    req = search.req
    c = req.cluster
    for f in _SCALES:
        slices = c.num_slices * f if c.device.ici_scope == "slice" else c.num_slices
        if c.device.ici_scope == "rack" and c.device.domain_nodes is not None:  # whole NVLink racks past one
            slices = max(1, -(-c.num_nodes * f // c.device.domain_nodes))
        try:
            bigger = dataclasses.replace(c, num_nodes=c.num_nodes * f, num_slices=slices)
        except ClusterError:  # beyond MAX_DEVICES: no larger cluster to suggest
            break
        trial = dataclasses.replace(req, cluster=bigger, batch=req.batch if batch_given else bigger.num_devices)
        try:
            _run(trial, search.model, search.groups, search.rule, batch_given=batch_given,
                 suggest=False)
        except PlanError:
            continue
        return bigger
    return None
