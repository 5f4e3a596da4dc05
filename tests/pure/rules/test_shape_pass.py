"""plan_tree's shape-only pass: each distinct (shape, dtype) asked once, at its first leaf, refusals counted right.

The pass looks up each kind's first leaf in one sweep of the leaves and counts a refused kind's leaves in one
more; these properties hold it to the per-leaf definition: the leaf a rule is shown (and a message names) is the
first of its kind in jax's leaf order, and "and N more leaves" counts exactly the leaves that share it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import AutoRule, plan_tree
from meshplan.pure.errors import ShardingRuleError
from tests.pure.rules.common import sds

# Few shapes and two dtypes, so kinds repeat; strings and None are non-array leaves between them.
_SHAPES = [(), (4,), (8, 2), (2, 8), (16,)]
leaves = st.one_of(
    st.tuples(st.sampled_from(_SHAPES), st.sampled_from([np.float32, np.int8])).map(lambda t: sds(*t)),
    st.sampled_from(["text", None, 3]),
)
trees = st.recursive(leaves, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                     st.dictionaries(st.sampled_from("abcd"), kids, max_size=4)),
                     max_leaves=40)


@dataclasses.dataclass
class Recording:
    """A shape-only rule that records the leaf it is shown and refuses the shapes in ``refuse``."""

    refuse: frozenset[tuple[int, ...]] = frozenset()
    shape_only = True
    name = "recording"
    seen: list[tuple[Any, int, str]] = dataclasses.field(default_factory=list)

    def __call__(self, ctx):
        self.seen.append(((ctx.shape, ctx.dtype), ctx.index, ctx.path))
        if ctx.shape in self.refuse:
            raise ShardingRuleError(f"{ctx.path}: refused {ctx.shape}")
        return AutoRule(min_shard_size=0)(ctx)


def _kinds(tree) -> tuple[list[str], list[Any]]:
    """Each leaf's path and its (shape, dtype), None for a non-array leaf, in jax's order."""
    with_path = jax.tree_util.tree_flatten_with_path(tree)[0]
    paths = [jax.tree_util.keystr(k, simple=True, separator="/") for k, _ in with_path]
    kinds = [(tuple(v.shape), np.dtype(v.dtype)) if hasattr(v, "shape") else
             (((), np.dtype(np.int32)) if isinstance(v, int) else None) for _, v in with_path]
    return paths, kinds


@given(tree=trees)
def test_each_kind_is_asked_once_at_its_first_leaf(tree):
    rule = Recording()
    plan_tree(tree, rule, {"tp": 2, "dp": 4})
    paths, kinds = _kinds(tree)
    firsts = {}
    for i, kind in enumerate(kinds):
        if kind is not None:
            firsts.setdefault(kind, i)
    assert [(kind, i) for kind, i, _ in rule.seen] == list(firsts.items())  # in first-leaf order
    assert [path for _, _, path in rule.seen] == [paths[i] for i in firsts.values()]


@given(tree=trees, refuse=st.sets(st.sampled_from(_SHAPES), min_size=1))
def test_a_refusal_names_the_first_leaf_of_each_kind_and_counts_the_rest(tree, refuse):
    paths, kinds = _kinds(tree)
    refused = [i for i, kind in enumerate(kinds) if kind is not None and kind[0] in refuse]
    rule = Recording(frozenset(refuse))
    if not refused:
        plan_tree(tree, rule, {"tp": 2})
        return
    with pytest.raises(ShardingRuleError) as err:
        plan_tree(tree, rule, {"tp": 2})
    text = str(err.value)
    if len(refused) == 1:
        assert text == f"{paths[refused[0]]}: refused {kinds[refused[0]][0]}"
        return
    assert text.startswith(f"rule 'recording' could not plan {len(refused)} leaves:")
    by_kind: dict[Any, list[int]] = {}
    for i in refused:
        by_kind.setdefault(kinds[i], []).append(i)
    expected = []
    for kind, where in list(by_kind.items())[:10]:  # the message lists ten kinds, then how many more
        more = f" (and {len(where) - 1} more leaves with this shape and dtype)" if len(where) > 1 else ""
        expected.append(f"{paths[where[0]]}: refused {kind[0]}{more}")
    if len(by_kind) > 10:
        expected.append(f"... and {len(by_kind) - 10} more")
    assert text.split("\n  - ")[1:] == expected


def test_many_distinct_shapes_are_each_asked_once_in_leaf_order():
    tree = {f"w{i:05d}": sds((i + 1, 8)) for i in range(3000)}  # one kind per leaf
    rule = Recording()
    plan = plan_tree(tree, rule, {"tp": 4})
    assert [i for _, i, _ in rule.seen] == list(range(3000))
    assert plan.specs["w00007"] == P("tp") and plan.specs["w00002"] == P(None, "tp")  # each its own answer
