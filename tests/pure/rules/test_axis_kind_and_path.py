"""Tests for the search's rules (meshplan.pure.rules._axis_kind): AxisKindRule, PathRule, their JSON form."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import AxisKindRule, LeafContext, PathRule, get_preset, plan_tree, tree_facts
from meshplan.pure.rules import path_rule_from_json, path_template
from meshplan.pure.specs import spec_axes
from meshplan.pure.rules._path import spec_from_json, spec_to_json
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError

from tests.pure.rules.common import assert_storable, shapes

TEMPLATES = [
    "model/layers/*/self_attn/q_proj/weight", "model/layers/*/self_attn/k_proj/weight",
    "model/layers/*/self_attn/o_proj/weight", "model/layers/*/mlp/down_proj/weight",
    "model/layers/*/mlp/gate_proj/weight", "model/embed_tokens/weight", "lm_head/weight",
    "transformer/h/*/attn/c_attn/weight", "transformer/h/*/attn/c_attn/bias", "transformer/h/*/mlp/c_proj/weight",
    "transformer/h/*/mlp/c_proj/bias", "model/layers/*/block_sparse_moe/experts/w1/weight",
    "model/layers/*/block_sparse_moe/experts/w2/weight", "model/layers/*/block_sparse_moe/experts/*/w1/weight",
    "model/layers/*/mlp/gate/weight", "model/norm/weight", "some/unknown/thing",
]
F32 = np.dtype("float32")


def _ctx(path: str, shape: tuple[int, ...], sizes: dict[str, int]) -> LeafContext:
    tree: dict = {}
    node = tree
    parts = path.split("/")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = np.zeros(shape, np.float32)
    return LeafContext(shape, F32, sizes, 0, tree_facts(tree))


def _decide(path: str, shape: tuple[int, ...], sizes: dict[str, int], **options) -> P:
    return AxisKindRule(**options)(_ctx(path, shape, sizes)).spec


sizes_st = st.fixed_dictionaries({a: st.sampled_from([1, 2, 3, 4, 8]) for a in ("dp", "fsdp", "ep", "sp", "tp")})


@given(st.sampled_from(TEMPLATES), shapes(max_rank=3), sizes_st, st.sampled_from([None, 4, 6, 8]))
def test_every_axis_kind_spec_can_store_its_leaf(template: str, shape, sizes, heads) -> None:
    spec = AxisKindRule(num_heads=heads, min_shard_size=0).decide(template, shape, sizes).spec
    assert_storable(shape, spec, sizes)
    used = spec_axes(spec)
    assert set(used) <= {"fsdp", "tp", "ep"} and all(sizes[a] > 1 for a in used)


@given(st.sampled_from(TEMPLATES), shapes(max_rank=3), sizes_st, sizes_st)
def test_axis_kind_answers_ignore_the_sizes_of_axes_it_does_not_read(template: str, shape, a, b) -> None:
    rule = AxisKindRule(min_shard_size=0)
    for axis in rule.reads_axes:
        b[axis] = a[axis]
    assert rule.decide(template, shape, a) == rule.decide(template, shape, b)


def test_column_and_row_parallel_projections_split_output_and_input_features() -> None:
    sizes = {"tp": 4}
    assert _decide("model/layers/0/self_attn/q_proj/weight", (4096, 1024), sizes) == P("tp")
    assert _decide("model/layers/0/self_attn/o_proj/weight", (1024, 4096), sizes) == P(None, "tp")
    assert _decide("model/layers/0/mlp/down_proj/weight", (1024, 4096), sizes) == P(None, "tp")
    # GPT-2's Conv1D stores (in, out): the split dims swap; the column bias splits, the row bias does not.
    assert _decide("transformer/h/0/attn/c_attn/weight", (768, 2304), sizes) == P(None, "tp")
    assert _decide("transformer/h/0/attn/c_attn/bias", (2304,), sizes) == P("tp")
    assert _decide("transformer/h/0/mlp/c_proj/weight", (3072, 768), sizes) == P("tp")
    assert _decide("transformer/h/0/mlp/c_proj/bias", (768,), sizes) == P()
    assert _decide("model/embed_tokens/weight", (32000, 4096), sizes) == P("tp")
    assert _decide("model/norm/weight", (4096,), sizes) == P()


def test_stacked_experts_split_over_ep_and_tp_and_per_expert_leaves_cannot() -> None:
    sizes = {"ep": 8, "tp": 2, "fsdp": 4}
    assert _decide("model/layers/0/block_sparse_moe/experts/w1/weight", (8, 14336, 4096), sizes,
                   num_experts=8) == P("ep", "tp", "fsdp")
    assert _decide("model/layers/0/block_sparse_moe/experts/w2/weight", (8, 4096, 14336), sizes,
                   num_experts=8) == P("ep", "fsdp", "tp")
    rule = AxisKindRule(num_experts=8)
    decision = rule(_ctx("model/layers/0/block_sparse_moe/experts/3/w1/weight", (14336, 4096), sizes))
    assert "ep cannot split it" in decision.reason and "ep" not in spec_axes(decision.spec)


def test_tp_respects_the_head_counts() -> None:
    sizes = {"tp": 16}
    assert _decide("model/layers/0/self_attn/k_proj/weight", (1024, 8192), sizes,
                   num_heads=64, num_kv_heads=8) == P()
    assert _decide("model/layers/0/self_attn/q_proj/weight", (8192, 8192), sizes,
                   num_heads=64, num_kv_heads=8) == P("tp")
    assert _decide("model/layers/0/self_attn/q_proj/weight", (768, 768), {"tp": 8}, num_heads=12) == P()


def test_fsdp_takes_the_largest_free_dim_or_joins_a_split_one() -> None:
    assert _decide("model/layers/0/mlp/gate_proj/weight", (14336, 4096), {"fsdp": 8}) == P("fsdp")
    assert _decide("model/layers/0/self_attn/q_proj/weight", (64, 6), {"tp": 2, "fsdp": 4},
                   min_shard_size=0) == P(("tp", "fsdp"))
    assert _decide("x/y", (7, 5), {"fsdp": 4}, min_shard_size=0) == P()
    assert _decide("model/norm/weight", (512,), {"fsdp": 4}) == P()  # below min_shard_size


def test_axis_kind_rule_plans_a_preset_like_the_search_groups_promise() -> None:
    preset = get_preset("mixtral-8x7b")
    rule = AxisKindRule.for_model(preset.spec)
    plan = plan_tree(preset.params, rule, {"dp": 2, "fsdp": 4, "ep": 8, "tp": 2})
    by_key: dict = {}
    for i, (path, decision) in enumerate(plan.items()):
        key = rule.group_key(LeafContext(plan.infos[i].shape, plan.infos[i].dtype, {}, i, plan.facts))
        assert by_key.setdefault(key, decision.spec) == decision.spec, path


def test_bad_axis_kind_options_are_refused() -> None:
    with pytest.raises(ShardingRuleError, match="num_heads=0"):
        AxisKindRule(num_heads=0)
    with pytest.raises(ShardingRuleError, match="must differ"):
        AxisKindRule(tp_axis="fsdp")
    with pytest.raises(MeshplanTypeError):
        AxisKindRule(num_experts=2.5)  # type: ignore[arg-type]


def test_path_template_stars_indices_only() -> None:
    assert path_template("model/layers/12/mlp/experts/3/w1/weight") == "model/layers/*/mlp/experts/*/w1/weight"
    assert path_template("h2/x1") == "h2/x1"


@given(st.lists(st.text(alphabet="0123a/\n", max_size=4), max_size=6))
def test_path_template_replaces_exactly_the_all_digit_components(parts: list[str]) -> None:
    # The component-wise definition (a component matching ^[0-9]+$ becomes "*"), against the
    # one-regex implementation the search uses for speed.
    import re

    path = "/".join(parts)
    expected = "/".join("*" if re.match(r"^[0-9]+$", c) else c for c in path.split("/"))
    assert path_template(path) == expected


def test_path_rule_first_match_wins_and_the_rest_falls_back() -> None:
    rule = PathRule([("q_proj", P("tp")), ("proj", P(None, "tp"))], fallback=AxisKindRule())
    sizes = {"tp": 2, "fsdp": 2}
    assert rule(_ctx("a/q_proj/weight", (8, 8), sizes)).spec == P("tp")
    assert rule(_ctx("a/k_proj/weight", (8, 8), sizes)).spec == P(None, "tp")
    assert rule(_ctx("a/norm/weight", (2048,), sizes)).rule == "axis-kind"
    assert PathRule([("x", P())])(_ctx("a/y", (4,), sizes)) is None
    with pytest.raises(ShardingRuleError, match="not divisible|does not fit"):
        rule(_ctx("a/q_proj/weight", (7, 8), sizes))
    assert rule.reads_axes == ("tp", "fsdp", "ep")


def test_path_rule_json_format_and_its_errors() -> None:
    rule = path_rule_from_json([["embed", ["tp", None]], ["norm", []], ["w", [["fsdp", "tp"]]]])
    assert [spec for _, spec in rule.rules] == [P("tp", None), P(), P(("fsdp", "tp"))]
    assert path_rule_from_json({"rules": [["a", "tp"]]}).rules == (("a", P("tp")),)
    with pytest.raises(ShardingRuleError, match="not a valid regex"):
        path_rule_from_json([["(", []]])
    with pytest.raises(ShardingRuleError, match=r"rules\[0\]"):
        path_rule_from_json([["a"]])
    with pytest.raises(MeshplanTypeError, match="exactly one key"):
        path_rule_from_json({"rule": []})
    with pytest.raises(MeshplanTypeError, match="must be null"):
        path_rule_from_json([["a", [3]]])


entries = st.one_of(st.none(), st.sampled_from(["dp", "tp"]), st.lists(st.sampled_from(["fsdp", "ep"]), min_size=1,
                                                                         max_size=2, unique=True).map(tuple))


@given(st.lists(entries, max_size=4))
def test_specs_survive_a_json_round_trip(raw) -> None:
    spec = P(*raw)
    assert spec_from_json(spec_to_json(spec)) == spec
