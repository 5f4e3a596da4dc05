"""Properties of the tree, model and cluster strategies."""

import math

import jax
import jax.numpy as jnp
from hypothesis import given
from jax.sharding import NamedSharding

from meshplan.pure import check_specs, parse_cluster
from meshplan.pure.presets import build_params
from meshplan.testing import DTYPES, clusters, mesh_shapes, model_specs, shape_dtype_trees, sharded_trees


@given(shape_dtype_trees())
def test_trees_are_dicts_of_shape_dtype_structs_with_known_dtypes(tree):
    assert isinstance(tree, dict)
    leaves = jax.tree_util.tree_leaves(tree)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert {x.dtype for x in leaves} <= {jnp.dtype(d) for d in DTYPES}


@given(shape_dtype_trees(dtypes=[jnp.int4, jnp.float8_e4m3fn, jnp.bfloat16]))
def test_sub_byte_and_fp8_dtypes_can_be_requested(tree):
    assert {x.dtype.name for x in jax.tree_util.tree_leaves(tree)} <= {"int4", "float8_e4m3fn", "bfloat16"}


@given(sharded_trees())
def test_sharded_trees_validate_in_meshplan_and_jax(case):
    check_specs(case.tree, case.specs, case.axis_sizes)
    mesh = jax.sharding.AbstractMesh(tuple(case.axis_sizes.values()), tuple(case.axis_sizes))
    for leaf, spec in zip(jax.tree_util.tree_leaves(case.tree), jax.tree_util.tree_leaves(
            case.specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
        NamedSharding(mesh, spec).shard_shape(leaf.shape)


@given(sharded_trees(mesh_shape={"dp": 2, "tp": 4}, divisible=True))
def test_divisible_sharded_trees_keep_the_given_mesh(case):
    assert case.axis_sizes == {"dp": 2, "tp": 4}
    assert all(d % 8 == 0 for x in jax.tree_util.tree_leaves(case.tree) for d in x.shape)


@given(sharded_trees(mesh_shape=mesh_shapes(num_devices=8), allow_uneven=True, allow_empty=True, max_leaves=4))
def test_uneven_sharded_trees_take_their_mesh_from_the_given_strategy_and_pass_inside_jit(case):
    assert len(case.axis_sizes) <= 3 and math.prod(case.axis_sizes.values()) == 8
    check_specs(case.tree, case.specs, case.axis_sizes, for_storage=False)


@given(model_specs())
def test_model_specs_build_into_parameter_trees(spec):
    tree = build_params(spec)
    assert jax.tree_util.tree_leaves(tree)
    assert spec.num_heads % spec.num_kv_heads == 0


@given(model_specs(family="deepseek_v3"))
def test_deepseek_specs_have_mla_and_experts(spec):
    assert spec.mla is not None and spec.is_moe and spec.num_dense_layers <= spec.num_layers


@given(clusters(max_nodes=64, max_slices=4))
def test_clusters_are_consistent_and_their_text_parses_back(cluster):
    assert cluster.num_devices == cluster.num_nodes * cluster.devices_per_node
    assert cluster.num_nodes % cluster.num_slices == 0
    assert parse_cluster(cluster.text) == cluster
