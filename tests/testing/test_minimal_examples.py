"""Each strategy shrinks to the minimal example its docstring promises (as hypothesis's test_minimise_*)."""

import jax
import numpy as np
from hypothesis import HealthCheck, Phase, find, settings
from jax.sharding import PartitionSpec as P

from meshplan.pure import HybridMeshShape, MeshShape
from meshplan.testing import (
    HostSplit,
    MeshDims,
    array_shapes_for,
    axis_names,
    clusters,
    device_counts,
    device_layouts,
    hybrid_mesh_shapes,
    host_splits,
    invalid_partition_specs,
    mesh_shapes,
    meshes,
    model_specs,
    partition_specs,
    shape_dtype_trees,
    sharded_trees,
)

# The same seed each run, no example database, and no explain phase (it re-runs
# every shrunk example once more, which doubles the time and tells us nothing here).
FIND = settings(max_examples=200, database=None, derandomize=True, phases=[Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck))


def minimal(strategy, condition=lambda x: True):
    return find(strategy, condition, settings=FIND)


def test_minimise_device_counts():
    assert minimal(device_counts(min_devices=2)) == 2
    assert minimal(device_counts(max_devices=64), lambda n: n >= 6) == 6


def test_minimise_axis_names():
    assert minimal(axis_names()) == ("dp",)
    assert minimal(axis_names(), lambda t: len(t) == 2) == ("dp", "fsdp")


def test_minimise_mesh_shapes():
    assert minimal(mesh_shapes()) == MeshShape(("dp",), (1,))
    assert minimal(mesh_shapes(num_devices=8), lambda m: m.ndim == 2) == MeshShape(("dp", "fsdp"), (8, 1))
    assert minimal(mesh_shapes(allow_infer=True)) == MeshDims((1,), ("dp",), 1)


def test_minimise_hybrid_shapes_and_host_splits():
    assert minimal(hybrid_mesh_shapes()) == HybridMeshShape((1,), (1,))
    assert minimal(hybrid_mesh_shapes(num_granules=2, devices_per_granule=4)) == HybridMeshShape((4,), (2,))
    assert minimal(host_splits()) == HostSplit((1,), 1)


def test_minimise_device_layouts():
    (only,) = minimal(device_layouts())
    assert (only.id, only.platform, only.process_index) == (0, "cpu", 0)
    (only,) = minimal(device_layouts(subset=True))
    assert (only.id, only.platform, only.process_index) == (0, "cpu", 0)


def test_minimise_meshes():
    mesh = minimal(meshes(abstract=True))
    assert dict(mesh.shape) == {"dp": 1} and str(mesh.axis_types[0]).endswith("Auto")
    assert dict(minimal(meshes()).shape) == {"dp": 1}
    assert dict(minimal(meshes(), lambda m: m.size == 8).shape) == {"dp": 8}


def test_minimise_shapes_and_specs():
    assert minimal(array_shapes_for({"dp": 2, "tp": 4})) == ()
    assert minimal(array_shapes_for({"dp": 2, "tp": 4}), lambda s: len(s) == 2) == (8, 8)
    assert minimal(array_shapes_for({"dp": 2}, divisible=False), lambda s: len(s) == 1) == (1,)
    assert minimal(partition_specs((8, 6), {"dp": 2, "tp": 4})) == P()
    assert minimal(partition_specs((8, 6), {"dp": 2, "tp": 4}), lambda p: "tp" in p) == P("tp")
    assert minimal(array_shapes_for({"dp": 2}, allow_empty=True), lambda s: len(s) == 1) == (2,)
    assert minimal(array_shapes_for({"dp": 2}, allow_empty=True), lambda s: 0 in s) == (0,)
    assert minimal(partition_specs((6,), {"tp": 4}, allow_uneven=True), lambda p: "tp" in p) == P("tp")
    assert minimal(partition_specs((8,), {"dp": 2}, allow_unconstrained=True),
                   lambda p: P.UNCONSTRAINED in p) == P(P.UNCONSTRAINED)


def test_minimise_invalid_specs_to_one_fault_on_an_empty_spec():
    assert minimal(invalid_partition_specs((8,), {"dp": 2}, fault="rank")).spec == P(None, "dp")
    assert minimal(invalid_partition_specs((6,), {"tp": 4}, fault="indivisible")).spec == P("tp")
    assert minimal(invalid_partition_specs((8,), {"dp": 2}, fault="unknown_axis")).spec == P(("unknown",))
    assert minimal(invalid_partition_specs((8,), {}, fault="rank")).spec == P(None, None)


def test_minimise_trees():
    assert minimal(shape_dtype_trees(max_leaves=2)) == {"kernel": jax.ShapeDtypeStruct((), np.float32)}
    assert minimal(sharded_trees(mesh_shape={"dp": 2}, max_leaves=2)).specs == {"kernel": P()}


def test_minimise_model_specs_and_clusters():
    spec = minimal(model_specs())
    assert (spec.family, spec.num_layers, spec.num_heads, spec.hidden_size) == ("llama", 1, 1, 8)
    cluster = minimal(clusters(devices=["H100"]))
    assert (cluster.num_nodes, cluster.devices_per_node) == (1, 8)
