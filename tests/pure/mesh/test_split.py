"""Tests for meshplan.pure.mesh._split: the global-shape-over-granules split."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.mesh._split import per_host_mesh_shape, split_over_granules
from meshplan.pure.errors import DeviceLayoutError, MeshplanTypeError, MeshShapeError
from meshplan.testing import host_splits, mesh_shapes


def _divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0]


def oracle_splits(shape: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    """Every valid dcn tuple, by brute force: dcn[i] | shape[i] and prod(dcn) == n."""
    return [
        dcn
        for dcn in itertools.product(*(_divisors(s) for s in shape))
        if math.prod(dcn) == n
    ]


# Shapes of 0-4 axes; shrink to ().
small_shapes = mesh_shapes(min_axes=0, max_axes=4, max_devices=64).map(lambda m: m.sizes)
# Shapes with a granule count that splits them (built as ici * dcn); shrink to ((1,), 1).
splittable = host_splits(max_axes=4, max_granules=16, max_devices_per_granule=16)
# A shape and a granule count: half split by construction, half any count.
shape_and_count = splittable | st.tuples(small_shapes, st.integers(1, 48))


# --- properties -----------------------------------------------------------------------------------


@given(case=shape_and_count)
def test_split_exists_iff_brute_force_finds_one_and_follows_the_preference(case):
    shape, n = case
    splits = oracle_splits(shape, n)
    try:
        ici, dcn = split_over_granules(shape, n)
    except DeviceLayoutError as err:
        assert not splits
        assert str(shape) in str(err) and f"num_granules={n}" in str(err)
        return
    assert splits, "returned a split where brute force finds none"
    assert dcn in splits
    assert tuple(i * d for i, d in zip(ici, dcn)) == shape
    assert math.prod(dcn) == n
    first = next((i for i, s in enumerate(shape) if s > 1 and s % n == 0), None)
    if n > 1 and first is not None:
        # (a): the first non-singleton axis divisible by n takes every granule.
        assert dcn == tuple(n if i == first else 1 for i in range(len(shape)))
    else:
        # (b): lexicographically largest of all valid splits.
        assert dcn == max(splits)


@given(case=shape_and_count)
def test_split_is_deterministic_and_accepts_numpy_ints(case):
    shape, n = case
    try:
        first = split_over_granules(shape, n)
    except DeviceLayoutError:
        with pytest.raises(DeviceLayoutError):
            split_over_granules(np.asarray(shape, dtype=np.int64).tolist(), np.int64(n))
        return
    again = split_over_granules([np.int64(s) for s in shape], np.int64(n))
    assert first == again
    assert all(type(x) is int for part in again for x in part)


@given(shape=small_shapes)
def test_one_granule_leaves_the_whole_shape_on_ici(shape):
    assert split_over_granules(shape, 1) == (shape, (1,) * len(shape))


@given(split=splittable)
def test_host_shape_times_dcn_is_global_with_host_product_local_devices(split):
    shape, hosts = split
    local = math.prod(shape) // hosts
    host = per_host_mesh_shape(shape, local, hosts)
    assert math.prod(host) == local
    assert all(s % h == 0 for s, h in zip(shape, host))
    assert host == split_over_granules(shape, hosts)[0]


@given(split=splittable, data=st.data())
def test_host_shape_infers_minus_one_against_all_devices(split, data):
    shape, hosts = split
    local = math.prod(shape) // hosts
    i = data.draw(st.integers(0, len(shape) - 1))
    dims = shape[:i] + (-1,) + shape[i + 1 :]
    assert per_host_mesh_shape(dims, local, hosts) == per_host_mesh_shape(
        shape, local, hosts
    )


# --- examples -------------------------------------------------------------------------------------


def test_reference_host_example_puts_the_process_split_on_the_outer_axis():
    assert per_host_mesh_shape((2, 4), total_devices=4, num_processes=2) == (1, 4)


def test_loadax_two_nodes_break_the_data_axis_over_dcn():
    assert split_over_granules((1, 2, 8), 2) == ((1, 1, 8), (1, 2, 1))


def test_loadax_two_nodes_break_the_pipeline_axis_when_it_comes_first():
    assert split_over_granules((2, 1, 8), 2) == ((1, 1, 8), (2, 1, 1))


def test_all_singleton_shape_on_one_granule_is_all_ones():
    assert split_over_granules((1, 1, 1), 1) == ((1, 1, 1), (1, 1, 1))


def test_one_axis_taking_all_granules_wins_over_spreading():
    # (b) alone would give (2, 2); (a) keeps the slow network on one axis.
    assert split_over_granules((2, 4), 4) == ((2, 1), (1, 4))


def test_host_share_spread_over_two_axes_is_found():
    # No single axis is divisible by 12, so the granules spread outermost first.
    assert split_over_granules((2, 3, 4), 12) == ((1, 1, 2), (2, 3, 2))
    assert per_host_mesh_shape((4, 6, 1), total_devices=2, num_processes=12) == (1, 2, 1)


def test_large_counts_split_without_search():
    shape = (8, 1000, 125, 1024, 1, 7, 9, 16)
    ici, dcn = split_over_granules(shape, 10**6)
    assert math.prod(dcn) == 10**6 and all(s % d == 0 for s, d in zip(shape, dcn))
    assert dcn == (8, 1000, 125, 1, 1, 1, 1, 1)
    with pytest.raises(DeviceLayoutError, match="prime factor 999983"):
        split_over_granules(shape, 999983)


# --- bad inputs -----------------------------------------------------------------------------------

BAD_CALLS = [
    (lambda: split_over_granules((4, 4), 3), DeviceLayoutError, "prime factor 3"),
    (lambda: split_over_granules((2, 2), 8), DeviceLayoutError, "2^3 divides 8"),
    (lambda: split_over_granules((), 2), DeviceLayoutError, "global_shape=()"),
    (lambda: split_over_granules((2, 0), 2), MeshShapeError, "global_shape[1]=0"),
    (lambda: split_over_granules((2, -1), 2), MeshShapeError, "global_shape[1]=-1"),
    (lambda: split_over_granules((2, 4), 0), MeshShapeError, "num_granules=0"),
    (lambda: split_over_granules((2, 4), 2.0), MeshplanTypeError, "num_granules=2.0"),
    (lambda: split_over_granules((2, 4.0), 2), MeshplanTypeError, "global_shape[1]=4.0"),
    (lambda: split_over_granules("24", 2), MeshplanTypeError, "'24'"),
    (lambda: per_host_mesh_shape((2, 4), 4, 3), MeshShapeError, "(2, 4)"),
    (lambda: per_host_mesh_shape((2, 4), 4, 3), MeshShapeError, "4*3"),
    (lambda: per_host_mesh_shape((2, 4), 0, 2), MeshShapeError, "total_devices=0"),
    (lambda: per_host_mesh_shape((2, 4), 4, None), MeshplanTypeError, "num_processes=None"),
    (lambda: per_host_mesh_shape((2, -1, -1), 4, 2), MeshShapeError, "(2, -1, -1)"),
]


@pytest.mark.parametrize("call, exc, needle", BAD_CALLS)
def test_bad_inputs_raise_typed_errors_naming_the_value(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    if needle is not None:
        assert needle in str(err.value)


@given(case=shape_and_count)
def test_a_split_exists_exactly_when_the_count_divides_the_mesh_size(case):
    shape, n = case
    assert bool(oracle_splits(shape, n)) == (math.prod(shape) % n == 0)
