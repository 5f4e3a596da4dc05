"""MeshPartitionHelper's suggestions, as pure functions of shapes and axis sizes.

The reference ``MeshPartitionHelper`` suggests *methods* (tuples of mesh
axis names) per shape and turns them into a spec. meshplan keeps its
preferences:

* :func:`suggest_methods`: ``("fsdp", "sp")`` for rank >= 2 when the first
  two dims hold at least ``fsdp * sp`` elements; then ``("dp",)``; then
  ``("sp",)`` for rank >= 2 (unless already paired with fsdp); then
  ``("tp",)``; then ``("fsdp",)`` if nothing uses fsdp yet. Only axes the
  mesh has are suggested.
* :func:`create_partition_spec` (:class:`SuggestRule` with ``methods``): a first pass places single-axis methods on
  the first dim of at least ``max(min_shard_size, elements // (2 * devices))``
  and pairs on dims 0 and 1 (or both on dim 0), stopping after a pair; if
  nothing was placed, a second pass retries with the plain
  ``min_shard_size`` threshold for single axes.

What differs, because the reference emits specs jax refuses (an fsdp+sp
fallback without divisibility checks, a pair checked only by the product of
two dims, an IndexError for rank-1 pairs): every placement here checks that
the dim is free, the axes are unused in the spec, and the dim is divisible
by the product of the axes placed on it. Axes of size 1 are never
placed (they split nothing but would take a dim: the reference turns a
vector on a ``dp=1`` mesh into ``P('dp')``, i.e. replicated, instead of
reaching fsdp). Leaves with fewer than ``min_shard_size`` elements stay
replicated, as the reference documents.
Unknown axes in ``methods`` raise :class:`ShardingRuleError` instead of a
KeyError.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from jax.sharding import PartitionSpec

from meshplan.pure._check import canonical_axis_sizes
from meshplan.pure._types import PyTree, Shape, make_spec
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._auto import DEFAULT_MIN_SHARD_SIZE, _min_shard_size
from meshplan.pure.rules._base import (
    Decision,
    LeafContext,
    canonical_shape,
    format_axes,
)
from meshplan.pure.specs._geometry import spec_from_entries
from meshplan.pure.specs._tree import tree_facts

__all__ = ["SuggestRule", "analyze_pytree", "create_partition_spec", "suggest_methods"]

Method = tuple[str, ...]


def suggest_methods(shape: Sequence[int], axis_sizes: Mapping[str, int]) -> list[Method]:
    """Sharding methods for a shape, preferred first (the reference's preferences).

    Args:
      shape: the array shape.
      axis_sizes: ordered mapping mesh axis name -> size.

    Returns:
      A list of axis-name tuples, e.g. ``[("fsdp", "sp"), ("dp",), ("tp",)]``.

    Example:
      >>> suggest_methods((1024, 4096), {"dp": 2, "fsdp": 4, "tp": 2, "sp": 1})
      [('fsdp', 'sp'), ('dp',), ('tp',)]
      >>> suggest_methods((8,), {"fsdp": 4, "tp": 2})
      [('tp',), ('fsdp',)]
    """
    return _methods(canonical_shape(shape), canonical_axis_sizes(axis_sizes))


def _methods(shape: Shape, sizes: Mapping[str, int]) -> list[Method]:
    rank = len(shape)
    methods: list[Method] = []
    if rank > 1 and "fsdp" in sizes and "sp" in sizes and shape[0] * shape[1] >= sizes["fsdp"] * sizes["sp"]:
        methods.append(("fsdp", "sp"))
    if rank > 0 and "dp" in sizes:
        methods.append(("dp",))
    if rank > 1 and "sp" in sizes and ("fsdp", "sp") not in methods:
        methods.append(("sp",))
    if "tp" in sizes:
        methods.append(("tp",))
    if "fsdp" in sizes and all("fsdp" not in m for m in methods):
        methods.append(("fsdp",))
    return methods


def _canonical_methods(methods: Any) -> tuple[Method, ...]:
    """User-given methods as a tuple of 1- or 2-axis tuples (axis names are checked per mesh)."""
    if isinstance(methods, str) or not isinstance(methods, Sequence):
        raise MeshplanTypeError(f"methods={methods!r} must be a list of axis-name tuples, e.g. [('fsdp', 'sp')].")
    out: list[Method] = []
    for raw in methods:
        m = (raw,) if isinstance(raw, str) else raw
        if not isinstance(m, Sequence) or not all(isinstance(a, str) for a in m):
            raise MeshplanTypeError(f"method {m!r} must be a tuple of mesh axis names.")
        m = tuple(m)
        if not 1 <= len(m) <= 2 or len(set(m)) != len(m):
            raise ShardingRuleError(f"method {m!r} must name one axis or two different axes.")
        out.append(m)
    return tuple(out)


def _check_methods(methods: Sequence[Method], sizes: Mapping[str, int]) -> None:
    unknown = list(dict.fromkeys(a for m in methods for a in m if a not in sizes))
    if unknown:
        raise ShardingRuleError(
            f"methods {list(methods)} use {unknown}, not axes of the mesh (mesh axes: {list(sizes)})."
        )


class _Spec:
    """A spec being filled in: each dim takes axes once, each axis is used once."""

    def __init__(self, shape: Shape, sizes: Mapping[str, int]) -> None:
        self.shape, self.sizes = shape, sizes
        self.entries: list[Method] = [()] * len(shape)
        self.used: set[str] = set()
        self.steps: list[str] = []

    def fits(self, d: int, axes: Method, threshold: int = 0) -> bool:
        n = math.prod(self.sizes[a] for a in axes)
        size = self.shape[d]
        return (not self.entries[d] and not self.used.intersection(axes) and size >= max(n, threshold)
                and size % n == 0)

    def put(self, d: int, axes: Method) -> None:
        self.entries[d] = axes
        self.used.update(axes)
        self.steps.append(f"dim {d} ({self.shape[d]}) <- {format_axes(axes, self.sizes)}")


def _place(spec: _Spec, methods: tuple[Method, ...], threshold: int, first_pass: bool) -> None:
    shape, sizes = spec.shape, spec.sizes
    for m in methods:
        if len(m) == 1:
            for d in range(len(shape)):
                if spec.fits(d, m, threshold):
                    spec.put(d, m)
                    break
            continue
        combined = sizes[m[0]] * sizes[m[1]]
        # The first pass asks the reference's question (do dims 0 and 1 hold
        # enough elements for the pair?) before trying; both passes then only
        # place the pair where every dim it touches divides evenly.
        if first_pass and not (len(shape) >= 2 and shape[0] * shape[1] >= combined
                               and shape[0] * shape[1] % combined == 0):
            continue
        if len(shape) >= 2 and spec.fits(0, m[:1]) and spec.fits(1, m[1:]):
            spec.put(0, m[:1])
            spec.put(1, m[1:])
            return
        if len(shape) >= 1 and spec.fits(0, m):
            spec.put(0, m)
            return


def _decide(shape: Shape, methods: Sequence[Method], sizes: Mapping[str, int], min_shard_size: int,
            name: str) -> Decision:
    n = math.prod(shape)
    if not shape:
        return Decision(make_spec(), "scalar; replicated", name)
    if n < min_shard_size:
        return Decision(make_spec(), f"{n} elements < min_shard_size={min_shard_size}; replicated", name)
    devices = math.prod(sizes.values())
    # Size-1 axes split nothing, yet placing one would use up its dim (the
    # reference gives a vector P('dp') on a dp=1 mesh and so never reaches
    # fsdp). Drop them; a pair with one size-1 axis acts as a single axis.
    methods = tuple(m for m in (tuple(a for a in m if sizes[a] > 1) for m in methods) if m)
    spec = _Spec(shape, sizes)
    _place(spec, methods, max(min_shard_size, n // (devices * 2)), first_pass=True)
    how = ""
    if not spec.steps:
        _place(spec, methods, min_shard_size, first_pass=False)
        how = " (second pass)"
    if not spec.steps:
        return Decision(make_spec(), f"no method in {list(methods)} fits {shape} evenly; replicated", name)
    return Decision(spec_from_entries(spec.entries), ", ".join(spec.steps) + how, name)


def create_partition_spec(
    array_shape: Sequence[int],
    methods: Sequence[Method],
    axis_sizes: Mapping[str, int],
    *,
    min_shard_size: int = DEFAULT_MIN_SHARD_SIZE,
) -> PartitionSpec:
    """A storable PartitionSpec for ``array_shape`` from suggested methods.

    Args:
      array_shape: the array shape.
      methods: axis-name tuples, preferred first (see :func:`suggest_methods`).
      axis_sizes: ordered mapping mesh axis name -> size.
      min_shard_size: arrays with fewer elements stay replicated; also the
        smallest dim a single axis is placed on in the second pass.

    Returns:
      A PartitionSpec that validates for storage (``P()`` if nothing fits).

    Raises:
      ShardingRuleError: a method names an unknown axis, or is not 1-2 distinct axes.

    Example:
      >>> sizes = {"dp": 1, "fsdp": 4, "tp": 1, "sp": 2}
      >>> create_partition_spec((1024, 4096), suggest_methods((1024, 4096), sizes), sizes)
      P('fsdp', 'sp')
      >>> create_partition_spec((6, 4096), [("fsdp", "sp")], sizes)  # fsdp (4) does not divide 6
      P()
    """
    rule = SuggestRule(min_shard_size=min_shard_size, methods=methods)
    return rule(LeafContext(canonical_shape(array_shape), None, canonical_axis_sizes(axis_sizes))).spec


def analyze_pytree(tree: PyTree, axis_sizes: Mapping[str, int], *, x64: bool = False) -> dict[Shape, list[Method]]:
    """Suggested methods for every distinct array shape in ``tree``, in leaf order.

    Example:
      >>> import numpy as np
      >>> analyze_pytree({"w": np.zeros((8, 16)), "b": np.zeros(16)}, {"fsdp": 4, "tp": 2})
      {(16,): [('tp',), ('fsdp',)], (8, 16): [('tp',), ('fsdp',)]}
    """
    sizes = canonical_axis_sizes(axis_sizes)
    out: dict[Shape, list[Method]] = {}
    for info in tree_facts(tree, x64=x64).infos:
        if info is not None and info.shape not in out:
            out[info.shape] = suggest_methods(info.shape, sizes)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class SuggestRule:
    """``create_partition_spec(shape, methods or suggest_methods(shape))`` as a pure shape-only rule.

    Attributes:
      min_shard_size: leaves with fewer elements stay replicated; also the
        smallest dim a single axis is placed on in the second pass.
      name: the label on its decisions.
      methods: axis-name tuples to place, preferred first; ``None`` (the
        default) asks :func:`suggest_methods` for each leaf's shape.

    Raises (when called):
      ShardingRuleError: a given method names an axis the mesh lacks.

    Example:
      >>> import numpy as np
      >>> rule = SuggestRule()
      >>> rule(LeafContext((1024, 4096), np.dtype("float32"), {"dp": 2, "fsdp": 4, "sp": 2})).spec
      P('fsdp', 'sp')
      >>> rule(LeafContext((4096,), np.dtype("float32"), {"dp": 1, "fsdp": 4})).spec  # size-1 dp skipped
      P('fsdp',)
      >>> SuggestRule(methods=[("dp",), ("tp",)])(LeafContext((1024, 1024), None, {"dp": 2, "tp": 4})).reason
      "dim 0 (1024) <- 'dp'(2), dim 1 (1024) <- 'tp'(4) (second pass)"
    """

    min_shard_size: int = DEFAULT_MIN_SHARD_SIZE
    name: str = "suggest"
    methods: Sequence[Method] | None = None
    shape_only: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.methods is not None:
            object.__setattr__(self, "methods", _canonical_methods(self.methods))
        object.__setattr__(self, "min_shard_size", _min_shard_size(self.min_shard_size))

    def __call__(self, ctx: LeafContext) -> Decision:
        methods: Sequence[Method]
        if self.methods is None:
            # Suggested methods name only mesh axes, so they skip the check given ones get.
            methods = tuple(_methods(ctx.shape, ctx.axis_sizes))
        else:
            _check_methods(self.methods, ctx.axis_sizes)
            methods = self.methods
        return _decide(ctx.shape, methods, ctx.axis_sizes, self.min_shard_size, self.name)
