"""The shape-pattern rule: specs for leaves whose shape matches a pattern.

A pattern is a tuple of dim sizes where ``None`` matches any size; it
matches leaves of exactly its rank. Patterns are tried in the caller's order
(a dict's insertion order) and the first match wins. Leaves no pattern
matches get no opinion (``None``; the planner replicates them).

Unlike the reference ``ShapeBasedShardingRule``, a matched pattern whose spec
cannot be stored for that leaf (an axis the mesh lacks, a dim its axes do
not divide) is an error naming the pattern and the leaf, never a spec that
fails later inside ``device_put``. Spec problems visible without a mesh
(a spec longer than the pattern, an axis used twice, ``UNCONSTRAINED``,
which cannot place a stored array) are refused when the rule is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_int
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError, SpecError
from meshplan.pure.rules._base import Decision, LeafContext
from meshplan.pure.specs._geometry import (
    UNCONSTRAINED,
    canonical_entries,
    shard_geometry,
    spec_axes,
)

__all__ = ["ShapePatternRule"]

Pattern = tuple[int | None, ...]


def _pattern(raw: Any, k: int) -> Pattern:
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = (raw,)
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise MeshplanTypeError(
            f"shape pattern #{k} {raw!r} must be a tuple of dim sizes and None wildcards, e.g. (None, 1024)."
        )
    dims = tuple(None if d is None else as_int(d, f"shape pattern #{k} {tuple(raw)!r} entry") for d in raw)
    if any(d is not None and d < 0 for d in dims):
        raise ShardingRuleError(f"shape pattern #{k} {dims} has a negative dim; use sizes >= 0 or None.")
    return dims


def _pattern_spec(pattern: Pattern, spec: Any, k: int) -> PartitionSpec:
    where = f"shape pattern #{k} {pattern}"
    if not isinstance(spec, PartitionSpec):
        raise MeshplanTypeError(f"{where} maps to {spec!r}; expected a PartitionSpec.")
    try:
        entries = canonical_entries(spec, len(pattern), where=where)
    except SpecError as err:
        raise ShardingRuleError(str(err)) from None
    if any(e is UNCONSTRAINED for e in entries):
        raise ShardingRuleError(
            f"{where} maps to {spec}, which uses UNCONSTRAINED; a stored array needs a concrete "
            "layout, so use None (replicated) or an axis name there."
        )
    axes = [a for e in entries for a in e]
    repeated = sorted({a for a in axes if axes.count(a) > 1})
    if repeated:
        raise ShardingRuleError(f"{where} maps to {spec}, which uses mesh axes {repeated} more than once.")
    return spec


def _canonical_patterns(shape_patterns: Any) -> tuple[tuple[Pattern, PartitionSpec], ...]:
    if isinstance(shape_patterns, Mapping):
        items = list(shape_patterns.items())
    elif isinstance(shape_patterns, Sequence) and not isinstance(shape_patterns, str):
        items = list(shape_patterns)
        if not all(isinstance(it, tuple | list) and len(it) == 2 and isinstance(it[1], PartitionSpec)
                   for it in items):
            raise MeshplanTypeError(
                "shape_patterns must be a dict {pattern: PartitionSpec} or a sequence of "
                f"(pattern, PartitionSpec) pairs; got {shape_patterns!r}."
            )
    else:
        raise MeshplanTypeError(
            f"shape_patterns={shape_patterns!r} must be a dict {{pattern: PartitionSpec}} (tried in "
            "insertion order) or a sequence of (pattern, PartitionSpec) pairs."
        )
    out = []
    for k, (raw, spec) in enumerate(items):
        pattern = _pattern(raw, k)
        out.append((pattern, _pattern_spec(pattern, spec, k)))
    return tuple(out)


def _matches(pattern: Pattern, shape: tuple[int, ...]) -> bool:
    return len(pattern) == len(shape) and all(p is None or p == d for p, d in zip(pattern, shape, strict=True))


def _misfit(shape: tuple[int, ...], spec: PartitionSpec, sizes: Mapping[str, int]) -> str | None:
    """Why ``spec`` cannot store an array of ``shape`` on this mesh (``None``: it can)."""
    unknown = [a for a in spec_axes(spec) if a not in sizes]
    if unknown:
        return f"it uses {unknown}, not axes of the mesh"
    # Axes are known and (checked when the rule was built) unique, so this cannot raise.
    geometry = shard_geometry(shape, spec, sizes)
    bad = [
        f"dim {d} (size {n}) is not divisible by its split {s}"
        for d, (n, s) in enumerate(zip(shape, geometry.splits, strict=True))
        if n % s
    ]
    return "; ".join(bad) or None


@dataclasses.dataclass(frozen=True, slots=True)
class ShapePatternRule:
    """Shape patterns -> specs, as a pure shape-only rule (see the module docstring).

    Attributes:
      patterns: ``(pattern, spec)`` pairs in matching order.
      name: the label on its decisions.
      check_mesh: check a matched spec against the mesh (its axes and
        divisibility). ``False`` when no mesh is known yet (eformer's
        ``ShapeBasedShardingRule(patterns).apply(params)``): the spec is
        returned after the checks that need no mesh (rank and form).

    Example:
      >>> import numpy as np
      >>> rule = ShapePatternRule({(None, 1024): PartitionSpec("tp", None)})
      >>> rule(LeafContext((32000, 1024), np.dtype("float32"), {"tp": 4}))
      Decision(spec=P('tp', None), reason='matched shape pattern #0 (None, 1024)', rule='shape')
      >>> rule(LeafContext((7,), np.dtype("float32"), {"tp": 4})) is None
      True

    Raises (when called):
      ShardingRuleError: the matching pattern's spec does not fit the mesh or the shape.
    """

    patterns: tuple[tuple[Pattern, PartitionSpec], ...]
    name: str = "shape"
    check_mesh: bool = True
    shape_only: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "patterns", _canonical_patterns(self.patterns))
        if not isinstance(self.name, str):
            raise MeshplanTypeError(f"name={self.name!r} must be a string.")
        if not isinstance(self.check_mesh, bool):
            raise MeshplanTypeError(f"check_mesh={self.check_mesh!r} must be True or False.")

    def __call__(self, ctx: LeafContext) -> Decision | None:
        for k, (pattern, spec) in enumerate(self.patterns):
            if _matches(pattern, ctx.shape):
                if not self.check_mesh:
                    return Decision(spec, f"matched shape pattern #{k} {pattern} (no mesh: not checked against one)",
                                    self.name)
                problem = _misfit(ctx.shape, spec, ctx.axis_sizes)
                if problem is not None:
                    raise ShardingRuleError(
                        f"{ctx.path}: shape {ctx.shape} matches shape pattern #{k} {pattern} -> {spec}, "
                        f"which does not fit: {problem.rstrip('.')}; mesh axis sizes: {dict(ctx.axis_sizes)}. "
                        "Fix that pattern's spec, or put a narrower pattern before it."
                    )
                return Decision(spec, f"matched shape pattern #{k} {pattern}", self.name)
        return None
