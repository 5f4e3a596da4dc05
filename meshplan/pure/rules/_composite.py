"""The composite rule: the first rule whose answer shards something wins.

Rules are asked in order. A rule's answer counts only if it splits at least
one dim: ``None`` (no opinion) and all-``None`` specs such as ``P()`` or
``P(None, None)`` pass the leaf on to the next rule. If no rule shards the
leaf, the composite replicates it, with a reason listing what each rule said
(or returns no opinion when no rule had one). Errors raised by a rule
propagate: a misfitting shape pattern is not skipped over silently.

The composite is shape-only exactly when all its rules are, so a composite
of built-in rules is still planned once per distinct (shape, dtype).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jax.sharding import PartitionSpec

from meshplan.pure.rules._base import Decision, LeafContext, is_shape_only, rule_name, shards_something
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError

__all__ = ["CompositeRule"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompositeRule:
    """Try ``rules`` in order; keep the first answer that shards the leaf.

    Attributes:
      rules: pure rules, highest priority first.
      name: the label on decisions where no rule sharded the leaf.

    Example:
      >>> import numpy as np
      >>> from meshplan.pure.rules._auto import AutoRule
      >>> from meshplan.pure.rules._shape import ShapePatternRule
      >>> rule = CompositeRule((ShapePatternRule({(None, 1024): PartitionSpec("tp")}), AutoRule()))
      >>> rule(LeafContext((4096, 512), np.dtype("float32"), {"tp": 4})).reason
      "auto won (rule 2 of 2; shape: no opinion): largest dims first: dim 0 (4096) <- 'tp'(4)"
    """

    rules: tuple[Any, ...]
    name: str = "composite"

    def __post_init__(self) -> None:
        if isinstance(self.rules, str) or not isinstance(self.rules, Sequence):
            raise MeshplanTypeError(f"rules={self.rules!r} must be a sequence of rules.")
        object.__setattr__(self, "rules", tuple(self.rules))
        if not self.rules:
            raise ShardingRuleError("a composite rule needs at least one rule to try.")
        for k, rule in enumerate(self.rules):
            if not callable(rule):
                raise MeshplanTypeError(f"rules[{k}]={rule!r} is not a rule (not callable).")
        if not isinstance(self.name, str):
            raise MeshplanTypeError(f"name={self.name!r} must be a string.")

    @property
    def shape_only(self) -> bool:
        """True when every rule is shape-only."""
        return all(is_shape_only(rule) for rule in self.rules)

    def __call__(self, ctx: LeafContext) -> Decision | None:
        said: list[str] = []
        any_opinion = False
        for k, rule in enumerate(self.rules):
            decision = rule(ctx)
            if decision is None:
                said.append(f"{rule_name(rule)}: no opinion")
                continue
            if not isinstance(decision, Decision):
                raise MeshplanTypeError(
                    f"{ctx.path}: rule {rule_name(rule)!r} returned {decision!r}; a rule returns a "
                    "Decision or None."
                )
            any_opinion = True
            if shards_something(decision.spec):
                before = f"; {', '.join(said)}" if said else ""
                reason = f"{decision.rule} won (rule {k + 1} of {len(self.rules)}{before}): {decision.reason}"
                return Decision(decision.spec, reason, decision.rule)
            said.append(f"{decision.rule}: {decision.reason}")
        if not any_opinion:
            return None
        return Decision(PartitionSpec(), "no rule sharded it (" + "; ".join(said) + ")", self.name)
