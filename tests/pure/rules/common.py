"""Shared strategies and checks for the rule, plan and suggestion tests."""

from __future__ import annotations

import itertools
import math

import jax
import numpy as np
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import check_specs
from meshplan.pure.specs import array_bytes, spec_from_entries
from meshplan.testing import array_shapes_for, axis_names, mesh_shapes

# Pattern dims for the shape rule: small primes' products that mesh axes divide
# often, plus a few primes that nothing divides.
DIMS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64]
NAMES = ["dp", "fsdp", "tp", "sp", "ep"]


def shapes(max_rank: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes with small dims (array_shapes_for's non-divisible pool); shrinks towards rank 0."""
    return array_shapes_for({}, divisible=False, max_dims=max_rank)


def axis_sizes(min_axes: int = 1, max_axes: int = 4) -> st.SearchStrategy[dict[str, int]]:
    """An ordered axis-size mapping over at most 64 devices, names from NAMES in a drawn order.

    Shrinks towards one axis ("dp") of size 1.
    """
    names = axis_names(names=NAMES, min_size=min_axes, max_size=max_axes)
    return names.flatmap(lambda n: mesh_shapes(axis_names=n, max_devices=64)).map(lambda m: m.as_dict())


def sds(shape: tuple[int, ...], dtype=np.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def assert_storable(shape, spec, sizes, dtype=np.float32) -> None:
    """The validation helper accepts ``spec`` for storing an array of ``shape``."""
    check_specs({"x": sds(tuple(shape), dtype)}, {"x": spec}, sizes, for_storage=True)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def all_assignments(shape, sizes):
    """Every storable way to give each axis (size > 1) to one dim or to none.

    Yields ``(entries, shard_shape)``; brute force, for small meshes only.
    """
    axes = [a for a in sizes if sizes[a] > 1]
    for choice in itertools.product(range(-1, len(shape)), repeat=len(axes)):
        entries = [() for _ in shape]
        for a, d in zip(axes, choice):
            if d >= 0:
                entries[d] += (a,)
        splits = [math.prod(sizes[a] for a in e) for e in entries]
        if all(dim % s == 0 and dim >= s for dim, s, e in zip(shape, splits, entries) if e):
            yield entries, tuple(dim // s for dim, s in zip(shape, splits))


def brute_min_bytes(shape, dtype, sizes) -> int:
    """The fewest bytes per device over every storable assignment."""
    return min(array_bytes(shard, dtype) for _, shard in all_assignments(shape, sizes))


def spec_of(entries) -> P:
    return spec_from_entries(entries)
