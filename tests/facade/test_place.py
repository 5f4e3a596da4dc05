"""meshplan.place: a whole training state on a mesh in one device_put, checked against its specs first."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings

from tests.profiles import examples
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import meshplan
from meshplan.errors import MeshplanTypeError, NoMeshError, SpecError
from meshplan.testing import assert_sharded_as, mesh_for, mesh_shapes, sharded_trees


@settings(max_examples=examples(20))
@given(sharded_trees(mesh_shape=mesh_shapes(num_devices=8), dtypes=("float32", "int8"), divisible=True))
def test_every_leaf_lands_with_its_spec(case: object) -> None:
    tree, specs, sizes = case.tree, case.specs, case.axis_sizes  # type: ignore[attr-defined]
    mesh = mesh_for(sizes)
    arrays = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), tree)
    placed = meshplan.place(arrays, specs, mesh)
    assert jax.tree.structure(placed) == jax.tree.structure(arrays)
    assert_sharded_as(placed, specs, mesh)


def test_params_and_adam_state_together_keep_nnx_boxes_and_take_named_shardings_too() -> None:
    mesh = mesh_for({"dp": 2, "tp": 4})
    params = nnx.state(nnx.Linear(16, 32, rngs=nnx.Rngs(0)), nnx.Param)
    opt_state = optax.adam(1e-3).init(params)
    param_specs = jax.tree_util.tree_map_with_path(
        lambda path, _: P("dp", "tp") if "kernel" in jax.tree_util.keystr(path) else P(), params)
    state_specs = meshplan.optimizer_state_specs(params, param_specs, opt_state)
    placed_params, placed_state = meshplan.place((params, opt_state), (param_specs, state_specs), mesh)
    assert isinstance(placed_params["kernel"], nnx.Param)  # boxes survive
    assert placed_params["kernel"].get_value().sharding.spec == P("dp", "tp")
    assert placed_state[0].mu["kernel"].get_value().sharding.spec == P("dp", "tp")
    assert placed_state[0].count.sharding.spec == P()
    named = jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs, is_leaf=lambda x: isinstance(x, P))
    again = meshplan.place(params, named, mesh)
    assert again["kernel"].get_value().sharding == NamedSharding(mesh, P("dp", "tp"))


def test_the_current_mesh_is_used_when_none_is_given() -> None:
    mesh = mesh_for({"x": 8})
    with jax.set_mesh(mesh):
        out = meshplan.place({"w": np.zeros((8, 2), np.float32)}, {"w": P("x")})
    assert out["w"].sharding == NamedSharding(mesh, P("x"))


def test_every_bad_spec_is_named_before_anything_moves() -> None:
    mesh = mesh_for({"dp": 2, "tp": 4})
    tree = {"a": np.zeros((3, 4), np.float32), "b": np.zeros((8,), jnp.bfloat16)}
    with pytest.raises(SpecError) as err:
        meshplan.place(tree, {"a": P("dp"), "b": P("fsdp")}, mesh)
    message = str(err.value)
    assert "'a'" in message and "'b'" in message and "fsdp" in message


def test_no_mesh_or_an_abstract_one_is_a_clear_error() -> None:
    tree = {"w": np.zeros((8,), np.float32)}
    with pytest.raises(NoMeshError, match="place"):
        meshplan.place(tree, {"w": P()})
    with pytest.raises(MeshplanTypeError, match="place"):
        meshplan.place(tree, {"w": P()}, AbstractMesh((8,), ("x",)))  # type: ignore[arg-type]


def test_a_spec_prefix_covers_the_leaves_below_it_and_non_arrays_are_named() -> None:
    mesh = mesh_for({"dp": 2, "tp": 4})
    tree = {"a": {"x": np.zeros((8, 4), np.float32), "y": np.zeros((2,), np.float32)}, "n": None}
    placed = meshplan.place(tree, {"a": P(), "n": None}, mesh)
    assert placed["n"] is None and placed["a"]["x"].sharding == NamedSharding(mesh, P())
    with pytest.raises(MeshplanTypeError, match=r"'w' \(ShapeDtypeStruct\)"):
        meshplan.place({"w": jax.ShapeDtypeStruct((8,), jnp.float32)}, {"w": P("dp")}, mesh)
    with pytest.raises(MeshplanTypeError, match="specs"):
        meshplan.place(tree, {1: P(), "a": P()}, mesh)
