"""Tests for the pure shape-pattern rule (meshplan.pure.rules._shape)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import LeafContext, ShapePatternRule, plan_tree
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from tests.pure.rules.common import DIMS, assert_storable, axis_sizes, sds, shapes


def _shape_pattern_decision(shape, dtype, sizes, *, shape_patterns):
    """The shape-pattern rule's decision for one leaf outside a tree (through ShapePatternRule)."""
    return ShapePatternRule(shape_patterns)(LeafContext(shape, dtype, sizes))


def _matches(pattern, shape):
    return len(pattern) == len(shape) and all(p is None or p == d for p, d in zip(pattern, shape))


@st.composite
def pattern_cases(draw):
    """A shape, a mesh, and patterns some of which match the shape (with wildcards)."""
    shape = draw(shapes(max_rank=3))
    sizes = draw(axis_sizes())
    patterns = {}
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            pattern = tuple(None if draw(st.booleans()) else d for d in shape)
        else:
            pattern = tuple(draw(st.sampled_from([None, *DIMS])) for _ in range(draw(st.integers(0, 3))))
        axes = draw(st.permutations(list(sizes)))
        entries = [draw(st.sampled_from([None, axes[i]])) if i < len(axes) else None for i in range(len(pattern))]
        patterns.setdefault(pattern, P(*entries))
    return shape, sizes, patterns


@given(case=pattern_cases())
def test_first_matching_pattern_in_insertion_order_wins_or_the_error_names_it(case):
    shape, sizes, patterns = case
    matching = [k for k, pattern in enumerate(patterns) if _matches(pattern, shape)]
    try:
        decision = _shape_pattern_decision(shape, np.float32, sizes, shape_patterns=patterns)
    except ShardingRuleError as err:
        assert matching, "only a matched pattern may raise"
        first = list(patterns)[matching[0]]
        assert f"pattern #{matching[0]} {first}" in str(err)
        return
    if not matching:
        assert decision is None
        return
    k = matching[0]
    pattern = list(patterns)[k]
    assert decision.spec == patterns[pattern]
    assert decision.reason == f"matched shape pattern #{k} {pattern}"
    assert_storable(shape, decision.spec, sizes)


@given(case=pattern_cases())
def test_reversing_the_pattern_order_changes_only_which_match_wins(case):
    shape, sizes, patterns = case
    backwards = dict(reversed(list(patterns.items())))
    matching = [p for p in backwards if _matches(p, shape)]
    try:
        decision = _shape_pattern_decision(shape, np.float32, sizes, shape_patterns=backwards)
    except ShardingRuleError:
        return
    assert (decision is None) == (not matching)
    if matching:
        assert decision.spec == backwards[matching[0]]


# --- examples -------------------------------------------------------------------------------------


def test_wildcards_match_any_size_but_rank_must_be_equal():
    rule = {(None, 1024): P("tp", None)}
    assert _shape_pattern_decision((32000, 1024), "f4", {"tp": 4}, shape_patterns=rule).spec == P("tp", None)
    assert _shape_pattern_decision((2, 32000, 1024), "f4", {"tp": 4}, shape_patterns=rule) is None
    assert _shape_pattern_decision((1024,), "f4", {"tp": 4}, shape_patterns=rule) is None


def test_a_sequence_of_pairs_works_like_a_dict():
    pairs = [((None, 8), P(None, "tp")), ((None, None), P("tp"))]
    assert _shape_pattern_decision((12, 8), "f4", {"tp": 4}, shape_patterns=pairs).spec == P(None, "tp")


def test_unmatched_leaves_get_no_opinion_and_replicate_in_a_plan():
    plan = plan_tree({"a": sds((8, 8)), "b": sds((3,))}, ShapePatternRule({(8, 8): P("tp")}), {"tp": 4})
    assert plan.specs == {"a": P("tp"), "b": P()}
    assert dict(plan.items())["b"] is None
    assert plan.counts() == {"none": 1, "shape": 1}


def test_misfit_in_a_plan_names_the_pattern_and_the_leaf_path():
    tree = {"layers": [{"w": sds((6, 1024))}], "emb": sds((8, 1024))}
    with pytest.raises(ShardingRuleError) as err:
        plan_tree(tree, ShapePatternRule({(None, 1024): P("tp", None)}), {"tp": 4})
    msg = str(err.value)
    assert msg.startswith("layers/0/w: shape (6, 1024) matches shape pattern #0 (None, 1024)")
    assert "dim 0 (size 6) is not divisible by its split 4" in msg


def test_unknown_axis_in_a_matched_pattern_is_an_error_not_a_pass_through():
    with pytest.raises(ShardingRuleError, match=r"\['mp'\], not axes of the mesh"):
        _shape_pattern_decision((8, 8), "f4", {"tp": 4}, shape_patterns={(8, 8): P("mp")})


def test_several_misfits_are_reported_once_together():
    tree = {"a": sds((6, 4)), "b": sds((6, 4)), "c": sds((10, 4))}
    with pytest.raises(ShardingRuleError, match="could not plan 3 leaves") as err:
        plan_tree(tree, ShapePatternRule({(None, 4): P("tp")}), {"tp": 4})
    assert "and 1 more leaves with this shape" in str(err.value) and "c: shape (10, 4)" in str(err.value)


# --- construction errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "patterns, error, fragment",
    [
        ({(None, 4): P("a", None, None)}, ShardingRuleError, "3 entries but the array has rank 2"),
        ({(None, 4): P("a", "a")}, ShardingRuleError, "more than once"),
        ({(None, 4): P(("a", "b"), "a")}, ShardingRuleError, "more than once"),
        ({(None, 4): P(P.UNCONSTRAINED)}, ShardingRuleError, "UNCONSTRAINED"),
        ({(None, 4): "a"}, MeshplanTypeError, "expected a PartitionSpec"),
        ({(None, -4): P()}, ShardingRuleError, "negative"),
        ({(None, 4.0): P()}, MeshplanTypeError, "float"),
        ({"ab": P()}, MeshplanTypeError, "tuple of dim sizes"),
        ("nope", MeshplanTypeError, "dict"),
        ([(None, 4)], MeshplanTypeError, "pairs"),
    ],
)
def test_bad_patterns_are_refused_when_the_rule_is_built(patterns, error, fragment):
    with pytest.raises(error, match=fragment):
        ShapePatternRule(patterns)


def test_an_int_pattern_means_a_rank_one_shape():
    assert ShapePatternRule({8: P("tp")}).patterns == (((8,), P("tp")),)


def test_shape_rule_is_shape_only():
    assert ShapePatternRule({}).shape_only
