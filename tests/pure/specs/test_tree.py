"""tree_facts: what counts as an array leaf, in which order, with which paths."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import MeshplanTypeError, tree_facts
from meshplan.pure.specs import LeafInfo, TreeFacts, leaf_info, path_str
from meshplan.testing import shape_dtype_trees


class Box:
    """An unregistered wrapper with the array in ``.value`` (like flax's Partitioned)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class Pair(NamedTuple):
    first: Any
    second: Any


def test_every_supported_leaf_kind_gives_its_shape_and_dtype():
    tree = {
        "sds": jax.ShapeDtypeStruct((4, 8), jnp.bfloat16),
        "np": np.zeros((3,), np.int8),
        "jax": jnp.zeros((2, 2), jnp.float32),
        "none": None,
        "scalars": [True, 3, 2.5, 1j],
        "pair": Pair(np.zeros(5, ml_dtypes.int4), (np.float16(1.0),)),
        "box": Box(jnp.ones((6,), jnp.float32)),
        "text": "not an array",
    }
    facts = tree_facts(tree)
    got = {facts.path(i): info for i, info in enumerate(facts.infos)}
    assert got == {
        "box": LeafInfo((6,), np.dtype(np.float32)),
        "jax": LeafInfo((2, 2), np.dtype(np.float32)),
        "np": LeafInfo((3,), np.dtype(np.int8)),
        "pair/first": LeafInfo((5,), np.dtype(ml_dtypes.int4)),
        "pair/second/0": LeafInfo((), np.dtype(np.float16)),
        "scalars/0": LeafInfo((), np.dtype(bool)),
        "scalars/1": LeafInfo((), np.dtype(np.int32)),
        "scalars/2": LeafInfo((), np.dtype(np.float32)),
        "scalars/3": LeafInfo((), np.dtype(np.complex64)),
        "sds": LeafInfo((4, 8), np.dtype(ml_dtypes.bfloat16)),
        "text": None,
    }


def test_python_scalars_follow_x64():
    infos = tree_facts([1, 1.0], x64=True).infos
    assert infos == (LeafInfo((), np.dtype(np.int64)), LeafInfo((), np.dtype(np.float64)))


def test_prng_key_arrays_keep_their_key_dtype():
    keys = jax.random.split(jax.random.key(0), 3)
    (info,) = tree_facts({"rng": keys}).infos
    assert info.shape == (3,) and info.dtype == keys.dtype


def test_none_leaves_are_empty_subtrees_and_come_back_as_none():
    facts = tree_facts({"a": None, "b": np.zeros(2)})
    assert len(facts.infos) == 1
    assert facts.unflatten(["x"]) == {"a": None, "b": "x"}


def test_equal_leaves_share_one_info_object():
    facts = tree_facts([np.zeros((2, 3))] * 5 + [jax.ShapeDtypeStruct((2, 3), np.float64)])
    assert len({id(i) for i in facts.infos}) == 1


def test_a_leaf_with_a_shape_but_a_bogus_dtype_is_a_typed_error():
    class Fake:
        shape = (2,)
        dtype = "no-such-dtype"

    with pytest.raises(MeshplanTypeError, match="no-such-dtype"):
        tree_facts([Fake()])


leaves = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.text(max_size=2),
    st.tuples(st.lists(st.integers(0, 3), max_size=3), st.sampled_from(["float32", "int8", "bfloat16", "uint4"]))
    .map(lambda sd: np.zeros(sd[0], sd[1])),
    # parameter-like subtrees of ShapeDtypeStructs (bf16, fp8, int4, ...); the rest are the odd leaves
    # and nodes (None, scalars, strings, custom nodes) that tree_facts must also take
    shape_dtype_trees(max_leaves=2),
)
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text("abc", min_size=1, max_size=2), children, max_size=3),
        st.tuples(children, children).map(lambda t: Pair(*t)),
        children.map(Box),
    ),
    max_leaves=12,
)


@given(trees)
def test_facts_match_jax_leaves_one_for_one_with_paths_in_leaf_order(tree):
    facts = tree_facts(tree)
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    assert facts.treedef == treedef
    assert len(facts.infos) == len(with_path)
    assert facts.keypaths == tuple(k for k, _ in with_path)
    for i, (keypath, leaf) in enumerate(with_path):
        assert facts.path(i) == path_str(keypath)
        assert facts.infos[i] == leaf_info(leaf)
        if isinstance(leaf, bool | int | float | np.ndarray):
            as_array = jnp.asarray(leaf)
            assert facts.infos[i] == LeafInfo(as_array.shape, as_array.dtype)
        if isinstance(leaf, str):
            assert facts.infos[i] is None


def test_key_paths_are_lazy_and_also_work_for_hand_built_facts():
    facts = tree_facts({"a": [np.zeros(2), 1], "b": None})
    assert facts._memo == []  # nothing formatted until asked
    by_hand = TreeFacts(facts.infos, facts.treedef)
    assert by_hand.keypaths == facts.keypaths and by_hand.path(1) == "a/1"
