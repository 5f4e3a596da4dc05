"""The auto rule: give the biggest dims the first mesh axes that divide them.

Behaviour (the reference ``AutoShardingRule``, made deterministic and safe):

1. leaves with fewer than ``min_shard_size`` elements stay replicated
   (default 1024; the reference's default ``None`` crashes);
2. dims are visited largest first (smallest first with ``reverse``), equal
   sizes in dim order;
3. each dim takes the first *unused* axis, in ``axis_names`` order (else mesh
   order), whose size divides it; axes of size 1 are never spent, since they
   split nothing but would use up the axis.

Every spec this rule emits is valid for storing the array: known axes, each
used once, every split dim divisible.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from meshplan.pure._check import as_int
from meshplan.pure._types import make_spec
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._base import (
    Decision,
    LeafContext,
    canonical_axis_names,
    select_axes,
)
from meshplan.pure.specs._geometry import spec_from_entries

__all__ = ["DEFAULT_MIN_SHARD_SIZE", "AutoRule"]

DEFAULT_MIN_SHARD_SIZE = 1024
"""Leaves with fewer elements than this stay replicated by default: splitting
them saves little memory and costs a collective each time they are used."""


def _min_shard_size(value: Any) -> int:
    if value is None:
        return DEFAULT_MIN_SHARD_SIZE
    out = as_int(value, "min_shard_size")
    if out < 0:
        raise ShardingRuleError(f"min_shard_size={out} must be >= 0 (0 shards every leaf it can).")
    return out


def _auto(shape: tuple[int, ...], sizes: Mapping[str, int], axes: tuple[str, ...], min_shard_size: int,
          reverse: bool, name: str) -> Decision:
    n = math.prod(shape)
    if n < min_shard_size:
        return Decision(make_spec(), f"{n} elements < min_shard_size={min_shard_size}; replicated", name)
    usable = [a for a in axes if sizes[a] > 1]
    # Ties go to the lower dim index either way, so equal dims are not
    # ordered by the sort's stability alone.
    order = sorted(range(len(shape)), key=lambda d: (shape[d] if reverse else -shape[d], d))
    entries: list[tuple[str, ...]] = [()] * len(shape)
    used: set[str] = set()
    steps: list[str] = []
    for d in order:
        for a in usable:
            if a not in used and shape[d] >= sizes[a] and shape[d] % sizes[a] == 0:
                entries[d] = (a,)
                used.add(a)
                steps.append(f"dim {d} ({shape[d]}) <- {a!r}({sizes[a]})")
                break
    if not steps:
        if not shape:
            why = "a scalar has no dim to split"
        elif not usable:
            why = f"no mesh axis of size > 1 among {list(axes)}"
        else:
            listed = ", ".join(f"{a!r}({sizes[a]})" for a in usable)
            why = f"no axis among {listed} divides a dim of {shape}"
        return Decision(make_spec(), f"{why}; replicated", name)
    first = "smallest" if reverse else "largest"
    return Decision(spec_from_entries(entries), f"{first} dims first: " + ", ".join(steps), name)


@dataclasses.dataclass(frozen=True, slots=True)
class AutoRule:
    """The auto rule as a pure, shape-only rule (see the module docstring).

    Attributes:
      axis_names: the mesh axes it may use, in preference order; ``None`` =
        every mesh axis in mesh order.
      min_shard_size: leaves with fewer elements stay replicated (``None`` =
        :data:`DEFAULT_MIN_SHARD_SIZE`).
      reverse: visit the smallest dims first.
      name: the label on its decisions.

    Example:
      >>> import numpy as np
      >>> rule = AutoRule(axis_names=("tp", "dp"))
      >>> rule(LeafContext((1024, 4096), np.dtype("float32"), {"dp": 2, "tp": 4})).spec
      P('dp', 'tp')
      >>> AutoRule()(LeafContext((4096, 1024), np.dtype("float32"), {"dp": 2, "tp": 4}))
      Decision(spec=P('dp', 'tp'), reason="largest dims first: dim 0 (4096) <- 'dp'(2), dim 1 (1024) <- 'tp'(4)", rule='auto')
      >>> AutoRule()(LeafContext((16,), np.dtype("float32"), {"dp": 2})).reason
      '16 elements < min_shard_size=1024; replicated'

    Raises (when called):
      ShardingRuleError: ``axis_names`` names an axis the mesh lacks.
    """

    axis_names: Sequence[str] | None = None
    min_shard_size: int | None = DEFAULT_MIN_SHARD_SIZE
    reverse: bool = False
    name: str = "auto"
    shape_only: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "axis_names", canonical_axis_names(self.axis_names, "axis_names"))
        object.__setattr__(self, "min_shard_size", _min_shard_size(self.min_shard_size))
        if not isinstance(self.reverse, bool):
            raise MeshplanTypeError(f"reverse={self.reverse!r} must be a bool.")
        if not isinstance(self.name, str):
            raise MeshplanTypeError(f"name={self.name!r} must be a string.")

    def __call__(self, ctx: LeafContext) -> Decision:
        axes = select_axes(self.axis_names, ctx.axis_sizes, self.name)
        min_size = DEFAULT_MIN_SHARD_SIZE if self.min_shard_size is None else self.min_shard_size
        return _auto(ctx.shape, ctx.axis_sizes, axes, min_size, self.reverse, self.name)
