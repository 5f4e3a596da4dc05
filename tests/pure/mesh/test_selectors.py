"""Tests for meshplan.pure.mesh._selectors: regex rules picking a mesh shape."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.mesh._axes import MeshShape
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.mesh._selectors import select_mesh_shape, validate_mesh_rules
from meshplan.pure.errors import MeshplanTypeError, MeshRuleError

DEFAULT = (1, -1)
patterns = st.sampled_from(["a", "b", "ab", "a.*", ".*b", "a+", "(a|b)*", "b?a", "[ab]{2}", ".*"])
shapes = st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple)
rules_st = st.lists(st.tuples(patterns, shapes), max_size=5)
selectors = st.text(alphabet="ab", max_size=4)


def oracle(rules, selector):
    """First rule whose pattern matches the whole selector, else DEFAULT."""
    for pattern, value in rules:
        if re.fullmatch(pattern, selector):
            return value
    return DEFAULT


@given(rules=rules_st, selector=selectors)
def test_first_full_match_wins_like_a_plain_fullmatch_loop(rules, selector):
    assert select_mesh_shape(rules, selector, DEFAULT) == oracle(rules, selector)


@given(rules=rules_st, selector=selectors, extra=st.text(alphabet="c", min_size=1, max_size=2))
def test_a_pattern_matching_only_a_prefix_does_not_select(rules, selector, extra):
    literal = [(re.escape(selector), (7, 7))] + rules
    assert select_mesh_shape(literal, selector, DEFAULT) == (7, 7)
    longer = selector + extra
    got = select_mesh_shape(literal, longer, DEFAULT)
    assert got == oracle(rules, longer)


@given(rules=rules_st, selector=selectors)
def test_no_selector_or_no_rules_gives_the_default(rules, selector):
    assert select_mesh_shape(rules, None, DEFAULT) is DEFAULT
    assert select_mesh_shape(None, selector, DEFAULT) is DEFAULT
    assert select_mesh_shape([], selector, DEFAULT) is DEFAULT


@given(rules=rules_st, selector=selectors, data=st.data())
def test_a_matching_none_rule_is_an_error_naming_index_pattern_and_selector(rules, selector, data):
    i = data.draw(st.integers(0, len(rules)))
    blocked = rules[:i] + [(re.escape(selector), None)] + rules[i:]
    first = next((j for j, (p, _) in enumerate(blocked) if re.fullmatch(p, selector)))
    if first != i:
        assert select_mesh_shape(blocked, selector, DEFAULT) == blocked[first][1]
        return
    with pytest.raises(MeshRuleError) as err:
        select_mesh_shape(blocked, selector, DEFAULT)
    message = str(err.value)
    assert f"mesh_rules[{i}]" in message and repr(selector) in message
    assert repr(re.escape(selector)) in message


@given(rules=rules_st)
def test_validate_is_idempotent_and_canonicalizes_lists(rules):
    as_lists = [[p, list(v)] for p, v in rules]
    once = validate_mesh_rules(as_lists)
    assert once == tuple((p, v) for p, v in rules)
    assert validate_mesh_rules(once) == once


# --- examples -------------------------------------------------------------------------------------


def test_loadax_style_rules_pick_by_device_type():
    rules = [
        ("tpu-v4-128", HybridMeshShape((1, 64), (2, 1))),
        ("gpu-p4de.24xlarge-32", HybridMeshShape((1, 8), (4, 1))),
        ("cpu-.*", None),
    ]
    assert select_mesh_shape(rules, "tpu-v4-128", DEFAULT) == HybridMeshShape((1, 64), (2, 1))
    assert select_mesh_shape(rules, "gpu-p4de.24xlarge-32", DEFAULT).dcn_mesh_shape == (4, 1)
    assert select_mesh_shape(rules, "tpu-v4-1280", DEFAULT) == DEFAULT
    with pytest.raises(MeshRuleError, match=r"mesh_rules\[2\] \('cpu-\.\*'\) selects no mesh"):
        select_mesh_shape(rules, "cpu-8", DEFAULT)


def test_named_mesh_shapes_are_allowed_as_rule_values():
    shape = MeshShape(("data", "model"), (2, 4))
    assert select_mesh_shape([("x", shape)], "x", DEFAULT) is shape


def test_malformed_rules_are_reported_even_when_an_earlier_rule_matches():
    with pytest.raises(MeshRuleError, match=r"mesh_rules\[1\]"):
        select_mesh_shape([("a", (1,)), ("(", (2,))], "a", DEFAULT)


# --- bad inputs -----------------------------------------------------------------------------------

BAD_CALLS = [
    (lambda: validate_mesh_rules([("a", (1,), 3)]), MeshRuleError, "mesh_rules[0]=('a', (1,), 3)"),
    (lambda: validate_mesh_rules(["a"]), MeshRuleError, "mesh_rules[0]='a'"),
    (lambda: validate_mesh_rules([("a", (1,)), 5]), MeshRuleError, "mesh_rules[1]=5"),
    (lambda: validate_mesh_rules([("(", (1,))]), MeshRuleError, "mesh_rules[0] pattern '('"),
    (lambda: validate_mesh_rules([(3, (1,))]), MeshRuleError, "mesh_rules[0] pattern 3"),
    (lambda: validate_mesh_rules([("a", "ab")]), MeshRuleError, "mesh_rules[0] mesh shape='ab'"),
    (lambda: validate_mesh_rules([("a", (1, 2.5))]), MeshRuleError, "2.5"),
    (lambda: validate_mesh_rules([("a", (0, 2))]), MeshRuleError, "(0, 2)"),
    (lambda: validate_mesh_rules([("a", (-1, -1))]), MeshRuleError, "(-1, -1)"),
    (lambda: validate_mesh_rules([("(", (1,)), ("b", 7)]), MeshRuleError, "mesh_rules[1]"),
    (lambda: validate_mesh_rules("a"), MeshplanTypeError, "mesh_rules='a'"),
    (lambda: validate_mesh_rules({("a", (1,))}), MeshplanTypeError, "set"),
    (lambda: select_mesh_shape([("a", (1,))], 5, DEFAULT), MeshplanTypeError, "mesh_selector=5"),
]


@pytest.mark.parametrize("call, exc, needle", BAD_CALLS)
def test_bad_inputs_raise_typed_errors_naming_the_value(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    assert needle in str(err.value)
