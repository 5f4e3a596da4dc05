"""assert_sharded_as / assert_specs_valid / assert_fits: pass on good input, list every problem on bad."""

import chex
import jax
import numpy as np
import pytest
from hypothesis import given
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.errors import MeshplanTypeError
from meshplan.pure import estimate_memory
from meshplan.testing import (
    assert_fits,
    assert_sharded_as,
    assert_specs_valid,
    invalid_partition_specs,
    sharded_trees,
)

MESH_SIZES = {"dp": 2, "tp": 4}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


def put(mesh, tree, specs):
    return jax.tree.map(lambda x, s: jax.device_put(np.zeros(x.shape, np.float32), NamedSharding(mesh, s)),
                        tree, specs, is_leaf=lambda x: isinstance(x, P))


def test_sharded_as_passes_for_what_device_put_did(mesh):
    specs = {"a": P("dp"), "b": {"c": P(None, "tp")}}
    tree = put(mesh, {"a": np.zeros((4, 2)), "b": {"c": np.zeros((2, 8))}}, specs)
    assert_sharded_as(tree, specs, mesh)
    assert_sharded_as(tree, {"a": P("dp", None), "b": P(None, "tp")}, mesh)  # prefix, trailing None


def test_sharded_as_names_every_wrong_leaf_with_expected_and_got(mesh):
    tree = put(mesh, {"a": np.zeros((4, 2)), "b": np.zeros((8,))}, {"a": P(), "b": P("tp")})
    with pytest.raises(AssertionError) as info:
        assert_sharded_as({**tree, "c": np.zeros(3)}, {"a": P("dp"), "b": P("dp"), "c": P()}, mesh)
    msg = str(info.value)
    # chex's prefix (a chex assertion), then the count of problems first
    assert msg.startswith("[Chex] Assertion assert_sharded_as failed: 3 leaf(s) not sharded as specified")
    assert "leaf 'a' (shape (4, 2)) is sharded as P(), expected P('dp',)" in msg
    assert "leaf 'b'" in msg and "leaf 'c' is a ndarray, not a live jax.Array" in msg


def test_sharded_as_reports_a_structure_mismatch(mesh):
    with pytest.raises(AssertionError, match="does not match"):
        assert_sharded_as({"a": 1}, {"b": P()}, mesh)


@given(sharded_trees(mesh_shape=MESH_SIZES))
def test_specs_valid_accepts_every_drawn_sharded_tree(case):
    assert_specs_valid(case.tree, case.specs, case.axis_sizes)


@given(invalid_partition_specs((6, 8), MESH_SIZES))
def test_specs_valid_names_the_leaf_of_every_invalid_spec(bad):
    tree = {"layer": {"w": jax.ShapeDtypeStruct((6, 8), np.float32)}, "ok": jax.ShapeDtypeStruct((2,), np.int8)}
    with pytest.raises(AssertionError, match="leaf 'layer/w'"):
        assert_specs_valid(tree, {"layer": {"w": bad.spec}, "ok": P()}, jax.sharding.AbstractMesh((2, 4), ("dp", "tp")))


def test_fits_passes_at_the_estimate_and_fails_one_byte_below():
    tree = {"w": jax.ShapeDtypeStruct((1024, 64), np.float32), "b": jax.ShapeDtypeStruct((64,), np.float32)}
    specs = {"w": P("dp", "tp"), "b": P()}
    need = estimate_memory(tree, specs, MESH_SIZES).max_per_device
    assert_fits(tree, specs, MESH_SIZES, need)
    with pytest.raises(AssertionError) as info:
        assert_fits(tree, specs, MESH_SIZES, need - 1)
    assert f"holds {need} bytes, over budget_bytes={need - 1} by 1" in str(info.value)
    assert "leaf 'w' (1024, 64) P('dp', 'tp'): 32768 bytes per device" in str(info.value)


# --- chex's assertion machinery: what chex users expect ---


def test_assertions_name_leaves_as_chex_does():
    tree = {"layer": [{"w": jax.ShapeDtypeStruct((6, 8), np.float32)}]}
    with pytest.raises(AssertionError) as ours:
        assert_specs_valid(tree, {"layer": [{"w": P("tp")}]}, MESH_SIZES)
    with pytest.raises(AssertionError) as theirs:
        chex.assert_tree_shape_prefix(tree, (7,))
    # chex: "Tree leaf 'layer/0/w' has a shape ..."; ours names the same leaf the same way
    assert "Tree leaf 'layer/0/w'" in str(theirs.value) and "Tree leaf 'layer/0/w'" in str(ours.value)
    assert str(ours.value).startswith("[Chex] Assertion assert_specs_valid failed: ")


def test_chex_disable_asserts_turns_every_assertion_off(mesh):
    tree = {"w": jax.ShapeDtypeStruct((6, 8), np.float32)}
    chex.disable_asserts()
    try:
        assert_specs_valid(tree, {"w": P("tp")}, MESH_SIZES)
        assert_fits(tree, {"w": P()}, MESH_SIZES, 0)
        assert_sharded_as({"w": np.zeros(3)}, {"w": P("dp")}, mesh)
    finally:
        chex.enable_asserts()
    with pytest.raises(AssertionError):
        assert_fits(tree, {"w": P()}, MESH_SIZES, 0)


def test_chex_keywords_custom_message_and_exception_type_work():
    tree = {"w": jax.ShapeDtypeStruct((6, 8), np.float32)}
    with pytest.raises(AssertionError, match=r"\[while checking the embedding\]$"):
        assert_specs_valid(tree, {"w": P("tp")}, MESH_SIZES, custom_message="while checking the embedding")

    class MyFailure(Exception):
        pass

    with pytest.raises(MyFailure, match="over budget_bytes=0"):
        assert_fits(tree, {"w": P()}, MESH_SIZES, 0, exception_type=MyFailure)


def test_a_bad_argument_is_meshplans_typed_error_not_an_assertion():
    tree = {"w": jax.ShapeDtypeStruct((8,), np.float32)}
    with pytest.raises(MeshplanTypeError, match="budget_bytes=-1"):
        assert_fits(tree, {"w": P()}, MESH_SIZES, -1)
    with pytest.raises(MeshplanTypeError, match="mesh=3"):
        assert_specs_valid(tree, {"w": P()}, 3)
    with pytest.raises(TypeError):  # also the builtin a caller catches
        assert_fits(tree, {"w": P()}, MESH_SIZES, "1 GiB")
