"""eformer's escale tests and documented examples, run against meshplan after changing the import.

Sources (github.com/erfanzar/eformer, commit 4b17881):
- tests/escale/test_mesh_creation.py (the only escale test of behaviour meshplan offers; the
  PartitionAxis / PartitionManager tests cover API meshplan does not offer);
- the documented examples, with their stated results, in eformer/escale/mesh/creation.py and
  eformer/escale/helpers/base.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, PartitionSpec

from meshplan import (
    AutoShardingRule,
    CompositeShardingRule,
    MemoryConstrainedShardingRule,
    ShapeBasedShardingRule,
    ShardingRule,
    calculate_host_mesh_shape,
    cpu_context,
    create_mesh,
    force_cpu,
    parse_mesh_from_string,
)


def _has_multiple_slices() -> bool:
    devices = jax.devices()
    if devices and hasattr(devices[0], "slice_index"):
        return len({d.slice_index for d in devices}) > 1
    return False


@pytest.mark.parametrize("use_jax", [True, False])
@pytest.mark.parametrize(("axis_type", "expected"), [
    ("auto", AxisType.Auto), ("explicit", AxisType.Explicit), ("manual", AxisType.Manual)])
def test_create_mesh_axis_types_strings(use_jax, axis_type, expected):
    if use_jax and _has_multiple_slices():
        pytest.skip("jax.make_mesh does not support multi-slice meshes")
    axis_names = ("x", "y")
    mesh = create_mesh(axis_dims=(1, -1), axis_names=axis_names, use_jax=use_jax, axis_types=axis_type)
    assert mesh.axis_names == axis_names
    assert mesh.axis_types == (expected, expected)


# --- documented examples: eformer/escale/mesh/creation.py -----------------------------------------


def test_calculate_host_mesh_shape_example():
    assert calculate_host_mesh_shape((2, 4), total_devices=4, num_processes=2) == (1, 4)


def test_create_mesh_and_parse_mesh_from_string_examples():
    mesh = create_mesh(axis_dims=(2, 4), axis_names=("data", "model"))
    assert isinstance(mesh, Mesh) and dict(mesh.shape) == {"data": 2, "model": 4}
    assert dict(parse_mesh_from_string("dp:2,tp:4", ["dp", "tp"]).shape) == {"dp": 2, "tp": 4}
    assert dict(parse_mesh_from_string("2,4", ["data", "model"]).shape) == {"data": 2, "model": 4}


def test_cpu_context_and_force_cpu_examples():
    with cpu_context() as mesh:
        @jax.jit
        def fn(x):
            return x * 2

        result = fn(jax.numpy.ones((4, 4)))
    assert isinstance(mesh, Mesh) and all(d.platform == "cpu" for d in mesh.devices.flat)
    np.testing.assert_array_equal(result, 2 * np.ones((4, 4)))
    with force_cpu() as cpu_device:
        total = jax.numpy.sum(jnp.arange(4))
    assert cpu_device.platform == "cpu" and int(total) == 6


# --- documented examples: eformer/escale/helpers/base.py -----------------------------------------

MODEL_PARAMS = {"embed": np.zeros((32000, 1024), np.float32), "square": np.zeros((1024, 1024), np.float32),
                "mlp": np.zeros((4096, 512), np.float32), "bias": np.zeros((16,), np.float32)}


def _is_spec_tree_of(specs, tree) -> bool:
    same = jax.tree.structure(tree) == jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    return same and all(isinstance(s, PartitionSpec) for s in jax.tree.leaves(
        specs, is_leaf=lambda x: isinstance(x, PartitionSpec)))


def test_custom_rule_example():
    class CustomRule(ShardingRule):
        def apply(self, pytree):
            return jax.tree_util.tree_map(lambda x: PartitionSpec("data"), pytree)

    assert CustomRule().apply(MODEL_PARAMS) == {k: PartitionSpec("data") for k in MODEL_PARAMS}


def test_auto_sharding_rule_example():
    mesh = create_mesh(axis_dims=(2, 4), axis_names=("dp", "tp"))
    rule = AutoShardingRule(mesh=mesh, axis_names=["dp", "tp"])
    assert _is_spec_tree_of(rule.apply(MODEL_PARAMS), MODEL_PARAMS)


def test_shape_based_sharding_rule_example_needs_no_mesh():
    # "Shard arrays with shape (vocab_size, embed_dim) along first axis"; eformer's signature has no mesh.
    patterns = {(None, 1024): PartitionSpec("tp", None), (1024, 1024): PartitionSpec("tp", None)}
    specs = ShapeBasedShardingRule(patterns).apply(MODEL_PARAMS)
    assert specs["embed"] == PartitionSpec("tp", None) and specs["square"] == PartitionSpec("tp", None)
    assert specs["mlp"] == PartitionSpec() and specs["bias"] == PartitionSpec()


def test_composite_sharding_rule_example():
    mesh = create_mesh(axis_dims=(2, 4), axis_names=("dp", "tp"))
    shape_rule = ShapeBasedShardingRule({(None, 1024): PartitionSpec("tp")})
    auto_rule = AutoShardingRule(mesh=mesh)
    specs = CompositeShardingRule(shape_rule, auto_rule).apply(MODEL_PARAMS)
    assert specs["embed"] == PartitionSpec("tp")  # the shape rule has priority
    assert _is_spec_tree_of(specs, MODEL_PARAMS)


def test_memory_constrained_sharding_rule_example():
    mesh = create_mesh(axis_dims=(2, 4), axis_names=("dp", "tp"))
    rule = MemoryConstrainedShardingRule(max_memory_per_device=1024**3, mesh=mesh)  # "Allow max 1GB per device"
    specs = rule.apply(MODEL_PARAMS)
    assert specs == {k: PartitionSpec() for k in MODEL_PARAMS}  # everything fits in 1 GB: no sharding
