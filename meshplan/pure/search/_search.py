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
5. **Price** a training step's collectives (:mod:`meshplan.pure.cost._param_collectives`,
   :mod:`meshplan.pure.cost._activation_collectives`, :mod:`meshplan.pure.cost._tpu_terms`)
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

from meshplan.pure._format import fmt_bytes
from meshplan.pure._types import PyTree
from meshplan.pure.errors import ClusterError, NothingFitsError, PlanError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.rules._base import Rule, reads_axes, rule_name
from meshplan.pure.cost import STEP_TIME_RESOLUTION
from meshplan.pure.cost._estimates import StepEstimate
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.search._groups import LeafGroups, PlanEval, Planner, param_groups, state_bytes
from meshplan.pure.search._pricing import PlanKey, Pricing
from meshplan.pure.search._request import canonical_request
from meshplan.pure.search._result import Rejection, SearchRequest, SearchResult
from meshplan.pure.search._scored import Scored, verdict
from meshplan.pure.search._space import (
    axis_problem,
    combinations,
    divisors,
    mesh_count,
    mesh_text,
    num_factorizations,
    Placer,
    unit,
)
from meshplan.pure.cost._recipe import TrainingRecipe
from meshplan.pure.cluster._profile import MachineProfile
from meshplan.pure.cost._activation_collectives import step_activations
from meshplan.pure.cost._placement import BATCH_AXES, AxisPlacement, price, to_terms
from meshplan.pure.cost._step_time import StepTime, overlap_class
from meshplan.pure.specs._dtypes import canonical_dtype
from meshplan.pure.specs._training import TrainingState

__all__ = ["WEIGHT_AXES", "search_meshes"]

WEIGHT_AXES: tuple[str, ...] = ("fsdp", "ep", "tp")
"""Axes that exist to split parameters: a mesh where one of size > 1 splits none is rejected.
(dp and sp split the batch and the sequence, never weights.)"""

_SCALES = (2, 4, 8, 16, 32, 64)
# A mesh is skipped when a lower bound of its step is above the top_k-th best times this: the bound and the
# step sum the same floats in different groupings, so a hair of slack keeps float rounding from ever
# skipping a mesh that ties.
_SLACK = 1 + 1e-9


def _no_detail() -> str:
    return ""


def _text(names: tuple[str, ...], sizes: tuple[int, ...]) -> str:
    return mesh_text(dict(zip(names, sizes, strict=True)))


class _Search:
    """One search: the canonical request, the leaf groups, the plan cache and what the driver prunes by. Every
    figure it ranks by comes from its :class:`~meshplan.pure.search._pricing.Pricing`."""

    def __init__(self, req: SearchRequest, model: ModelSpec, groups: LeafGroups, rule: Rule) -> None:
        self.req, self.model, self.rule = req, model, rule
        self.groups = groups  # built once per tree and rule (the larger clusters' searches reuse them)
        self.reads = reads_axes(rule)
        self.plans: dict[PlanKey, PlanEval] = {}
        # req.optimizer_copies counts the master weights among the copies; they are fp32 whatever the
        # moments' dtype (a bf16-moment optimizer's master copy is 4 bytes, not 2).
        master = int(req.recipe.master_weights)
        self.state = TrainingState(None if req.grad_dtype == "param" else canonical_dtype(req.grad_dtype),
                                   canonical_dtype(req.optimizer_dtype), req.optimizer_copies - master,
                                   master_copies=master)
        self.state_total = state_bytes(self.groups, self.state)
        self.planner = Planner(self.groups, rule, state=self.state)
        self.pricing = Pricing(req, model, groups)
        # The bound-pruned meshes and their bounds (two lists: ~700 pairs would be as many more objects).
        self.bounded: list[tuple[int, ...]] = []
        self.bounded_at: list[float] = []
        self.placer = Placer(req.axes, req)
        self.tp_index = req.axes.index("tp") if "tp" in req.axes else None
        self.sp_index = req.axes.index("sp") if "sp" in req.axes else None
        self.batch_index = tuple(i for i, a in enumerate(req.axes) if a in BATCH_AXES)
        # Positions of the rule's axes among the mesh's (an axis the mesh lacks has size 1).
        self.reads_index = None if self.reads is None else tuple(
            req.axes.index(a) for a in self.reads if a in req.axes)
        self.rejected: dict[str, list[Any]] = {}  # kind -> [meshes, the first one's detail]
        self.budget = req.budget  # a property of properties, read several times per mesh
        self.micro_counts: dict[int, list[int]] = {}  # per-replica batch -> counts (asked twice per mesh)

    def _mesh(self, s: Scored) -> dict[str, int]:
        return dict(zip(self.req.axes, s.sizes, strict=True))

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

    def timed(self, s: Scored) -> StepTime:
        """Compute + exposed communication of one priced mesh, per collective too (kept on ``s``)."""
        if s.time is None:
            s.time = self.pricing.step_time(self._mesh(s), s.pending, s.term_seconds)
        return s.time

    def plan(self, sizes: dict[str, int]) -> tuple[PlanKey, PlanEval]:
        key = tuple(sizes.items()) if self.reads is None else tuple([sizes.get(a, 1) for a in self.reads])
        found = self.plans.get(key)
        if found is None:
            found = self.plans[key] = self.planner(sizes)
        return key, found

    def run(self) -> tuple[list[Scored], list[Scored], list[Rejection], int, int]:
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
        fits: list[Scored] = []
        over: list[Scored] = []
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

    def _place(self, s: Scored) -> AxisPlacement:
        """``s``'s :class:`AxisPlacement`, made when first needed (most meshes are never priced)."""
        if s.placement is None:
            dcn = self.placer.split(s.sizes)
            assert dcn is not None  # its domains were placed before it was scored
            s.placement = self.placer.placement(s.sizes, dcn)
        return s.placement

    def _price_steps(self, scored: list[Scored]) -> None:
        """List and price the collectives of ``scored`` (one vectorized pass) and their step times."""
        self._pass(scored, [])

    def _pass(self, whole: list[Scored], bound: list[Scored], floors: Sequence[float] = ()) -> list[float]:
        """One vectorized pricing pass (its numpy set-up costs as much as a few hundred collectives): the
        step times of ``whole`` (their activation collectives priced by an earlier pass are taken as they
        are), and of ``bound`` (whose :meth:`~meshplan.pure.search._pricing.Pricing.compute_s` are
        ``floors``) the activation collectives, kept on
        each mesh with their seconds, and the step with its critical-path ones alone (see
        :meth:`_contenders`), returned."""
        pricing = self.pricing
        lists = []  # per mesh, the collectives priced here: whole, then bound
        for s in whole:
            placement, mesh = self._place(s), self._mesh(s)
            terms = pricing.param_pending(s.plan_key, self.plans[s.plan_key], mesh, placement, s.micro_batches)
            if s.activations is None:
                terms += pricing.activation_pending(mesh, placement, s.micro_batches)
            lists.append(terms)
        for s in bound:
            acts = s.activations = pricing.activation_pending(self._mesh(s), self._place(s), s.micro_batches)
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
            s.step_s = pricing.step_s(self._mesh(s), s.pending, s.term_seconds)
            # Summed in term order with Python floats: identical on every platform and run.
            s.seconds = float(sum(s.term_seconds))
            start = stop
        steps = []
        for s, terms, floor in zip(bound, lists[len(whole):], floors, strict=True):
            stop = start + len(terms)
            s.activation_seconds = seconds[start:stop]
            # The step with these alone: its compute, and the critical ones exposed whole (_step_time).
            steps.append(floor + sum(t for p, t in zip(terms, s.activation_seconds, strict=True)
                                     if overlap_class(p.what, p.kind) == "critical"))
            start = stop
        return steps

    def _contenders(self, fits: list[Scored], over: list[Scored]) -> list[Scored]:
        """The fitting meshes that can rank in the ``top_k``, priced; the others are only counted. The
        over-budget meshes ``over`` (all shown) are priced in the first pass.

        Ranked by step time, no mesh's step is faster than its step with no collectives (its
        compute, :meth:`~meshplan.pure.search._pricing.Pricing.compute_s`; a test holds step_time to that), nor than its *critical step*, its
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
        tie = math.exp(STEP_TIME_RESOLUTION)
        if self.req.rank_by != "time" or len(fits) <= k:
            self._price_steps(fits + over)
            return fits
        floor = [self.pricing.compute_s(self._mesh(s)) for s in fits]
        order = sorted(range(len(fits)), key=lambda i: (floor[i], fits[i].sizes))
        floors = [floor[i] for i in order]  # ascending
        # The least floors priced whole (a k-th best step to cut at), the next ones bounded.
        priced, bound = [fits[i] for i in order[:k]], [fits[i] for i in order[k:3 * k]]
        steps = self._pass(priced + over, bound, floors[k:3 * k])
        best = sorted(s.step_s for s in priced)  # the k least step times priced so far, ascending
        # Bounded meshes not yet priced whose critical step can still rank: (critical step, sizes, mesh).
        waiting: list[tuple[float, tuple[int, ...], Scored]] = []
        start, size, batch = 3 * k, 4 * k, k
        while True:
            # Every mesh the model cannot tell from the best is priced too: the tied group is ordered whole.
            bar = max(best[-1], best[0] * tie) * _SLACK
            for s, t in zip(bound, steps, strict=True):
                if t <= bar:
                    heapq.heappush(waiting, (t, s.sizes, s))
            # Each pass bounds the next floors that can still rank and prices the least waiting.
            stop = bisect.bisect_right(floors, bar, lo=start, hi=min(start + size, len(floors)))
            bound = [fits[i] for i in order[start:stop]]
            chunk: list[Scored] = []
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

    def _score(self, names: tuple[str, ...], sizes: tuple[int, ...], fits: list[Scored],
               over: list[Scored]) -> tuple[str, Callable[[], str]]:
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
        return state + self.pricing.activation_floor((tp, sp, ways, micro_batches))

    def _over_at(self, state: int, tp: int, sp: int, ways: int, micro_batches: int) -> bool:
        """Whether a plan whose params + grads + optimizer are ``state`` bytes is over the budget at this
        many micro-batches, known without pricing its peak: the backward phase holds that state and the
        activation floor at least (the peak is no less; a test holds lower_bound below the peak)."""
        return (self.req.activations
                and state + self.pricing.activation_floor((tp, sp, ways, micro_batches)) > self.budget)

    def _exact(self, mesh: dict[str, int], sizes: tuple[int, ...], fits: list[Scored], over: list[Scored], *,
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
        head = self.pricing.head(key, plan, mesh)
        tp, sp = mesh.get("tp", 1), mesh.get("sp", 1)
        state = plan.param_bytes + plan.grad_bytes + plan.optimizer_bytes
        # A count the plan is over the budget at (its bound says so) is not priced when another is tried
        # anyway: pricing it would say "does not fit" and change nothing.
        memory = (None if len(counts) > 1 and (over_at_fewest or self._over_at(state, tp, sp, ways, m))
                  else self.pricing.memory(plan, gathered, (tp, sp, ways, m), head))
        if memory is None or (not memory.fits and len(counts) > 1):
            # The fewest micro-batches that fit: check the most first (the leanest; a mesh that fits at none is
            # reported there), then bisect: from 2 on, the peak only falls as the count grows (the activations
            # shrink, the fp32 accumulator stays).
            m, memory = counts[-1], self.pricing.memory(plan, gathered, (tp, sp, ways, counts[-1]), head)
            lo, hi = 1, len(counts) - 1  # counts[hi] fits; find the first that does in counts[lo:hi + 1]
            while memory.fits and lo < hi:
                mid = (lo + hi) // 2
                if self._over_at(state, tp, sp, ways, counts[mid]):
                    lo = mid + 1
                    continue
                trial = self.pricing.memory(plan, gathered, (tp, sp, ways, counts[mid]), head)
                if trial.fits:
                    hi, m, memory = mid, counts[mid], trial
                else:
                    lo = mid + 1
        scored = Scored(sizes, key, memory, m)  # collectives listed if it can rank (_contenders)
        if memory.fits:
            fits.append(scored)
            return "", _no_detail
        over.append(scored)  # its collectives are listed only if it is among the leanest (see _leanest)
        return "memory", _no_detail if "memory" in self.rejected else (
            lambda: f"{mesh_text(mesh)}: {fmt_bytes(memory.total)}/device > {fmt_bytes(req.budget)} budget")

    def _leanest(self, over: list[Scored]) -> list[Scored]:
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

    def _fill_leanest(self, over: list[Scored]) -> None:
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

    def candidate(self, s: Scored, verdict: str, rank: int | None) -> MeshCandidate:
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
        step = StepEstimate(time.compute_s, time.exposed_s, time.tokens_per_s, time.mfu,
                            self.pricing.flops(self._mesh(s)).per_device, self.pricing.efficiency, s.micro_batches)
        return MeshCandidate(p.names, s.sizes, p.ici, p.dcn, s.memory, terms, verdict, rank, groups,
                             activations=acts, step=step)


def search_meshes(
    model: str | ModelSpec,
    cluster: str | Cluster,
    *,
    params: PyTree = None,
    axes: Sequence[str] | None = None,
    fixed: Mapping[str, int] | None = None,
    rule: Rule | None = None,
    batch: int | None = None,
    seq: int | None = None,
    headroom: float | None = None,
    activations: bool = True,
    tp_within_domain: bool = True,
    ep_within_domain: bool = False,
    top_k: int = 5,
    recipe: TrainingRecipe | None = None,
    efficiency: float | None = None,
    rank: str = "time",
    micro_batches: int | None = None,
    profile: MachineProfile | None = None,
) -> SearchResult:
    """Rank the meshes of ``cluster`` for training ``model`` (see the module docstring).

    Args:
      model: a preset name (``"llama3-70b"``) or a :class:`~meshplan.pure.ModelSpec`.
      cluster: a :class:`~meshplan.pure.Cluster` or its text (``"8x8xH100"``, ``"v5p-256"``).
      params: the parameter shape tree (default: the preset / ``build_params(model)`` in the recipe's
        ``weight_dtype``).
      axes: the mesh axes to search, a subset of ``dp, fsdp, ep, sp, tp`` (default:
        all but ``ep`` for dense models); the mesh keeps them in that order.
      fixed: sizes to keep, e.g. ``{"tp": 8}``.
      rule: a pure rule for the parameter specs (default: ``AxisKindRule.for_model(model)``).
      batch: global batch in sequences (default: one per device).
      seq: tokens per sequence (default 4096, or the model's position limit).
      headroom: fraction of HBM kept free for the runtime (default
        :func:`~meshplan.pure.cluster.default_headroom`, as ``meshplan plan``'s: on a GPU the 25% jax's
        allocator leaves by default, on a TPU 10%).
      activations: price the step's peak (activations by phase, see
        :mod:`meshplan.pure.cost._step_memory`) in the fit; ``False`` counts the state only.
      tp_within_domain, ep_within_domain: keep tp / ep inside one ICI domain.
      top_k: how many fitting (and how many over-budget) meshes to return.
      recipe: the training step priced (:class:`~meshplan.pure.cost.TrainingRecipe`: the weight,
        gradient and optimizer dtypes, the optimizer and its state copies, master weights, remat,
        attention, micro-batches, the compiler; default ``TrainingRecipe()``, an AdamW bf16 step). The
        weight dtype is the parameter tree's where ``params`` is given.
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
      profile: a :class:`~meshplan.pure.cluster.MachineProfile` of this device kind (``meshplan profile``): its
        link figures and matmul efficiency replace the catalogue's wherever it measured them, for a cluster of
        any size (:mod:`meshplan.pure.cost._profile_pricing`); ``request.profile`` records which and when. An
        ``efficiency`` given wins over the profile's.

    Returns:
      A :class:`~meshplan.pure.SearchResult`, best mesh first.

    Raises:
      PlanError: nothing fits (with how much is missing and a cluster that
        fits), no mesh meets the constraints, bad options, or an FP8 recipe on a
        device with no FP8 peak.
      ClusterError: a cluster text that does not parse.
      ProfileError: a profile for another device kind (a link whose timings cannot be fitted keeps the
        catalogue's figure, and ``request.profile`` says why).
      MeshplanTypeError: options of the wrong type.

    Example:
      >>> result = search_meshes("llama3-8b", "2x8xH100", batch=16, seq=4096)
      >>> result.best.text, result.best.dcn_shape
      ('dp=2,fsdp=8', (2, 1, 1, 1))
      >>> result.best.memory.fits
      True
    """
    c = canonical_request(model, cluster, params=params, axes=axes, fixed=fixed, rule=rule, batch=batch, seq=seq,
                          headroom=headroom, activations=activations, tp_within_domain=tp_within_domain,
                          ep_within_domain=ep_within_domain, top_k=top_k, recipe=recipe, efficiency=efficiency,
                          rank=rank, micro_batches=micro_batches, profile=profile)
    return _run(c.request, c.model, LeafGroups.build(c.facts, c.rule), c.rule, batch_given=batch is not None,
                suggest=True)


def fastest_stage_meshes(model: ModelSpec, cluster: Cluster, *, batch: int, seq: int, micro_batches: int,
                         recipe: TrainingRecipe | None, top_k: int, headroom: float, efficiency: float | None,
                         fixed: Mapping[str, int] | None, axes: Sequence[str] | None, activations: bool
                         ) -> SearchResult:
    """:func:`search_meshes` for one pipeline stage, ranked by predicted step alone: the meshes tied with the
    best keep their step order, so a stage gets the fastest mesh that fits and the pipeline search compares
    layouts by their own steps (:func:`~meshplan.pure.search.search_pipelines`)."""
    c = canonical_request(model, cluster, params=None, axes=axes, fixed=fixed, rule=None, batch=batch, seq=seq,
                          headroom=headroom, activations=activations, tp_within_domain=True,
                          ep_within_domain=False, top_k=top_k, recipe=recipe, efficiency=efficiency, rank="time",
                          micro_batches=micro_batches, profile=None)
    return _run(c.request, c.model, LeafGroups.build(c.facts, c.rule), c.rule, batch_given=True, suggest=True,
                ties=False)


def _run(req: SearchRequest, model: ModelSpec, groups: LeafGroups, rule: Rule, *, batch_given: bool,
         suggest: bool, ties: bool = True) -> SearchResult:
    search = _Search(req, model, groups, rule)
    fits, over, rejections, total, num_fitting = search.run()
    if req.rank_by == "time":
        fits.sort(key=lambda s: (s.step_s, s.memory.total, s.sizes))
        fits, tied = tied_first(fits) if ties else (fits, 0)
    else:
        tied = 0
        fits.sort(key=lambda s: (s.seconds, s.memory.total, s.sizes))
    over.sort(key=lambda s: (s.memory.total, s.seconds, s.sizes))
    if not fits:  # over the budget when some mesh was priced, else no mesh met the constraints
        raise (NothingFitsError if over else PlanError)(_nothing_fits(search, over, rejections, batch_given, suggest))
    k = req.top_k
    for s in fits[:k] + over[:k]:  # the meshes shown: their collectives' exposure too
        search.timed(s)
    ranked = tuple(search.candidate(s, verdict(s, fits[0], r + 1, req.budget, req.rank_by, tied=r < tied and tied > 1), r + 1)
                   for r, s in enumerate(fits[:k]))
    rejected = tuple(
        search.candidate(s, f"rejected: {fmt_bytes(s.memory.total)}/device > {fmt_bytes(req.budget)} budget "
                            f"({s.memory.parts()})", None)
        for s in over[:k])
    return SearchResult(req, ranked, rejected, tuple(rejections), total, num_fitting)


def tied_first(fits: list[Scored]) -> tuple[list[Scored], int]:
    """``fits`` (by predicted step) with the meshes the step-time model cannot tell from the best (within
    :data:`~meshplan.pure.cost.STEP_TIME_RESOLUTION`) ordered by fewer bytes over the network per step, then
    step, memory and sizes (:mod:`meshplan.pure.search._ties` says why), the rest in their order; and how many
    are tied (the best included)."""
    if not fits:
        return fits, 0
    limit = fits[0].step_s * math.exp(STEP_TIME_RESOLUTION)
    n = sum(1 for s in fits if s.step_s <= limit)

    def network_bytes(s: Scored) -> float:
        return sum(p.nbytes * p.calls for p in s.pending if p.dcn > 1)

    head = sorted(fits[:n], key=lambda s: (network_bytes(s), s.step_s, s.memory.total, s.sizes))
    return head + fits[n:], n


def _nothing_fits(search: _Search, over: list[Scored], rejections: list[Rejection], batch_given: bool,
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
