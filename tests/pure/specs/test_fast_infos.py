"""tree_facts' one-pass leaf facts for numpy / jax arrays and ShapeDtypeStructs: each kind's info built once,
equal to the per-leaf definition, and a bad leaf named by the first leaf of its kind."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import tree_facts
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.specs import leaf_info

_KINDS = [((4,), np.float32), ((8, 2), np.float32), ((8, 2), np.int8), ((), np.float16)]
leaves = st.sampled_from(_KINDS).flatmap(lambda k: st.sampled_from([
    jax.ShapeDtypeStruct(*k), np.zeros(*k), jax.numpy.zeros(*k)]))


@given(st.lists(leaves, min_size=1, max_size=30))
def test_each_leaf_gets_its_own_facts_and_equal_kinds_share_one_object(tree):
    infos = tree_facts(tree).infos
    assert list(infos) == [leaf_info(x) for x in tree]
    by_kind = {}
    for info in infos:
        assert by_kind.setdefault((info.shape, info.dtype), info) is info


def test_a_bad_leaf_is_named_by_the_first_leaf_of_the_first_bad_kind():
    tree = {"a": np.zeros(3), "b": np.zeros(3), "c": np.array(["x"]), "d": np.array([b"y"]), "e": np.array(["z"])}
    with pytest.raises(MeshplanTypeError, match=r"^leaf 'c': dtype=<U1"):
        tree_facts(tree)
    with pytest.raises(MeshplanTypeError, match=r"^leaf 'd': dtype=\|S1"):
        tree_facts({k: v for k, v in tree.items() if k != "c"})
