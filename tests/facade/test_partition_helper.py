"""Tests for MeshPartitionHelper (meshplan.facade._partition_helper) on 8 real CPU devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from meshplan import MeshPartitionHelper, create_mesh
from meshplan.pure import shard_shape, validate_specs
from meshplan.pure.rules import analyze_pytree, create_partition_spec, suggest_methods
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError, SpecError
from meshplan.testing import array_shapes_for, meshes

AUTO = AxisType.Auto


def _mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AUTO,) * len(shape))


leaf_shapes = array_shapes_for({}, divisible=False, max_dims=3)
# Every split of the 8 devices over eformer's five axes, or over two or one of them.
eformer_meshes = st.one_of(*[meshes(axis_names=names, num_devices=8, axis_types="auto")
                             for names in (("dp", "fsdp", "ep", "tp", "sp"), ("dp", "tp"), ("fsdp",))])


@given(mesh=eformer_meshes, shapes=st.lists(leaf_shapes, min_size=1, max_size=5),
       min_size=st.sampled_from([0, 16, 1024]))
def test_auto_shard_pytree_places_every_array_as_planned_with_a_storable_spec(mesh, shapes, min_size):
    helper = MeshPartitionHelper(mesh)
    tree = [np.arange(np.prod(s), dtype=np.float32).reshape(s) for s in shapes]
    plan = helper.plan(tree, min_size)
    assert validate_specs(tree, plan.specs, helper.axis_sizes) == []
    placed = helper.auto_shard_pytree(tree, min_shard_size=min_size)
    for x, y, spec in zip(tree, placed, plan.specs):
        assert y.sharding.spec == spec and y.sharding.mesh == mesh
        assert y.addressable_shards[0].data.shape == shard_shape(x.shape, spec, helper.axis_sizes)
        np.testing.assert_array_equal(np.asarray(y), x)


def test_auto_shard_pytree_calls_device_put_once_for_the_whole_tree(monkeypatch):
    calls = []
    real = jax.device_put

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(jax, "device_put", counting)
    helper = MeshPartitionHelper(_mesh((2, 4), ("dp", "tp")))
    tree = {f"w{i}": np.ones((64, 64), np.float32) for i in range(20)}
    placed = helper.auto_shard_pytree(tree, min_shard_size=0)
    assert len(calls) == 1
    assert all(a.sharding.spec == P("dp", "tp") for a in placed.values())


def test_non_array_leaves_come_back_unchanged():
    helper = MeshPartitionHelper(_mesh((2, 4), ("dp", "tp")))

    class Box:
        value = np.zeros((64, 64))

    box = Box()
    sds = jax.ShapeDtypeStruct((64, 64), np.float32)
    tree = {"w": np.ones((64, 64), np.float32), "n": None, "k": 3, "s": "name", "box": box, "sds": sds,
            "j": jax.numpy.ones((64, 64)), "g": np.float32(2.0)}
    out = helper.auto_shard_pytree(tree, min_shard_size=0)
    assert out["n"] is None and out["k"] == 3 and out["s"] == "name" and out["box"] is box and out["sds"] is sds
    assert isinstance(out["w"], jax.Array) and out["w"].sharding.spec == P("dp", "tp")
    assert out["j"].sharding.spec == P("dp", "tp")
    assert isinstance(out["g"], jax.Array) and out["g"].sharding.spec == P()


def test_reference_example_on_eight_devices():
    # The reference's mesh is (2, 4, 1, 2, 1): 16 devices. Eight CPU devices
    # give dp=1; the rest of the example is verbatim.
    model_params = {"w": np.ones((1024, 4096), np.float32), "norm": np.ones(4096, np.float32)}
    mesh = create_mesh(axis_dims=(1, 4, 1, 2, 1),
                       axis_names=('dp', 'fsdp', 'ep', 'tp', 'sp'))
    helper = MeshPartitionHelper(mesh)
    # Analyze and auto-shard a model
    sharded_params = helper.auto_shard_pytree(model_params)
    # sp=1 is never spent (see meshplan.pure.rules._suggest), so w gets fsdp and tp.
    assert sharded_params["w"].sharding.spec == P("fsdp", "tp")
    assert sharded_params["norm"].sharding.spec == P("tp")

    shape_methods = helper.analyze_pytree(model_params)
    assert shape_methods == {(4096,): [("dp",), ("tp",), ("fsdp",)], (1024, 4096): [("fsdp", "sp"), ("dp",), ("tp",)]}
    methods = helper._suggest_methods((1024, 4096))
    spec = helper.create_partition_spec((1024, 4096), methods)
    assert spec == P("fsdp", "tp")


def test_helper_methods_are_the_pure_functions_on_the_mesh_axis_sizes():
    mesh = _mesh((1, 2, 1, 2, 2), ("dp", "fsdp", "ep", "tp", "sp"))
    helper = MeshPartitionHelper(mesh)
    assert helper.axis_sizes == {"dp": 1, "fsdp": 2, "ep": 1, "tp": 2, "sp": 2}
    tree = {"a": np.zeros((6, 4096)), "b": np.zeros((4096,))}
    assert helper.analyze_pytree(tree) == analyze_pytree(tree, helper.axis_sizes)
    for shape in [(6, 4096), (4096,), (64, 64, 64)]:
        methods = helper._suggest_methods(shape)
        assert methods == suggest_methods(shape, helper.axis_sizes)
        assert helper.create_partition_spec(shape, methods, 0) == create_partition_spec(
            shape, methods, helper.axis_sizes, min_shard_size=0)


def test_shard_array_checks_the_spec_before_placing():
    helper = MeshPartitionHelper(_mesh((2, 4), ("dp", "tp")))
    placed = helper.shard_array(np.ones((8, 8)), P("dp", "tp"))
    assert placed.sharding.spec == P("dp", "tp")
    with pytest.raises(SpecError, match="does not divide by 4"):
        helper.shard_array(np.ones((6, 8)), P("tp"))
    with pytest.raises(SpecError, match="'mp'"):
        helper.shard_array(np.ones((8, 8)), P("mp"))


def test_unknown_axes_in_methods_are_rule_errors():
    helper = MeshPartitionHelper(_mesh((2, 4), ("dp", "tp")))
    with pytest.raises(ShardingRuleError, match="not axes of the mesh"):
        helper.create_partition_spec((64, 64), [("fsdp",)])


def test_the_helper_needs_a_concrete_mesh():
    with pytest.raises(MeshplanTypeError, match="needs a jax.sharding.Mesh"):
        MeshPartitionHelper(_mesh((2, 4), ("dp", "tp")).abstract_mesh)


def test_plan_explains_the_placement():
    helper = MeshPartitionHelper(_mesh((2, 4), ("fsdp", "sp")))
    plan = helper.plan({"w": np.zeros((1024, 4096), np.float32)})
    assert plan.explain("w") == (
        "w: (1024, 4096) float32 -> P('fsdp', 'sp') [suggest] dim 0 (1024) <- 'fsdp'(2), dim 1 (4096) <- 'sp'(4)"
    )
