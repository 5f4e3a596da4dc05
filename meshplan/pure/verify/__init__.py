"""The pure half of verification: the records a compiled plan is made of and the decisions made with them.

The facade (:mod:`meshplan.facade.verify`) compiles reference steps ahead of time; what it returns and decides
is plain data and pure functions here, so the report's renderers and ``--json`` read it without a compiler:
each compile's :class:`CompileOutcome` with its program's step simulated from the schedule
(:class:`CompiledStep`), each mesh's :class:`VerifyRow` (exact, estimate, over budget, not
verified), a plan's :class:`PlanVerification`, the verdict on a compiled peak (:func:`compiled_fit`), the one
outcome-to-row conversion (:func:`outcome_row`), which meshes a plan compiles (:func:`next_to_compile`, and of
those the estimate rejected :func:`near_misses`) and how the compiled figures rerank it (:func:`rank_by_compiled`,
:func:`admit_compiled`).
"""

from meshplan.pure.verify._compiled_step import CompiledStep, CostlyOp, ExposedCollective, compiled_step_of
from meshplan.pure.verify._outcome import CompileOutcome
from meshplan.pure.verify._ranking import ADMITTED, admit_compiled, rank_by_compiled, rejected_under
from meshplan.pure.verify._rows import STATUSES, PlanVerification, VerifyRow
from meshplan.pure.verify._verdict import (
    OOM_SOURCE,
    compiled_fit,
    estimate_range,
    estimate_row,
    near_misses,
    next_to_compile,
    outcome_row,
    uncompiled_dispatch,
)

__all__ = ["ADMITTED", "OOM_SOURCE", "STATUSES", "admit_compiled", "near_misses", "CompileOutcome", "CompiledStep", "CostlyOp", "ExposedCollective",
           "compiled_step_of", "PlanVerification", "VerifyRow", "compiled_fit",
           "estimate_range", "estimate_row", "next_to_compile", "outcome_row", "rank_by_compiled", "rejected_under",
           "uncompiled_dispatch"]
