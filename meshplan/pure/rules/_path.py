"""A path-regex rule: ``(regex, spec)`` pairs matched against leaf paths, and its JSON form.

:class:`PathRule` searches each pattern (``re.search``) in the leaf path
(``"model/layers/0/self_attn/q_proj/weight"``); the first match wins and
unmatched leaves go to a ``fallback`` rule. It is what ``meshplan plan
--rules FILE`` builds (:func:`path_rule_from_json`). Specs travel as JSON
lists (:func:`spec_to_json` / :func:`spec_from_json`), as in saved plans.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_json_spec
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._base import (
    as_rule,
    as_context,
    Decision,
    LeafContext,
    Rule,
    group_key_fn,
    reads_axes,
    rule_name,
)
from meshplan.pure.rules._shape import _misfit

__all__ = ["PathRule", "path_rule_from_json", "spec_from_json", "spec_to_json"]


def spec_to_json(spec: PartitionSpec) -> list[Any]:
    """A PartitionSpec as JSON data: one entry per dim, ``None`` / name / list of names.

    Example:
      >>> spec_to_json(PartitionSpec(("fsdp", "tp"), None, "ep"))
      [['fsdp', 'tp'], None, 'ep']
    """
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def spec_from_json(data: Any, *, where: str = "spec") -> PartitionSpec:
    """The inverse of :func:`spec_to_json`; a bare string is a one-entry spec.

    Raises:
      MeshplanTypeError: an entry that is not null, a name or a list of names.

    Example:
      >>> spec_from_json([["fsdp", "tp"], None])
      P(('fsdp', 'tp'), None)
    """
    return as_json_spec(data, where)


@dataclasses.dataclass(frozen=True, slots=True)
class PathRule:
    """``(regex, spec)`` pairs matched against leaf paths; first match wins.

    Patterns are searched (``re.search``) in the ``"a/b/0"`` path. A matched
    spec that cannot store the leaf on the mesh (unknown axis, indivisible
    dim) is a :class:`ShardingRuleError`, never passed through. Unmatched
    leaves go to ``fallback`` (no opinion when it is ``None``).

    Attributes:
      rules: ``(pattern, PartitionSpec)`` pairs, tried in order.
      fallback: the rule for leaves no pattern matches, or ``None``.
      name: the label on its decisions.

    Example:
      >>> import numpy as np
      >>> from meshplan.pure import tree_facts
      >>> facts = tree_facts({"lm_head": {"weight": np.zeros((32, 8))}})
      >>> rule = PathRule([("lm_head", PartitionSpec("tp"))])
      >>> rule(LeafContext((32, 8), np.dtype("float32"), {"tp": 4}, 0, facts))
      Decision(spec=P('tp',), reason="matched path rule #0 'lm_head'", rule='path')
    """

    rules: tuple[tuple[str, PartitionSpec], ...]
    fallback: Rule | None = None
    name: str = "path"
    _compiled: tuple[re.Pattern[str], ...] = dataclasses.field(default=(), repr=False, compare=False)
    shape_only: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if isinstance(self.rules, str) or not isinstance(self.rules, Sequence):
            raise MeshplanTypeError(f"rules={self.rules!r} must be a sequence of (regex, PartitionSpec) pairs.")
        pairs, compiled, problems = [], [], []
        for k, item in enumerate(self.rules):
            if not (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], PartitionSpec)):
                problems.append(f"rule #{k} {item!r} is not a (regex str, PartitionSpec) pair")
                continue
            try:
                compiled.append(re.compile(item[0]))
            except re.error as err:
                problems.append(f"rule #{k} pattern {item[0]!r} is not a valid regex ({err})")
                continue
            pairs.append((item[0], item[1]))
        if problems:
            raise ShardingRuleError("invalid path rules: " + "; ".join(problems) + ".")
        if self.fallback is not None:
            as_rule(self.fallback, "fallback")
        object.__setattr__(self, "rules", tuple(pairs))
        object.__setattr__(self, "_compiled", tuple(compiled))

    @property
    def reads_axes(self) -> tuple[str, ...] | None:
        """Axes whose sizes matter: those the patterns name plus the fallback's (None: all)."""
        fallback = () if self.fallback is None else reads_axes(self.fallback)
        if fallback is None:
            return None
        named = [a for _, spec in self.rules for e in spec if e is not None
                 for a in (e if isinstance(e, tuple) else (e,))]
        return tuple(dict.fromkeys([*named, *fallback]))

    def _match(self, path: str) -> int | None:
        for k, pattern in enumerate(self._compiled):
            if pattern.search(path):
                return k
        return None

    def group_key(self, ctx: LeafContext) -> Hashable:
        """Equal keys, equal decisions: the matching pattern (or the fallback's key)."""
        ctx = as_context(ctx)
        k = self._match(ctx.path)
        if k is not None:
            return ("path", k, ctx.shape)
        if self.fallback is None:
            return ("none",)
        return ("fallback", group_key_fn(self.fallback)(ctx))

    def __call__(self, ctx: LeafContext) -> Decision | None:
        k = self._match(ctx.path)
        if k is None:
            return None if self.fallback is None else self.fallback(ctx)
        pattern, spec = self.rules[k]
        problem = _misfit(ctx.shape, spec, ctx.axis_sizes)
        if problem is not None:
            raise ShardingRuleError(
                f"{ctx.path}: shape {ctx.shape} matches path rule #{k} {pattern!r} -> {spec}, which does "
                f"not fit: {problem}; mesh axis sizes: {dict(ctx.axis_sizes)}. Fix that rule's spec."
            )
        return Decision(spec, f"matched path rule #{k} {pattern!r}", self.name)

    def __repr__(self) -> str:
        fallback = "" if self.fallback is None else f", fallback={rule_name(self.fallback)!r}"
        return f"PathRule({len(self.rules)} rules{fallback})"


def path_rule_from_json(data: Any, *, fallback: Rule | None = None) -> PathRule:
    """A :class:`PathRule` from the ``--rules FILE`` JSON format.

    The format is a list of ``[regex, spec]`` pairs (or ``{"rules": [...]}``),
    where ``spec`` is a list with one entry per dim: ``null``, an axis name,
    or a list of axis names. ``[]`` replicates the matched leaves.

    Raises:
      ShardingRuleError: a malformed entry or regex (every problem listed).
      MeshplanTypeError: the data is not a list / object of that shape.

    Example:
      >>> path_rule_from_json({"rules": [["embed_tokens", ["tp", None]], ["norm", []]]}).rules
      (('embed_tokens', P('tp', None)), ('norm', P()))
    """
    if isinstance(data, Mapping):
        keys = sorted(map(repr, data))  # repr: JSON keys are str, but a Python caller's may be anything
        if keys != ["'rules'"]:
            raise MeshplanTypeError(f"a rules object has exactly one key, 'rules'; got keys {keys}.")
        data = data["rules"]
    if not isinstance(data, list):
        raise MeshplanTypeError(
            f"rules must be a JSON list of [regex, spec] pairs, e.g. [[\"lm_head\", [\"tp\", null]]]; got {data!r}."
        )
    pairs = []
    for k, item in enumerate(data):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise ShardingRuleError(f"rules[{k}]={item!r} must be a [regex, spec] pair.")
        pairs.append((item[0], spec_from_json(item[1], where=f"rules[{k}] spec")))
    return PathRule(tuple(pairs), fallback=fallback)
