"""Logical rules over live flax trees (linen boxes, nnx Variables) on 8 CPU devices, and the flax round trip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan import AutoShardingRule, CompositeShardingRule, LogicalShardingRule, logical_export, logical_names
from meshplan.pure import normalize_path

RULES = [("batch", "dp"), ("mlp", "tp"), ("heads", "tp"), ("embed", "dp"), ("vocab", "tp")]


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        x = nn.Embed(64, 16, embedding_init=nn.with_logical_partitioning(init, ("vocab", "embed")))(x)
        x = nn.Dense(32, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
        return nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))(x)


@pytest.fixture(scope="module")
def linen_vars():
    # Shapes only (no compile), then concrete zeros in the same boxes.
    shapes = jax.eval_shape(_Block().init, jax.random.key(0), jnp.zeros((2, 3), jnp.int32))
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


def test_names_come_from_linen_boxes(linen_vars):
    assert logical_names(linen_vars) == {
        "Dense_0/kernel": ("embed", "mlp"),
        "Dense_1/kernel": ("mlp", "embed"),
        "Embed_0/embedding": ("vocab", "embed"),
    }
    assert logical_names(nn.get_partition_spec(linen_vars))["Dense_0/kernel"] == ("embed", "mlp")


def test_linen_specs_equal_flax_and_place_the_tree(linen_vars, mesh):
    rule = LogicalShardingRule(RULES, names=nn.get_partition_spec(linen_vars), mesh=mesh)
    params = nn.unbox(linen_vars)
    specs = rule.apply(params)
    theirs = nn.logical_to_mesh_sharding(nn.get_partition_spec(linen_vars), mesh, RULES)
    ours = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    for a, b, leaf in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), jax.tree.leaves(params), strict=True):
        assert a.is_equivalent_to(b, leaf.ndim)
    placed = jax.device_put(params, ours)
    assert placed["params"]["Dense_0"]["kernel"].sharding.spec == P("dp", "tp")


def test_nnx_names_come_from_variable_metadata(mesh):
    class Model(nnx.Module):
        def __init__(self, rngs):
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(16, 32, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")), rngs=rngs)
            self.down = nnx.Linear(32, 16, kernel_init=nnx.with_partitioning(init, ("mlp", "embed")), rngs=rngs)

    with nnx.use_eager_sharding(False):
        state = nnx.state(Model(nnx.Rngs(0)), nnx.Param)
    assert logical_names(state) == {"down/kernel": ("mlp", "embed"), "up/kernel": ("embed", "mlp")}
    plan = LogicalShardingRule(RULES, mesh=mesh).plan(state)
    assert plan.specs["up"]["kernel"].get_value() == P("dp", "tp")
    assert "dim 1 'mlp' <- 'tp'(4)" in plan.explain("up/kernel/value")


def test_composes_with_the_other_rules(linen_vars, mesh):
    params = nn.unbox(linen_vars)
    rule = CompositeShardingRule(LogicalShardingRule(RULES, names=nn.get_partition_spec(linen_vars)),
                                 AutoShardingRule(mesh=mesh, min_shard_size=1))
    plan = rule.plan(params)
    assert plan.specs["params"]["Dense_0"]["kernel"] == P("dp", "tp")
    assert plan.leaf_decisions[0].rule == "auto"  # Dense_0/bias has no names: the next rule decides


def test_an_indivisible_dim_falls_back_and_says_so(mesh):
    params = {"kv": np.zeros((2, 16), np.float32)}  # 2 heads, tp=4
    rule = LogicalShardingRule([("heads", "tp"), ("heads", "dp"), ("embed", "tp")],
                               names={"kv": ("heads", "embed")}, mesh=mesh)
    plan = rule.plan(params)
    assert plan.specs["kv"] == P("dp", "tp")
    assert "'tp'(4) does not divide dim 0 (2)" in plan.explain("kv")


def test_the_flax_export_of_a_plan_places_exactly_like_the_plan(linen_vars, mesh):
    params = nn.unbox(linen_vars)
    plan = AutoShardingRule(mesh=mesh, min_shard_size=1).plan(params)
    export = logical_export(plan, logical_names(linen_vars))
    # The export keys leaves by normalize_path (the params/ prefix goes).
    logical = jax.tree_util.tree_map_with_path(lambda kp, _: P(*export.names[normalize_path(kp)]), params)
    rows = [(n, None if not a else a) for n, a in export.rules]
    shardings = nn.logical_to_mesh_sharding(logical, mesh, rows)
    placed = jax.device_put(params, shardings)
    for arr, spec in zip(jax.tree.leaves(placed), jax.tree.leaves(plan.specs, is_leaf=lambda x: isinstance(x, P)),
                         strict=True):
        assert arr.sharding.is_equivalent_to(NamedSharding(mesh, spec), arr.ndim)


def test_flax_nnx_guide_example_scanned_layers():
    # flax's "Scale up on multiple devices" guide (docs_nnx/guides/flax_gspmd.md): two vmapped layers,
    # the layer axis unnamed; the guide asserts P(None, None, 'model') and P(None, 'model', None).
    rules = (("batch", "data"), ("hidden", "model"), ("embed", None))

    class DotReluDot(nnx.Module):
        def __init__(self, depth, rngs):
            init = nnx.initializers.lecun_normal()
            self.dot1 = nnx.Linear(depth, depth, kernel_init=nnx.with_partitioning(init, ("embed", "hidden")),
                                   use_bias=False, rngs=rngs)
            self.w2 = nnx.Param(init(rngs.params(), (depth, depth)), out_sharding=("hidden", "embed"))

    class MultiDotReluDot(nnx.Module):
        def __init__(self, depth, num_layers, rngs):
            @nnx.vmap(transform_metadata={nnx.PARTITION_NAME: None})
            def create_sublayers(r):
                return DotReluDot(depth, r)

            self.layers = create_sublayers(rngs.split(num_layers))

    with nnx.use_eager_sharding(False):
        state = nnx.state(nnx.eval_shape(lambda: MultiDotReluDot(1024, 2, rngs=nnx.Rngs(0))))
    guide_mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    plan = LogicalShardingRule(rules, mesh=guide_mesh).plan(state)
    specs = dict(plan.items())
    assert specs["layers/dot1/kernel/value"].spec == P(None, None, "model")
    assert specs["layers/w2/value"].spec == P(None, "model")  # == P(None, 'model', None): trailing None dropped


@pytest.mark.parametrize("spelling", ["sharding_names", "sharding"])
def test_the_older_nnx_metadata_spellings_are_read(spelling):
    # flax 0.12 warns and stores them as out_sharding; logical_names reads either way.
    with nnx.use_eager_sharding(False), pytest.warns(DeprecationWarning, match=spelling):
        param = nnx.Param(np.zeros((2, 3), np.float32), **{spelling: ("embed", "mlp")})
    assert logical_names({"w": param}) == {"w": ("embed", "mlp")}


def test_a_table_for_a_larger_mesh_needs_its_axes_declared(mesh):
    from meshplan.pure import ShardingRuleError

    table = [("embed", "fsdp"), ("embed", "dp"), ("mlp", "tp")]
    with pytest.raises(ShardingRuleError, match=r"row #0 'embed' names 'fsdp'; the mesh axes are \['dp', 'tp'\]"):
        LogicalShardingRule(table, mesh=mesh)
    rule = LogicalShardingRule(table, names={"w": ("embed", "mlp")}, mesh=mesh, mesh_axes=("dp", "fsdp", "tp"))
    plan = rule.plan({"w": np.zeros((8, 8), np.float32)})
    assert plan.specs["w"] == P("dp", "tp")
    assert "row #0 'embed'->'fsdp': the mesh has no axis 'fsdp'" in plan.explain("w")
