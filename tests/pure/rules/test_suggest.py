"""Tests for MeshPartitionHelper's pure suggestions (meshplan.pure.rules._suggest)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import LeafContext, SuggestRule, plan_tree
from meshplan.pure.rules import analyze_pytree, create_partition_spec, suggest_methods
from meshplan.pure.specs import canonical_entries
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from tests.pure.rules.common import assert_storable, axis_sizes, sds, shapes


def _suggest_decision(shape, methods, sizes, **options):
    """The suggest rule's decision for one leaf with given methods (through SuggestRule)."""
    return SuggestRule(methods=methods, **options)(LeafContext(shape, None, sizes))

REFERENCE_MESH = {"dp": 2, "fsdp": 4, "ep": 1, "tp": 2, "sp": 1}


@st.composite
def methods_for(draw, sizes):
    """Method lists over the mesh's axes: one or two distinct axes each."""
    names = list(sizes)
    one = st.sampled_from(names).map(lambda a: (a,))
    two = st.permutations(names).map(lambda p: tuple(p[:2])) if len(names) > 1 else one
    return draw(st.lists(st.one_of(one, two), max_size=4))


# --- properties -----------------------------------------------------------------------------------


@given(shape=shapes(), sizes=axis_sizes(max_axes=5), data=st.data())
def test_every_spec_from_any_methods_is_storable(shape, sizes, data):
    methods = data.draw(methods_for(sizes))
    min_size = data.draw(st.sampled_from([0, 16, 1024]))
    decision = _suggest_decision(shape, methods, sizes, min_shard_size=min_size)
    assert_storable(shape, decision.spec, sizes)
    used = {a for e in canonical_entries(decision.spec, len(shape)) for a in e}
    assert used <= {a for m in methods for a in m}
    if math.prod(shape) < min_size:
        assert decision.spec == P()


@given(shape=shapes(), sizes=axis_sizes(max_axes=5))
def test_suggested_methods_use_mesh_axes_once_and_their_spec_is_storable(shape, sizes):
    methods = suggest_methods(shape, sizes)
    axes = [a for m in methods for a in m]
    assert set(axes) <= set(sizes) and len(axes) == len(set(axes))
    assert_storable(shape, create_partition_spec(shape, methods, sizes, min_shard_size=0), sizes)


@given(shape=shapes(), sizes=axis_sizes(max_axes=5))
def test_suggest_rule_agrees_with_create_partition_spec(shape, sizes):
    plan = plan_tree({"x": sds(shape)}, SuggestRule(min_shard_size=16), sizes)
    assert plan.specs["x"] == create_partition_spec(shape, suggest_methods(shape, sizes), sizes, min_shard_size=16)


# --- the reference's preferences ------------------------------------------------------------------


def test_reference_mesh_prefers_fsdp_with_sp_for_matrices():
    assert suggest_methods((1024, 4096), REFERENCE_MESH) == [("fsdp", "sp"), ("dp",), ("tp",)]
    with_sp = dict(REFERENCE_MESH, sp=2)
    assert create_partition_spec((1024, 4096), suggest_methods((1024, 4096), with_sp), with_sp) == P("fsdp", "sp")


def test_size_one_axes_are_never_placed():
    # sp=1 reduces the pair to fsdp; the reference would place ('fsdp', 'sp')
    # and stop, leaving dp unused.
    d = _suggest_decision((1024, 4096), suggest_methods((1024, 4096), REFERENCE_MESH), REFERENCE_MESH)
    assert d.spec == P("fsdp", "dp")
    # On the reference's default mesh (dp=ep=tp=sp=1) a vector reaches fsdp
    # rather than being "sharded" over dp=1.
    default = {"dp": 1, "fsdp": 8, "ep": 1, "tp": 1, "sp": 1}
    assert create_partition_spec((4096,), suggest_methods((4096,), default), default) == P("fsdp")


@given(shape=shapes(), sizes=axis_sizes(max_axes=5), data=st.data())
def test_placed_axes_all_have_size_above_one(shape, sizes, data):
    spec = _suggest_decision(shape, data.draw(methods_for(sizes)), sizes, min_shard_size=0).spec
    assert all(sizes[a] > 1 for e in canonical_entries(spec, len(shape)) for a in e)


def test_vectors_get_dp_then_tp_then_fsdp():
    assert suggest_methods((4096,), REFERENCE_MESH) == [("dp",), ("tp",), ("fsdp",)]
    assert suggest_methods((4096,), {"sp": 2, "tp": 2}) == [("tp",)]
    assert suggest_methods((), {"dp": 2, "tp": 2}) == [("tp",)]


def test_single_axis_methods_fill_dims_in_order():
    # First pass: dims of >= max(1024, 2**20 // 16) = 65536 elements; none
    # qualify, so the second pass uses the 1024 threshold.
    d = _suggest_decision((1024, 1024), [("dp",), ("tp",)], {"dp": 2, "tp": 4})
    assert d.spec == P("dp", "tp") and d.reason.endswith("(second pass)")


# --- where the reference emits specs jax refuses ---------------------------------------------------


def test_pair_is_not_placed_on_a_dim_it_does_not_divide():
    sizes = {"fsdp": 4, "sp": 2}
    # The reference returns P('fsdp', 'sp') here though 6 % 4 != 0.
    spec = create_partition_spec((6, 4096), [("fsdp", "sp")], sizes)
    assert spec == P()
    assert_storable((6, 4096), spec, sizes)


def test_pair_falls_back_to_dim_zero_only_when_it_divides():
    spec = create_partition_spec((8, 3), [("fsdp", "sp")], {"fsdp": 4, "sp": 2}, min_shard_size=0)
    assert spec == P(("fsdp", "sp"))


def test_rank_one_pair_does_not_crash():
    # The reference indexes spec[1] of a rank-1 spec here (IndexError).
    assert create_partition_spec((4096,), [("fsdp", "sp")], {"fsdp": 4, "sp": 2}) == P(("fsdp", "sp"))


def test_an_axis_is_never_used_twice_even_if_methods_repeat_it():
    assert create_partition_spec((4096, 4096), [("tp",), ("tp",)], {"dp": 2, "tp": 4}) == P("tp")
    # 'tp' takes dim 0 in the first pass; the pair then finds dim 0 taken and 'tp' spent.
    assert create_partition_spec((4096, 2), [("tp",), ("dp", "tp")], {"dp": 2, "tp": 4}) == P("tp")


def test_small_arrays_stay_replicated_as_documented():
    d = _suggest_decision((8, 8), [("fsdp", "sp")], {"fsdp": 4, "sp": 2})
    assert d.spec == P() and d.reason == "64 elements < min_shard_size=1024; replicated"


def test_scalars_replicate():
    assert _suggest_decision((), [("tp",)], {"tp": 2}, min_shard_size=0).reason == "scalar; replicated"


# --- analyze_pytree and errors --------------------------------------------------------------------


def test_analyze_pytree_lists_each_distinct_shape_once_in_leaf_order():
    tree = {"b": np.zeros(8), "a": [np.zeros((4, 8)), np.zeros((4, 8))], "s": "x", "n": None}
    got = analyze_pytree(tree, {"dp": 2, "tp": 2})
    assert list(got) == [(4, 8), (8,)]
    assert got[(4, 8)] == [("dp",), ("tp",)]


@pytest.mark.parametrize(
    "methods, error, fragment",
    [
        ([("mp",)], ShardingRuleError, r"\['mp'\], not axes of the mesh"),
        ([("tp", "tp")], ShardingRuleError, "two different axes"),
        ([("a", "b", "c")], ShardingRuleError, "one axis or two"),
        ([()], ShardingRuleError, "one axis or two"),
        ("tp", MeshplanTypeError, "list of axis-name tuples"),
        ([(1,)], MeshplanTypeError, "mesh axis names"),
    ],
)
def test_bad_methods_are_errors_not_key_errors(methods, error, fragment):
    with pytest.raises(error, match=fragment):
        create_partition_spec((64, 64), methods, {"tp": 2, "a": 2, "b": 2, "c": 2})


def test_a_bare_string_method_means_one_axis():
    assert create_partition_spec((4096,), ["tp"], {"tp": 2}) == P("tp")
