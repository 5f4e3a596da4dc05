"""plan_tree's template fast path: a rule that promises one answer per path template
(``template_group``, e.g. AxisKindRule) is asked once per (template, shape, dtype), and the plan is
the one asking every leaf gives."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure import AxisKindRule, Decision, LeafContext, plan_tree
from meshplan.pure.errors import ShardingRuleError
from meshplan.pure.presets import MODEL_SPECS, build_params
from meshplan.pure.rules import path_template
from meshplan.pure.specs import tree_facts
from meshplan.pure.specs._tree import path_str
from tests.profiles import examples

# Names the conventions reader gives meaning to, and indices: the paths that could go wrong.
_KEYS = ["layers", "experts", "moe", "mlp", "self_attn", "q_proj", "k_proj", "o_proj", "up_proj", "down_proj",
         "gate", "query", "out", "wi_0", "embed_tokens", "lm_head", "norm", "ln_f", "kernel", "weight", "bias",
         "scale", "embedding", "value", "params", "0", "1", "7", "12"]
_SHAPES = [(), (8,), (64,), (16, 32), (32, 16), (64, 64), (4, 32, 64), (8, 64, 32), (4, 8, 16, 32)]
_DTYPES = ["float32", "bfloat16"]

leaves = st.one_of(
    st.builds(lambda s, d: jax.ShapeDtypeStruct(s, np.dtype(d) if d == "float32" else jax.numpy.bfloat16),
              st.sampled_from(_SHAPES), st.sampled_from(_DTYPES)),
    st.just("not an array"),
    st.none(),
)
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=4),
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(_KEYS), children, min_size=1, max_size=4),
        st.dictionaries(st.integers(0, 12), children, min_size=1, max_size=3),
        st.dictionaries(st.sampled_from(_KEYS), children, min_size=1, max_size=3).map(
            lambda d: collections.OrderedDict(reversed(list(d.items())))),
    ),
    max_leaves=24,
)
rules = st.builds(
    AxisKindRule,
    num_heads=st.sampled_from([None, 4, 8]),
    num_kv_heads=st.sampled_from([None, 2, 8]),
    num_experts=st.sampled_from([None, 4, 8]),
    min_shard_size=st.sampled_from([0, 64, 1024]),
    convention=st.sampled_from(["auto", "flax", "torch", "maxtext"]),
    dims=st.sampled_from([(), (("layers/0/", ("layers", "in", "out")),)]),
)
sizes = st.fixed_dictionaries({"fsdp": st.sampled_from([1, 2, 4]), "tp": st.sampled_from([1, 2, 4]),
                               "ep": st.sampled_from([1, 2])})


@dataclasses.dataclass(frozen=True)
class _LeafByLeaf:
    """The same rule (and name) without its template promise: plan_tree asks it about every leaf."""

    inner: Any

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def __call__(self, ctx: LeafContext) -> Decision | None:
        return self.inner(ctx)  # type: ignore[no-any-return]


def _leaf_by_leaf(rule: Any) -> Any:
    return _LeafByLeaf(rule)


def _plan_or_error(tree: Any, rule: Any, axis_sizes: dict[str, int]) -> Any:
    try:
        return plan_tree(tree, rule, axis_sizes)
    except ShardingRuleError as err:
        return f"{type(err).__name__}: {err}"


@settings(max_examples=examples(150), deadline=None)
@given(trees, rules, sizes)
def test_the_template_fast_path_gives_the_plan_asking_every_leaf_gives(tree, rule, axis_sizes):
    fast = _plan_or_error(tree, rule, axis_sizes)
    slow = _plan_or_error(tree, _leaf_by_leaf(rule), axis_sizes)
    if isinstance(slow, str):  # a refused leaf (a dims override of the wrong rank): the same error, every leaf named
        assert fast == slow
        return
    assert fast.leaf_decisions == slow.leaf_decisions
    assert fast.leaf_specs == slow.leaf_specs
    assert jax.tree.structure(fast.specs) == jax.tree.structure(slow.specs)


@settings(max_examples=examples(150), deadline=None)
@given(trees)
def test_paths_and_templates_read_off_the_structure_equal_jax_key_paths(tree):
    facts = tree_facts(tree)
    n = len(facts.infos)
    descended = [facts.path(i) for i in range(n)]  # before the key paths are made
    templates = facts.templates()
    table, codes = facts.template_codes()
    keyed = [path_str(k) for k, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    assert descended == keyed
    assert templates == [path_template(p) for p in keyed]
    assert [table[c] for c in codes] == templates and len(set(table)) == len(table)


def test_a_deepseek_tree_with_one_leaf_per_expert_asks_the_rule_once_per_group():
    spec = MODEL_SPECS["deepseek-v3"]
    tree = build_params(dataclasses.replace(spec, num_layers=4, num_experts=16), unstack_experts=True)
    asked: list[str] = []

    @dataclasses.dataclass(frozen=True)
    class Counting:
        inner: AxisKindRule

        def __call__(self, ctx: LeafContext) -> Decision:
            asked.append(ctx.path)
            return self.inner(ctx)

        def template_group(self, template: str) -> bool:
            return self.inner.template_group(template)

    rule = AxisKindRule.for_model(spec)
    plan = plan_tree(tree, Counting(rule), {"fsdp": 2, "tp": 4, "ep": 2})
    assert len(plan) > 3 * len(asked)  # the experts of a layer share their answers
    assert len(asked) == len({(path_template(p), plan.infos[plan.facts.templates().index(path_template(p))])
                               for p in asked})
    assert plan.leaf_decisions == plan_tree(tree, _leaf_by_leaf(rule), {"fsdp": 2, "tp": 4, "ep": 2}).leaf_decisions


def test_a_leaf_or_parameter_named_by_an_index_is_asked_on_its_own():
    # "0/kernel: not a tensor-parallel layer" names the index: leaves 0 and 1 must not share it.
    tree = {"blocks": [jax.ShapeDtypeStruct((64, 64), np.float32)] * 2}
    plan = plan_tree(tree, AxisKindRule(min_shard_size=0), {"tp": 2})
    assert [d.reason for d in plan.leaf_decisions] == [
        "0/kernel: not a tensor-parallel layer; not split over tp=2",
        "1/kernel: not a tensor-parallel layer; not split over tp=2"]


@dataclasses.dataclass(frozen=True)
class _RefusesWide:
    """Promises one answer per template, and refuses leaves wider than 32."""

    name: str = "refuses-wide"

    def __call__(self, ctx: LeafContext) -> Decision | None:
        if ctx.shape and ctx.shape[-1] > 32:
            raise ShardingRuleError(f"{ctx.path}: too wide")
        return None

    def template_group(self, template: str) -> bool:
        return True


def test_refused_leaves_are_each_named_as_when_every_leaf_is_asked():
    tree = {"layers": [{"w": jax.ShapeDtypeStruct((8, 64), np.float32), "b": jax.ShapeDtypeStruct((8,), np.float32)}
                       for _ in range(3)]}
    with pytest.raises(ShardingRuleError) as fast:
        plan_tree(tree, _RefusesWide(), {"tp": 2})
    with pytest.raises(ShardingRuleError) as slow:
        plan_tree(tree, _leaf_by_leaf(_RefusesWide()), {"tp": 2})
    assert str(fast.value) == str(slow.value)
    assert all(f"layers/{i}/w" in str(fast.value) for i in range(3))
