"""The mesh search's view of a parameter tree: leaf groups, and one plan per distinct mesh.

Asking a rule once per leaf per candidate mesh would cost leaves x meshes
rule calls (723 x 290 for Llama-3-70B on 4096 devices). Instead:

1. :class:`LeafGroups` splits the tree once into groups of leaves the rule
   promises to treat alike: its ``group_key(ctx)`` when it has one (the
   default :class:`~meshplan.pure.rules._axis_kind.AxisKindRule`: path template,
   shape, dtype), ``(shape, dtype)`` for shape-only rules, else one group
   per leaf (correct for any rule, just slower);
2. :func:`evaluate_plan` asks the rule once per group for one set of axis
   sizes, and the search caches the answer per *distinct* sizes of the axes
   the rule reads (``rule.reads_axes``; every axis when it does not say), so
   meshes that differ only in dp/sp or in their DCN split share one plan.

Bytes per device are the pure memory estimator's arithmetic
(:func:`~meshplan.pure.shard_geometry` + :func:`~meshplan.pure.array_bytes`,
with gradients and optimizer copies typed as
:func:`~meshplan.pure.estimate_training_memory` types them); the tests check
that they equal ``estimate_training_memory`` of the expanded spec tree, byte
for byte.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from meshplan.pure.rules._axis_kind import path_template
from meshplan.pure.specs._dtypes import dtype_storage_bytes
from meshplan.pure.search._candidate import ParamGroup
from meshplan.pure.rules._base import Decision, LeafContext, is_shape_only, rule_name
from meshplan.pure._check import canonical_axis_sizes
from meshplan.pure.rules._composite import CompositeRule
from meshplan.pure.specs._geometry import UNCONSTRAINED, shard_geometry
from meshplan.pure.search._step_cost import DATA_AXES, STORAGE_AXES, ParamTraffic
from meshplan.pure.specs._training import _is_inexact
from meshplan.pure.specs._tree import LeafInfo, TreeFacts
from meshplan.pure.errors import MemoryBudgetError, MeshplanTypeError, ShardingRuleError, SpecError

__all__ = ["LeafGroups", "PlanEval", "evaluate_plan", "group_key_fn", "param_groups", "reads_axes", "state_bytes"]

_REPLICATED = PartitionSpec()
_RULE_ERRORS = (ShardingRuleError, MemoryBudgetError, SpecError)
_FLOAT0 = np.dtype(jax.dtypes.float0)


def group_key_fn(rule: Any) -> Any:
    """``ctx -> key`` such that leaves with equal keys get equal decisions from ``rule``."""
    key = getattr(rule, "group_key", None)
    if callable(key):
        return key
    if isinstance(rule, CompositeRule):
        parts = [group_key_fn(r) for r in rule.rules]
        return lambda ctx: tuple(part(ctx) for part in parts)
    if is_shape_only(rule):
        return lambda ctx: (ctx.shape, ctx.dtype)
    return lambda ctx: ("leaf", ctx.index)


def reads_axes(rule: Any) -> tuple[str, ...] | None:
    """The axes whose sizes ``rule``'s answers depend on (``None``: possibly all)."""
    if isinstance(rule, CompositeRule):
        parts = [reads_axes(r) for r in rule.rules]
        if any(p is None for p in parts):
            return None
        return tuple(dict.fromkeys(a for p in parts for a in p))
    found = getattr(rule, "reads_axes", None)
    return tuple(found) if isinstance(found, tuple | list) else None


class _Paths:
    """A tree's leaf paths, formatted once (rules read ``ctx.path`` once per group per mesh)."""

    __slots__ = ("_facts", "_paths")

    def __init__(self, facts: TreeFacts) -> None:
        self._facts = facts
        self._paths = [facts.path(i) for i in range(len(facts.infos))]

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
    """

    facts: TreeFacts
    paths: _Paths
    first: tuple[int, ...]
    infos: tuple[LeafInfo, ...]
    counts: tuple[int, ...]
    leaf_group: tuple[int, ...]
    display: tuple[tuple[tuple[str, tuple[int, ...], str], tuple[tuple[int, int], ...]], ...]

    @classmethod
    def build(cls, facts: TreeFacts, rule: Any) -> LeafGroups:
        """Group the leaves of ``facts`` for ``rule`` (one rule-key call and one path per leaf)."""
        key_of = group_key_fn(rule)
        paths = _Paths(facts)
        no_axes = canonical_axis_sizes({})
        ids: dict[Hashable, int] = {}
        first: list[int] = []
        infos: list[LeafInfo] = []
        counts: list[int] = []
        leaf_group: list[int] = []
        display: dict[tuple, dict[int, int]] = {}
        for i, info in enumerate(facts.infos):
            if info is None:
                leaf_group.append(-1)
                continue
            ctx = LeafContext(info.shape, info.dtype, no_axes, i, paths)
            key = key_of(ctx)
            g = ids.get(key)
            if g is None:
                g = ids[key] = len(first)
                first.append(i)
                infos.append(info)
                counts.append(0)
            counts[g] += 1
            leaf_group.append(g)
            where = display.setdefault((path_template(paths.path(i)), info.shape, str(info.dtype)), {})
            where[g] = where.get(g, 0) + 1
        shown = tuple((k, tuple(v.items())) for k, v in display.items())
        return cls(facts, paths, tuple(first), tuple(infos), tuple(counts), tuple(leaf_group), shown)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class PlanEval:
    """One plan of the tree for one set of axis sizes: decisions, bytes and traffic.

    ``error`` is set (and the rest empty) when the rule refused the mesh.
    """

    decisions: tuple[Decision | None, ...]
    specs: tuple[PartitionSpec, ...]
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    traffic: ParamTraffic
    error: str | None = None


def _failed(message: str) -> PlanEval:
    return PlanEval((), (), 0, 0, 0, ParamTraffic((), (), ()), message)


def evaluate_plan(
    groups: LeafGroups,
    rule: Any,
    sizes: Mapping[str, int],
    *,
    grad_dtype: Any,
    optimizer_dtype: Any,
    optimizer_copies: int,
    geometry_cache: dict[Any, tuple[int, bool]] | None = None,
) -> PlanEval:
    """Ask ``rule`` once per group and total the bytes and parameter traffic per device.

    Args:
      groups: the tree's leaf groups for ``rule``.
      rule: a pure rule.
      sizes: mesh axis sizes (mesh order).
      grad_dtype: gradient dtype of floating leaves (``None``: the leaf's own).
      optimizer_dtype: dtype of the optimizer copies of floating leaves.
      optimizer_copies: parameter-shaped optimizer copies per floating leaf.
      geometry_cache: a dict shared across calls; shard sizes are looked up there by
        (shape, spec, sizes of the spec's axes), so meshes that split a leaf the same
        way skip :func:`~meshplan.pure.shard_geometry`.

    Returns:
      A :class:`PlanEval` (with ``error`` set when the rule refused a leaf or
      gave a spec that cannot store it on this mesh).
    """
    sizes = canonical_axis_sizes(sizes)  # once per plan: leaf contexts then take it as is
    mesh_axes = tuple(sizes)
    decisions: list[Decision | None] = []
    specs: list[PartitionSpec] = []
    p_total = g_total = o_total = 0
    gather: dict[tuple[str, ...], int] = {}
    scatter: dict[tuple[str, ...], int] = {}
    reduce: dict[tuple[str, ...], int] = {}
    itemsizes: dict[Any, int] = {}
    for g, (index, info, count) in enumerate(zip(groups.first, groups.infos, groups.counts, strict=True)):
        ctx = LeafContext(info.shape, info.dtype, sizes, index, groups.paths)
        try:
            decision = rule(ctx)
            if decision is not None and not isinstance(decision, Decision):
                raise MeshplanTypeError(f"{ctx.path}: rule {rule_name(rule)!r} returned {decision!r}, "
                                        "not a Decision or None.")
            spec = _REPLICATED if decision is None else decision.spec
            axes = _spec_axes(spec)
            elements, padded = _shard_elements(info.shape, spec, axes, sizes, ctx, geometry_cache)
        except _RULE_ERRORS as err:
            return _failed(str(err))
        if padded:
            return _failed(f"{ctx.path}: rule {rule_name(rule)!r} gave {spec} for shape {info.shape}, "
                           f"which does not divide evenly on {dict(sizes)}; jax cannot store it.")
        decisions.append(decision)
        specs.append(spec)
        # array_bytes(shard, dtype) == elements * dtype_storage_bytes(dtype); the itemsizes are
        # looked up once per dtype because dtype_bits is slow next to a multiplication.
        inexact = _is_inexact(info.dtype)
        p = elements * _itemsize(info.dtype, itemsizes)
        gr = elements * _itemsize((grad_dtype or info.dtype) if inexact else _FLOAT0, itemsizes)
        o = optimizer_copies * elements * _itemsize(optimizer_dtype if inexact else _FLOAT0, itemsizes)
        p_total += count * p
        g_total += count * gr
        o_total += count * o
        used = set(axes)
        storage = tuple(a for a in mesh_axes if a in used and a in STORAGE_AXES)
        replicas = tuple(a for a in mesh_axes if a in DATA_AXES and a not in used)
        ways = math.prod(sizes[a] for a in storage)
        if storage:
            gather[storage] = gather.get(storage, 0) + count * p * ways
            scatter[storage] = scatter.get(storage, 0) + count * gr * ways
        if replicas:
            reduce[replicas] = reduce.get(replicas, 0) + count * gr
    traffic = ParamTraffic(tuple(gather.items()), tuple(scatter.items()), tuple(reduce.items()))
    return PlanEval(tuple(decisions), tuple(specs), p_total, g_total, o_total, traffic)


def _spec_axes(spec: PartitionSpec) -> tuple[Any, ...]:
    """The names a spec uses (as spec_axes, without its entry checks: shard_geometry does those)."""
    return tuple(a for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,)))


def _shard_elements(shape: tuple[int, ...], spec: PartitionSpec, axes: tuple[Any, ...], sizes: Mapping[str, int],
                    ctx: LeafContext, cache: dict[Any, tuple[int, bool]] | None) -> tuple[int, bool]:
    """(elements per shard, padded) via shard_geometry, memoized by the sizes the spec uses."""
    if any(e is UNCONSTRAINED for e in spec):
        raise SpecError(f"{ctx.path}: spec {spec} has P.UNCONSTRAINED, which a stored parameter cannot "
                        "honour; name the axes or use None.")
    try:
        key = (shape, spec, tuple(sizes.get(a, 0) for a in axes))
        found = None if cache is None else cache.get(key)
    except TypeError:  # an unhashable or malformed entry: let shard_geometry explain it
        key, found = None, None
    if found is None:
        geometry = shard_geometry(shape, spec, sizes, where=ctx.path)
        found = (math.prod(geometry.shard_shape), geometry.padded)
        if cache is not None and key is not None:
            cache[key] = found
    return found


def state_bytes(groups: LeafGroups, *, grad_dtype: Any, optimizer_dtype: Any, optimizer_copies: int) -> int:
    """Unsharded bytes of params + grads + optimizer copies: what all devices hold together at least."""
    cache: dict[Any, int] = {}
    total = 0
    for info, count in zip(groups.infos, groups.counts, strict=True):
        inexact = _is_inexact(info.dtype)
        per_element = (_itemsize(info.dtype, cache)
                       + _itemsize((grad_dtype or info.dtype) if inexact else _FLOAT0, cache)
                       + optimizer_copies * _itemsize(optimizer_dtype if inexact else _FLOAT0, cache))
        total += count * math.prod(info.shape) * per_element
    return total


def _itemsize(dtype: Any, cache: dict[Any, int]) -> int:
    found = cache.get(dtype)
    if found is None:
        found = cache[dtype] = dtype_storage_bytes(dtype)
    return found


def param_groups(groups: LeafGroups, plan: PlanEval, rule: Any) -> tuple[ParamGroup, ...]:
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
                if path_template(path) == template and (info.shape, str(info.dtype)) == (shape, dtype):
                    out.append(_record(path, shape, dtype, 1, plan, leaf_g, name))
    return tuple(out)


def _record(pattern: str, shape: tuple[int, ...], dtype: str, count: int, plan: PlanEval, g: int,
            name: str) -> ParamGroup:
    decision = plan.decisions[g]
    if decision is None:
        return ParamGroup(pattern, shape, dtype, count, _REPLICATED, name, "no opinion; replicated")
    return ParamGroup(pattern, shape, dtype, count, decision.spec, decision.rule, decision.reason)
