"""Every strategy checks its arguments when it is built, naming the bad one."""

import pytest
from hypothesis.errors import InvalidArgument

from meshplan import testing as mt


def e(fn, **kwargs):
    """One bad call: the strategy, its keyword arguments and the argument name the error must quote."""
    return fn, kwargs


def _id(case) -> str:
    (fn, kwargs), _ = case
    return f"{fn.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


BAD_CALLS = [
    (e(mt.device_counts, min_devices=0), "min_devices"),
    (e(mt.device_counts, min_devices=4, max_devices=2), "min_devices"),
    (e(mt.device_counts, max_devices=2.5), "max_devices"),
    (e(mt.axis_names, min_size=-1), "min_size"),
    (e(mt.axis_names, min_size=3, max_size=2), "min_size"),
    (e(mt.axis_names, max_size=100), "max_size"),
    (e(mt.axis_names, names="dp"), "names"),
    (e(mt.axis_names, names=["dp", "dp"]), "names"),
    (e(mt.axis_names, names=["dp", ""]), "names[1]"),
    (e(mt.mesh_shapes, num_devices=0), "num_devices"),
    (e(mt.mesh_shapes, min_axes=3, max_axes=1), "min_axes"),
    (e(mt.mesh_shapes, max_axes=20), "max_axes"),
    (e(mt.mesh_shapes, axis_names=("dp",), min_axes=2), "min_axes"),
    (e(mt.mesh_shapes, axis_names=(), num_devices=4), "num_devices"),
    (e(mt.mesh_shapes, allow_infer=1), "allow_infer"),
    (e(mt.mesh_shapes, allow_infer=True, max_axes=0), "max_axes"),
    (e(mt.mesh_shapes, allow_infer=True, axis_names=()), "axis_names"),
    (e(mt.mesh_shapes, max_devices=True), "max_devices"),
    (e(mt.hybrid_mesh_shapes, num_granules=0), "num_granules"),
    (e(mt.hybrid_mesh_shapes, allow_infer=True, num_granules=2), "devices_per_granule"),
    (e(mt.hybrid_mesh_shapes, min_axes=2, max_axes=1), "min_axes"),
    (e(mt.host_splits, max_granules=0), "max_granules"),
    (e(mt.device_layouts, platform="npu"), "platform"),
    (e(mt.device_layouts, platform="gpu", num_slices=2), "num_slices"),
    (e(mt.device_layouts, platform="tpu", num_processes=3, num_slices=1), "num_processes"),
    (e(mt.device_layouts, num_processes=0), "num_processes"),
    (e(mt.device_layouts, max_processes=0), "max_processes"),
    (e(mt.device_layouts, subset="yes"), "subset"),
    (e(mt.meshes, axis_types="manual"), "axis_types"),
    (e(mt.meshes, num_devices=1000), "num_devices"),
    (e(mt.mesh_for, axis_sizes={"dp": 1000}), "num_devices"),
    (e(mt.mesh_for, axis_sizes={"dp": 2}, axis_types="manual"), "axis_types"),
    (e(mt.mesh_for, axis_sizes=[2, 4]), "axis_sizes"),
    (e(mt.array_shapes_for, axis_sizes={"dp": 0}), "axis_sizes['dp']"),
    (e(mt.array_shapes_for, axis_sizes=[2, 4]), "axis_sizes"),
    (e(mt.array_shapes_for, axis_sizes={"dp": 2}, min_dims=3, max_dims=1), "min_dims"),
    (e(mt.array_shapes_for, axis_sizes={"dp": 2}, divisible="yes"), "divisible"),
    (e(mt.array_shapes_for, axis_sizes={"dp": 2}, allow_empty=0), "allow_empty"),
    (e(mt.partition_specs, shape=(4, -1), axis_sizes={"dp": 2}), "shape[1]"),
    (e(mt.partition_specs, shape=4, axis_sizes={"dp": 2}), "shape"),
    (e(mt.partition_specs, shape=(4,), axis_sizes={"dp": 2}, allow_uneven="yes"), "allow_uneven"),
    (e(mt.partition_specs, shape=(4,), axis_sizes={"dp": 2}, valid=False, allow_unconstrained=True),
     "allow_unconstrained"),
    (e(mt.invalid_partition_specs, shape=(4,), axis_sizes={"dp": 2}, fault="typo"), "fault"),
    (e(mt.invalid_partition_specs, shape=(4,), axis_sizes={"dp": 2}, fault="indivisible"), "fault"),
    (e(mt.invalid_partition_specs, shape=(), axis_sizes={"dp": 2}, fault="unknown_axis"), "fault"),
    (e(mt.shape_dtype_trees, shapes=(2, 3)), "shapes"),
    (e(mt.shape_dtype_trees, dtypes=[]), "dtypes"),
    (e(mt.shape_dtype_trees, dtypes=["not-a-dtype"]), "dtypes[0]"),
    (e(mt.shape_dtype_trees, max_leaves=0), "max_leaves"),
    (e(mt.sharded_trees, mesh_shape={"dp": -2}), "mesh_shape['dp']"),
    (e(mt.sharded_trees, allow_uneven=None), "allow_uneven"),
    (e(mt.sharded_trees, dtypes=[]), "dtypes"),
    (e(mt.model_specs, family="bert"), "family"),
    (e(mt.model_specs, max_experts=1), "max_experts"),
    (e(mt.clusters, devices=["Z80"]), "devices"),
    (e(mt.clusters, min_nodes=4, max_nodes=2), "min_nodes"),
    (e(mt.clusters, devices=["v4"], min_nodes=3, max_nodes=3), "min_nodes"),
]


@pytest.mark.parametrize("case", BAD_CALLS, ids=[_id(c) for c in BAD_CALLS])
def test_bad_arguments_raise_invalid_argument_naming_the_argument(case):
    (fn, kwargs), argument = case
    with pytest.raises(InvalidArgument) as info:
        fn(**kwargs)
    assert argument in str(info.value)
