"""Tests for the mesh-bound sharding rules (meshplan.facade._rules) on 8 real CPU devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from jax.sharding import PartitionSpec as P

from meshplan import (
    AutoShardingRule,
    CompositeShardingRule,
    MemoryConstrainedShardingRule,
    ShapeBasedShardingRule,
    ShardingRule,
    create_mesh,
)
from meshplan.pure import Decision, Plan, shard_shape, validate_specs
from meshplan.pure.errors import MemoryBudgetError, MeshplanTypeError, ShardingRuleError
from meshplan.testing import array_shapes_for, meshes

AUTO = AxisType.Auto


def _mesh(shape=(2, 4), names=("dp", "tp")):
    return jax.make_mesh(shape, names, axis_types=(AUTO,) * len(shape))


def _model_params():
    """A small Llama-like parameter tree."""
    rng = np.random.default_rng(0)
    layer = lambda: {  # noqa: E731
        "attn": {"wq": rng.standard_normal((256, 256), np.float32), "wo": rng.standard_normal((256, 256), np.float32)},
        "mlp": {"up": rng.standard_normal((256, 1024), np.float32),
                "down": rng.standard_normal((1024, 256), np.float32)},
        "norm": np.ones(256, np.float32),
    }
    return {"embed": rng.standard_normal((1000, 256), np.float32), "layers": [layer(), layer()],
            "lm_head": rng.standard_normal((256, 1024), np.float32)}


# --- every spec is storable, and jax agrees -------------------------------------------------------

leaf_shapes = array_shapes_for({}, divisible=False, max_dims=3)


@given(mesh=meshes(num_devices=8, axis_types="auto"), shapes=st.lists(leaf_shapes, min_size=1, max_size=5),
       which=st.sampled_from(["auto", "auto-reverse", "memory", "composite"]))
def test_built_in_specs_validate_and_device_put_places_them_as_planned(mesh, shapes, which):
    tree = {f"p{i}": np.arange(np.prod(s), dtype=np.float32).reshape(s) for i, s in enumerate(shapes)}
    rule = {
        "auto": AutoShardingRule(mesh=mesh, min_shard_size=0),
        "auto-reverse": AutoShardingRule(mesh=mesh, min_shard_size=0, reverse=True),
        "memory": MemoryConstrainedShardingRule(64, mesh=mesh),
        "composite": CompositeShardingRule(ShapeBasedShardingRule({(None, 8): P(None, None)}),
                                           AutoShardingRule(mesh=mesh, min_shard_size=4)),
    }[which]
    try:
        specs = rule.apply(tree)
    except MemoryBudgetError:
        assert which == "memory"
        return
    sizes = dict(mesh.shape)
    assert validate_specs(tree, specs, sizes) == []
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    placed = jax.device_put(tree, shardings)
    for key, array in placed.items():
        assert array.sharding.spec == specs[key]
        assert array.addressable_shards[0].data.shape == shard_shape(tree[key].shape, specs[key], sizes)
        np.testing.assert_array_equal(np.asarray(array), tree[key])


# --- the reference documentation's examples (verbatim apart from the import) ---------------------


def test_reference_auto_sharding_rule_example():
    model_params = _model_params()
    mesh = create_mesh(axis_dims=(2, 4), axis_names=('dp', 'tp'))
    rule = AutoShardingRule(mesh=mesh, axis_names=['dp', 'tp'])
    # Apply to model parameters
    specs = rule.apply(model_params)
    assert specs["embed"] == P("dp", "tp") and specs["layers"][0]["mlp"]["up"] == P("tp", "dp")
    assert specs["layers"][0]["norm"] == P()  # 256 elements < 1024


def test_reference_memory_constrained_rule_example():
    large_model_params = {"w": jax.ShapeDtypeStruct((65536, 8192), np.float32), "b": np.zeros(8192, np.float32)}
    mesh = create_mesh(axis_dims=(2, 4), axis_names=('dp', 'tp'))
    # Allow max 1GB per device
    rule = MemoryConstrainedShardingRule(
        max_memory_per_device=1024**3,
        mesh=mesh
    )
    specs = rule.apply(large_model_params)
    assert specs == {"w": P("tp"), "b": P()}


def test_reference_shape_based_rule_example():
    model_params = _model_params()
    model_params["square"] = np.zeros((1024, 1024), np.float32)
    model_params["table"] = np.zeros((4000, 1024), np.float32)
    with jax.set_mesh(create_mesh(axis_dims=(2, 4), axis_names=('dp', 'tp'))):
        # Shard arrays with shape (vocab_size, embed_dim) along first axis
        patterns = {
            (None, 1024): PartitionSpec('tp', None),  # Embedding tables
            (1024, 1024): PartitionSpec('tp', None),  # Square weight matrices
        }
        rule = ShapeBasedShardingRule(patterns)
        specs = rule.apply(model_params)
    assert specs["table"] == specs["square"] == specs["lm_head"] == P("tp", None)
    assert specs["embed"] == P()  # (1000, 256) matches no pattern


def test_reference_composite_rule_example():
    model_params = _model_params()
    mesh = create_mesh(axis_dims=(2, 4), axis_names=('dp', 'tp'))
    # Try shape-based first, fall back to auto sharding
    shape_rule = ShapeBasedShardingRule({(None, 1024): PartitionSpec('tp')})
    auto_rule = AutoShardingRule(mesh=mesh)
    combined = CompositeShardingRule(shape_rule, auto_rule)
    specs = combined.apply(model_params)
    assert specs["lm_head"] == P("tp") and specs["layers"][1]["mlp"]["up"] == P("tp")
    assert specs["embed"] == P("dp", "tp")  # (1000, 256): auto


def test_reference_custom_rule_example_works_alone_and_inside_a_composite():
    class CustomRule(ShardingRule):
        def apply(self, pytree):
            return jax.tree_util.tree_map(
                lambda x: PartitionSpec('data'),
                pytree
            )

    mesh = _mesh((2, 4), ("data", "tp"))
    params = {"w": np.zeros((8, 8)), "b": np.zeros(8)}
    assert CustomRule().apply(params) == {"w": P("data"), "b": P("data")}
    plan = CompositeShardingRule(CustomRule(), AutoShardingRule(mesh=mesh)).plan(params)
    assert plan.specs == {"w": P("data"), "b": P("data")}
    assert plan.explain("w").endswith("[CustomRule] CustomRule won (rule 1 of 2): returned by CustomRule.apply")


# --- mesh binding ---------------------------------------------------------------------------------


def test_rules_take_the_current_mesh_at_construction_or_at_apply():
    mesh = _mesh()
    params = {"w": jax.ShapeDtypeStruct((4096, 1024), np.float32)}
    with jax.set_mesh(mesh):
        built_inside = AutoShardingRule()
    assert built_inside.mesh is mesh
    assert built_inside.apply(params) == {"w": P("dp", "tp")}
    built_outside = AutoShardingRule()
    assert built_outside.mesh is None
    with jax.set_mesh(_mesh((4, 2), ("dp", "tp"))):
        assert built_outside.apply(params) == {"w": P("dp", "tp")}
        assert built_outside.plan(params).axis_sizes == {"dp": 4, "tp": 2}


def test_without_any_mesh_the_error_says_how_to_give_one():
    with pytest.raises(ShardingRuleError, match=r"AutoShardingRule has no mesh: pass mesh=.*jax.set_mesh"):
        AutoShardingRule().apply({"w": np.zeros(8)})
    with pytest.raises(ShardingRuleError, match="CompositeShardingRule has no mesh"):
        # (a shape rule alone needs no mesh: eformer's ShapeBasedShardingRule(patterns).apply(params))
        CompositeShardingRule(ShapeBasedShardingRule({}), AutoShardingRule()).apply({"w": np.zeros(8)})


def test_an_abstract_mesh_is_enough_to_plan():
    abstract = _mesh().abstract_mesh
    rule = MemoryConstrainedShardingRule(2 * 1024**2, mesh=abstract)
    assert rule.apply({"w": jax.ShapeDtypeStruct((4096, 1024), np.float32)}) == {"w": P(("tp", "dp"))}


def test_bad_meshes_and_unknown_axis_names_fail_early():
    with pytest.raises(MeshplanTypeError, match="must be a jax.sharding.Mesh"):
        AutoShardingRule(mesh="dp:2")
    with pytest.raises(ShardingRuleError, match=r"\['mp'\]"):
        AutoShardingRule(mesh=_mesh(), axis_names=["dp", "mp"])
    with pytest.raises(ShardingRuleError, match=r"\['mp'\]"):
        MemoryConstrainedShardingRule(10, mesh=_mesh(), axis_names=["mp"])


def test_composite_refuses_rules_on_different_meshes_and_borrows_for_meshless_ones():
    a = AutoShardingRule(mesh=_mesh((2, 4), ("dp", "tp")))
    b = AutoShardingRule(mesh=_mesh((4, 2), ("dp", "tp")))
    with pytest.raises(ShardingRuleError, match="different meshes"):
        CompositeShardingRule(a, b).apply({"w": np.zeros(8)})
    shape_rule = ShapeBasedShardingRule({(6,): P("tp")})  # no mesh anywhere: uses a's
    with pytest.raises(ShardingRuleError, match=r"^w: shape \(6,\) matches shape pattern #0"):
        CompositeShardingRule(shape_rule, a).apply({"w": np.zeros(6)})


# --- subclasses and other rule kinds inside composites ---------------------------------------------


def test_a_subclass_overriding_apply_with_super_is_honoured_inside_a_composite():
    class Halved(AutoShardingRule):
        def apply(self, pytree):
            specs = super().apply(pytree)
            return jax.tree.map(lambda s: P(*s[:1]), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))

    mesh = _mesh()
    params = {"w": jax.ShapeDtypeStruct((4096, 1024), np.float32)}
    rule = Halved(mesh=mesh)
    assert rule.apply(params) == {"w": P("dp")}
    assert rule.plan(params).explain("w").endswith("[Halved] returned by Halved.apply")
    assert CompositeShardingRule(rule, AutoShardingRule(mesh=mesh)).apply(params) == {"w": P("dp")}


def test_duck_typed_rules_and_pure_rules_join_a_composite():
    class Duck:
        def apply(self, pytree):
            return jax.tree.map(lambda x: P(), pytree)

    def path_rule(ctx):
        return Decision(P(None, "tp"), "heads", "path") if ctx.path.endswith("wq") else None

    mesh = _mesh()
    params = {"wq": np.zeros((8, 8)), "wo": np.zeros((8, 8))}
    rule = CompositeShardingRule(Duck(), path_rule, AutoShardingRule(mesh=mesh, min_shard_size=0))
    plan = rule.plan(params)
    assert isinstance(plan, Plan)
    assert plan.specs == {"wq": P(None, "tp"), "wo": P("dp", "tp")}
    assert plan.counts() == {"auto": 1, "path": 1}


def test_composite_rejects_non_rules_and_emptiness():
    with pytest.raises(ShardingRuleError, match="at least one rule"):
        CompositeShardingRule()
    with pytest.raises(MeshplanTypeError, match="not rules"):
        CompositeShardingRule(AutoShardingRule(mesh=_mesh()), 42)


def test_sharding_rule_is_abstract():
    with pytest.raises(TypeError):
        ShardingRule()  # type: ignore[abstract]


def test_defaults_work_out_of_the_box_and_reprs_show_the_mesh():
    rule = AutoShardingRule(mesh=_mesh())
    assert rule.min_shard_size == 1024 and rule.axis_names is None and rule.reverse is False
    assert "mesh={'dp': 2, 'tp': 4}" in repr(rule)
    assert MemoryConstrainedShardingRule(1024**3, mesh=_mesh()).max_memory_per_device == 1024**3
