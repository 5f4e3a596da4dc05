"""XLA's own step floor (``cost_analysis()["optimal_seconds"]``), read back when XLA marks ops it cannot price.

XLA's ``HloCostAnalysis`` sums, over the ops of a module (each loop body once), the time of each op at
its bottleneck rate (FLOPs at peak, bytes at peak bandwidth): ``optimal_seconds``, a floor under any run
of that program. A custom call it cannot price adds ``-1`` to the sum (its marker for "unknown"), so one
such op turns the floor negative. On XLA:TPU (libtpu 0.0.42.1) the custom calls that do so are
:data:`XLA_TPU_UNPRICED` (read off compiled programs: a step with 24 ``ConcatBitcast`` calls reported
``-23.9947``, one with a ``SliceId`` and three ``ZeroCrop`` calls ``-3.99986``, an MoE step with three
``ConcatBitcast`` and two each of ``PrepareAsyncCallStart`` / ``-Done`` ``-6.99721``; steps with none of them
reported a positive figure). :func:`xla_floor` adds the count back when that leaves the figure at or above 0;
otherwise the floor is unknown. A target missing from the list would leave the figure short by a whole
second per call: the list is what was observed, not a documented one.

Example:
  >>> xla_floor(0.25, ScheduledProgram("main", ()))
  0.25
"""

from __future__ import annotations

import math

from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.xla._schedule_records import ScheduledProgram

__all__ = ["XLA_TPU_UNPRICED", "unpriced_calls", "xla_floor"]

XLA_TPU_UNPRICED: tuple[str, ...] = ("ConcatBitcast", "PrepareAsyncCallDone", "PrepareAsyncCallStart", "SliceId",
                                     "ZeroCrop")
"""Custom-call targets XLA:TPU's cost analysis marks unknown (``-1`` each in ``optimal_seconds``)."""


def unpriced_calls(program: ScheduledProgram) -> int:
    """Ops of :data:`XLA_TPU_UNPRICED` in the program, each loop body counted once (as XLA counts them).

    Example:
      >>> unpriced_calls(ScheduledProgram("main", ()))
      0
    """
    if not isinstance(program, ScheduledProgram):
        raise MeshplanTypeError(f"program={program!r:.60} must be a ScheduledProgram (read_schedule(text)).")
    return sum(1 for comp in program.computations for op in comp.ops if op.target in XLA_TPU_UNPRICED)


def xla_floor(reported: float, program: ScheduledProgram) -> float | None:
    """XLA's ``optimal_seconds`` for ``program``, its unknown markers taken back out (the module docstring).

    Args:
      reported: ``compiled.cost_analysis()["optimal_seconds"]``.
      program: the same compile's :func:`~meshplan.pure.xla.read_schedule`.

    Returns:
      The floor in seconds, or ``None`` when the figure is negative and the program's unpriced calls do
      not account for it.

    Example:
      >>> xla_floor(-1.0, ScheduledProgram("main", ())) is None
      True
    """
    finite = isinstance(reported, float) and math.isfinite(reported) or (
        isinstance(reported, int) and not isinstance(reported, bool) and abs(reported) < 2**53)
    if not finite:
        raise MeshplanTypeError(f"reported={reported!r:.60} must be the finite number cost_analysis() gives.")
    if reported >= 0:
        return float(reported)
    fixed = reported + unpriced_calls(program)
    return float(fixed) if fixed >= 0 else None
