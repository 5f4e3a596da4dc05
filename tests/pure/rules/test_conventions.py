"""Tests for the tree-conventions reader (meshplan.pure.rules._conventions): properties and a layout table."""

from __future__ import annotations

import re

import jax
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules import AxisKindRule
from meshplan.pure.rules._conventions import DIM_KINDS, leaf_layout, normalize_path

NAMES = ["model", "layers", "params", "value", "raw_value", "q_proj", "kernel", "weight", "bias", "embedding",
         "scale", "experts", "w1", "self_attn", "mlp", "layers_0", "decoder", "query", "out", "lm_head"]
name = st.sampled_from(NAMES) | st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
component = name | st.integers(0, 40).map(str)
paths = st.lists(component, min_size=1, max_size=7).map("/".join)
# A "core" path: neither starts with a prefix nor ends with a box tail, so wrapping it must not change it.
cores = st.lists(component, min_size=1, max_size=6).filter(
    lambda p: p[0] != "params" and p[-1] not in {"value", "raw_value"}).map("/".join)


@given(paths)
def test_normalizing_is_idempotent(path: str) -> None:
    once = normalize_path(path)
    assert normalize_path(once) == once and once


@given(cores, st.integers(0, 2), st.lists(st.sampled_from(["value", "raw_value"]), max_size=2))
def test_params_prefixes_and_box_tails_do_not_change_a_path(core: str, prefixes: int, tails: list[str]) -> None:
    wrapped = "/".join(["params"] * prefixes + [core] + tails)
    assert normalize_path(wrapped) == normalize_path(core) == core


@st.composite
def keypaths(draw: st.DrawFn) -> tuple:
    keys = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["dict", "attr", "seq"]))
        if kind == "seq":
            keys.append(SequenceKey(draw(st.integers(0, 9))))
        else:
            text = draw(name)
            keys.append(DictKey(text) if kind == "dict" else GetAttrKey(text))
    return tuple(keys)


@given(keypaths())
def test_every_written_form_of_a_jax_key_path_normalizes_alike(keypath: tuple) -> None:
    # agreement with jax's own renderings of the same key path
    expected = normalize_path(keypath)
    assert normalize_path(jax.tree_util.keystr(keypath)) == expected
    assert normalize_path(jax.tree_util.keystr(keypath, simple=True, separator="/")) == expected
    assert normalize_path(jax.tree_util.keystr(keypath, simple=True, separator=".")) == expected


def test_written_forms_of_one_leaf() -> None:
    want = "layers/0/q_proj/kernel"
    for form in ("params/layers/0/q_proj/kernel/value", "['params']['layers'][0]['q_proj']['kernel'].value",
                 ".layers[0].q_proj.kernel", "layers.0.q_proj.kernel", "params/params/layers/0/q_proj/kernel"):
        assert normalize_path(form) == want, form
    assert normalize_path("params") == "params" and normalize_path("value") == "value"
    with pytest.raises(MeshplanTypeError):
        normalize_path(3)  # type: ignore[arg-type]


shapes3 = st.tuples(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64))


@given(st.sampled_from(["q_proj", "o_proj", "w1", "lm_head", "dense", "gate_proj"]), shapes3)
def test_dim_meanings_follow_the_features_not_their_positions(module: str, shape) -> None:
    # a flax kernel (in, out) and the PyTorch weight of the same layer (out, in) mean the same features
    a, b = shape[:2]
    flax = leaf_layout(f"params/{module}/kernel/value", (a, b)).dims
    torch = leaf_layout(f"model/{module}/weight", (b, a)).dims
    assert flax == tuple(reversed(torch))
    # and the meaning depends on the shape only through its rank (no head counts given)
    assert leaf_layout(f"{module}/kernel", shape).dims == leaf_layout(f"{module}/kernel", shape[::-1]).dims
    # a leading stack does not change the meaning of the layer's own dims
    assert leaf_layout(f"layers/{module}/kernel", (7, a, b)).dims == ("layers", *flax)


@given(paths, st.lists(st.integers(1, 16), max_size=4).map(tuple))
def test_every_leaf_gets_one_known_meaning_per_dim(path: str, shape) -> None:
    lay = leaf_layout(path, shape)
    assert len(lay.dims) == len(shape) and set(lay.dims) <= set(DIM_KINDS)
    for kind in ("in", "out", "vocab", "experts", "heads", "head_dim"):
        assert lay.dims.count(kind) <= 1, lay


@given(cores, st.lists(st.integers(1, 512), min_size=1, max_size=3).map(tuple))
def test_the_default_rule_decides_alike_for_a_wrapped_and_a_plain_path(core: str, shape) -> None:
    rule = AxisKindRule(min_shard_size=0)
    sizes = {"fsdp": 2, "tp": 4}
    assert rule.decide(f"params/{core}/value", shape, sizes) == rule.decide(core, shape, sizes)


# path, shape, convention, expected dims, role
TABLE = [
    ("model/layers/0/self_attn/q_proj/weight", (64, 32), "auto", ("out", "in"), "column"),  # HF PyTorch
    ("model/layers/0/self_attn/o_proj/weight", (32, 64), "auto", ("out", "in"), "row"),
    ("model/embed_tokens/weight", (1000, 32), "auto", ("vocab", "embed"), "vocab"),
    ("lm_head/weight", (1000, 32), "auto", ("vocab", "in"), "column"),
    ("model/norm/weight", (32,), "auto", ("embed",), "other"),
    ("transformer/h/0/attn/c_attn/weight", (32, 96), "auto", ("in", "out"), "column"),  # GPT-2 Conv1D
    ("transformer/h/0/mlp/c_proj/weight", (128, 32), "auto", ("in", "out"), "row"),
    ("params/model/layers/0/self_attn/q_proj/kernel", (32, 64), "auto", ("in", "out"), "column"),  # HF Flax
    ("params/model/layers/0/self_attn/q_proj/bias", (64,), "auto", ("out",), "column"),
    ("layers/mlp/experts/w2/weight", (8, 32, 128), "auto", ("experts", "out", "in"), "row"),
    ("layers/mlp/experts/3/w2/weight", (32, 128), "auto", ("out", "in"), "row"),  # per-expert
    ("decoder/layers/self_attention/query/kernel", (32, 4, 8), "auto", ("in", "heads", "head_dim"), "column"),
    ("decoder/layers/self_attention/out/kernel", (4, 8, 32), "auto", ("heads", "head_dim", "out"), "row"),
    ("decoder/layers/self_attention/query/kernel", (32, 6, 4, 8), "maxtext",
     ("in", "layers", "heads", "head_dim"), "column"),
    ("decoder/layers/moe_block/wi_0", (8, 32, 128), "auto", ("experts", "in", "out"), "column"),
    ("decoder/layers/moe_block/gate/kernel", (32, 8), "auto", ("in", "out"), "other"),
    ("attn/q_proj/kernel", (32, 4, 8), "auto", ("layers", "in", "out"), "column"),  # no head count: a stack
    ("enc/wi/w", (32, 64), "auto", ("in", "out"), "column"),  # Haiku's w is (in, out)
]


@pytest.mark.parametrize("path,shape,convention,dims,role", TABLE)
def test_layouts_of_each_convention(path: str, shape, convention: str, dims, role: str) -> None:
    lay = leaf_layout(path, shape, convention=convention)
    assert (lay.dims, lay.role) == (dims, role)


def test_head_counts_settle_a_rank_3_attention_kernel_and_overrides_win() -> None:
    assert leaf_layout("attn/q_proj/kernel", (32, 4, 8), num_heads=4).dims == ("in", "heads", "head_dim")
    assert leaf_layout("attn/query/kernel", (3, 32, 32), num_heads=4).dims == ("layers", "in", "out")
    assert leaf_layout("x/y", (2, 3), dims=("vocab", "embed")).dims == ("vocab", "embed")
    rule = AxisKindRule(dims=(("odd/proj", ("out", "in")),))
    assert rule.layout("params/odd/proj/kernel/value", (8, 4)).dims == ("out", "in")
    with pytest.raises(ShardingRuleError, match="dims="):
        leaf_layout("x/y", (2, 3), dims=("vocab",))
    with pytest.raises(ShardingRuleError, match="unknown kinds"):
        AxisKindRule(dims=(("x", ("rows",)),))
    with pytest.raises(ShardingRuleError, match="convention="):
        AxisKindRule(convention="jax")


sizes = st.fixed_dictionaries({"fsdp": st.sampled_from([1, 2, 3, 4]), "tp": st.sampled_from([1, 2, 4, 8]),
                               "ep": st.sampled_from([1, 2, 4])})


@given(paths, st.lists(st.sampled_from([1, 3, 4, 8, 12, 64]), min_size=1, max_size=4).map(tuple), sizes)
def test_a_reason_never_says_no_axis_was_left_while_one_idles(path: str, shape, mesh) -> None:
    decision = AxisKindRule(min_shard_size=0).decide(path, shape, mesh)
    used = {a for e in decision.spec if e is not None for a in (e if isinstance(e, tuple) else (e,))}
    if "no axis of size > 1" in decision.reason:
        assert all(v == 1 for v in mesh.values()), decision
    for axis in ("fsdp", "tp"):
        if mesh[axis] > 1 and axis not in used:
            assert re.search(rf"\b{axis}\b", decision.reason), decision


def test_fsdp_takes_a_layer_stack_only_when_no_other_dim_divides() -> None:
    from jax.sharding import PartitionSpec as P

    rule = AxisKindRule(min_shard_size=0)
    assert rule.decide("layers/q_proj/kernel", (64, 8, 16), {"fsdp": 8}).spec == P(None, None, "fsdp")
    assert rule.decide("layers/q_proj/kernel", (64, 3, 5), {"fsdp": 8}).spec == P("fsdp")
