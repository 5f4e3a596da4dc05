"""Replaying decisions made elsewhere, as a pure rule.

Two places need a rule that only gives back answers already made:

* a facade rule that exists only as ``apply(pytree)`` (a user subclass of
  ``ShardingRule``) takes part in a composite rule through the
  :class:`~meshplan.pure.rules.Plan` it made for the same tree: leaf ``i``
  gets the plan's decision ``i`` (*by index*);
* a mesh-search candidate rebuilds the specs of a parameter tree from its
  parameter groups: a leaf gets the decision recorded for its exact path, or
  else for its path template (layer and expert indices as ``*``), with its
  shape and dtype (*by pattern*).

:class:`PlanRule` does both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from meshplan.pure._types import Shape
from meshplan.pure._check import as_str
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._axis_kind import path_template
from meshplan.pure.rules._base import Decision, LeafContext
from meshplan.pure.rules._engine import Plan

__all__ = ["PatternKey", "PlanRule"]

PatternKey = tuple[str, Shape, str]
"""``(path or path template, shape, dtype name)``: what a by-pattern replay matches a leaf on."""


class PlanRule:
    """A pure rule replaying decisions: a plan's by leaf index, or recorded ones by path pattern.

    ``PlanRule(plan)`` replays a :class:`~meshplan.pure.rules.Plan` made for
    the same tree; :meth:`from_patterns` replays ``(pattern, shape, dtype
    name) -> decision`` records (the first record of a key wins).

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> from meshplan.pure.rules import Decision, plan_from_specs, plan_tree
      >>> tree = {"w": np.zeros((4, 4))}
      >>> replay = PlanRule(plan_from_specs(tree, {"w": P("dp")}, rule="mine"))
      >>> plan_tree(tree, replay, {"dp": 2}).specs
      {'w': P('dp',)}
      >>> records = [(("layers/*/w", (4, 4), "float64"), Decision(P("dp"), "saved", "mine"))]
      >>> tree = {"layers": [{"w": np.zeros((4, 4))}] * 2}
      >>> plan_tree(tree, PlanRule.from_patterns(records, name="plan"), {"dp": 2}).specs
      {'layers': [{'w': P('dp',)}, {'w': P('dp',)}]}
    """

    __slots__ = ("_by_index", "_by_pattern", "name")
    shape_only: ClassVar[bool] = False

    def __init__(self, plan: Plan) -> None:
        if not isinstance(plan, Plan):
            raise MeshplanTypeError(f"plan={plan!r:.80} must be a Plan (from plan_tree or plan_from_specs).")
        self.name: str = plan.rule
        self._by_index: tuple[Decision | None, ...] | None = plan.leaf_decisions
        self._by_pattern: dict[PatternKey, Decision] = {}

    @classmethod
    def from_patterns(cls, records: Iterable[tuple[PatternKey, Decision]], *, name: str) -> PlanRule:
        """Replay ``(pattern, shape, dtype name), decision`` records by path, else path template."""
        rule = cls.__new__(cls)
        rule.name = as_str(name, "name")
        rule._by_index = None
        rule._by_pattern = {}
        if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
            raise MeshplanTypeError(f"records={records!r:.80} must be an iterable of (pattern key, Decision).")
        try:
            items = list(records)
        except TypeError:  # iterable by type but not in fact (a 0-d numpy array)
            raise MeshplanTypeError(
                f"records={records!r:.80} must be an iterable of (pattern key, Decision).") from None
        for i, item in enumerate(items):
            if not (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[1], Decision)
                    and isinstance(item[0], tuple) and len(item[0]) == 3 and _hashable(item[0])):
                raise MeshplanTypeError(f"records[{i}]={item!r:.80} must be ((pattern, shape, dtype name), "
                                        "Decision).")
            key, decision = item
            rule._by_pattern.setdefault(key, decision)
        return rule

    def __repr__(self) -> str:
        how = "patterns" if self._by_index is None else "leaves"
        count = len(self._by_pattern) if self._by_index is None else len(self._by_index)
        return f"PlanRule(name={self.name!r}, {count} {how})"

    def __call__(self, ctx: LeafContext) -> Decision | None:
        if self._by_index is not None:
            return self._replay_index(ctx, self._by_index)
        return self._replay_pattern(ctx)

    def _replay_index(self, ctx: LeafContext, decisions: tuple[Decision | None, ...]) -> Decision | None:
        if not 0 <= ctx.index < len(decisions):
            raise ShardingRuleError(
                f"{ctx.path}: the replayed plan of rule {self.name!r} has "
                f"{len(decisions)} leaves; it was made for a different tree."
            )
        return decisions[ctx.index]

    def _replay_pattern(self, ctx: LeafContext) -> Decision:
        dtype = str(ctx.dtype)
        path = ctx.path
        found = self._by_pattern.get((path, ctx.shape, dtype)) or self._by_pattern.get(
            (path_template(path), ctx.shape, dtype))
        if found is None:
            raise ShardingRuleError(
                f"{path}: no parameter group of this plan matches {path_template(path)!r} {ctx.shape} "
                f"{dtype}; the plan was made for a different parameter tree (model or dtype)."
            )
        return found


def _hashable(key: object) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True
