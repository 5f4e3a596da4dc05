"""Tests for plans (meshplan.pure.rules._engine): planning a whole tree, with reasons."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import (
    AutoRule,
    CompositeRule,
    Decision,
    LeafContext,
    MemoryRule,
    Plan,
    ShapePatternRule,
    SuggestRule,
    plan_from_specs,
    plan_tree,
    validate_specs,
)
from meshplan.pure._check import canonical_axis_sizes
from meshplan.pure.rules import PlanRule
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError, PlanError, ShardingRuleError
from tests.pure.rules.common import axis_sizes, sds, shapes


@dataclasses.dataclass
class Counting:
    """A shape-only rule wrapper that counts how often it is asked."""

    inner: Any
    shape_only: bool = True
    calls: list = dataclasses.field(default_factory=list)
    name: str = "counting"

    def __call__(self, ctx):
        self.calls.append(ctx.shape)
        return self.inner(ctx)


@dataclasses.dataclass(frozen=True)
class PerLeaf:
    """The same rule, declared not shape-only, so the planner asks it per leaf."""

    inner: Any
    shape_only = False
    name = "per-leaf"

    def __call__(self, ctx):
        return self.inner(ctx)


class Box:
    """A flax-Partitioned-like box the tree does not know how to flatten."""

    def __init__(self, value):
        self.value = value


class Pair(NamedTuple):
    a: Any
    b: Any


trees = st.recursive(
    shapes().map(sds),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(["w", "b", "k", "q"]), children, max_size=3),
        st.tuples(children, children).map(lambda t: Pair(*t)),
    ),
    max_leaves=12,
)
rules = st.sampled_from(
    [AutoRule(min_shard_size=0), AutoRule(reverse=True, min_shard_size=16), SuggestRule(min_shard_size=0),
     MemoryRule(10**9), CompositeRule((ShapePatternRule({(None, 8): P(None, None)}), AutoRule(min_shard_size=0)))]
)


# --- properties -----------------------------------------------------------------------------------


@given(tree=trees, rule=rules, sizes=axis_sizes())
def test_asking_once_per_shape_gives_the_same_plan_as_asking_every_leaf(tree, rule, sizes):
    cached = plan_tree(tree, rule, sizes)
    per_leaf = plan_tree(tree, PerLeaf(rule), sizes)
    assert cached.specs == per_leaf.specs
    assert cached.leaf_decisions == per_leaf.leaf_decisions


@given(tree=trees, rule=rules, sizes=axis_sizes())
def test_every_planned_spec_validates_and_mirrors_the_tree(tree, rule, sizes):
    plan = plan_tree(tree, rule, sizes)
    assert jax.tree_util.tree_structure(plan.specs, is_leaf=lambda x: isinstance(x, P)) == \
        jax.tree_util.tree_structure(tree)
    assert validate_specs(tree, plan.specs, sizes) == []
    paths = [p for p, _ in plan.items()]
    assert len(paths) == len(jax.tree_util.tree_leaves(tree))
    for path, decision in plan.items():
        assert plan.explain(path).startswith(f"{path}: ")
        assert decision is None or decision.spec == plan.leaf_specs[paths.index(path)]


@given(tree=trees, sizes=axis_sizes())
def test_a_shape_only_rule_is_asked_once_per_distinct_shape_and_dtype(tree, sizes):
    rule = Counting(AutoRule(min_shard_size=0))
    plan_tree(tree, rule, sizes)
    distinct = {leaf.shape for leaf in jax.tree_util.tree_leaves(tree)}
    assert sorted(rule.calls) == sorted(distinct)


# --- leaves of every kind -------------------------------------------------------------------------


def test_none_stays_none_non_arrays_stay_as_they_are_and_scalars_replicate():
    tree = {"w": sds((64, 64)), "n": None, "s": "name", "k": 3, "f": 0.5, "box": Box(np.zeros((64, 64)))}
    plan = plan_tree(tree, AutoRule(min_shard_size=0), {"tp": 4})
    assert plan.specs == {"w": P("tp"), "n": None, "s": "name", "k": P(), "f": P(), "box": P("tp")}
    decisions = plan.decisions
    assert decisions["n"] is None and decisions["s"] is None
    assert decisions["box"].rule == "auto"
    assert plan.explain("s") == "s: not an array leaf; kept as is"
    assert [p for p, _ in plan.items()] == ["box", "f", "k", "w"]


def test_numpy_and_jax_arrays_and_shape_dtype_structs_plan_alike():
    tree = [np.zeros((8, 8), np.float32), jax.numpy.zeros((8, 8)), sds((8, 8))]
    plan = plan_tree(tree, Counting(AutoRule(min_shard_size=0)), {"tp": 4})
    assert plan.specs == [P("tp")] * 3


def test_an_empty_tree_gives_an_empty_plan():
    plan = plan_tree({}, AutoRule(), {"tp": 4})
    assert plan.specs == {} and len(plan) == 0 and plan.counts() == {}


# --- explanations ---------------------------------------------------------------------------------


def test_explain_counts_and_repr_say_what_happened():
    tree = {"emb": sds((32000, 4096)), "norm": sds((4096,)), "tiny": sds((4,))}
    rule = CompositeRule((ShapePatternRule({(None, 4096): P("tp")}), AutoRule()))
    plan = plan_tree(tree, rule, {"dp": 2, "tp": 4})
    assert plan.explain("emb") == (
        "emb: (32000, 4096) float32 -> P('tp',) [shape] shape won (rule 1 of 2): matched shape pattern #0 (None, 4096)"
    )
    assert plan.explain("norm").endswith("dim 0 (4096) <- 'dp'(2)")
    assert plan.explain("tiny").endswith("auto: 4 elements < min_shard_size=1024; replicated)")
    assert plan.counts() == {"auto": 1, "composite": 1, "shape": 1}
    assert repr(plan) == "Plan(rule='composite', leaves=3, arrays=3, axis_sizes={'dp': 2, 'tp': 4})"
    with pytest.raises(PlanError, match="no leaf has path 'nope'"):
        plan.explain("nope")


def test_no_opinion_leaves_have_no_decision_and_replicate():
    plan = plan_tree({"a": sds((8,))}, lambda ctx: None, {"tp": 4})
    assert plan.specs == {"a": P()} and plan.leaf_decisions == (None,)
    assert plan.explain("a") == "a: (8,) float32 -> P() [<lambda>] no opinion; replicated"
    assert plan.counts() == {"none": 1}


# --- path rules (the protocol's other half) -------------------------------------------------------


def test_a_path_rule_sees_each_leaf_path_and_composes_with_shape_rules():
    def attention_rule(ctx: LeafContext):
        if re.search(r"attn/w[qkv]$", ctx.path):
            return Decision(P(None, "tp"), "attention projection: split heads", "attn-path")
        return None

    tree = {"layers": [{"attn": {"wq": sds((64, 64)), "wo": sds((64, 64))}}]}
    plan = plan_tree(tree, CompositeRule((attention_rule, AutoRule(min_shard_size=0))), {"tp": 4, "dp": 2})
    assert plan.specs["layers"][0]["attn"] == {"wq": P(None, "tp"), "wo": P("tp", "dp")}
    assert dict(plan.items())["layers/0/attn/wq"].rule == "attn-path"


def test_errors_from_a_per_leaf_rule_list_every_leaf_once():
    def refuse(ctx):
        raise ShardingRuleError(f"{ctx.path}: refused")

    with pytest.raises(ShardingRuleError) as err:
        plan_tree({"a": sds((2,)), "b": sds((2,))}, refuse, {"tp": 2})
    assert "could not plan 2 leaves" in str(err.value)
    assert "a: refused" in str(err.value) and "b: refused" in str(err.value)


def test_a_single_failure_is_raised_as_is():
    with pytest.raises(ShardingRuleError, match=r"^a: refused$"):
        plan_tree({"a": sds((2,))}, PerLeaf(lambda ctx: (_ for _ in ()).throw(ShardingRuleError("a: refused"))),
                  {"tp": 2})


def test_bad_rules_are_type_errors():
    with pytest.raises(MeshplanTypeError, match="not callable"):
        plan_tree({"a": sds((2,))}, "auto", {"tp": 2})
    with pytest.raises(MeshplanTypeError, match=r"a: rule '<lambda>' returned P\('tp',\)"):
        plan_tree({"a": sds((2,))}, lambda ctx: P("tp"), {"tp": 2})


# --- plans from given specs -----------------------------------------------------------------------


def test_plan_from_specs_records_the_given_specs_and_replays_inside_a_composite():
    tree = {"w": np.zeros((8, 8)), "b": np.zeros(8), "n": None}
    given_plan = plan_from_specs(tree, {"w": P("dp"), "b": None, "n": None}, rule="Custom", reason="from apply()")
    assert given_plan.specs == {"w": P("dp"), "b": P(), "n": None}
    assert given_plan.explain("w") == "w: (8, 8) float64 -> P('dp',) [Custom] from apply()"
    plan = plan_tree(tree, CompositeRule((PlanRule(given_plan), AutoRule(min_shard_size=0))), {"tp": 4, "dp": 2})
    assert plan.specs == {"w": P("dp"), "b": P("tp"), "n": None}
    assert isinstance(plan, Plan)


def test_plan_from_specs_refuses_mismatched_trees_and_non_specs():
    with pytest.raises(ShardingRuleError, match="structure does not match"):
        plan_from_specs({"w": np.zeros(2)}, {"v": P()})
    with pytest.raises(MeshplanTypeError, match="w: rule 'given' gave 'dp', not a PartitionSpec"):
        plan_from_specs({"w": np.zeros(2)}, {"w": "dp"})


def test_a_replayed_plan_refuses_a_different_tree():
    replay = PlanRule(plan_from_specs({"w": np.zeros(2)}, {"w": P()}))
    with pytest.raises(ShardingRuleError, match="different tree"):
        plan_tree([np.zeros(2), np.zeros(2)], replay, {"tp": 2})


# --- contexts and axis sizes ----------------------------------------------------------------------


def test_axis_sizes_are_checked_once_and_then_read_only():
    sizes = canonical_axis_sizes({"dp": 2, "tp": np.int64(4)})
    assert sizes == {"dp": 2, "tp": 4} and type(sizes["tp"]) is int
    assert canonical_axis_sizes(sizes) is sizes
    with pytest.raises(MeshplanTypeError, match="read-only"):
        sizes["dp"] = 8
    with pytest.raises(MeshplanTypeError, match="read-only"):
        sizes.update(dp=8)
    assert plan_tree({"a": sds((8,))}, AutoRule(), {"dp": 2}).axis_sizes == {"dp": 2}


@pytest.mark.parametrize("bad", [{"dp": 0}, {"dp": True}, {1: 2}, [("dp", 2)]])
def test_bad_axis_sizes_are_refused(bad):
    with pytest.raises((MeshplanTypeError, MeshShapeError)):
        canonical_axis_sizes(bad)


def test_a_context_outside_a_tree_has_no_path_and_a_frozen_copy_of_the_sizes():
    raw = {"tp": 4}
    ctx = LeafContext([8, 8], np.dtype("float32"), raw)
    assert ctx.shape == (8, 8) and ctx.keypath == () and ctx.path == "<leaf>" and ctx.num_elements == 64
    raw["tp"] = 2
    assert ctx.axis_sizes == {"tp": 4}
