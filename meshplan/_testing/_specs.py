"""Strategies for array shapes and PartitionSpecs on a given mesh.

Valid specs are drawn as "which dim does each mesh axis go to, if any" and
then repaired in mesh order: an axis whose split would not divide its dim is
dropped (left replicated) unless uneven splits are allowed. So every draw is
valid by construction, and the choice lists shrink to "no axis anywhere": ``P()``.

Invalid specs start from a valid spec over the other axes and insert exactly
one fault, one of :data:`SPEC_FAULTS` (named as meshplan's finding kinds).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from hypothesis import strategies as st
from jax.sharding import PartitionSpec

from meshplan._testing._check import (
    InvalidArgument,
    check_axis_sizes,
    check_bool,
    check_int,
    check_order,
)

__all__ = ["InvalidSpec", "SPEC_FAULTS", "array_shapes_for", "invalid_partition_specs", "partition_specs"]

# In the order a drawn fault shrinks through.
SPEC_FAULTS: tuple[str, ...] = ("unknown_axis", "repeated_axis", "indivisible", "rank")
# Dims built from small primes, so axes divide them often, plus primes nothing divides.
_DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 16, 24, 32, 48, 64)


class InvalidSpec(NamedTuple):
    """A PartitionSpec that jax refuses for a shape, and the fault that makes it so."""

    spec: PartitionSpec
    fault: str


def _check_shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)):
        raise InvalidArgument(f"shape={shape!r} must be a tuple of ints.")
    for i, d in enumerate(shape):
        check_int(d, f"shape[{i}]", minimum=0)
    return tuple(shape)


def array_shapes_for(axis_sizes: Mapping[str, int], *, divisible: bool = True, min_dims: int = 0,
                     max_dims: int = 4, max_multiple: int = 4,
                     allow_empty: bool = False) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes to shard over a mesh with ``axis_sizes``.

    Args:
      axis_sizes: mesh axis name -> size (a MeshShape or mesh also works).
      divisible: every dim is a multiple of the mesh size, so any spec without
        repeated axes stores evenly. False draws dims from small numbers that
        axes often, but not always, divide.
      min_dims, max_dims: the rank.
      max_multiple: with ``divisible``, dims are ``k * mesh_size`` for ``k <= max_multiple``.
      allow_empty: dims may also be 0 (zero-size arrays, which every axis divides).

    Returns:
      Shapes as tuples; shrinks to rank ``min_dims`` with every dim the mesh
      size (``divisible``) or 1, never to 0.

    Example:
      >>> from hypothesis import find
      >>> find(array_shapes_for({"dp": 2, "tp": 4}), lambda s: len(s) == 2)
      (8, 8)
    """
    sizes = check_axis_sizes(axis_sizes)
    check_bool(divisible, "divisible")
    check_int(min_dims, "min_dims", minimum=0)
    check_int(max_dims, "max_dims", minimum=0, maximum=32)
    check_order(min_dims, max_dims, "min_dims", "max_dims")
    check_int(max_multiple, "max_multiple", minimum=1)
    check_bool(allow_empty, "allow_empty")
    total = math.prod(sizes.values())
    # 0 is the last choice (k = max_multiple + 1, or the pool's last entry), so dims never shrink to it
    if divisible:
        top = max_multiple + allow_empty
        dim = st.integers(1, top).map(lambda k: 0 if k > max_multiple else k * total)
    else:
        dim = st.sampled_from(_DIMS + (0,) * allow_empty)
    return st.lists(dim, min_size=min_dims, max_size=max_dims).map(tuple)


def _entry(axes: Sequence[str]) -> Any:
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def _repair(shape: tuple[int, ...], sizes: dict[str, int], uneven: bool, order: Sequence[str],
            choice: Sequence[int | None], free: Sequence[bool], length: int) -> PartitionSpec:
    """The spec putting ``order[i]`` on dim ``choice[i]`` where the split still divides it
    (anywhere if ``uneven``), and UNCONSTRAINED on each dim left without axes whose ``free`` is set."""
    per_dim: list[list[str]] = [[] for _ in shape]
    split = [1] * len(shape)
    for axis, dim in zip(order, choice):
        if dim is None:
            continue
        if uneven or shape[dim] % (split[dim] * sizes[axis]) == 0:
            per_dim[dim].append(axis)
            split[dim] *= sizes[axis]
    entries = [PartitionSpec.UNCONSTRAINED if not axes and f else _entry(axes) for axes, f in zip(per_dim, free)]
    used = max([i + 1 for i, e in enumerate(entries) if e is not None], default=0)
    return PartitionSpec(*entries[:max(used, min(length, len(shape)))])


def _valid_specs(shape: tuple[int, ...], sizes: dict[str, int], axes: Sequence[str], *,
                 uneven: bool = False, unconstrained: bool = False) -> st.SearchStrategy[PartitionSpec]:
    return _valid_specs_cached(shape, tuple(sizes.items()), tuple(axes), uneven, unconstrained)


# Trees repeat shapes; building (and hypothesis validating) one strategy per
# distinct (shape, mesh, axes) instead of one per leaf per draw keeps draws cheap.
@functools.lru_cache(maxsize=4096)
def _valid_specs_cached(shape: tuple[int, ...], size_items: tuple[tuple[str, int], ...],
                        axes: tuple[str, ...], uneven: bool,
                        unconstrained: bool) -> st.SearchStrategy[PartitionSpec]:
    sizes = dict(size_items)
    rank = len(shape)
    if not rank:
        return st.just(PartitionSpec())
    # sampled_from: each axis is as likely on any one dim as on none, and shrinks to None
    dim = st.sampled_from((None, *range(rank)))
    # st.just when unconstrained is off, so the other draws (and their shrinking) are unchanged
    free = st.lists(st.booleans(), min_size=rank, max_size=rank) if unconstrained else st.just([False] * rank)
    return st.tuples(st.permutations(list(axes)), st.lists(dim, min_size=len(axes), max_size=len(axes)),
                     free, st.integers(0, rank)).map(lambda t: _repair(shape, sizes, uneven, *t))


def partition_specs(shape: Sequence[int], axis_sizes: Mapping[str, int], *, valid: bool = True,
                    allow_uneven: bool = False,
                    allow_unconstrained: bool = False) -> st.SearchStrategy[PartitionSpec]:
    """PartitionSpecs for an array of ``shape`` on a mesh with ``axis_sizes``.

    Args:
      shape: the array shape.
      axis_sizes: mesh axis name -> size (a MeshShape or mesh also works).
      valid: True draws only specs jax can store the array with
        (``NamedSharding(mesh, spec).shard_shape(shape)`` succeeds, and
        :func:`meshplan.pure.check_specs` passes); False draws from
        :func:`invalid_partition_specs` and returns only the spec.
      allow_uneven: an axis may also split a dim it does not divide. jax pads
        such a dim inside ``jit`` but refuses to store it (``IndivisibleError``);
        meshplan reports it as ``"indivisible"``, a warning with ``for_storage=False``.
      allow_unconstrained: a dim without axes may be ``P.UNCONSTRAINED`` (for
        ``with_sharding_constraint`` on Auto axes; refused for storage).

    Returns:
      Specs with known, unrepeated axes and no more entries than ``shape`` has
      dims; with both ``allow_*`` off they store the array, else
      ``check_specs(..., for_storage=False)`` passes. Valid ones shrink to ``P()`` (replicated).

    Example:
      >>> from hypothesis import find
      >>> find(partition_specs((8, 6), {"dp": 2, "tp": 4}), lambda p: "tp" in p)
      P('tp',)
    """
    shape_t = _check_shape(shape)
    sizes = check_axis_sizes(axis_sizes)
    check_bool(valid, "valid")
    check_bool(allow_uneven, "allow_uneven")
    check_bool(allow_unconstrained, "allow_unconstrained")
    del shape, axis_sizes
    if not valid:
        for name, value in (("allow_uneven", allow_uneven), ("allow_unconstrained", allow_unconstrained)):
            if value:
                raise InvalidArgument(f"{name}=True relaxes valid specs; it has no meaning with valid=False.")
        return invalid_partition_specs(shape_t, sizes).map(lambda bad: bad.spec)
    return _valid_specs(shape_t, sizes, list(sizes), uneven=allow_uneven, unconstrained=allow_unconstrained)


def _unknown_name(sizes: Mapping[str, int]) -> str:
    name = "unknown"
    while name in sizes:
        name += "_"
    return name


def _feasible(shape: tuple[int, ...], sizes: dict[str, int]) -> dict[str, list[Any]]:
    """For each fault, the places it can go (empty: the fault cannot occur)."""
    rank = len(shape)
    return {
        "unknown_axis": list(range(rank)),
        "repeated_axis": [(a, i, j) for a in sizes for i in range(rank) for j in range(i, rank)],
        "indivisible": [(a, i) for a in sizes for i in range(rank) if shape[i] % sizes[a]],
        # an axis, or None: jax refuses a spec longer than the rank either way
        "rank": [(a,) for a in sizes] + [(None,)],
    }


def _with_entry(spec: PartitionSpec, rank: int, dim: int, axes: Sequence[str]) -> list[Any]:
    entries = list(spec) + [None] * (rank - len(spec))
    old = entries[dim]
    old_axes = [] if old is None else [old] if isinstance(old, str) else list(old)
    entries[dim] = tuple(old_axes + list(axes))
    return entries


def _inject(shape: tuple[int, ...], sizes: dict[str, int], fault: str,
            where: Any) -> st.SearchStrategy[InvalidSpec]:
    """One fault at ``where`` on top of a valid spec over the axes it leaves free."""
    rank = len(shape)
    if fault == "unknown_axis":
        base = _valid_specs(shape, sizes, list(sizes))
        return base.map(lambda p: InvalidSpec(
            PartitionSpec(*_with_entry(p, rank, where, [_unknown_name(sizes)])), fault))
    axis = where[0]
    others = [a for a in sizes if a != axis]
    if fault == "repeated_axis":
        _, i, j = where
        def put(p: PartitionSpec) -> InvalidSpec:
            entries = _with_entry(p, rank, i, [axis])
            entries = _with_entry(PartitionSpec(*entries), rank, j, [axis])
            return InvalidSpec(PartitionSpec(*entries), fault)
        return _valid_specs(shape, sizes, others).map(put)
    if fault == "indivisible":
        _, i = where
        # the other axes avoid dim i, so it holds exactly the one indivisible axis
        rest = shape[:i] + (0,) + shape[i + 1:]
        def put_axis(p: PartitionSpec) -> InvalidSpec:
            entries = list(p) + [None] * (rank - len(p))
            entries[i] = axis
            return InvalidSpec(PartitionSpec(*entries), fault)
        return _valid_specs(rest, sizes, others).map(
            lambda p: PartitionSpec(*[None if k == i else e for k, e in enumerate(p)])).map(put_axis)
    # rank: a valid spec over the other axes, padded to the rank, then ``axis``
    # (a mesh axis or None) after the last dim.
    return st.tuples(_valid_specs(shape, sizes, others), st.integers(0, 1)).map(
        lambda t: InvalidSpec(PartitionSpec(*(list(t[0]) + [None] * (rank - len(t[0]) + t[1]) + [axis])),
                              fault))


def invalid_partition_specs(shape: Sequence[int], axis_sizes: Mapping[str, int], *,
                            fault: str | Collection[str] | None = None) -> st.SearchStrategy[InvalidSpec]:
    """Specs jax refuses for ``shape`` on ``axis_sizes``, each with the fault that makes it so.

    Faults (meshplan's finding kinds, see :data:`SPEC_FAULTS`):

    * ``"unknown_axis"``: an axis name that is not in the mesh;
    * ``"repeated_axis"``: one mesh axis used twice;
    * ``"indivisible"``: a dim that is not a multiple of its axis's size;
    * ``"rank"``: an entry after the last dim (a mesh axis, or ``None``: jax
      refuses a spec longer than the array's rank either way).

    The drawn fault is always reported by :func:`meshplan.pure.validate_specs`
    (a repeated axis may also make a dim indivisible).

    Args:
      shape: the array shape.
      axis_sizes: mesh axis name -> size.
      fault: one fault, a collection of them, or None for every fault that
        this shape and mesh allow.

    Returns:
      :class:`InvalidSpec` ``(spec, fault)`` values; shrinks to the first
      possible fault in :data:`SPEC_FAULTS` order on top of an otherwise empty spec.

    Raises:
      InvalidArgument: an unknown fault, or one this shape and mesh cannot
        have (e.g. ``"indivisible"`` when every axis divides every dim).

    Example:
      >>> from hypothesis import find
      >>> find(invalid_partition_specs((8,), {"dp": 2}, fault="rank"), lambda b: True)
      InvalidSpec(spec=P(None, 'dp'), fault='rank')
    """
    shape_t = _check_shape(shape)
    sizes = check_axis_sizes(axis_sizes)
    del shape, axis_sizes
    if fault is None:
        wanted = list(SPEC_FAULTS)
    elif isinstance(fault, str):
        wanted = [fault]
    elif isinstance(fault, Collection):
        wanted = [f for f in SPEC_FAULTS if f in fault]
        extra = sorted(set(fault) - set(SPEC_FAULTS), key=repr)
        if extra or not wanted:
            raise InvalidArgument(f"fault={fault!r} holds {extra or 'nothing'}; each fault must be one of {SPEC_FAULTS}.")
    else:
        raise InvalidArgument(f"fault={fault!r} must be None, a fault name or a collection of them.")
    unknown = [f for f in wanted if f not in SPEC_FAULTS]
    if unknown:
        raise InvalidArgument(f"fault={unknown[0]!r} is not one of {SPEC_FAULTS}.")
    places = _feasible(shape_t, sizes)
    possible = [f for f in wanted if places[f]]
    if not possible:
        raise InvalidArgument(
            f"fault={fault!r} cannot occur for shape={shape_t} on axis_sizes={sizes}: "
            + "; ".join(f"{f} needs {_NEEDS[f]}" for f in wanted) + ".")
    return st.sampled_from(possible).flatmap(
        lambda f: st.sampled_from(places[f]).flatmap(lambda w: _inject(shape_t, sizes, f, w)))


_NEEDS = {
    "unknown_axis": "a dim (rank >= 1)",
    "repeated_axis": "a dim and a mesh axis",
    "indivisible": "a dim that some axis size does not divide",
}  # "rank" is always possible
