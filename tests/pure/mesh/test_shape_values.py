"""The mesh-shape values agree: MeshShape <-> axis sizes, HybridMeshShape and MeshRequest build on it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure._types import FrozenAxisSizes
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError
from meshplan.pure.mesh._axes import MeshShape, mesh_dims
from meshplan.pure.mesh._hybrid import HybridMeshShape, reconcile_dcn, split_mesh_shape
from meshplan.pure.mesh._request import (
    MeshRequest,
    canonical_dims,
    resolve_mesh_request,
)
from meshplan.pure.mesh._selectors import validate_mesh_rules
from meshplan.testing import hybrid_mesh_shapes, mesh_shapes


# Up to 4 axes (0 too) over up to 64 devices; shrink to no axes, and to one axis of (1, 1).
shapes = mesh_shapes(min_axes=0, max_axes=4, max_devices=64)
hybrids = hybrid_mesh_shapes(max_axes=4, max_devices_per_granule=32, max_granules=8)


@given(shape=shapes)
def test_mesh_shape_round_trips_through_frozen_axis_sizes(shape):
    sizes = shape.axis_sizes
    assert type(sizes) is FrozenAxisSizes and sizes == shape.as_dict()
    assert MeshShape.from_axis_sizes(sizes) == shape
    assert len(shape) == shape.ndim == len(sizes)


@given(shape=shapes)
def test_mesh_dims_reads_a_named_shape_as_its_sizes(shape):
    assert mesh_dims(shape, "mesh_shape") == shape.sizes == mesh_dims(list(shape.sizes), "mesh_shape")


@given(hybrid=hybrids)
def test_hybrid_named_is_the_global_mesh_shape(hybrid):
    names = tuple(f"x{i}" for i in range(len(hybrid)))
    named = hybrid.named(names)
    assert named.names == names and named.sizes == hybrid.global_shape
    assert len(hybrid) == hybrid.ndim == len(named)


@given(hybrid=hybrids)
def test_request_mesh_shape_names_the_global_shape(hybrid):
    names = tuple(f"x{i}" for i in range(len(hybrid)))
    request = MeshRequest(list(names), hybrid)
    assert request.axis_names == names
    assert request.mesh_shape == MeshShape(names, request.shape)


@given(shape=shapes, granules=st.sampled_from([1, 2]))
def test_a_named_shape_resolves_like_its_sizes(shape, granules):
    total = shape.size * granules
    if not shape.names:
        return
    plain = shape.sizes[:-1] + (shape.sizes[-1] * granules,)
    named = MeshShape(shape.names, plain)
    assert resolve_mesh_request(named, shape.names, num_devices=total, num_granules=granules) == \
        resolve_mesh_request(plain, shape.names, num_devices=total, num_granules=granules)
    assert split_mesh_shape(named, granules) == split_mesh_shape(plain, granules)
    assert math.prod(named.sizes) == total


def test_named_shapes_go_wherever_plain_shapes_go():
    shape = MeshShape(("dp", "tp"), (2, 4))
    assert HybridMeshShape(shape, (1, 1)).global_shape == (2, 4)
    assert reconcile_dcn(shape, (2, 1), num_devices=8, num_granules=2) == HybridMeshShape((1, 4), (2, 1))
    assert validate_mesh_rules([("x", shape)]) == (("x", shape),)


BAD_CALLS = [
    (lambda: MeshRequest(("dp",), HybridMeshShape((1, 4), (2, 1))), MeshShapeError, "1 names"),
    (lambda: MeshRequest(("dp", "tp"), HybridMeshShape((1, -1), (2, 1))), MeshShapeError, "-1"),
    (lambda: MeshRequest(("dp",), (8,)), MeshplanTypeError, "HybridMeshShape"),
    (lambda: MeshShape.from_axis_sizes([("dp", 2)]), MeshplanTypeError, "mapping"),
    (lambda: MeshShape.from_axis_sizes({"dp": 0}), MeshShapeError, "dp=0"),
    (
        lambda: resolve_mesh_request(MeshShape(("dp", "tp"), (2, 4)), ("tp", "dp"), num_devices=8),
        MeshShapeError,
        "axis_names=('tp', 'dp')",
    ),
    (lambda: canonical_dims("2,4"), MeshplanTypeError, "parse_mesh_from_string"),
    (lambda: canonical_dims((2, 4.0)), MeshplanTypeError, "axis_dims[1]=4.0"),
    (lambda: HybridMeshShape((1, -1), (1, 1)).named(("a", "b")), MeshShapeError, "-1"),
]


@pytest.mark.parametrize("call, exc, needle", BAD_CALLS)
def test_bad_shape_values_raise_typed_errors_naming_the_value(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    assert needle in str(err.value)
