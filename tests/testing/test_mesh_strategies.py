"""Properties of the mesh strategies: every draw is valid for meshplan and jax."""

import math

import jax
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AbstractMesh, AxisType, Mesh

from meshplan.pure import HybridMeshShape, MeshShape, layout_device_ids, resolve_mesh_shape, split_over_granules
from meshplan.pure.mesh import group_granules, resolve_hybrid
from meshplan.testing import (
    axis_names,
    device_counts,
    device_layouts,
    host_splits,
    hybrid_mesh_shapes,
    mesh_for,
    mesh_shapes,
    meshes,
)


@given(device_counts(min_devices=2, max_devices=5))
def test_device_counts_stay_in_bounds(n):
    assert 2 <= n <= 5


@given(axis_names(min_size=2, max_size=4))
def test_axis_names_are_unique_and_in_bounds(names):
    assert 2 <= len(names) <= 4 and len(set(names)) == len(names)


@given(mesh_shapes())
def test_every_drawn_mesh_shape_resolves_to_itself(shape):
    assert isinstance(shape, MeshShape)
    assert resolve_mesh_shape(shape.sizes, shape.names, shape.size) == shape


@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), mesh_shapes(num_devices=n, allow_infer=True))))
def test_every_drawn_request_with_minus_one_resolves_to_the_device_count(case):
    n, dims = case
    assert dims.axis_dims.count(-1) <= 1 and dims.num_devices == n
    assert resolve_mesh_shape(*dims).size == n


@given(mesh_shapes(axis_names=("data", "model"), num_devices=8))
def test_fixed_names_and_count_are_kept(shape):
    assert shape.names == ("data", "model") and shape.size == 8


@given(hybrid_mesh_shapes(num_granules=4, devices_per_granule=8, allow_infer=True))
def test_hybrid_shapes_resolve_against_their_counts(shape):
    resolved = resolve_hybrid(shape, devices_per_granule=8, num_granules=4)
    assert math.prod(resolved.dcn_mesh_shape) == 4 and math.prod(resolved.ici_mesh_shape) == 8


@given(host_splits())
def test_host_splits_are_splittable(split):
    ici, dcn = split_over_granules(split.global_shape, split.num_granules)
    assert math.prod(dcn) == split.num_granules
    assert tuple(i * d for i, d in zip(ici, dcn)) == split.global_shape


@given(device_layouts())
def test_device_layouts_lay_out_over_their_granules(devices):
    granules = group_granules(devices)
    shape = HybridMeshShape((len(granules[0]),), (len(granules),))
    ids = layout_device_ids(devices, shape)
    assert sorted(ids.ravel().tolist()) == sorted(d.id for d in devices)


@given(device_layouts(platform="tpu", num_slices=2))
def test_tpu_layouts_have_coordinates_and_slices(devices):
    assert {d.slice_index for d in devices} == {0, 1}
    assert all(d.platform == "tpu" and len(d.coords) == 3 for d in devices)


@given(device_layouts(platform="gpu", num_processes=3, shuffle=False))
def test_gpu_layouts_have_equal_nodes(devices):
    per = [sum(d.process_index == p for d in devices) for p in range(3)]
    assert len(set(per)) == 1 and [d.id for d in devices] == sorted(d.id for d in devices)


@given(device_layouts(platform="cpu", max_processes=6, subset=True))
def test_subset_layouts_keep_ids_and_processes_unique_and_granules_equal(devices):
    ids = [d.id for d in devices]
    per = {p: sum(d.process_index == p for d in devices) for p in {d.process_index for d in devices}}
    assert len(set(ids)) == len(ids) and len(per) <= 6 and len(set(per.values())) == 1
    assert sorted(ids) == sorted(
        layout_device_ids(devices, HybridMeshShape((len(devices) // len(per),), (len(per),))).ravel().tolist())


@given(meshes())
def test_live_meshes_use_local_devices(mesh):
    assert isinstance(mesh, Mesh) and len(jax.devices()) % mesh.size == 0


@given(meshes(abstract=True, axis_types="explicit"))
def test_abstract_meshes_have_the_requested_axis_types(mesh):
    assert isinstance(mesh, AbstractMesh)
    assert all(t == AxisType.Explicit for t in mesh.axis_types)


@given(mesh_shapes(max_devices=8), st.sampled_from([None, "auto", "explicit"]))
def test_mesh_for_builds_the_drawn_shape_on_the_first_devices_once(shape, axis_types):
    mesh = mesh_for(shape, axis_types=axis_types)
    assert dict(mesh.shape) == shape.as_dict()
    assert mesh.devices.ravel().tolist() == jax.devices()[:shape.size]
    assert mesh_for(shape.as_dict(), axis_types=axis_types) is mesh
    if axis_types is not None:
        kind = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[axis_types]
        assert mesh.axis_types == (kind,) * shape.ndim
