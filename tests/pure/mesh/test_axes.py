"""Tests for meshplan.pure.mesh._axes: axis names, MeshShape, -1 inference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from meshplan.pure.mesh._axes import (
    MeshShape,
    infer_axis_dims,
    resolve_mesh_shape,
    validate_axis_names,
)
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError
from meshplan.testing import mesh_shapes

# 0-5 named axes over up to 720 devices; shrink to no axes.
shapes_st = mesh_shapes(min_axes=0, max_axes=5, max_devices=720)
sizes_st = shapes_st.map(lambda m: m.sizes)


# --- properties -----------------------------------------------------------------------------------


@given(sizes=sizes_st, data=st.data())
def test_infer_replaces_one_minus_one_with_the_missing_factor(sizes, data):
    total = math.prod(sizes)
    assume(sizes)
    i = data.draw(st.integers(0, len(sizes) - 1))
    dims = sizes[:i] + (-1,) + sizes[i + 1 :]
    assert infer_axis_dims(dims, total) == sizes


@given(sizes=sizes_st)
def test_infer_is_identity_on_resolved_dims_with_matching_total(sizes):
    assert infer_axis_dims(sizes, math.prod(sizes)) == sizes
    assert infer_axis_dims(list(sizes), np.int64(math.prod(sizes))) == sizes


@given(sizes=sizes_st, total=st.integers(1, 200))
def test_infer_result_always_multiplies_to_total_or_raises(sizes, total):
    dims = sizes + (-1,)
    try:
        out = infer_axis_dims(dims, total)
    except MeshShapeError as err:
        assert total % math.prod(sizes) != 0
        assert "not divisible" in str(err) and str(total) in str(err)
    else:
        assert math.prod(out) == total and out[:-1] == sizes


@given(sizes=mesh_shapes(max_axes=5, max_devices=720).map(lambda m: m.sizes), extra=st.integers(2, 5))
def test_infer_rejects_a_product_mismatch_naming_dims_and_total(sizes, extra):
    total = math.prod(sizes) * extra
    with pytest.raises(MeshShapeError) as err:
        infer_axis_dims(sizes, total)
    assert str(sizes) in str(err.value) and str(total) in str(err.value)


@given(drawn=shapes_st)
def test_mesh_shape_round_trips_through_as_dict(drawn):
    names, sizes = drawn.names, drawn.sizes
    shape = MeshShape(names, sizes)
    d = shape.as_dict()
    assert tuple(d) == names and tuple(d.values()) == sizes
    assert MeshShape(tuple(d), tuple(d.values())) == shape
    assert shape.size == math.prod(sizes) and shape.ndim == len(names)


@given(drawn=shapes_st)
def test_resolve_mesh_shape_agrees_with_infer_axis_dims(drawn):
    names, sizes = drawn.names, drawn.sizes
    total = math.prod(sizes)
    dims = sizes if not sizes else (-1,) + sizes[1:]
    shape = resolve_mesh_shape(list(dims), list(names), total)
    assert shape == MeshShape(names, infer_axis_dims(dims, total))


# --- examples -------------------------------------------------------------------------------------


def test_reference_default_dims_take_all_devices_on_fsdp():
    shape = resolve_mesh_shape((1, -1, 1, 1, 1), ("dp", "fsdp", "ep", "tp", "sp"), 8)
    assert shape.sizes == (1, 8, 1, 1, 1) and shape.names == ("dp", "fsdp", "ep", "tp", "sp")


def test_reference_example_2x4_resolves_unchanged():
    assert resolve_mesh_shape((2, 4), ("data", "model"), 8) == MeshShape(("data", "model"), (2, 4))


def test_mesh_shape_repr_shows_names_and_sizes_only():
    assert repr(MeshShape(("dp", "tp"), (2, 4))) == "MeshShape(dp=2, tp=4)"
    assert repr(MeshShape(("a b",), (3,))) == "MeshShape('a b'=3)"


def test_mesh_shape_is_frozen_and_canonicalizes_lists_to_tuples():
    shape = MeshShape(["dp"], [np.int32(2)])
    assert shape.names == ("dp",) and shape.sizes == (2,) and type(shape.sizes[0]) is int
    with pytest.raises(AttributeError):
        shape.sizes = (3,)  # type: ignore[misc]


def test_validate_axis_names_accepts_lists_and_returns_tuples():
    assert validate_axis_names(["dp", "tp"]) == ("dp", "tp")


# --- bad inputs -----------------------------------------------------------------------------------


BAD_CALLS = [
    # (callable, expected exception, substring the message must contain)
    (lambda: validate_axis_names("dp"), MeshplanTypeError, "'dp'"),
    (lambda: validate_axis_names({"dp", "tp"}), MeshplanTypeError, "set"),
    (lambda: validate_axis_names(("dp", 3)), MeshplanTypeError, "axis_names[1]=3"),
    (lambda: validate_axis_names(("dp", "")), MeshShapeError, "axis_names[1]=''"),
    (lambda: validate_axis_names(("dp", "tp", "dp")), MeshShapeError, "axis_names[2]='dp'"),
    (lambda: infer_axis_dims((-1, -1), 8), MeshShapeError, "(-1, -1)"),
    (lambda: infer_axis_dims((0, 8), 8), MeshShapeError, "axis_dims[0]=0"),
    (lambda: infer_axis_dims((2, -2), 8), MeshShapeError, "axis_dims[1]=-2"),
    (lambda: infer_axis_dims((3, -1), 8), MeshShapeError, "not divisible"),
    (lambda: infer_axis_dims((16, -1), 8), MeshShapeError, "(16, -1)"),
    (lambda: infer_axis_dims((2, 2), 8), MeshShapeError, "multiply to 4, not 8"),
    (lambda: infer_axis_dims((2, 4), 0), MeshShapeError, "num_devices=0"),
    (lambda: infer_axis_dims((2, 2.0), 4), MeshplanTypeError, "axis_dims[1]=2.0"),
    (lambda: infer_axis_dims((2, True), 2), MeshplanTypeError, "axis_dims[1]=True"),
    (lambda: infer_axis_dims((2, "4"), 8), MeshplanTypeError, "axis_dims[1]='4'"),
    (lambda: infer_axis_dims(8, 8), MeshplanTypeError, "axis_dims=8"),
    (lambda: infer_axis_dims((8,), 8.0), MeshplanTypeError, "num_devices=8.0"),
    (lambda: MeshShape(("dp",), (2, 4)), MeshShapeError, "(2, 4)"),
    (lambda: MeshShape(("dp", "tp"), (2, 0)), MeshShapeError, "tp=0"),
    (lambda: MeshShape(("dp",), (-1,)), MeshShapeError, "dp=-1"),
    (lambda: MeshShape(("dp",), (True,)), MeshplanTypeError, "True"),
    (lambda: MeshShape(("dp",), (1.5,)), MeshplanTypeError, "1.5"),
    (lambda: MeshShape("dp", (2,)), MeshplanTypeError, "'dp'"),
    (lambda: resolve_mesh_shape((2, 4), ("dp",), 8), MeshShapeError, "axis_names=('dp',)"),
    (lambda: resolve_mesh_shape((2, 4), ("dp", "dp"), 8), MeshShapeError, "'dp'"),
    (lambda: resolve_mesh_shape((3, -1), ("dp", "tp"), 8), MeshShapeError, "(3, -1)"),
]


@pytest.mark.parametrize("call, exc, needle", BAD_CALLS)
def test_bad_inputs_raise_typed_errors_naming_the_value(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    assert needle in str(err.value)
