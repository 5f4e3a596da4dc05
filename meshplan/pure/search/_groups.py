"""The mesh search's view of a parameter tree: leaf groups, and one plan per distinct mesh.

Asking a rule once per leaf per candidate mesh would cost leaves x meshes
rule calls (723 x 290 for Llama-3-70B on 4096 devices). Instead:

1. :class:`LeafGroups` splits the tree once into groups of leaves the rule
   promises to treat alike (:func:`~meshplan.pure.rules._base.group_key_fn`:
   its ``group_key(ctx)`` when it has one, e.g. the default
   :class:`~meshplan.pure.rules.AxisKindRule`'s path template, shape and
   dtype; ``(shape, dtype)`` for shape-only rules; else one group per leaf,
   correct for any rule, just slower);
2. a :class:`Planner` (:func:`evaluate_plan` for one mesh) asks the rule once
   per group for one set of axis sizes, and the search caches the plan per
   *distinct* sizes of the axes the rule reads
   (:func:`~meshplan.pure.rules._base.reads_axes`; every axis when it does not
   say), so meshes that differ only in dp/sp or in their DCN split share one plan;
3. for the default rule the planner goes further: it asks each group's spec
   without its reason (:meth:`~meshplan.pure.AxisKindRule.spec_function`),
   keeps each group's share of a plan per sizes of the axes *that group* reads,
   and asks for whole decisions only for the plans that are read.

Bytes per device are the pure memory estimator's arithmetic
(:func:`~meshplan.pure.shard_geometry`'s shard times
:meth:`~meshplan.pure.specs._training.TrainingState.element_bytes`, the
dtypes :func:`~meshplan.pure.estimate_training_memory` counts); the tests
check that they equal ``estimate_training_memory`` of the expanded spec tree,
byte for byte.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple, cast

from jax.sharding import PartitionSpec

from meshplan.pure._check import canonical_axis_sizes
from meshplan.pure._types import FrozenAxisSizes, Shape, make_spec
from meshplan.pure.errors import SpecError
from meshplan.pure.rules._axis_kind import AxisKindRule, path_template
from meshplan.pure.rules._base import (
    LEAF_ERRORS,
    Decision,
    LeafContext,
    Rule,
    ask,
    group_key_fn,
    rule_name,
)
from meshplan.pure.search._candidate import ParamGroup
from meshplan.pure.cost._param_collectives import ParamTraffic
from meshplan.pure.cost._placement import DATA_AXES, STORAGE_AXES
from meshplan.pure.specs._geometry import (
    UNCONSTRAINED,
    ShardGeometry,
    canonical_entries,
    shard_geometry,
)
from meshplan.pure.specs._training import TrainingState
from meshplan.pure.specs._tree import LeafInfo, TreeFacts

__all__ = ["GeometryCache", "LeafGroups", "PlanEval", "Planner", "evaluate_plan", "param_groups", "state_bytes"]

_REPLICATED = make_spec()
_DisplayKey = tuple[str, Shape, str]  # (path template, shape, dtype name)


@dataclasses.dataclass(frozen=True, slots=True)
class GeometryCache:
    """Shared by a search's plans, so meshes that split a leaf alike skip :func:`shard_geometry`.

    Attributes:
      axes: spec -> the mesh axes it uses.
      geometry: (shape, spec, sizes of the spec's axes) -> its :class:`ShardGeometry`.
      checked: (shape, spec, mesh axis names) -> what does not depend on the sizes (:class:`_Checked`,
        with the leaf's :class:`_Share` per sizes of the spec's axes), once :func:`shard_geometry`
        has accepted the spec there.
    """

    axes: dict[PartitionSpec, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    geometry: dict[tuple[Shape, PartitionSpec, tuple[int, ...]], ShardGeometry] = dataclasses.field(
        default_factory=dict)
    checked: dict[tuple[Shape, PartitionSpec, tuple[str, ...]], _Checked] = dataclasses.field(default_factory=dict)


class _Share(NamedTuple):
    """What one leaf under one spec adds to a plan: its shard, where it is stored and replicated.

    A named tuple: the search builds hundreds and keeps them (memoized), so they are made at C speed.

    Attributes:
      spec: the spec.
      axes: the mesh axes the spec uses (spec order); ``padded``: the spec does not divide the shape.
      elements: elements of one shard.
      storage: the storage axes it is split over, ``ways`` their product (mesh order).
      replicas: the data axes it is replicated over (mesh order).
    """

    spec: PartitionSpec
    axes: tuple[str, ...]
    padded: bool
    elements: int
    storage: tuple[str, ...]
    ways: int
    replicas: tuple[str, ...]


class _Checked(NamedTuple):
    """A spec :func:`shard_geometry` accepted on a shape and a mesh of these axis names: its axes and
    canonical entries, the storage and replica axes that follow from them (:class:`_Share`), and
    the shares seen, by the sizes of the spec's axes."""

    axes: tuple[str, ...]
    entries: tuple[Any, ...]
    storage: tuple[str, ...]
    replicas: tuple[str, ...]
    shares: dict[tuple[int, ...], _Share]


class _Paths:
    """A tree's leaf paths, formatted once (rules read ``ctx.path`` once per group per mesh)."""

    __slots__ = ("_facts", "_paths")

    def __init__(self, facts: TreeFacts) -> None:
        self._facts = facts
        # TreeFacts.path(i) for every i, without making the key paths when the tree is plain containers.
        self._paths = facts.paths()

    @property
    def keypaths(self) -> tuple[Any, ...]:
        return self._facts.keypaths

    def path(self, i: int) -> str:
        return self._paths[i]


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class LeafGroups:
    """A tree's array leaves, grouped for one rule.

    Attributes:
      facts: the tree's facts.
      paths: its leaf paths, formatted once.
      first: per group, the index of its first leaf.
      infos: per group, the shared shape and dtype.
      counts: per group, how many leaves it holds.
      leaf_group: per flattened leaf, its group (``-1`` for non-array leaves).
      display: ``(template, shape, dtype name)`` -> the groups with leaves there,
        with how many of their leaves each.
      roles: group's first leaf -> ``"embed"`` / ``"head"`` / ``"pos"`` / ``"attn"`` (see
        :func:`_embedding_roles`), read once here: a plan per mesh would read every leaf path again.
    """

    facts: TreeFacts
    paths: _Paths
    first: tuple[int, ...]
    infos: tuple[LeafInfo, ...]
    counts: tuple[int, ...]
    leaf_group: tuple[int, ...]
    display: tuple[tuple[_DisplayKey, tuple[tuple[int, int], ...]], ...]
    roles: Mapping[int, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, facts: TreeFacts, rule: Rule) -> LeafGroups:
        """Group the leaves of ``facts`` for ``rule`` (one rule-key call and one path per leaf)."""
        key_of = group_key_fn(rule)
        paths = _Paths(facts)
        no_axes = canonical_axis_sizes({})
        ids: dict[Hashable, int] = {}
        first: list[int] = []
        infos: list[LeafInfo] = []
        counts: list[int] = []
        leaf_group: list[int] = []
        display: dict[_DisplayKey, dict[int, int]] = {}
        names: dict[Any, str] = {}  # dtype -> its name (numpy formats it anew on every str())
        templates: list[str] = []  # per leaf ("" for a non-array leaf), for _embedding_roles
        keyed_by_template = type(rule) is AxisKindRule  # its group key is (path template, shape, dtype)
        by_template: dict[str, bool] = {}  # AxisKindRule.template_group of each template seen
        for i, info in enumerate(facts.infos):
            if info is None:
                leaf_group.append(-1)
                templates.append("")
                continue
            if keyed_by_template:
                # AxisKindRule.group_key(ctx) without making a LeafContext per leaf (a tenth of grouping
                # a 1,025-leaf tree); tests/pure/search/test_planner.py holds the two equal.
                path = paths.path(i)
                template = path_template(path)
                alike = by_template.get(template)
                if alike is None:  # once per template, not per leaf
                    alike = by_template[template] = cast(AxisKindRule, rule).template_group(template)
                key: Hashable = (template if alike else path, info.shape, info.dtype)
            else:
                key = key_of(LeafContext.trusted(info.shape, info.dtype, no_axes, i, paths))  # checked by tree_facts
            g = ids.get(key)
            if g is None:
                g = ids[key] = len(first)
                first.append(i)
                infos.append(info)
                counts.append(0)
            counts[g] += 1
            leaf_group.append(g)
            dtype = names.get(info.dtype)
            if dtype is None:
                dtype = names[info.dtype] = str(info.dtype)
            template = template if keyed_by_template else path_template(paths.path(i))
            templates.append(template)
            where = display.setdefault((template, info.shape, dtype), {})
            where[g] = where.get(g, 0) + 1
        shown = tuple((k, tuple(v.items())) for k, v in display.items())
        return cls(facts, paths, tuple(first), tuple(infos), tuple(counts), tuple(leaf_group), shown,
                   _embedding_roles(leaf_group, first, templates))


class PlanEval:
    """One plan of the tree for one set of axis sizes: specs, bytes and traffic.

    Attributes:
      specs: per group, its spec.
      param_bytes, grad_bytes, optimizer_bytes: per device, summed over the tree.
      gather: ``(storage axes, gathered bytes)`` of the leaves stored split over them (mesh order),
        what the step's peak reads; the rest of :attr:`traffic` is summed when first read.
      error: set (and the rest empty) when the rule refused the mesh.
      axes_used: the mesh axes some leaf is split over (mesh order).

    :attr:`decisions` (with their reasons) and :attr:`traffic` are worked out when first read:
    a search plans a few hundred meshes, prices a few dozen and shows a few.
    """

    __slots__ = ("specs", "param_bytes", "grad_bytes", "optimizer_bytes", "gather", "error", "axes_used",
                 "_decisions", "_planner", "_sizes", "_shares", "_traffic")

    def __init__(self, specs: tuple[PartitionSpec, ...], param_bytes: int, grad_bytes: int, optimizer_bytes: int,
                 gather: tuple[tuple[tuple[str, ...], int], ...], *, error: str | None = None,
                 axes_used: tuple[str, ...] = (), decisions: tuple[Decision | None, ...] | None = (),
                 planner: Planner | None = None, sizes: FrozenAxisSizes | None = None,
                 shares: tuple[_Share, ...] = ()) -> None:
        self.specs, self.param_bytes, self.grad_bytes, self.optimizer_bytes = specs, param_bytes, grad_bytes, \
            optimizer_bytes
        self.gather, self.error, self.axes_used = gather, error, axes_used
        # The planner and sizes it came from (a reference each, not a closure: the search keeps ~200 plans).
        self._decisions, self._planner, self._sizes, self._shares = decisions, planner, sizes, shares
        self._traffic: ParamTraffic | None = None

    @property
    def decisions(self) -> tuple[Decision | None, ...]:
        """Per group, the rule's decision (``None``: no opinion, replicated)."""
        if self._decisions is None:
            assert self._planner is not None and self._sizes is not None  # set whenever the decisions are not
            self._decisions = self._planner.explain(self._sizes)
        return self._decisions

    @property
    def traffic(self) -> ParamTraffic:
        """The parameter bytes each collective moves (see :class:`ParamTraffic`)."""
        if self._traffic is None:
            rows = () if self._planner is None else self._planner.rows
            self._traffic = _traffic(self.gather, rows, self._shares)
        return self._traffic


def _failed(message: str) -> PlanEval:
    return PlanEval((), 0, 0, 0, (), error=message)


_Row = tuple[int, Shape, Any, int, int, int, int, str]
"""What a plan reads of one group: (first leaf, shape, dtype, leaves, bytes per element of the parameter,
gradient and optimizer copies, role: "embed", "head", "pos", "attn" or "")."""


class _Part(NamedTuple):
    """What one group adds to a plan: its shard, and its leaves' bytes per device (params, grads,
    optimizer copies, and the params gathered when the shard is stored split)."""

    share: _Share
    params: int
    grads: int
    optimizer: int
    gathered: int


class _Refused(Exception):
    """A group's spec cannot store it on the mesh (the plan's error)."""


_PLAN_ERRORS: tuple[type[Exception], ...] = (*LEAF_ERRORS, _Refused)
"""What makes one plan fail (its message is the plan's error), not the search."""


class _Block(NamedTuple):
    """What one class of groups (those whose specs read the same mesh axes) adds to a plan, for one
    set of sizes of those axes; memoized per class, so a plan sums a few blocks, not every group.

    Attributes:
      specs, shares: per group of the class (group order), its spec and :class:`_Share`.
      params, grads, optimizer: bytes per device of the class's leaves.
      gather: ``(storage axes, gathered bytes, first group stored so)`` per storage axes met.
      used: the mesh axes some group of the class is split over.
    """

    specs: tuple[PartitionSpec, ...]
    shares: tuple[_Share, ...]
    params: int
    grads: int
    optimizer: int
    gather: tuple[tuple[tuple[str, ...], int, int], ...]
    used: frozenset[str]


_SpecFn = Callable[[Mapping[str, int]], PartitionSpec]
# Per mesh axis names: the classes (sizes -> the key of the axes they read, their groups, key -> block), and
# the function putting the classes' concatenated per-group tuples back in group order.
_Classes = tuple[tuple[Callable[[Mapping[str, int]], Hashable], tuple[int, ...], dict[Hashable, _Block]], ...]
_Layout = tuple[_Classes, Callable[[tuple[Any, ...]], tuple[Any, ...]]]


class Planner:
    """Plans of one tree for one rule and training state, on many meshes (what one search asks).

    ``planner(sizes)`` is :func:`evaluate_plan`; the planner keeps what does not depend on the
    mesh (per group: shape, dtype, bytes per element, role) and the shard sizes seen. For the
    default :class:`~meshplan.pure.AxisKindRule` it also keeps each group's spec and shard per
    sizes of the axes that group reads (:meth:`~meshplan.pure.AxisKindRule.spec_function`):
    a 4096-device search plans ~200 meshes, and a dense leaf or a norm meets a few dozen
    distinct (fsdp, tp) among them.
    """

    __slots__ = ("groups", "rule", "cache", "rows", "_paths", "_specs", "_layouts")

    def __init__(self, groups: LeafGroups, rule: Rule, *, state: TrainingState,
                 geometry_cache: GeometryCache | None = None) -> None:
        self.groups, self.rule = groups, rule
        self.cache = GeometryCache() if geometry_cache is None else geometry_cache
        roles = groups.roles
        self.rows: tuple[_Row, ...] = tuple(
            (index, info.shape, info.dtype, count, *state.element_bytes(info.dtype), roles.get(index, ""))
            for index, info, count in zip(groups.first, groups.infos, groups.counts, strict=True))
        self._paths = tuple(groups.paths.path(index) for index in groups.first)
        # The default rule gives each group's spec as a function of the mesh, without its reason (the
        # decisions are asked again only for the plans read); a subclass may decide otherwise, so
        # only the class itself. A leaf it refuses whatever the mesh keeps its error, raised in turn.
        self._specs: tuple[tuple[_SpecFn, tuple[str, ...]] | Exception, ...] | None = None
        if type(rule) is AxisKindRule:
            no_axes = canonical_axis_sizes({})
            self._specs = tuple(_spec_function(rule, LeafContext.trusted(row[1], row[2], no_axes, row[0],
                                                                         groups.paths))
                                for row in self.rows)
        # mesh axis names -> the classes of groups whose specs read the same axes, each with its blocks
        # by the sizes of those axes (a DeepSeek-V3 plan adds 4 blocks instead of 23 groups).
        self._layouts: dict[tuple[str, ...], _Layout | None] = {}

    def __call__(self, sizes: Mapping[str, int]) -> PlanEval:
        sizes = canonical_axis_sizes(sizes)  # once per plan: leaf contexts then take it as is
        mesh_axes = tuple(sizes)
        fast = self._specs
        if fast is not None:
            layout = self._layouts.get(mesh_axes) or self._new_layout(mesh_axes, fast)
            if layout is not None:
                try:
                    return self._from_blocks(sizes, mesh_axes, fast, layout)
                except _PLAN_ERRORS:
                    pass  # the group-by-group walk below names the first group failing, in group order
        return self._by_group(sizes, mesh_axes)

    def _by_group(self, sizes: FrozenAxisSizes, mesh_axes: tuple[str, ...]) -> PlanEval:
        """The plan asked group by group, in group order (no memo): rules without a spec function, and
        the plans of the default rule that fail (the first group failing gives the error)."""
        rule, paths, fast = self.rule, self.groups.paths, self._specs
        decisions: list[Decision | None] = []
        parts: list[_Part] = []
        p_total = g_total = o_total = 0
        gather: dict[tuple[str, ...], int] = {}
        all_used: set[str] = set()
        try:
            for g, row in enumerate(self.rows):
                if fast is not None:
                    found = fast[g]
                    if isinstance(found, Exception):  # refused whatever the mesh
                        return _failed(str(found))
                    part = self._part(g, found[0](sizes), sizes, mesh_axes)
                else:
                    decision = ask(rule, LeafContext.trusted(row[1], row[2], sizes, row[0], paths))  # checked by tree_facts
                    decisions.append(decision)
                    part = self._part(g, _REPLICATED if decision is None else decision.spec, sizes, mesh_axes)
                parts.append(part)
                p_total += part.params
                g_total += part.grads
                o_total += part.optimizer
                share = part.share
                all_used.update(share.axes)
                if share.storage:
                    gather[share.storage] = gather.get(share.storage, 0) + part.gathered
        except _PLAN_ERRORS as err:
            return _failed(str(err))
        return PlanEval(tuple(p.share.spec for p in parts), p_total, g_total, o_total, tuple(gather.items()),
                        axes_used=tuple(a for a in mesh_axes if a in all_used),
                        decisions=tuple(decisions) if fast is None else None, planner=self, sizes=sizes,
                        shares=tuple(p.share for p in parts))

    def _from_blocks(self, sizes: FrozenAxisSizes, mesh_axes: tuple[str, ...], fast: tuple[Any, ...],
                     layout: _Layout) -> PlanEval:
        """The plan as :meth:`_by_group` makes it, from one memoized :class:`_Block` per class of groups.

        Raises:
          LEAF_ERRORS, _Refused: a group fails (which one first is :meth:`_by_group`'s to say).
        """
        classes, order = layout
        p_total = g_total = o_total = 0
        specs: tuple[PartitionSpec, ...] = ()
        shares: tuple[_Share, ...] = ()
        used: set[str] = set()
        gather: dict[tuple[str, ...], list[int]] = {}  # storage axes -> [bytes, first group stored so]
        for key_of, members, memo in classes:
            key = key_of(sizes)
            block = memo.get(key)
            if block is None:
                block = memo[key] = self._block(members, sizes, mesh_axes, fast)
            p_total += block.params
            g_total += block.grads
            o_total += block.optimizer
            specs += block.specs
            shares += block.shares
            used |= block.used
            for storage, nbytes, first in block.gather:
                found = gather.get(storage)
                if found is None:
                    gather[storage] = [nbytes, first]
                else:
                    found[0] += nbytes
                    found[1] = min(found[1], first)
        # Group by group, the storage axes are met in the order of their first group (dict order there).
        ordered = sorted(gather.items(), key=lambda kv: kv[1][1])
        return PlanEval(order(specs), p_total, g_total, o_total, tuple((k, v[0]) for k, v in ordered),
                        axes_used=tuple(a for a in mesh_axes if a in used), decisions=None, planner=self,
                        sizes=sizes, shares=order(shares))

    def _block(self, members: tuple[int, ...], sizes: FrozenAxisSizes, mesh_axes: tuple[str, ...],
               fast: tuple[Any, ...]) -> _Block:
        """What the groups ``members`` (one class) add to a plan on a mesh of these sizes."""
        specs: list[PartitionSpec] = []
        shares: list[_Share] = []
        params = grads = optimizer = 0
        gather: dict[tuple[str, ...], list[int]] = {}
        used: set[str] = set()
        rows, paths, cache = self.rows, self._paths, self.cache
        for g in members:  # one pass: a search makes ~250 blocks of ~1,200 group parts
            # _part's arithmetic without its record (a group's part is read only here).
            _, shape, _, count, p_unit, g_unit, o_unit, _ = rows[g]
            spec = fast[g][0](sizes)
            share = _share(shape, spec, sizes, mesh_axes, paths[g], cache)
            if share.padded:
                self._part(g, spec, sizes, mesh_axes)  # raises the group's error
            elements = count * share.elements
            specs.append(spec)
            shares.append(share)
            params += elements * p_unit
            grads += elements * g_unit
            optimizer += elements * o_unit
            used.update(share.axes)
            if share.storage:
                found = gather.get(share.storage)
                if found is None:
                    gather[share.storage] = [elements * p_unit * share.ways, g]
                else:
                    found[0] += elements * p_unit * share.ways
        return _Block(tuple(specs), tuple(shares), params, grads, optimizer,
                      tuple((k, v[0], v[1]) for k, v in gather.items()), frozenset(used))

    def _part(self, g: int, spec: PartitionSpec, sizes: FrozenAxisSizes, mesh_axes: tuple[str, ...]) -> _Part:
        """What group ``g`` under ``spec`` adds to a plan.

        Raises:
          _Refused: the spec does not divide the shape; what :func:`shard_geometry` raises.
        """
        _, shape, _, count, p_unit, g_unit, o_unit, _ = self.rows[g]
        path = self._paths[g]
        share = _share(shape, spec, sizes, mesh_axes, path, self.cache)
        if share.padded:
            raise _Refused(f"{path}: rule {rule_name(self.rule)!r} gave {spec} for shape {shape}, "
                           f"which does not divide evenly on {dict(sizes)}; jax cannot store it.")
        elements = share.elements
        params = count * elements * p_unit
        return _Part(share, params, count * elements * g_unit, count * elements * o_unit, params * share.ways)

    def _new_layout(self, mesh_axes: tuple[str, ...],
                    fast: tuple[tuple[_SpecFn, tuple[str, ...]] | Exception, ...]) -> _Layout | None:
        """The classes of groups whose specs read the same axes of a mesh with these names (None when a
        group is refused whatever the mesh: such plans are walked group by group)."""
        if any(isinstance(found, Exception) for found in fast):
            self._layouts[mesh_axes] = None
            return None
        by_axes: dict[tuple[str, ...], list[int]] = {}
        for g, found in enumerate(fast):
            # An axis the mesh lacks reads as 1 on every mesh with these names: not part of the key.
            present = tuple(a for a in found[1] if a in mesh_axes)  # type: ignore[index]
            by_axes.setdefault(present, []).append(g)
        classes: _Classes = tuple((operator.itemgetter(*present) if present else _no_key, tuple(members), {})
                                  for present, members in by_axes.items())
        # The classes' groups, concatenated, back in group order.
        perm = [0] * len(fast)
        for position, g in enumerate(g for _, members, _ in classes for g in members):
            perm[g] = position
        order = _identity if perm == sorted(perm) else operator.itemgetter(*perm)
        layout = self._layouts[mesh_axes] = (classes, order)
        return layout

    def explain(self, sizes: FrozenAxisSizes) -> tuple[Decision | None, ...]:
        """The rule's whole decisions on a mesh of these (canonical) sizes, one per group."""
        rule, paths = self.rule, self.groups.paths
        return tuple(ask(rule, LeafContext.trusted(row[1], row[2], sizes, row[0], paths)) for row in self.rows)


def _no_key(sizes: Mapping[str, int]) -> Hashable:
    return ()


def _identity(items: tuple[Any, ...]) -> tuple[Any, ...]:
    return items


def _spec_function(rule: AxisKindRule, ctx: LeafContext) -> tuple[_SpecFn, tuple[str, ...]] | Exception:
    try:
        return rule.spec_function(ctx)
    except LEAF_ERRORS as err:
        return err


def evaluate_plan(
    groups: LeafGroups,
    rule: Rule,
    sizes: Mapping[str, int],
    *,
    state: TrainingState,
    geometry_cache: GeometryCache | None = None,
) -> PlanEval:
    """Ask ``rule`` once per group and total the bytes and parameter traffic per device.

    The arithmetic is :func:`~meshplan.pure.estimate_training_memory`'s: each
    group's shard is :func:`~meshplan.pure.shard_geometry`'s (padded) shard
    shape, and its bytes per element are ``state.element_bytes(dtype)``.
    A search asks a :class:`Planner` instead, which keeps what does not
    depend on the mesh.

    Args:
      groups: the tree's leaf groups for ``rule``.
      rule: a pure rule.
      sizes: mesh axis sizes (mesh order).
      state: the gradient and optimizer dtypes and copies (canonical dtypes).
      geometry_cache: a dict shared across calls; shard sizes are looked up there by
        (shape, spec, sizes of the spec's axes), so meshes that split a leaf the same
        way skip :func:`~meshplan.pure.shard_geometry`.

    Returns:
      A :class:`PlanEval` (with ``error`` set when the rule refused a leaf or
      gave a spec that cannot store it on this mesh).
    """
    return Planner(groups, rule, state=state, geometry_cache=geometry_cache)(sizes)


def _traffic(gather: tuple[tuple[tuple[str, ...], int], ...], rows: tuple[_Row, ...],
             shares: tuple[_Share, ...]) -> ParamTraffic:
    """The plan's :class:`ParamTraffic`: per group, its shard's bytes by where it is stored and replicated."""
    scatter: dict[tuple[str, ...], int] = {}
    reduce: dict[tuple[str, ...], int] = {}
    embed: dict[tuple[str, ...], int] = {}
    head: dict[tuple[str, ...], int] = {}
    head_scatter: dict[tuple[str, ...], int] = {}
    head_f32: dict[tuple[str, ...], int] = {}
    head_reduce: dict[tuple[str, ...], int] = {}
    embed_whole: list[tuple[tuple[str, ...], tuple[str, ...], int, int]] = []
    embed_table: list[tuple[tuple[str, ...], tuple[str, ...], int, int]] = []
    experts: list[tuple[tuple[str, ...], int, int]] = []
    attn: dict[tuple[str, ...], int] = {}
    roles = {row[7] for row in rows}
    head_tp = False
    grad_whole: list[tuple[tuple[str, ...], tuple[str, ...], int, int]] = []
    head_whole: list[tuple[tuple[str, ...], tuple[str, ...], int, int]] = []
    for (_, shape, _, count, p_unit, g_unit, _, role), share in zip(rows, shares, strict=True):
        elements = share.elements
        p, gr = elements * p_unit, elements * g_unit
        storage, replicas, ways = share.storage, share.replicas, share.ways
        if storage:
            scatter[storage] = scatter.get(storage, 0) + count * gr * ways
            if role == "embed":
                embed[storage] = embed.get(storage, 0) + count * p * ways
                embed_table.append((storage, replicas, count * p * ways, count * gr * ways))
            elif role == "head":
                head_tp = head_tp or "tp" in share.axes
                head[storage] = head.get(storage, 0) + count * p * ways
                head_scatter[storage] = head_scatter.get(storage, 0) + count * gr * ways
                head_f32[storage] = head_f32.get(storage, 0) + count * elements * 4 * ways
            elif role == "attn":
                attn[storage] = attn.get(storage, 0) + count * p * ways
            elif role == "experts":
                experts.append((storage, count * p * ways, count * gr * ways))
            elif role == "pos":  # read only by an add, whose backward needs no weights: gathered once
                embed[storage] = embed.get(storage, 0) + count * p * ways
        if storage and replicas and role == "head":
            head_whole.append((storage, replicas, count * gr * ways, 0))
        if storage and replicas and role in ("embed", "pos"):
            embed_whole.append((storage, replicas, count * gr * ways, count * gr))
        elif storage and role not in ("embed", "head", "pos") and _narrow_minor(shape, share, ways):
            # Whole over the storage group only: the shard's all-reduce over its replicas stays as it is.
            grad_whole.append((storage, (), count * gr * ways, 0))
        if replicas:
            reduce[replicas] = reduce.get(replicas, 0) + count * gr
            if role == "head":  # its fp32 gradient is all-reduced in fp32 too (see ParamTraffic)
                head_reduce[replicas] = head_reduce.get(replicas, 0) + count * max(elements * 4 - gr, 0)
    return ParamTraffic(gather, tuple(scatter.items()), tuple(reduce.items()), tuple(embed.items()),
                        tuple(head.items()), tuple(head_scatter.items()), tuple(head_f32.items()),
                        tuple(head_reduce.items()), tuple(embed_whole), tuple(attn.items()),
                        tied="head" in roles and "embed" not in roles, head_tp=head_tp, grad_whole=tuple(grad_whole),
                        head_whole=tuple(head_whole), embed_table=tuple(embed_table), experts=tuple(experts))


def _narrow_minor(shape: Shape, share: _Share, ways: int) -> bool:
    """Whether XLA:TPU sums this leaf's gradient whole over its storage group instead of reduce-scattering it
    (see ``ParamTraffic.grad_whole``): a matrix split over its storage axes on its last dim alone into shards an
    odd multiple of 128 elements wide. (Vectors, summed whole too at fsdp=8, are left
    out: under tp their compiled sums differ, a few KiB a step.)"""
    entries = tuple(share.spec)
    if len(shape) < 2 or len(entries) != len(shape) or any(e is not None for e in entries[:-1]):
        return False
    last = entries[-1]
    named = (last,) if isinstance(last, str) else tuple(last or ())
    return set(named) == set(share.storage) and shape[-1] % ways == 0 and shape[-1] // ways % 256 == 128


_EMBEDDINGS = ("embed_tokens", "wte")
_HEADS = ("lm_head",)
# Substring tests of every leaf path, as one C-level search each (a search groups a 45k-leaf tree).
_EMBEDDING_NAMES = re.compile("|".join(map(re.escape, _EMBEDDINGS)))
_POSITION_NAMES = re.compile(r"(?:^|/)wpe/")  # GPT-2's learned position embedding
_HEAD_NAMES = re.compile("|".join(map(re.escape, _HEADS)))
_ATTENTION_NAMES = re.compile(r"(?:^|/)(?:self_attn|attn)/")  # Llama / Mixtral / DeepSeek, GPT-2
_EXPERT_NAMES = re.compile(r"(?:^|/)experts/")  # Mixtral / DeepSeek routed experts (not shared_experts/)


def _embedding_roles(leaf_group: list[int], first: list[int], templates: list[str]) -> dict[int, str]:
    """``{group's first leaf: "embed" | "head" | "pos" | "attn" | "experts"}`` for the input embedding, the
    output head, a learned position embedding, the attention weights and the routed experts, by name.

    The compiled steps gather them differently from the other layers' weights (see ``ParamTraffic``); a
    tree without an output head uses its embedding as the head (tied weights). A group whose leaves
    do not all share one role gets none.

    Read off each leaf's path template (``templates[i]``; the names are matched once per template, not
    per leaf: a 61-layer tree has ~25 templates for its ~1000 leaves): the names hold no digit, '*' or
    '/' but where they name a whole component, and no all-digit component holds a name, so a path and
    its template match the same names."""
    leaf: dict[int, str] = {}
    by_template: dict[str, str] = {}
    for i, g in enumerate(leaf_group):
        if g >= 0:
            path = templates[i]
            role = by_template.get(path)
            if role is None:
                role = by_template[path] = (
                    "head" if _HEAD_NAMES.search(path) else "embed" if _EMBEDDING_NAMES.search(path)
                    else "pos" if _POSITION_NAMES.search(path) else "attn" if _ATTENTION_NAMES.search(path)
                    else "experts" if _EXPERT_NAMES.search(path) else "")
            leaf[i] = role
    if "head" not in leaf.values():
        leaf = {i: "head" if r == "embed" else r for i, r in leaf.items()}
    by_group: dict[int, set[str]] = {}
    for i, r in leaf.items():
        by_group.setdefault(leaf_group[i], set()).add(r)
    return {first[g]: next(iter(r)) for g, r in by_group.items() if len(r) == 1 and "" not in r}


def _share(shape: Shape, spec: PartitionSpec, sizes: Mapping[str, int], names: tuple[str, ...],
           path: str, cache: GeometryCache) -> _Share:
    """:class:`_Share` of a leaf, memoized by (shape, spec, mesh axis names), then by the sizes of the
    spec's axes: the search meets the same few hundred of them in thousands of (group, mesh) pairs."""
    try:
        checked = cache.checked.get((shape, spec, names))
    except TypeError:  # an unhashable entry (a list): nothing to memoize by
        axes, geometry = _geometry(shape, spec, sizes, path, cache)
        storage, replicas = _placed(axes, names)
        return _Share(spec, axes, geometry.padded, geometry.num_elements, storage,
                      math.prod(sizes[a] for a in storage), replicas)
    if checked is None:
        # First sight of this spec on this shape and mesh: shard_geometry checks it (and raises
        # the leaf's error); its canonical entries are kept for the other axis sizes.
        axes, geometry = _geometry(shape, spec, sizes, path, cache)
        checked = cache.checked[(shape, spec, names)] = _Checked(
            axes, canonical_entries(spec, len(shape), where=path), *_placed(axes, names), {})
        padded, elements = geometry.padded, geometry.num_elements
    else:
        hit = checked.shares.get(tuple([sizes[a] for a in checked.axes]))
        if hit is not None:
            # An equal spec may be written differently (P('tp') == P(('tp',))): the plan keeps the rule's own.
            return hit if hit.spec is spec else hit._replace(spec=spec)
        # geometry_of_entries' arithmetic without building its record (a DeepSeek-V3 search meets ~800 new
        # (leaf, sizes) pairs here; test_planner's lazy plans hold it to shard_geometry's). The entries were
        # checked for this shape and these axes (never P.UNCONSTRAINED: _geometry refuses it).
        padded, elements = False, 1
        for d, entry in zip(shape, checked.entries, strict=True):
            n = 1
            for a in entry:
                n *= sizes[a]
            if d % n:
                padded = True
            elements *= -(-d // n)
    storage = checked.storage
    found = checked.shares[tuple([sizes[a] for a in checked.axes])] = _Share(
        spec, checked.axes, padded, elements, storage, math.prod(sizes[a] for a in storage), checked.replicas)
    return found


def _placed(axes: tuple[str, ...], names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the storage axes a spec using ``axes`` splits a leaf over, the data axes it is replicated over),
    in mesh order."""
    used = set(axes)
    return (tuple(a for a in names if a in used and a in STORAGE_AXES),
            tuple(a for a in names if a in DATA_AXES and a not in used))


def _geometry(shape: Shape, spec: PartitionSpec, sizes: Mapping[str, int], where: str,
              cache: GeometryCache) -> tuple[tuple[str, ...], ShardGeometry]:
    """(the axes ``spec`` uses, :func:`shard_geometry`), memoized by the sizes of those axes.

    Raises:
      SpecError: ``P.UNCONSTRAINED`` (a stored parameter cannot honour it), or
        what :func:`shard_geometry` refuses.
    """
    if any(e is UNCONSTRAINED for e in spec):
        raise SpecError(f"{where}: spec {spec} has P.UNCONSTRAINED, which a stored parameter cannot "
                        "honour; name the axes or use None.")
    try:
        axes = cache.axes.get(spec)
    except TypeError:  # an unhashable entry (a list): nothing to memoize by
        return _axes(spec, where), shard_geometry(shape, spec, sizes, where=where)
    if axes is None:
        axes = cache.axes[spec] = _axes(spec, where)
    key = (shape, spec, tuple(sizes.get(a, 0) for a in axes))
    found = cache.geometry.get(key)
    if found is None:
        found = cache.geometry[key] = shard_geometry(shape, spec, sizes, where=where)
    return axes, found


def _axes(spec: PartitionSpec, where: str) -> tuple[str, ...]:
    """spec_axes(spec), naming the leaf if an entry is malformed (as shard_geometry would)."""
    return tuple(a for e in canonical_entries(spec, where=where) for a in e)


def state_bytes(groups: LeafGroups, state: TrainingState) -> int:
    """Unsharded bytes of params + grads + optimizer copies: what all devices hold together at least."""
    total = 0
    for info, count in zip(groups.infos, groups.counts, strict=True):
        total += count * math.prod(info.shape) * sum(state.element_bytes(info.dtype))
    return total


def param_groups(groups: LeafGroups, plan: PlanEval, rule: Rule) -> tuple[ParamGroup, ...]:
    """The plan as :class:`ParamGroup` records: one per (template, shape, dtype).

    Where leaves sharing a template got different specs (a rule that looks
    at layer indices), each of those leaves gets its own group, keyed by its
    exact path, so replaying the groups gives back the same specs.
    """
    out: list[ParamGroup] = []
    name = rule_name(rule)
    for (template, shape, dtype), members in groups.display:
        specs = {plan.specs[g] for g, _ in members}
        if len(specs) == 1:
            g = members[0][0]
            out.append(_record(template, shape, dtype, sum(n for _, n in members), plan, g, name))
            continue
        wanted = {g for g, _ in members}
        for i, leaf_g in enumerate(groups.leaf_group):
            if leaf_g in wanted:
                path = groups.paths.path(i)
                info = groups.facts.infos[i]
                if (info is not None and path_template(path) == template
                        and (info.shape, str(info.dtype)) == (shape, dtype)):
                    out.append(_record(path, shape, dtype, 1, plan, leaf_g, name))
    return tuple(out)


def _record(pattern: str, shape: tuple[int, ...], dtype: str, count: int, plan: PlanEval, g: int,
            name: str) -> ParamGroup:
    decision = plan.decisions[g]
    # Trusted: the pattern, shape and dtype come from the checked tree, the rest from checked decisions.
    if decision is None:
        return ParamGroup.trusted(pattern, shape, dtype, count, _REPLICATED, name, "no opinion; replicated")
    return ParamGroup.trusted(pattern, shape, dtype, count, decision.spec, decision.rule, decision.reason)
