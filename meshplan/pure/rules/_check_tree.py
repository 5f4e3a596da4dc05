"""Checking a rule against a model tree before planning: wrong rules fail early, by name.

A rule that names an axis the mesh lacks, gives a spec longer than a leaf's
rank, or has a pattern that matches no leaf would otherwise surface late and
vaguely: every candidate mesh rejected, and the search reporting whatever
other constraint it met first. :func:`check_rule` finds those mistakes on
the tree alone (no mesh sizes needed) and raises one
:class:`~meshplan.pure.errors.RuleValidationError` listing each, with the
rule, the leaf and what would be valid.

It looks inside :class:`~meshplan.pure.rules.PathRule` (and its fallback)
and :class:`~meshplan.pure.rules.CompositeRule`; any other rule can take part
by defining ``problems(leaves, axis_names) -> list[str]`` (``leaves``: the
tree's ``(path, shape)`` pairs).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from meshplan.pure._check import as_sequence, as_str
from meshplan.pure._types import PyTree, Shape
from meshplan.pure.errors import RuleValidationError
from meshplan.pure.rules._base import Rule, rule_name
from meshplan.pure.rules._composite import CompositeRule
from meshplan.pure.rules._path import PathRule
from meshplan.pure.specs._tree import tree_facts

__all__ = ["check_rule"]

_SHOWN = 3  # example leaf paths in a "matches no leaf" message


def _spec_axes(spec: Any) -> list[str]:
    return [a for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,))
            if isinstance(a, str)]


def _path_rule_problems(rule: PathRule, leaves: Sequence[tuple[str, Shape]], axes: Sequence[str]) -> list[str]:
    problems = []
    first: dict[int, tuple[str, Shape]] = {}  # rule index -> the first leaf whose first match it is
    matched: set[int] = set()
    too_long: dict[int, tuple[str, Shape]] = {}
    for path, shape in leaves:
        hits = [k for k, pattern in enumerate(rule._compiled) if pattern.search(path)]
        matched.update(hits)
        if hits:
            k = hits[0]
            first.setdefault(k, (path, shape))
            if len(rule.rules[k][1]) > len(shape) and k not in too_long:
                too_long[k] = (path, shape)
    for k, (pattern, spec) in enumerate(rule.rules):
        where = f"rule {rule_name(rule)!r} #{k} {pattern!r} -> {spec}"
        unknown = [a for a in _spec_axes(spec) if a not in axes]
        if unknown:
            problems.append(f"{where}: {unknown} are not axes of the mesh; valid axes: {list(axes)}")
        if k not in matched:
            shown = ", ".join(repr(p) for p, _ in leaves[:_SHOWN])
            names = sorted({part for p, _ in leaves for part in p.split("/")})
            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f"; closest names: {', '.join(map(repr, close))}" if close else ""
            problems.append(f"{where}: the pattern matches no leaf (re.search on paths such as {shown}){hint}")
        elif k in too_long:
            path, shape = too_long[k]
            problems.append(f"{where}: {len(spec)} entries for leaf {path!r} of rank {len(shape)} "
                            f"(shape {shape}); give at most {len(shape)} entries")
    return problems


def _problems(rule: Rule | None, leaves: Sequence[tuple[str, Shape]], axes: Sequence[str]) -> list[str]:
    if rule is None:
        return []
    if isinstance(rule, PathRule):
        return _path_rule_problems(rule, leaves, axes) + _problems(rule.fallback, leaves, axes)
    if isinstance(rule, CompositeRule):
        return [p for r in rule.rules for p in _problems(r, leaves, axes)]
    hook = getattr(rule, "problems", None)
    return list(hook(leaves, tuple(axes))) if callable(hook) else []


def _inspects(rule: Rule | None) -> bool:
    if isinstance(rule, PathRule):
        return True
    if isinstance(rule, CompositeRule):
        return any(_inspects(r) for r in rule.rules)
    return callable(getattr(rule, "problems", None))


def check_rule(rule: Rule, tree: PyTree, axis_names: Sequence[str]) -> None:
    """Raise if ``rule`` cannot be right for ``tree`` on any mesh with ``axis_names``.

    Args:
      rule: a pure rule (its path rules, composite parts and ``problems`` hook are checked).
      tree: the parameter tree (shapes are enough).
      axis_names: the mesh axes a plan may use.

    Raises:
      RuleValidationError: every problem found, one per line, naming the rule, the leaf and
        what would be valid.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> from meshplan.pure.rules import PathRule
      >>> tree = {"lm_head": {"weight": np.zeros((32, 8))}}
      >>> check_rule(PathRule([("lm_head", P("tp"))]), tree, ["dp", "tp"])  # fine: no error
      >>> try:
      ...     check_rule(PathRule([("lm_hed", P("tp"))]), tree, ["dp", "tp"])
      ... except RuleValidationError as err:
      ...     print(str(err).split(": ", 1)[1])
      rule 'path' #0 'lm_hed' -> P('tp',): the pattern matches no leaf (re.search on paths such as 'lm_head/weight'); closest names: 'lm_head'.
    """
    axes = tuple(as_str(a, f"axis_names[{i}]") for i, a in enumerate(as_sequence(axis_names, "axis_names")))
    del axis_names
    if not _inspects(rule):
        return  # nothing to check: skip formatting every leaf path
    facts = tree_facts(tree)
    leaves = [(facts.path(i), info.shape) for i, info in enumerate(facts.infos) if info is not None]
    problems = _problems(rule, leaves, axes)
    if problems:
        sep = "\n  - " if len(problems) > 1 else " "
        raise RuleValidationError("rules do not fit the model tree:" + sep + sep.join(problems) + ".")
