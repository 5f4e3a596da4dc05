"""The search's fast paths change no answer: AxisKindRule.spec and the Planner's lazy plans.

The search prices the default rule's plans from specs alone and works out the
reasons and the full parameter traffic only for the plans it reads. These
properties hold both to the slow path: the rule's whole decision, and a plan
of an identical rule the planner does not know (a subclass), which it asks
for every decision as it does any user rule.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax.sharding import PartitionSpec as P

from meshplan.pure import AxisKindRule, get_preset, plan_tree, tree_facts
from meshplan.pure._check import canonical_axis_sizes
from meshplan.pure.errors import ShardingRuleError
from meshplan.pure.rules._axis_kind import path_template
from meshplan.pure.search._groups import LeafGroups, Planner, _embedding_roles, evaluate_plan
from meshplan.pure.specs._training import TrainingState
from tests.profiles import examples
from tests.pure.rules.common import shapes
from tests.pure.rules.test_axis_kind_and_path import TEMPLATES, _ctx


@dataclasses.dataclass(frozen=True, slots=True)
class _Eager(AxisKindRule):
    """The same rule under another class: the planner cannot take its spec-only path."""


sizes_st = st.fixed_dictionaries({a: st.sampled_from([1, 2, 3, 4, 8, 16]) for a in ("dp", "fsdp", "ep", "tp")})


@given(st.sampled_from(TEMPLATES), shapes(max_rank=3), sizes_st, st.sampled_from([None, 4, 6, 8]),
       st.sampled_from([None, 4, 8]), st.sampled_from([0, 64]))
def test_spec_is_the_decisions_spec(template, shape, sizes, heads, experts, min_size) -> None:
    rule = AxisKindRule(num_heads=heads, num_kv_heads=heads, num_experts=experts, min_shard_size=min_size)
    ctx = _ctx(template.replace("*", "0"), shape, sizes)
    assert rule.spec(ctx) == rule(ctx).spec
    assert rule.spec(ctx) == AxisKindRule(num_heads=heads, num_kv_heads=heads, num_experts=experts,
                                          min_shard_size=min_size)(ctx).spec  # asked first, before any memo


@given(st.sampled_from(TEMPLATES), shapes(max_rank=3), sizes_st, sizes_st, st.sampled_from([None, 4, 8]),
       st.sampled_from([0, 64]))
def test_spec_function_reads_only_the_axes_it_names(template, shape, a, b, experts, min_size) -> None:
    rule = AxisKindRule(num_heads=8, num_experts=experts, min_shard_size=min_size)
    ctx = _ctx(template.replace("*", "0"), shape, a)
    f, reads = rule.spec_function(ctx)
    assert set(reads) <= set(rule.reads_axes)
    for axis in reads:
        b[axis] = a[axis]
    assert f(a) == rule(ctx).spec
    assert f(b) == f(a)  # meshes that agree on the axes it reads give the leaf one spec


def test_spec_refuses_what_the_decision_refuses() -> None:
    rule = AxisKindRule(dims=(("q_proj", ("in", "out")),))  # rank 2 named for a rank-3 leaf
    ctx = _ctx("model/layers/0/self_attn/q_proj/weight", (4, 8, 16), {"tp": 2})
    with pytest.raises(ShardingRuleError) as slow:
        rule(ctx)
    with pytest.raises(ShardingRuleError) as fast:
        AxisKindRule(dims=rule.dims).spec(ctx)
    assert str(fast.value) == str(slow.value)


_STATE = TrainingState(grad_dtype=None, optimizer_dtype=np.dtype(np.float32), optimizer_copies=2)
# DeepSeek-V3: four classes of groups by the axes their specs read (fsdp+tp, fsdp, none, fsdp+tp+ep).
_TREES = {name: tree_facts(get_preset(name).params) for name in ("gpt2", "mixtral-8x7b", "deepseek-v3")}


_RULES = {name: AxisKindRule.for_model(get_preset(name).spec) for name in _TREES}
# One planner per tree for every example: its memos (spec and shard per group, per sizes of the axes
# the group reads) are reused across meshes, as in a search.
_PLANNERS = {name: Planner(LeafGroups.build(_TREES[name], _RULES[name]), _RULES[name], state=_STATE)
             for name in _TREES}


def test_spec_function_names_the_axes_of_each_leaf_kind() -> None:
    rule = AxisKindRule(num_experts=8)
    reads = {path: rule.spec_function(_ctx(path, shape, {}))[1] for path, shape in (
        ("model/layers/0/block_sparse_moe/experts/w1/weight", (8, 64, 32)),
        ("model/layers/0/block_sparse_moe/experts/3/w1/weight", (64, 32)),
        ("model/layers/0/mlp/down_proj/weight", (64, 32)), ("model/norm/weight", (4096,)),
        ("model/layers/0/input_layernorm/weight", (8,)))}
    assert list(reads.values()) == [("fsdp", "tp", "ep"), ("fsdp", "tp"), ("fsdp", "tp"), ("fsdp",), ()]


@settings(max_examples=examples(40))
@given(st.sampled_from(sorted(_TREES)), sizes_st)
def test_lazy_plans_equal_the_plans_that_ask_every_decision(name, sizes) -> None:
    planner = _PLANNERS[name]
    fast = planner(sizes)
    slow_rule = _Eager.for_model(get_preset(name).spec)
    slow = evaluate_plan(LeafGroups.build(_TREES[name], slow_rule), slow_rule, sizes, state=_STATE)
    assert slow.decisions and all(type(d).__name__ == "Decision" for d in slow.decisions)
    for field in ("specs", "param_bytes", "grad_bytes", "optimizer_bytes", "gather", "error", "axes_used",
                  "traffic"):
        assert getattr(fast, field) == getattr(slow, field), field
    assert fast.decisions == slow.decisions  # worked out when read, reasons included
    assert fast.traffic.gather == fast.gather
    assert planner(sizes).traffic == fast.traffic  # the planner's caches give the same plan again


def test_a_failing_plan_names_the_first_failing_group_in_group_order() -> None:
    # The planner adds memoized blocks of groups that read the same axes; when a block fails, the
    # error must still be the first failing group's in group order, as asking group by group gives.
    # The default rule never fails per mesh, so the groups' spec functions are given here: leaf d
    # (read with a and c: one block, evaluated first) fails on fsdp=2, leaf b (its own block) on tp=2.
    shape = (5,)
    tree = {k: {"w": jax.ShapeDtypeStruct(shape, np.float32)} for k in "abcd"}
    rule = AxisKindRule(min_shard_size=0)
    planner = Planner(LeafGroups.build(tree_facts(tree), rule), rule, state=_STATE)
    specs = {"a": P(), "b": P("tp"), "c": P(), "d": P("fsdp")}
    reads = {"a": ("fsdp",), "b": ("tp",), "c": ("fsdp",), "d": ("fsdp",)}
    planner._specs = tuple((lambda sizes, k=k: specs[k], reads[k]) for k in "abcd")
    for fsdp, tp, failing in ((1, 1, None), (2, 1, "d/w"), (1, 2, "b/w"), (2, 2, "b/w")):
        sizes = canonical_axis_sizes({"fsdp": fsdp, "tp": tp})
        plan, walked = planner(sizes), planner._by_group(sizes, tuple(sizes))
        assert plan.error == walked.error
        assert (plan.error or "").startswith(failing or "")
        assert (plan.error is None) == (failing is None)
        if failing is None:
            assert plan.specs == walked.specs == (P(), P("tp"), P(), P("fsdp"))
            assert (plan.param_bytes, plan.gather, plan.axes_used) == (walked.param_bytes, walked.gather,
                                                                      walked.axes_used)


@pytest.mark.parametrize("name", sorted(_TREES))
def test_the_default_rule_groups_leaves_as_its_group_key_says(name) -> None:
    # LeafGroups.build keys the default rule's leaves by (path template, shape, dtype) without asking
    # AxisKindRule.group_key per leaf; an identical rule under another class is asked: same groups.
    fast = LeafGroups.build(_TREES[name], _RULES[name])
    slow = LeafGroups.build(_TREES[name], _Eager.for_model(get_preset(name).spec))
    for field in ("first", "infos", "counts", "leaf_group", "display", "roles"):
        assert getattr(fast, field) == getattr(slow, field), field
    assert len(fast.first) < len(fast.leaf_group)  # leaves do share groups (layers, experts)


@pytest.mark.parametrize("rule", [AxisKindRule(), AxisKindRule(dims=(("layers/0/mlp/up_proj", ("out", "in")),))],
                         ids=["templated", "a dims pattern names layer 0"])
def test_leaves_whose_answer_reads_an_index_are_grouped_by_their_own_path(rule) -> None:
    # A dims pattern may name one layer: the search must not give layer 1 layer 0's decision. The fast keying
    # in LeafGroups.build and the rule's own group_key agree, and so do their plans.
    tree = {"layers": [{"mlp": {"up_proj": {"kernel": np.zeros((64, 256), np.float32)}}} for _ in range(2)]}
    facts = tree_facts(tree)
    fast, slow = LeafGroups.build(facts, rule), LeafGroups.build(facts, _Eager(**{
        f.name: getattr(rule, f.name) for f in dataclasses.fields(AxisKindRule) if f.init}))
    assert fast.leaf_group == slow.leaf_group
    assert tuple(fast.leaf_group) == ((0, 0) if not rule.dims else (0, 1))
    sizes = {"dp": 1, "fsdp": 2, "ep": 1, "tp": 4}
    per_group = evaluate_plan(fast, rule, sizes, state=_STATE).specs
    specs = tuple(per_group[g] for g in fast.leaf_group)
    walked = plan_tree(tree, rule, sizes).specs  # the engine asks the rule leaf by leaf where it must
    assert specs == tuple(jax.tree.leaves(walked, is_leaf=lambda x: isinstance(x, P)))
    assert specs == ((P("tp", "fsdp"), P("fsdp", "tp")) if rule.dims else (P("fsdp", "tp"),) * 2)


_COMPONENTS = st.sampled_from(["lm_head", "embed_tokens", "wte", "wpe", "attn", "self_attn", "mlp", "model", "0",
                               "12", "3\n", "x1", "attn0", "wpe2", "*", ""])


@given(st.lists(st.lists(_COMPONENTS, min_size=1, max_size=5).map("/".join), min_size=1, max_size=8),
       st.data())
def test_leaf_roles_read_off_templates_equal_roles_read_off_paths(paths, data) -> None:
    # LeafGroups.build matches the role names once per path template: a path and its template must
    # give every leaf, so every group, the same role (raw paths passed as templates: one match per leaf).
    leaf_group = data.draw(st.lists(st.integers(-1, 2), min_size=len(paths), max_size=len(paths)))
    groups = sorted({g for g in leaf_group if g >= 0})
    leaf_group = [groups.index(g) if g >= 0 else -1 for g in leaf_group]  # groups 0..n-1
    first = [leaf_group.index(g) for g in range(len(groups))]
    assert (_embedding_roles(leaf_group, first, [path_template(p) for p in paths])
            == _embedding_roles(leaf_group, first, paths))
