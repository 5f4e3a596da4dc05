"""Tests for the pure memory-budget rule (meshplan.pure.rules._memory)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import LeafContext, MemoryRule, plan_tree, shard_shape
from meshplan.pure.rules import min_shard_bytes
from meshplan.pure.specs import array_bytes, canonical_entries
from meshplan.pure.errors import MemoryBudgetError, MeshplanTypeError, ShardingRuleError
from tests.pure.rules.common import all_assignments, assert_storable, axis_sizes, brute_min_bytes, sds, shapes


def _memory_decision(shape, dtype, sizes, **options):
    """The memory rule's decision for one leaf outside a tree (through MemoryRule)."""
    return MemoryRule(**options)(LeafContext(shape, dtype, sizes))

DTYPES = [np.float32, np.int8, ml_dtypes.bfloat16, ml_dtypes.int4, np.complex64]


@st.composite
def budget_cases(draw):
    shape = draw(shapes(max_rank=3))
    sizes = draw(axis_sizes(max_axes=3))
    dtype = draw(st.sampled_from(DTYPES))
    full = array_bytes(shape, dtype)
    # Half the budgets sit right at the edge: the best reachable bytes (just
    # achievable) or one below (just not).
    best = brute_min_bytes(shape, dtype, sizes)
    edge = st.sampled_from([b for b in (best, best - 1) if b >= 1] or [1])
    budget = draw(st.one_of(edge, st.integers(1, max(1, full + 8))))
    return shape, sizes, dtype, budget


@given(case=budget_cases())
def test_memory_rule_meets_the_budget_exactly_when_brute_force_says_it_can(case):
    shape, sizes, dtype, budget = case
    best = brute_min_bytes(shape, dtype, sizes)
    try:
        decision = _memory_decision(shape, dtype, sizes, max_memory_per_device=budget)
    except MemoryBudgetError as err:
        assert best > budget, f"brute force fits {best} B <= {budget} B, the rule gave up"
        assert f"at best {best} B per device" in str(err)
        assert f"max_memory_per_device={budget} B" in str(err)
        assert err.best_bytes == best
        return
    assert best <= budget
    assert_storable(shape, decision.spec, sizes, dtype)
    assert array_bytes(shard_shape(shape, decision.spec, sizes), dtype) <= budget


@given(case=budget_cases())
def test_memory_rule_replicates_exactly_the_leaves_that_already_fit(case):
    shape, sizes, dtype, budget = case
    try:
        decision = _memory_decision(shape, dtype, sizes, max_memory_per_device=budget)
    except MemoryBudgetError:
        return
    assert (decision.spec == P()) == (array_bytes(shape, dtype) <= budget)


@given(case=budget_cases())
def test_memory_rule_stops_adding_axes_once_the_leaf_fits_on_its_greedy_path(case):
    """Dropping the last axis placed by the greedy pass would break the budget."""
    shape, sizes, dtype, budget = case
    try:
        decision = _memory_decision(shape, dtype, sizes, max_memory_per_device=budget)
    except MemoryBudgetError:
        return
    if "exhaustive" in decision.reason or decision.spec == P():
        return
    entries = canonical_entries(decision.spec, len(shape))
    by_size = sorted((a for a in sizes if sizes[a] > 1), key=lambda a: -sizes[a])
    last = max((a for e in entries for a in e), key=by_size.index)
    fewer = [tuple(x for x in e if x != last) for e in entries]
    assert array_bytes(shard_shape(shape, P(*fewer), sizes), dtype) > budget


@given(shape=shapes(max_rank=3), sizes=axis_sizes(max_axes=3), dtype=st.sampled_from(DTYPES))
def test_min_shard_bytes_matches_brute_force_and_its_spec_is_storable(shape, sizes, dtype):
    got, spec = min_shard_bytes(shape, dtype, sizes)
    assert got == brute_min_bytes(shape, dtype, sizes)
    assert_storable(shape, spec, sizes, dtype)
    assert array_bytes(shard_shape(shape, spec, sizes), dtype) == got


# --- examples -------------------------------------------------------------------------------------


def test_largest_axis_goes_on_the_largest_dim_first():
    d = _memory_decision((1024, 4096), np.float32, {"dp": 2, "tp": 4}, max_memory_per_device=4 * 2**20)
    assert d.spec == P(None, "tp")
    assert d.reason == "16777216 B > budget 4194304 B; dim 1 (4096) over 'tp'(4) -> 4194304 B per device"


def test_several_axes_share_a_dim_as_a_tuple_when_one_is_not_enough():
    d = _memory_decision((4096, 1024), np.float32, {"dp": 2, "tp": 4}, max_memory_per_device=2 * 2**20)
    assert d.spec == P(("tp", "dp"))


def test_the_exhaustive_search_rescues_what_the_greedy_pass_misses():
    # Greedy puts 'c'(6) on the larger dim 12 (-> 6 x 2); then 'b'(4) divides
    # nothing and 'a'(2) only reaches 3 x 2 = 6 B. 'c' on dim 0 and 'b' on
    # dim 1 reach 1 x 3 = 3 B.
    sizes = {"a": 2, "b": 4, "c": 6}
    d = _memory_decision((6, 12), np.int8, sizes, max_memory_per_device=3)
    assert d.spec == P("c", "b")
    assert d.reason.endswith("-> 3 B per device (exhaustive search)")


def test_sub_byte_dtypes_count_like_jax_unless_packed():
    # int4 arrays hold one byte per element in jax.Array.nbytes; TPU packs two.
    d = _memory_decision((4096,), ml_dtypes.int4, {"tp": 2}, max_memory_per_device=2048)
    assert d.spec == P("tp")
    d = _memory_decision((4096,), ml_dtypes.int4, {"tp": 2}, max_memory_per_device=2048, packed_subbyte=True)
    assert d.spec == P()


def test_axis_names_limit_the_axes_used():
    d = _memory_decision((4096,), np.float32, {"dp": 8, "tp": 2}, max_memory_per_device=8192,
                        axis_names=["tp"])
    assert d.spec == P("tp")


def test_a_leaf_that_cannot_fit_names_itself_its_best_bytes_and_the_budget():
    tree = {"emb": sds((7, 5)), "ok": sds((2,))}
    with pytest.raises(MemoryBudgetError) as err:
        plan_tree(tree, MemoryRule(16), {"dp": 2})
    msg = str(err.value)
    assert msg.startswith("emb: (7, 5) float32 needs 140 B unsharded and at best 140 B per device")
    assert "max_memory_per_device=16 B" in msg


def test_zero_size_leaves_always_fit():
    assert _memory_decision((0, 8), np.float32, {"dp": 2}, max_memory_per_device=1).spec == P()


@pytest.mark.parametrize(
    "budget, error",
    [(0, ShardingRuleError), (-5, ShardingRuleError), (True, MeshplanTypeError), ("1GB", MeshplanTypeError)],
)
def test_bad_budgets_are_refused(budget, error):
    with pytest.raises(error, match="max_memory_per_device"):
        MemoryRule(budget)


def test_float_budgets_are_accepted():
    assert MemoryRule(1e9).max_memory_per_device == 1e9


def test_all_assignments_oracle_is_complete_on_a_tiny_case():
    # (4,) over {a: 2, b: 2}: none, a, b, (a, b) -> 4 assignments.
    assert len(list(all_assignments((4,), {"a": 2, "b": 2}))) == 4
    assert math.prod(shard_shape((4,), P(("a", "b")), {"a": 2, "b": 2})) == 1
