"""Mesh rules: ``(regex, mesh shape or None)`` pairs chosen by a selector string.

As in loadax's ``MeshConfig.mesh_rules``: a launch script sets a selector
such as ``"tpu-v4-128"`` or ``"gpu-p4de.24xlarge-32"`` and the first rule
whose regex matches picks the mesh shape; with no match the default shape
is used. Two things are stricter than a plain ``re.search`` loop:

- Matching is a **full match** (``re.fullmatch``): ``"tpu-v4"`` does not
  select ``"tpu-v4-128"``. Partial matches silently picking the wrong rule
  is the classic bug here; write ``"tpu-v4-.*"`` to mean a prefix.
- A rule whose value is ``None`` means "this platform has no mesh"; selecting
  it is an error that names the rule, not a silent fall-through to the default.

Every rule is validated up front, whatever the selector, so a typo in the
last rule surfaces on the first run rather than on the one platform that
reaches it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeAlias, TypeVar

from meshplan.pure._check import as_int_tuple, as_sequence, unresolved_shape_problems
from meshplan.pure.errors import MeshplanTypeError, MeshRuleError
from meshplan.pure.mesh._axes import MeshShape
from meshplan.pure.mesh._hybrid import HybridMeshShape

__all__ = ["RuleValue", "select_mesh_shape", "validate_mesh_rules"]

X = TypeVar("X")

RuleValue: TypeAlias = tuple[int, ...] | HybridMeshShape | MeshShape
"""A canonical rule value (None, "no mesh on this platform", aside)."""


def _check_value(value: Any, where: str, problems: list[str]) -> RuleValue | None:
    """The canonical rule value (tuple of ints, HybridMeshShape, MeshShape or None)."""
    if value is None or isinstance(value, (HybridMeshShape, MeshShape)):
        return value
    try:
        shape = as_int_tuple(value, f"{where} mesh shape")
    except MeshplanTypeError as err:
        problems.append(f"{err} Use a tuple of ints, a HybridMeshShape, or None")
        return None
    bad = unresolved_shape_problems(shape, "size")
    if bad:
        problems.append(
            f"{where} mesh shape {shape} is invalid ({', '.join(bad)}; sizes >= 1, or -1 at most once)"
        )
    return shape


def validate_mesh_rules(rules: Sequence[tuple[str, Any]] | None) -> tuple[tuple[str, RuleValue | None], ...]:
    """Checks every mesh rule and returns them canonicalized.

    Args:
      rules: None, or a sequence of ``(regex, value)`` pairs where value is a
        mesh shape (sequence of ints, ``-1`` allowed once), a
        :class:`HybridMeshShape`, a :class:`MeshShape`, or None.

    Returns:
      The rules as a tuple of ``(pattern, value)`` pairs, list shapes turned
      into tuples; ``()`` for None.

    Raises:
      MeshplanTypeError: ``rules`` is not an ordered sequence.
      MeshRuleError: a rule is not a pair, its pattern is not a string or
        not a valid regex, or its value is not a mesh shape; every bad rule
        is listed by index.

    Example:
      >>> validate_mesh_rules([("tpu-v4-.*", [1, -1]), ("cpu", None)])
      (('tpu-v4-.*', (1, -1)), ('cpu', None))
    """
    if rules is None:
        return ()
    items = as_sequence(rules, "mesh_rules")
    problems: list[str] = []
    out: list[tuple[str, RuleValue | None]] = []
    for i, rule in enumerate(items):
        where = f"mesh_rules[{i}]"
        if isinstance(rule, (str, bytes)) or not isinstance(rule, Sequence) or len(rule) != 2:
            problems.append(f"{where}={rule!r} is not a (regex, mesh_shape) pair")
            continue
        pattern, value = rule
        if not isinstance(pattern, str):
            problems.append(f"{where} pattern {pattern!r} is not a string")
        else:
            try:
                re.compile(pattern)
            except re.error as err:
                problems.append(f"{where} pattern {pattern!r} is not a valid regex ({err})")
        out.append((pattern, _check_value(value, where, problems)))
    if problems:
        raise MeshRuleError(
            f"invalid mesh_rules: {'; '.join(problems)}. Each rule is (regex, mesh_shape or None)."
        )
    return tuple(out)


def select_mesh_shape(
    mesh_rules: Sequence[tuple[str, Any]] | None, selector: str | None, default: X
) -> X | RuleValue:
    """The mesh shape the first fully matching rule selects, else ``default``.

    Args:
      mesh_rules: ``(regex, shape or None)`` pairs (see :func:`validate_mesh_rules`).
      selector: the platform string, e.g. ``"tpu-v4-128"``; None selects ``default``.
      default: returned when no rule matches (or there is no selector or rule).

    Returns:
      The matched rule's value (canonicalized), or ``default``.

    Raises:
      MeshplanTypeError: ``selector`` is not a string or None.
      MeshRuleError: a malformed rule, or the first matching rule's value is
        None (the platform explicitly has no mesh).

    Example:
      >>> rules = [("tpu-v4-.*", (4, -1)), ("gpu-.*-32", (2, 16))]
      >>> select_mesh_shape(rules, "tpu-v4-128", (1, -1))
      (4, -1)
      >>> select_mesh_shape(rules, "tpu-v5e-8", (1, -1))
      (1, -1)
    """
    rules = validate_mesh_rules(mesh_rules)
    del mesh_rules
    if selector is None:
        return default
    if not isinstance(selector, str):
        raise MeshplanTypeError(
            f"mesh_selector={selector!r} has type {type(selector).__name__}; expected a str "
            "such as 'tpu-v4-128', or None."
        )
    for i, (pattern, value) in enumerate(rules):
        if re.fullmatch(pattern, selector):
            if value is None:
                raise MeshRuleError(
                    f"mesh_rules[{i}] ({pattern!r}) selects no mesh for selector {selector!r}: "
                    "the rule says this platform is not supported. Give that rule a mesh "
                    "shape, or run with another mesh_selector."
                )
            return value
    return default
