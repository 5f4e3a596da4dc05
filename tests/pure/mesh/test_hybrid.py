"""Tests for meshplan.pure.mesh._hybrid: HybridMeshShape, default split, -1 resolution, reconcile."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.mesh._axes import MeshShape
from meshplan.pure.mesh._hybrid import (
    HybridMeshShape,
    reconcile_dcn,
    resolve_hybrid,
    split_mesh_shape,
)
from meshplan.pure.mesh._split import split_over_granules
from meshplan.pure.errors import (
    DeviceLayoutError,
    MeshplanTypeError,
    MeshShapeError,
)
from meshplan.testing import hybrid_mesh_shapes


# Resolved (ici, dcn) pairs of equal rank 1-4; shrink to one axis of (1, 1).
ici_dcn = hybrid_mesh_shapes(max_axes=4, max_devices_per_granule=32, max_granules=8).map(
    lambda h: (h.ici_mesh_shape, h.dcn_mesh_shape))


def _with_minus_one(shape, i):
    return shape[:i] + (-1,) + shape[i + 1 :]


# --- properties -----------------------------------------------------------------------------------


@given(pair=ici_dcn)
def test_global_shape_is_the_elementwise_product(pair):
    ici, dcn = pair
    shape = HybridMeshShape(list(ici), np.asarray(dcn).tolist())
    assert shape.global_shape == tuple(i * d for i, d in zip(ici, dcn))
    assert shape.ndim == len(ici) and shape.ici_mesh_shape == ici and shape.dcn_mesh_shape == dcn


@given(pair=ici_dcn, data=st.data())
def test_resolve_hybrid_infers_each_part_against_its_own_count(pair, data):
    ici, dcn = pair
    i = data.draw(st.integers(0, len(ici) - 1))
    j = data.draw(st.integers(0, len(dcn) - 1))
    partial = HybridMeshShape(_with_minus_one(ici, i), _with_minus_one(dcn, j))
    assert not partial.is_resolved
    resolved = resolve_hybrid(
        partial, devices_per_granule=math.prod(ici), num_granules=math.prod(dcn)
    )
    assert resolved == HybridMeshShape(ici, dcn) and resolved.is_resolved


@given(pair=ici_dcn)
def test_reconcile_recovers_ici_from_global_and_dcn(pair):
    ici, dcn = pair
    global_shape = tuple(i * d for i, d in zip(ici, dcn))
    out = reconcile_dcn(
        global_shape, dcn, num_devices=math.prod(global_shape), num_granules=math.prod(dcn)
    )
    assert out == HybridMeshShape(ici, dcn)
    assert out.global_shape == global_shape


@given(pair=ici_dcn, data=st.data())
def test_reconcile_keeps_the_global_shape_with_minus_ones_in_both(pair, data):
    ici, dcn = pair
    global_shape = tuple(i * d for i, d in zip(ici, dcn))
    i = data.draw(st.integers(0, len(ici) - 1))
    j = data.draw(st.integers(0, len(dcn) - 1))
    out = reconcile_dcn(
        _with_minus_one(global_shape, i),
        _with_minus_one(dcn, j),
        num_devices=math.prod(global_shape),
        num_granules=math.prod(dcn),
    )
    assert out.global_shape == global_shape and out.dcn_mesh_shape == dcn


@given(pair=ici_dcn)
def test_split_mesh_shape_round_trips_the_global_shape(pair):
    ici, dcn = pair
    global_shape = tuple(i * d for i, d in zip(ici, dcn))
    n = math.prod(dcn)
    out = split_mesh_shape(global_shape, n)
    assert out.global_shape == global_shape
    assert math.prod(out.dcn_mesh_shape) == n
    assert (out.ici_mesh_shape, out.dcn_mesh_shape) == split_over_granules(global_shape, n)


@given(pair=ici_dcn, data=st.data())
def test_split_mesh_shape_infers_minus_one_before_splitting(pair, data):
    ici, dcn = pair
    global_shape = tuple(i * d for i, d in zip(ici, dcn))
    i = data.draw(st.integers(0, len(ici) - 1))
    n = math.prod(dcn)
    total = math.prod(global_shape)
    assert split_mesh_shape(
        _with_minus_one(global_shape, i), n, num_devices=total
    ) == split_mesh_shape(global_shape, n)


# --- examples -------------------------------------------------------------------------------------


def test_loadax_examples_construct_and_multiply_out():
    assert HybridMeshShape(ici_mesh_shape=(1, 4), dcn_mesh_shape=(1, 1)).global_shape == (1, 4)
    assert HybridMeshShape(ici_mesh_shape=(1, 8), dcn_mesh_shape=(2, 1)).global_shape == (2, 8)


def test_loadax_default_split_on_two_nodes():
    assert split_mesh_shape((1, 2, 8), 2) == HybridMeshShape((1, 1, 8), (1, 2, 1))
    assert split_mesh_shape((2, 1, 8), 2) == HybridMeshShape((1, 1, 8), (2, 1, 1))


def test_all_singleton_shape_gets_all_one_dcn():
    assert split_mesh_shape((1, 1, 1), 1) == HybridMeshShape((1, 1, 1), (1, 1, 1))


def test_split_mesh_shape_accepts_a_named_mesh_shape():
    named = MeshShape(("pipeline", "data", "model"), (1, 2, 8))
    assert split_mesh_shape(named, 2) == HybridMeshShape((1, 1, 8), (1, 2, 1))


def test_resolve_returns_the_same_object_when_already_resolved():
    shape = HybridMeshShape((1, 8), (2, 1))
    assert resolve_hybrid(shape, devices_per_granule=8, num_granules=2) is shape


# --- bad inputs -----------------------------------------------------------------------------------

def _resolve(ici, dcn, per, num):
    return resolve_hybrid(HybridMeshShape(ici, dcn), devices_per_granule=per, num_granules=num)


BAD_CALLS = [
    (lambda: HybridMeshShape((1, 8), (2, 1, 1)), MeshShapeError, "rank 2"),
    (lambda: HybridMeshShape((1, 0), (2, 1)), MeshShapeError, "ici_mesh_shape[1]=0"),
    (lambda: HybridMeshShape((1, 8), (-3, 1)), MeshShapeError, "dcn_mesh_shape[0]=-3"),
    (lambda: HybridMeshShape((-1, -1), (1, 1)), MeshShapeError, "2 entries of -1"),
    (lambda: HybridMeshShape((1, 8.0), (1, 1)), MeshplanTypeError, "ici_mesh_shape[1]=8.0"),
    (lambda: HybridMeshShape("18", (1, 1)), MeshplanTypeError, "'18'"),
    (lambda: HybridMeshShape((1, -1), (2, 1)).global_shape, MeshShapeError, "-1"),
    (lambda: split_mesh_shape((1, -1, 8), 2), MeshShapeError, "num_devices"),
    (lambda: split_mesh_shape((1, 2, 8), 2, num_devices=32), MeshShapeError, "(1, 2, 8)"),
    (lambda: split_mesh_shape((3, 3), 2), DeviceLayoutError, "num_granules=2"),
    (lambda: split_mesh_shape((3, 0), 1), MeshShapeError, "mesh_shape[1]=0"),
    (
        lambda: _resolve((1, 4), (2, 1), 8, 2),
        MeshShapeError,
        "devices_per_granule=8",
    ),
    (
        lambda: _resolve((1, 3), (-1, 1), 8, 2),
        MeshShapeError,
        "ici_mesh_shape=(1, 3)",
    ),
    (
        lambda: _resolve((1, -1), (3, 1), 8, 2),
        MeshShapeError,
        "dcn_mesh_shape=(3, 1)",
    ),
    (
        lambda: resolve_hybrid((1, 8), devices_per_granule=8, num_granules=1),
        MeshplanTypeError,
        "(1, 8)",
    ),
    (
        lambda: _resolve((8,), (1,), 0, 1),
        MeshShapeError,
        "devices_per_granule=0",
    ),
    (
        lambda: reconcile_dcn((2, 8), (2, 1, 1), num_devices=16, num_granules=2),
        MeshShapeError,
        "dcn_mesh_dims=(2, 1, 1)",
    ),
    (
        lambda: reconcile_dcn((3, 4), (2, 1), num_devices=12, num_granules=2),
        MeshShapeError,
        "axis 0: global size 3 is not divisible by dcn size 2",
    ),
    (
        lambda: reconcile_dcn((3, 4), (1, 3), num_devices=12, num_granules=3),
        MeshShapeError,
        "axis 1: global size 4 is not divisible by dcn size 3",
    ),
    (
        lambda: reconcile_dcn((2, 6), (1, 5), num_devices=12, num_granules=5),
        MeshShapeError,
        "num_devices=12 is not divisible by num_granules=5",
    ),
    (
        lambda: reconcile_dcn((2, 6), (1, 4), num_devices=12, num_granules=4),
        MeshShapeError,
        "axis 1: global size 6 is not divisible by dcn size 4",
    ),
    (
        lambda: reconcile_dcn((2, 8), (4, 1), num_devices=16, num_granules=2),
        MeshShapeError,
        "dcn_mesh_dims=(4, 1)",
    ),
    (
        lambda: reconcile_dcn((2, 8), (2, 1), num_devices=16, num_granules=3),
        MeshShapeError,
        "num_granules=3",
    ),
    (
        lambda: reconcile_dcn((2, 8), (2, 1), num_devices=16.0, num_granules=2),
        MeshplanTypeError,
        "num_devices=16.0",
    ),
]


@pytest.mark.parametrize("call, exc, needle", BAD_CALLS)
def test_bad_inputs_raise_typed_errors_naming_the_value(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    assert needle in str(err.value)
