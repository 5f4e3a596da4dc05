"""The composite rule: the first rule whose answer shards something wins.

Rules are asked in order. A rule's answer counts only if it splits at least
one dim: ``None`` (no opinion) and all-``None`` specs such as ``P()`` or
``P(None, None)`` pass the leaf on to the next rule. If no rule shards the
leaf, the composite replicates it, with a reason listing what each rule said
(or returns no opinion when no rule had one). Errors raised by a rule
propagate: a misfitting shape pattern is not skipped over silently.

The composite forwards its rules' hints (see :class:`~meshplan.pure.rules.Rule`):
it is shape-only exactly when all its rules are, so a composite of built-in
rules is still planned once per distinct (shape, dtype); its group key is the
tuple of its rules' keys; it reads the union of the axes its rules read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

from meshplan.pure._types import make_spec
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._base import (
    as_context,
    as_rule,
    Decision,
    GroupKey,
    LeafContext,
    Rule,
    ask,
    group_key_fn,
    is_shape_only,
    reads_axes,
    rule_name,
    shards_something,
)

__all__ = ["CompositeRule"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompositeRule:
    """Try ``rules`` in order; keep the first answer that shards the leaf.

    Attributes:
      rules: pure rules, highest priority first.
      name: the label on decisions where no rule sharded the leaf.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> from meshplan.pure.rules import AutoRule, LeafContext, ShapePatternRule
      >>> rule = CompositeRule((ShapePatternRule({(None, 1024): P("tp")}), AutoRule()))
      >>> rule(LeafContext((4096, 512), np.dtype("float32"), {"tp": 4})).reason
      "auto won (rule 2 of 2; shape: no opinion): largest dims first: dim 0 (4096) <- 'tp'(4)"
    """

    rules: tuple[Rule, ...]
    name: str = "composite"
    # Each rule's group-key function, found once (the search keys every leaf of a tree).
    _keys: tuple[GroupKey, ...] = dataclasses.field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.rules, str) or not isinstance(self.rules, Sequence):
            raise MeshplanTypeError(f"rules={self.rules!r} must be a sequence of rules.")
        object.__setattr__(self, "rules", tuple(self.rules))
        if not self.rules:
            raise ShardingRuleError("a composite rule needs at least one rule to try.")
        for k, rule in enumerate(self.rules):
            as_rule(rule, f"rules[{k}]")
        if not isinstance(self.name, str):
            raise MeshplanTypeError(f"name={self.name!r} must be a string.")
        object.__setattr__(self, "_keys", tuple(group_key_fn(rule) for rule in self.rules))

    @property
    def shape_only(self) -> bool:
        """True when every rule is shape-only."""
        return all(is_shape_only(rule) for rule in self.rules)

    @property
    def reads_axes(self) -> tuple[str, ...] | None:
        """The axes any of its rules reads (``None`` when one of them may read any axis)."""
        parts = [reads_axes(rule) for rule in self.rules]
        if any(p is None for p in parts):
            return None
        return tuple(dict.fromkeys(a for p in parts if p is not None for a in p))

    def group_key(self, ctx: LeafContext) -> Hashable:
        """Equal keys, equal decisions: the tuple of its rules' keys."""
        ctx = as_context(ctx)
        return tuple(key(ctx) for key in self._keys)

    def __call__(self, ctx: LeafContext) -> Decision | None:
        said: list[str] = []
        any_opinion = False
        for k, rule in enumerate(self.rules):
            decision = ask(rule, ctx)
            if decision is None:
                said.append(f"{rule_name(rule)}: no opinion")
                continue
            any_opinion = True
            if shards_something(decision.spec):
                before = f"; {', '.join(said)}" if said else ""
                reason = f"{decision.rule} won (rule {k + 1} of {len(self.rules)}{before}): {decision.reason}"
                return Decision(decision.spec, reason, decision.rule)
            said.append(f"{decision.rule}: {decision.reason}")
        if not any_opinion:
            return None
        return Decision(make_spec(), "no rule sharded it (" + "; ".join(said) + ")", self.name)
