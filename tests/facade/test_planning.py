"""The facade's whole-tree planning (meshplan.facade._planning): plan_tree's answers, the collector paused.

Every facade planner goes through ``plan_live``: its plans must be plan_tree's, byte for byte, and the cyclic
collector must be off while it runs and back as it was afterwards, also when the rule refuses a leaf.
"""

from __future__ import annotations

import dataclasses
import gc

import jax
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from meshplan import (
    AutoShardingRule,
    CompositeShardingRule,
    LogicalShardingRule,
    MemoryConstrainedShardingRule,
    MeshPartitionHelper,
    ShapeBasedShardingRule,
)
from meshplan.facade._planning import collector_paused, plan_live
from meshplan.pure import AutoRule, MemoryRule, SuggestRule, plan_tree
from meshplan.pure.errors import ShardingRuleError
from meshplan.pure.presets import MODEL_SPECS, build_params


@dataclasses.dataclass
class Watching:
    """A shape-only rule that records whether the collector ran while it was asked, then refuses if told to."""

    refuse: bool = False
    shape_only = True
    name = "watching"
    enabled: list[bool] = dataclasses.field(default_factory=list)

    def __call__(self, ctx):
        self.enabled.append(gc.isenabled())
        if self.refuse:
            raise ShardingRuleError(f"{ctx.path}: refused")
        return None


_TREE = {"w": jax.ShapeDtypeStruct((64, 64), np.float32), "b": jax.ShapeDtypeStruct((64,), np.float32)}


def test_the_collector_is_off_while_a_plan_runs_and_on_after():
    rule = Watching()
    assert gc.isenabled()
    plan_live(_TREE, rule, {"tp": 2})
    assert rule.enabled == [False, False] and gc.isenabled()


def test_the_collector_comes_back_when_the_rule_refuses():
    with pytest.raises(ShardingRuleError, match="refused"):
        plan_live(_TREE, Watching(refuse=True), {"tp": 2})
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        plan_live(_TREE, Watching(), {"tp": 2})
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_pauses_switch_the_collector_back_on_once_at_the_outermost():
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_every_facade_planner_gives_plan_tree_s_plan_on_a_moe_tree():
    tree = build_params(MODEL_SPECS["deepseek-v2-lite"], unstack_experts=True)
    mesh = jax.make_mesh((1, 2, 1, 4, 1), ("dp", "fsdp", "ep", "tp", "sp"), axis_types=(AxisType.Auto,) * 5)
    sizes = dict(mesh.shape)
    pairs = [
        (AutoShardingRule(mesh=mesh, min_shard_size=1024).plan(tree), plan_tree(tree, AutoRule(), sizes)),
        (MemoryConstrainedShardingRule(2**27, mesh=mesh).plan(tree), plan_tree(tree, MemoryRule(2**27), sizes)),
        (MeshPartitionHelper(mesh).plan(tree), plan_tree(tree, SuggestRule(), sizes)),
    ]
    for facade, pure in pairs:
        assert repr(facade.specs) == repr(pure.specs)
        assert facade.leaf_decisions == pure.leaf_decisions
    assert AutoShardingRule(mesh=mesh, min_shard_size=1024).apply(tree) == pairs[0][1].specs
    assert gc.isenabled()


def test_composite_shape_and_logical_rules_leave_the_collector_on():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
    tree = {"emb": np.zeros((64, 1024), np.int8)}
    assert CompositeShardingRule(ShapeBasedShardingRule({(None, 1024): P("tp")}),
                                 AutoShardingRule(mesh=mesh)).apply(tree) == {"emb": P("tp")}
    assert ShapeBasedShardingRule({(None, 1024): P("tp")}).apply(tree) == {"emb": P("tp")}
    assert LogicalShardingRule([("embed", "tp")], mesh=mesh).apply(tree) == {"emb": P()}
    assert gc.isenabled()
