"""Sharding rules: the rule protocol, the plan engine that asks a rule about every leaf, and the built-in
rules (auto, shape pattern, memory, composite, path, axis kind, suggest). Builds on :mod:`meshplan.pure.specs`.
"""

from meshplan.pure.rules._base import Decision, LeafContext, Rule, shards_something
from meshplan.pure.rules._engine import Plan, plan_from_specs, plan_tree
from meshplan.pure.rules._replay import PlanRule
from meshplan.pure.rules._auto import AutoRule, DEFAULT_MIN_SHARD_SIZE
from meshplan.pure.rules._axis_kind import AxisKindRule, path_template
from meshplan.pure.rules._composite import CompositeRule
from meshplan.pure.rules._conventions import CONVENTIONS, DIM_KINDS, LeafLayout, leaf_layout, normalize_path
from meshplan.pure.rules._check_tree import check_rule
from meshplan.pure.rules._logical import (
    canonical_logical_table,
    logical_names_by_path,
    logical_rule_from_json,
    logical_table_to_json,
    LogicalRule,
    resolve_logical_axes,
)
from meshplan.pure.rules._memory import MemoryRule, min_shard_bytes
from meshplan.pure.rules._path import path_rule_from_json, PathRule
from meshplan.pure.rules._shape import ShapePatternRule
from meshplan.pure.rules._suggest import analyze_pytree, create_partition_spec, suggest_methods, SuggestRule

__all__ = [
    "analyze_pytree",
    "AutoRule",
    "AxisKindRule",
    "CompositeRule",
    "create_partition_spec",
    "Decision",
    "DEFAULT_MIN_SHARD_SIZE",
    "LeafContext",
    "canonical_logical_table",
    "check_rule",
    "CONVENTIONS",
    "DIM_KINDS",
    "leaf_layout",
    "LeafLayout",
    "normalize_path",
    "logical_names_by_path",
    "logical_rule_from_json",
    "logical_table_to_json",
    "LogicalRule",
    "MemoryRule",
    "min_shard_bytes",
    "path_rule_from_json",
    "path_template",
    "PathRule",
    "Plan",
    "plan_from_specs",
    "plan_tree",
    "PlanRule",
    "resolve_logical_axes",
    "Rule",
    "ShapePatternRule",
    "shards_something",
    "suggest_methods",
    "SuggestRule",
]
