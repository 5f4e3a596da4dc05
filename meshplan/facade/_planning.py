"""Whole-tree planning as the facade runs it: jax's live x64 setting, the cyclic collector paused.

:func:`plan_live` is :func:`meshplan.pure.plan_tree` with the two things only a
live process has: jax's ``jax_enable_x64`` (how wide Python scalar leaves
are) and the interpreter's garbage collector. Every facade planner
(the sharding rules, ``MeshPartitionHelper.plan``, ``LogicalShardingRule``)
plans through it.

Why pause the collector: a plan's spec tree is as many new containers as the
tree has nodes (the 45k-leaf DeepSeek-V3 tree: ~60k dicts, each holding a
PartitionSpec, so each tracked by the collector). Built with the collector
running, they are moved to the oldest generation while the call still runs,
which sets off a full collection of the whole heap in nearly every call:
about twice the rest of the call (see ``benchmarks/RESULTS.md``, Planning
speed), and growing with everything else the program holds. Paused, nothing
is collected during the call; what the caller keeps is collected later like
any other new object, and what it drops is freed by reference counting as
always. No object can be lost: a pause only defers collection.

The pause is process-wide (the collector is one per interpreter). It is
skipped when the collector is already off (the caller's choice, or an
enclosing pause), and the collector is switched back on whatever the call
raised. A ``gc.disable()`` issued by another thread while a plan runs is
undone when the plan ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping

from meshplan.facade._context import x64_enabled
from meshplan.pure._types import PyTree
from meshplan.pure.rules._base import Rule
from meshplan.pure.rules._engine import Plan, plan_tree

__all__ = ["collector_paused", "plan_live"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the ``with`` block (left as it was if already off).

    Example:
      >>> import gc
      >>> with collector_paused():
      ...     gc.isenabled()
      False
      >>> gc.isenabled()
      True
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def plan_live(tree: PyTree, rule: Rule, axis_sizes: Mapping[str, int]) -> Plan:
    """:func:`meshplan.pure.plan_tree` with jax's live x64 setting, the collector paused.

    Args:
      tree: any pytree; leaves are read for shape and dtype only.
      rule: a pure rule.
      axis_sizes: ordered mapping mesh axis name -> size.

    Returns:
      The :class:`~meshplan.pure.Plan` ``plan_tree`` returns.

    Raises:
      ShardingRuleError, MemoryBudgetError, SpecError, MeshplanTypeError: as
        :func:`~meshplan.pure.plan_tree` does.

    Example:
      >>> import jax, numpy as np
      >>> from meshplan.pure import AutoRule
      >>> plan_live({"w": jax.ShapeDtypeStruct((4096, 1024), np.float32)}, AutoRule(), {"tp": 4}).specs
      {'w': P('tp',)}
    """
    x64 = x64_enabled()
    with collector_paused():
        return plan_tree(tree, rule, axis_sizes, x64=x64)
