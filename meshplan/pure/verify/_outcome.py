"""What one compile gave (:class:`CompileOutcome`): XLA's figures, or why there are none. Plain data.

The verification's workers return one per job, the compile cache stores them, and
:func:`~meshplan.pure.verify.outcome_row` turns one into a row; none of them needs a compiler.
"""

from __future__ import annotations

import dataclasses

from meshplan.pure._fields import as_bool, as_nonneg, as_seconds, as_text, check_fields, instance_of, optional
from meshplan.pure.verify._compiled_step import CompiledStep
from meshplan.pure.xla._compiled_memory import CompiledMemory

__all__ = ["CompileOutcome"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompileOutcome:
    """What a compile gave: XLA's figures, or why there are none.

    Attributes:
      target: where it compiled (``"8 x NVIDIA H100 80GB HBM3 (no GPU: meshplan's shipped description)"``).
      memory: XLA's per-device figures (``None`` when the compile failed).
      oom: the compiler refused the step as too big for the device (XLA:TPU's out-of-memory).
      oom_required_bytes, oom_available_bytes: the figures of XLA's out-of-memory message, where given.
      error: why there are no figures (``""`` when there are).
      seconds: the wall time of the job, worker start included.
      deviceless: XLA:GPU compiled for GPUs it did not run on (no autotuning: a run on the GPU may peak
        higher, :func:`~meshplan.pure.xla.deviceless_gpu_run_range`).
      step: the compiled program's step, simulated from its schedule (``None``: not simulated; ``step_note``
        says why).
      step_note: why there is no simulated step, or what the simulated one assumed (``""``: nothing to say).

    Example:
      >>> CompileOutcome("8 x XLA:CPU", None, error="timed out after 1 s").ok
      False
    """

    target: str
    memory: CompiledMemory | None
    oom: bool = False
    oom_required_bytes: int | None = None
    oom_available_bytes: int | None = None
    error: str = ""
    seconds: float = 0.0
    deviceless: bool = False
    step: CompiledStep | None = None
    step_note: str = ""

    def __post_init__(self) -> None:
        # Checked when made, so outcome_row reads a CompileOutcome it is given without checking it again.
        check_fields(self, _OUTCOME_CHECKS)

    @property
    def ok(self) -> bool:
        """Whether XLA gave figures."""
        return self.memory is not None


_OUTCOME_CHECKS = {
    "target": as_text, "memory": optional(instance_of(CompiledMemory)), "oom": as_bool,
    "oom_required_bytes": optional(as_nonneg), "oom_available_bytes": optional(as_nonneg), "error": as_text,
    "seconds": as_seconds, "deviceless": as_bool, "step": optional(instance_of(CompiledStep)), "step_note": as_text,
}
