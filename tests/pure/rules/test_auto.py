"""Tests for the pure auto rule (meshplan.pure.rules._auto)."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import AutoRule, LeafContext, plan_tree
from meshplan.pure.rules import DEFAULT_MIN_SHARD_SIZE
from meshplan.pure.specs import canonical_entries
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from tests.hash_seed import outputs_under_two_hash_seeds
from tests.pure.rules.common import assert_storable, axis_sizes, sds, shapes


def _auto_decision(shape, dtype, sizes, **options):
    """The auto rule's decision for one leaf outside a tree (through AutoRule)."""
    return AutoRule(**options)(LeafContext(shape, dtype, sizes))


def _visit_order(shape, reverse):
    return sorted(range(len(shape)), key=lambda d: (shape[d] if reverse else -shape[d], d))


@st.composite
def auto_cases(draw):
    sizes = draw(axis_sizes())
    names = None
    if draw(st.booleans()):
        names = tuple(draw(st.permutations(list(sizes)))[: draw(st.integers(1, len(sizes)))])
    return draw(shapes()), sizes, names, draw(st.sampled_from([0, 1, 16, 1024])), draw(st.booleans())


# --- properties -----------------------------------------------------------------------------------


@given(case=auto_cases())
def test_auto_spec_is_storable_and_spends_only_allowed_axes_of_size_above_one(case):
    shape, sizes, names, min_size, reverse = case
    decision = _auto_decision(shape, np.float32, sizes, axis_names=names, min_shard_size=min_size, reverse=reverse)
    assert_storable(shape, decision.spec, sizes)
    entries = canonical_entries(decision.spec, len(shape))
    used = [a for e in entries for a in e]
    assert all(len(e) <= 1 for e in entries), "auto gives each dim at most one axis"
    assert len(used) == len(set(used))
    assert all(sizes[a] > 1 for a in used)
    assert set(used) <= set(names if names is not None else sizes)
    assert decision.rule == "auto" and decision.reason


@given(case=auto_cases())
def test_auto_is_the_greedy_largest_dim_first_assignment(case):
    """Characterises the result without re-running the algorithm.

    Visiting dims in priority order, a dim holds axis ``a`` only if every
    axis listed before ``a`` was already taken by an earlier dim or does
    not divide it; a dim left unsplit has no free axis dividing it.
    """
    shape, sizes, names, min_size, reverse = case
    spec = _auto_decision(shape, "float32", sizes, axis_names=names, min_shard_size=min_size, reverse=reverse).spec
    if math.prod(shape) < min_size:
        assert spec == P()
        return
    order = [a for a in (names if names is not None else sizes) if sizes[a] > 1]
    entries = canonical_entries(spec, len(shape))
    taken: set[str] = set()
    for d in _visit_order(shape, reverse):
        free = [a for a in order if a not in taken and shape[d] % sizes[a] == 0 and shape[d] >= sizes[a]]
        if entries[d]:
            assert free and entries[d] == (free[0],), (d, free, entries)
            taken.add(free[0])
        else:
            assert not free, f"dim {d} left unsplit although {free} divide it"


@given(case=auto_cases())
def test_auto_with_axis_names_ignores_mesh_order(case):
    shape, sizes, names, min_size, reverse = case
    names = names or tuple(sizes)
    shuffled = dict(reversed(list(sizes.items())))
    a = _auto_decision(shape, "float32", sizes, axis_names=names, min_shard_size=min_size, reverse=reverse)
    b = _auto_decision(shape, "float32", shuffled, axis_names=names, min_shard_size=min_size, reverse=reverse)
    assert a == b


@given(shape=shapes(), sizes=axis_sizes(), data=st.data())
def test_auto_plan_ignores_dict_insertion_order_of_the_tree(shape, sizes, data):
    keys = data.draw(st.permutations(["q", "k", "v", "o", "mlp"]))
    other = data.draw(st.permutations(keys))
    leaf_shapes = {k: data.draw(shapes()) for k in keys}
    tree_a = {k: sds(leaf_shapes[k]) for k in keys}
    tree_b = {k: sds(leaf_shapes[k]) for k in other}
    rule = AutoRule(min_shard_size=0)
    assert plan_tree(tree_a, rule, sizes).specs == plan_tree(tree_b, rule, sizes).specs


_SEED_SCRIPT = textwrap.dedent(
    """
    import numpy as np, jax
    from meshplan.pure import AutoRule, MemoryRule, CompositeRule, SuggestRule, plan_tree
    names = ["a%d" % i for i in range(12)]
    sizes = {n: 2 for n in names}
    tree = {n: jax.ShapeDtypeStruct((64, 32, 16, 8), np.float32) for n in names}
    rules = [AutoRule(min_shard_size=0), MemoryRule(4096), SuggestRule(min_shard_size=0),
             CompositeRule((MemoryRule(10**9), AutoRule(min_shard_size=0)))]
    for rule in rules:
        plan = plan_tree(tree, rule, sizes)
        print(plan.specs, [d.reason for _, d in plan.items()])
    """
)


def test_plans_are_identical_under_different_python_hash_seeds():
    outputs = outputs_under_two_hash_seeds(_SEED_SCRIPT)
    assert outputs[0] == outputs[1]
    assert "a0" in outputs[0]


# --- examples -------------------------------------------------------------------------------------


def test_auto_gives_the_largest_dim_the_first_axis_in_mesh_order():
    d = _auto_decision((1024, 4096), "float32", {"dp": 2, "tp": 4})
    assert d.spec == P("tp", "dp")
    assert d.reason == "largest dims first: dim 1 (4096) <- 'dp'(2), dim 0 (1024) <- 'tp'(4)"


def test_auto_reverse_visits_the_smallest_dim_first():
    assert _auto_decision((1024, 4096), "float32", {"dp": 2, "tp": 4}, reverse=True).spec == P("dp", "tp")


def test_auto_breaks_ties_by_dim_index():
    assert _auto_decision((512, 512), "float32", {"x": 2, "y": 4}).spec == P("x", "y")
    assert _auto_decision((512, 512), "float32", {"x": 2, "y": 4}, reverse=True).spec == P("x", "y")


def test_auto_skips_an_axis_that_does_not_divide_and_tries_the_next():
    assert _auto_decision((6, 4096), "float32", {"dp": 4, "tp": 3}).spec == P("tp", "dp")


def test_auto_never_spends_size_one_axes():
    d = _auto_decision((4096,), "float32", {"one": 1, "tp": 4})
    assert d.spec == P("tp")
    d = _auto_decision((4096,), "float32", {"one": 1})
    assert d.spec == P() and "no mesh axis of size > 1" in d.reason


def test_auto_default_min_shard_size_works_out_of_the_box():
    assert AutoRule().min_shard_size == DEFAULT_MIN_SHARD_SIZE == AutoRule(min_shard_size=None).min_shard_size
    d = _auto_decision((16, 16), "float32", {"dp": 2})
    assert d.spec == P() and d.reason == "256 elements < min_shard_size=1024; replicated"


def test_auto_replicates_scalars_with_a_reason():
    d = _auto_decision((), "float32", {"dp": 2}, min_shard_size=0)
    assert d.spec == P() and "scalar" in d.reason


def test_auto_rule_is_immutable_and_shape_only():
    rule = AutoRule(axis_names=["tp", "dp"])
    assert rule.axis_names == ("tp", "dp") and AutoRule.shape_only
    with pytest.raises(AttributeError):
        rule.reverse = True  # type: ignore[misc]


def test_auto_rule_answers_a_bare_context():
    ctx = LeafContext((6, 4096), np.dtype("float32"), {"dp": 2, "tp": 4})
    assert AutoRule()(ctx).spec == P(None, "dp")


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"axis_names": "dp"}, MeshplanTypeError, "string"),
        ({"axis_names": {"dp", "tp"}}, MeshplanTypeError, "ordered"),
        ({"axis_names": ["dp", "dp"]}, ShardingRuleError, "repeats"),
        ({"axis_names": ["dp", 3]}, MeshplanTypeError, "non-string"),
        ({"min_shard_size": -1}, ShardingRuleError, ">= 0"),
        ({"min_shard_size": 1.5}, MeshplanTypeError, "min_shard_size"),
        ({"reverse": "yes"}, MeshplanTypeError, "reverse"),
    ],
)
def test_auto_rule_rejects_bad_options(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        AutoRule(**kwargs)


def test_auto_names_axes_the_mesh_lacks():
    with pytest.raises(ShardingRuleError, match=r"\['mp'\].*mesh axes: \['dp', 'tp'\]"):
        _auto_decision((64,), "float32", {"dp": 2, "tp": 4}, axis_names=["dp", "mp"])


@pytest.mark.parametrize("sizes", [{"dp": 0}, {"dp": 2.0}, [("dp", 2)]])
def test_auto_rejects_bad_axis_sizes(sizes):
    with pytest.raises((MeshplanTypeError, ValueError)):
        _auto_decision((64,), "float32", sizes)
