"""Replaying a searched plan on a user's tree: leaves matched by normalised path and shape, not dtype.

A :class:`~meshplan.pure.MeshCandidate` records one
:class:`~meshplan.pure.search._candidate.ParamGroup` per (path template,
shape, dtype). The tree a user hands back to ``specs_for`` is often written
differently from the one searched: linen's ``{"params": tree}``, nnx's
``.../kernel/value`` boxes, a :class:`~meshplan.pure.Preset`, or fp32
parameters against a bf16 plan. None of that changes a PartitionSpec, so
:class:`GroupRule` matches on :func:`~meshplan.pure.rules._conventions.normalize_path`
forms and the shape, and uses the dtype only to choose between groups that
differ in nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from meshplan.pure._types import Shape
from meshplan.pure.errors import ShardingRuleError
from meshplan.pure.rules._axis_kind import path_template
from meshplan.pure.rules._base import Decision, LeafContext
from meshplan.pure.rules._conventions import normalize_path

__all__ = ["GroupRule"]

GroupRecord = tuple[str, Shape, str, Decision]
"""``(path or path template, shape, dtype name, decision)``: one recorded parameter group."""


class GroupRule:
    """A pure rule giving each leaf the decision of the recorded group it belongs to.

    A leaf matches a record with the same normalised exact path, else the same
    normalised path template (layer and expert indices as ``*``), and the same
    shape; among matches, one with the leaf's dtype wins, else the first.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> from meshplan.pure.rules import plan_tree
      >>> rule = GroupRule([("layers/*/w", (4, 4), "bfloat16", Decision(P("tp"), "saved", "plan"))])
      >>> tree = {"params": {"layers": [{"w": np.zeros((4, 4), np.float32)}]}}
      >>> plan_tree(tree, rule, {"tp": 2}).specs
      {'params': {'layers': [{'w': P('tp',)}]}}
    """

    __slots__ = ("_exact", "_template", "name")
    shape_only: ClassVar[bool] = False

    def __init__(self, records: Iterable[GroupRecord], *, name: str = "plan") -> None:
        self.name = name
        self._exact: dict[tuple[str, Shape], list[tuple[str, Decision]]] = {}
        self._template: dict[tuple[str, Shape], list[tuple[str, Decision]]] = {}
        for pattern, shape, dtype, decision in records:
            norm = normalize_path(pattern)
            table = self._template if "*" in norm.split("/") else self._exact
            table.setdefault((norm, tuple(shape)), []).append((dtype, decision))

    def __repr__(self) -> str:
        return f"GroupRule(name={self.name!r}, {len(self._exact) + len(self._template)} groups)"

    def __call__(self, ctx: LeafContext) -> Decision:
        norm = normalize_path(ctx.path)
        found = self._exact.get((norm, ctx.shape)) or self._template.get((path_template(norm), ctx.shape))
        if not found:
            near = sorted(t for t, s in self._template if t.split("/")[-1] == norm.split("/")[-1])[:3]
            hint = f"; groups with that name: {near}" if near else ""
            raise ShardingRuleError(
                f"{ctx.path}: no parameter group of this plan matches {path_template(norm)!r} {ctx.shape}"
                f"{hint}. The plan was made for a different parameter tree (another model or size); "
                "prefixes such as params/, box tails such as /value and the dtype do not matter.")
        dtype = str(ctx.dtype)
        return next((d for dt, d in found if dt == dtype), found[0][1])
