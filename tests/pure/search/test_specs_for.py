"""MeshCandidate.specs_for matches normalised paths and shapes, never the dtype (meshplan.pure.search._match)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import examples
from jax.sharding import PartitionSpec as P

from meshplan.pure import get_preset, search_meshes
from meshplan.pure.errors import ShardingRuleError


def _leaves(tree):
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, P))


@pytest.fixture(scope="module")
def best():
    return search_meshes("llama3-8b", "2x8xH100", batch=16, top_k=1).best


def test_a_preset_a_params_wrapper_and_fp32_leaves_get_the_searched_specs(best) -> None:
    preset = get_preset("llama3-8b")
    plain = _leaves(best.specs_for(preset.params))
    assert any(s != P() for s in plain)
    assert _leaves(best.specs_for(preset)) == plain
    assert _leaves(best.specs_for({"params": preset.params})) == plain
    fp32 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32), preset.params)
    assert _leaves(best.specs_for(fp32)) == plain


@settings(max_examples=examples(10))
@given(st.sampled_from(["params", "value"]), st.integers(0, 2))
def test_prefixes_and_box_tails_never_change_the_specs(wrapper: str, depth: int) -> None:
    best = search_meshes("gpt2", "2xH100", batch=4, top_k=1).best
    params = get_preset("gpt2").params
    tree = params
    for _ in range(depth):
        tree = {"params": tree} if wrapper == "params" else jax.tree.map(lambda x: {"value": x}, tree)
    assert _leaves(best.specs_for(tree)) == _leaves(best.specs_for(params))


def test_another_model_is_refused_with_the_leaf_and_why(best) -> None:
    with pytest.raises(ShardingRuleError, match="different parameter tree.*dtype do not matter"):
        best.specs_for(get_preset("llama3-70b").params)
