"""Tests for the pure composite rule (meshplan.pure.rules._composite)."""

from __future__ import annotations

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
    ShapePatternRule,
    SuggestRule,
    plan_tree,
)
from meshplan.pure.rules import shards_something
from meshplan.pure.errors import MemoryBudgetError, MeshplanTypeError, ShardingRuleError
from tests.pure.rules.common import assert_storable, axis_sizes, sds, shapes


def _rules(sizes):
    """Rules that never raise on any leaf (so every composite answer is comparable)."""
    axes = list(sizes)
    return st.lists(
        st.one_of(
            st.builds(AutoRule, min_shard_size=st.sampled_from([0, 64, 1024]), reverse=st.booleans()),
            st.builds(MemoryRule, st.sampled_from([10**12])),
            st.just(ShapePatternRule({(None, None): P()})),
            st.just(SuggestRule(min_shard_size=0)),
            st.just(lambda ctx: None),
            st.just(ShapePatternRule({(None,): P(None)})),
            st.just(AutoRule(axis_names=axes[::-1], min_shard_size=0)),
        ),
        min_size=1,
        max_size=4,
    )


@given(shape=shapes(), sizes=axis_sizes(), data=st.data())
def test_composite_takes_the_first_answer_that_shards_something(shape, sizes, data):
    rules = data.draw(_rules(sizes))
    ctx = LeafContext(shape, np.dtype("float32"), sizes)
    answers = [rule(ctx) for rule in rules]
    got = CompositeRule(tuple(rules))(ctx)
    winners = [a for a in answers if a is not None and shards_something(a.spec)]
    if winners:
        assert got.spec == winners[0].spec and got.rule == winners[0].rule
        assert f"{winners[0].rule} won (rule {answers.index(winners[0]) + 1} of {len(rules)}" in got.reason
        assert_storable(shape, got.spec, sizes)
    elif all(a is None for a in answers):
        assert got is None
    else:
        assert got.spec == P() and got.rule == "composite"
        assert got.reason.startswith("no rule sharded it (")


def test_all_none_specs_count_as_nothing():
    first = ShapePatternRule({(None, None): P(None, None)})
    rule = CompositeRule((first, AutoRule(min_shard_size=0)))
    decision = rule(LeafContext((8, 8), np.dtype("float32"), {"tp": 4}))
    assert decision.spec == P("tp") and decision.rule == "auto"
    assert decision.reason.startswith("auto won (rule 2 of 2; shape: matched shape pattern #0 (None, None)):")


def test_errors_of_a_consulted_rule_propagate():
    rule = CompositeRule((ShapePatternRule({(None,): P("tp")}), AutoRule()))
    with pytest.raises(ShardingRuleError, match="pattern #0"):
        plan_tree({"x": sds((6,))}, rule, {"tp": 4})


def test_later_rules_are_not_consulted_once_one_shards():
    rule = CompositeRule((AutoRule(min_shard_size=0), MemoryRule(1)))
    plan = plan_tree({"x": sds((8, 8))}, rule, {"tp": 4})
    assert plan.specs == {"x": P("tp")}
    with pytest.raises(MemoryBudgetError):
        plan_tree({"x": sds((7, 7))}, rule, {"tp": 4})


def test_composite_is_shape_only_iff_every_rule_is():
    assert CompositeRule((AutoRule(), MemoryRule(10))).shape_only
    assert not CompositeRule((AutoRule(), lambda ctx: None)).shape_only


def test_composites_nest():
    inner = CompositeRule((ShapePatternRule({(3,): P()}), AutoRule(min_shard_size=0)))
    outer = CompositeRule((ShapePatternRule({(8,): P(None)}), inner))
    assert outer(LeafContext((8,), np.dtype("float32"), {"tp": 4})).spec == P("tp")


@pytest.mark.parametrize(
    "rules, error",
    [((), ShardingRuleError), ("auto", MeshplanTypeError), ((AutoRule(), 3), MeshplanTypeError)],
)
def test_bad_rule_lists_are_refused(rules, error):
    with pytest.raises(error):
        CompositeRule(rules)


def test_a_rule_returning_a_non_decision_is_a_type_error():
    rule = CompositeRule((lambda ctx: P("tp"),))
    with pytest.raises(MeshplanTypeError, match="returns a Decision or None"):
        rule(LeafContext((8,), np.dtype("float32"), {"tp": 4}))


def test_decision_checks_its_fields():
    with pytest.raises(MeshplanTypeError):
        Decision("tp", "why", "me")  # type: ignore[arg-type]
