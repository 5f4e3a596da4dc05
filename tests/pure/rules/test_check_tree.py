"""Rules are checked against the model tree before any mesh is searched (meshplan.pure.rules._check_tree)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import AxisKindRule, PathRule, get_preset, search_meshes
from meshplan.pure.errors import PlanError, RuleValidationError, ShardingRuleError
from meshplan.pure.rules import CompositeRule
from meshplan.pure.rules._check_tree import check_rule

TREE = {"lm_head": {"weight": np.zeros((32, 8))}, "model": {"norm": {"weight": np.zeros((8,))}}}
AXES = ("dp", "fsdp", "tp")

BAD = [
    (PathRule([("lm_head", P("zz"))]), r"#0 'lm_head' -> P\('zz',\): \['zz'\] are not axes of the mesh; valid axes"),
    (PathRule([("norm", P("fsdp", None))]), r"2 entries for leaf 'model/norm/weight' of rank 1 .*at most 1"),
    (PathRule([("lm_haed", P("tp"))]), r"matches no leaf .*closest names: 'lm_head'"),
    (PathRule([("norm", P())], fallback=PathRule([("head", P(None, None, "tp"))], name="inner")),
     r"rule 'inner' #0 'head'.*rank 2"),
    (CompositeRule((AxisKindRule(), PathRule([("x", P("ep"))]))), r"\['ep'\] are not axes"),
]


@pytest.mark.parametrize("rule,message", BAD)
def test_each_bad_rule_is_refused_naming_the_rule_the_leaf_and_what_is_valid(rule, message: str) -> None:
    with pytest.raises(RuleValidationError, match=message):
        check_rule(rule, TREE, AXES)


def test_every_problem_is_listed_at_once_and_the_error_is_both_kinds() -> None:
    rule = PathRule([("lm_head", P("zz")), ("norm", P("fsdp", "tp")), ("nothing", P())])
    with pytest.raises(RuleValidationError) as info:
        check_rule(rule, TREE, AXES)
    assert str(info.value).count("\n  - ") == 3
    assert isinstance(info.value, PlanError) and isinstance(info.value, ShardingRuleError)


class _Hooked:
    name = "hooked"

    def __call__(self, ctx):  # pragma: no cover - never planned here
        return None

    def problems(self, leaves, axes):
        return [f"{p}: hooked sees rank {len(s)} on {list(axes)}" for p, s in leaves if len(s) == 1]


def test_any_rule_can_report_problems_through_the_hook() -> None:
    with pytest.raises(RuleValidationError, match=r"model/norm/weight: hooked sees rank 1 on \['dp', 'fsdp', 'tp'\]"):
        check_rule(_Hooked(), TREE, AXES)


paths = st.sampled_from(["lm_head/weight", "model/norm/weight", "lm_head", "norm", "weight"])


@given(st.lists(st.tuples(paths, st.sampled_from([P(), P("tp"), P(None), P("fsdp"), P(("dp", "fsdp"))])),
                min_size=1, max_size=4))
def test_rules_that_match_with_known_axes_and_fitting_ranks_pass(pairs) -> None:
    check_rule(PathRule(pairs), TREE, AXES)  # every pattern matches a leaf; specs have rank <= 1


def test_the_search_checks_rules_and_the_batch_before_searching() -> None:
    preset = get_preset("llama3-8b")
    fallback = AxisKindRule.for_model(preset.spec)
    with pytest.raises(RuleValidationError, match="'ep'.*not axes of the mesh; valid axes: \\['dp', 'fsdp', 'sp', 'tp'\\]"):
        search_meshes("llama3-8b", "2x8xH100", rule=PathRule([("embed_tokens", P("ep"))], fallback=fallback))
    with pytest.raises(PlanError, match="batch=3: no batch axis can split it.*multiple of 2"):
        search_meshes("llama3-8b", "8xH100", batch=3)
    with pytest.raises(PlanError, match=r"batch=6: the fixed batch axes \['dp=4'\] do not divide it"):
        search_meshes("gpt2", "H100", batch=6, fixed={"dp": 4})
    # without batch axes, an odd batch is a legitimate choice: sequences split over sp/tp
    result = search_meshes("gpt2", "H100", batch=3, axes=["sp", "tp"], seq=1024, top_k=1)
    assert result.best.mesh_shape["sp"] * result.best.mesh_shape["tp"] == 8
