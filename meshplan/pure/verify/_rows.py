"""The records a verified plan is made of: one :class:`VerifyRow` per mesh, a :class:`PlanVerification`.

Plain data (no jax), so the command line, ``--json`` and the report's renderers read them without starting
a compiler; :mod:`meshplan.facade.verify` fills them, and :meth:`VerifyRow.from_dict` /
:meth:`PlanVerification.from_dict` read a saved report back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan.pure._check import as_choice, as_real
from meshplan.pure._fields import (
    as_bool,
    as_nonneg,
    as_rank,
    as_text,
    check_fields,
    fields_of,
    instance_of,
    nested,
    optional,
    records,
    tuple_of,
)
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import PlanError
from meshplan.pure.verify._compiled_step import CompiledStep
from meshplan.pure.xla._buffer_report import LiveBuffer

__all__ = ["STATUSES", "PlanVerification", "VerifyRow"]

STATUSES = ("exact", "estimate", "over budget", "not verified")


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyRow:
    """One mesh: the planner's estimate and range, and XLA's figures (or why there are none).

    Attributes:
      mesh: ``"fsdp=4,tp=2"``.
      rank: its rank in the plan (``None`` for ``meshplan check``'s one layout).
      analytic_bytes: the planner's per-device estimate.
      budget_bytes: the bytes per device the plan allows.
      target: where it compiled (``"8 x NVIDIA H100 80GB HBM3 (no GPU: ...)"``).
      status: ``"exact"``, ``"estimate"``, ``"over budget"`` or ``"not verified"``.
      compiler: the compiler and versions of an exact figure (``"XLA:GPU (jax-cuda12-plugin 0.10.2, ...)"``).
      range_low_bytes, range_high_bytes: the estimate's stated range (``None`` where no spread is recorded).
      argument_bytes, temp_bytes, peak_bytes, peak_source: XLA's figures per device.
      compile_seconds: the compile (worker start included when run in a worker).
      error: why there are no figures, or why the mesh is out (``""``).
      largest, largest_note: the biggest buffers live at XLA's peak (LiveBuffer records).
      micro_batches: gradient-accumulation steps the compiled step ran.
      cached: the figures came from the compile cache.
      schedule: a pipeline row's schedule as the search priced it (``"1f1b m=8"``; ``""``: not pipelined).
      compiled_schedule: the schedule the compiled pipelined step ran (``"circular v=1 m=8"``).
      note: what the compiled figure is a check of, where it is not the row's own schedule.
      run_high_bytes: the most a run on the GPU peaks at, for a peak XLA:GPU compiled with no GPU
        (:func:`~meshplan.pure.xla.deviceless_gpu_run_range`: x 1.06, as measured on an H100); ``None``
        where the compiled peak is the run's (TPU, XLA:CPU, a local GPU).
      deviceless: XLA:GPU compiled for GPUs it did not run on (no autotuning).
      compiled_step: the compiled program's step, simulated from its schedule (``None``: not compiled, or not
        simulated: ``step_note`` says why).
      step_note: why there is no compiled step, or what it was priced with where that is not the cluster's
        own program (``""``: nothing to say).

    Example:
      >>> row = VerifyRow("fsdp=8", 1, 100, 200, "8 x XLA:CPU", peak_bytes=125, status="exact")
      >>> row.ratio, row.fits
      (0.8, True)
    """

    mesh: str
    rank: int | None
    analytic_bytes: int | None
    budget_bytes: int
    target: str
    argument_bytes: int | None = None
    temp_bytes: int | None = None
    peak_bytes: int | None = None
    peak_source: str = ""
    compile_seconds: float = 0.0
    error: str = ""
    largest: tuple[Any, ...] = ()
    largest_note: str = ""
    micro_batches: int = 1
    status: str = "exact"
    compiler: str = ""
    range_low_bytes: int | None = None
    range_high_bytes: int | None = None
    cached: bool = False
    schedule: str = ""
    compiled_schedule: str = ""
    note: str = ""
    run_high_bytes: int | None = None
    deviceless: bool = False
    compiled_step: CompiledStep | None = None
    step_note: str = ""

    def __post_init__(self) -> None:
        check_fields(self, _ROW_CHECKS)

    @property
    def ratio(self) -> float | None:
        """Analytic estimate over XLA's peak (1.0: exact; below: the planner is optimistic)."""
        if self.peak_bytes and self.analytic_bytes:
            return self.analytic_bytes / self.peak_bytes
        return None

    @property
    def fits(self) -> bool | None:
        """Whether XLA's peak (for a GPU compiled with no GPU, the top of a run's range) is within the budget
        (``None`` without a compiled peak)."""
        if self.peak_bytes is None or self.status not in ("exact", "over budget"):
            return None
        return (self.run_high_bytes or self.peak_bytes) <= self.budget_bytes

    def describe(self) -> str:
        """One line with the compiler: ``'exact: peak 27.0 GiB (XLA:GPU (jax-cuda12-plugin 0.10.2, ...))'``."""
        if self.status in ("exact", "over budget") and self.peak_bytes is not None:
            return f"{self.summary()} ({self.compiler or self.target})"
        return self.summary()

    def summary(self) -> str:
        """One line: ``'exact: peak 27.0 GiB'``, ``'estimate: 26.0 GiB (range 22.1 GiB - 30.4 GiB)'``, or
        ``'not verified: estimate 26.0 GiB (...); timed out after 600 s'``; a compiled row with its compiled
        schedule's step (``'exact: peak 27.0 GiB; step 5.80 s (compute ...)'``)."""
        if self.status in ("exact", "over budget") and self.peak_bytes is not None:
            run = "" if self.run_high_bytes is None else f" (a run <= {fmt_bytes(self.run_high_bytes)})"
            step = "" if self.compiled_step is None else f"; step {self.compiled_step.describe()}"
            return f"{self.status}: peak {fmt_bytes(self.peak_bytes)}{run}{step}"
        rng = ("" if self.range_low_bytes is None or self.range_high_bytes is None else
               f" (range {fmt_bytes(self.range_low_bytes)} - {fmt_bytes(self.range_high_bytes)})")
        est = "-" if self.analytic_bytes is None else fmt_bytes(self.analytic_bytes)
        if self.status == "estimate":
            return f"estimate: {est}{rng}"
        why = f"; {self.error.removeprefix('not verified: ')}" if self.error else ""
        return f"{self.status}: estimate {est}{rng}{why}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with the ratio)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["largest"] = [b.to_dict() for b in self.largest]
        out["analytic_over_exact"] = self.ratio
        out["compiled_step"] = None if self.compiled_step is None else self.compiled_step.to_dict()
        out["compiled_step_s"] = None if self.compiled_step is None else self.compiled_step.step_s
        return out

    @classmethod
    def from_dict(cls, data: Any) -> VerifyRow:
        """Inverse of :meth:`to_dict` (the derived ``analytic_over_exact`` is read past).

        Raises:
          PlanError: not a row; the message names the field.
        """
        fields = fields_of(cls, data, ignore=("analytic_over_exact", "compiled_step_s"))
        if fields.get("compiled_step") is not None:
            fields["compiled_step"] = nested("compiled_step", lambda: CompiledStep.from_dict(fields["compiled_step"]))
        if "largest" in fields:
            fields["largest"] = records("largest", lambda b: LiveBuffer(**fields_of(LiveBuffer, b)),
                                        fields["largest"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class PlanVerification:
    """A plan's meshes after compiling: the shown rows in rank order, the removed ones, and a note.

    Attributes:
      rows: one per shown mesh, best first (exact, estimate or not verified).
      removed: meshes whose compiled peak is over the budget (best ranked first).
      compiler: the compiler used (``""`` when none is installed).
      note: how to get exact figures where the compiler is missing, or why verification stopped early.
      seconds: wall time of the verification.

    Example:
      >>> PlanVerification((), (), "", "no compiler", 0.0).exact_rows
      ()
    """

    rows: tuple[VerifyRow, ...]
    removed: tuple[VerifyRow, ...]
    compiler: str
    note: str
    seconds: float

    @property
    def exact_rows(self) -> tuple[VerifyRow, ...]:
        """The rows with a compiled peak within the budget."""
        return tuple(r for r in self.rows if r.status == "exact")

    def __post_init__(self) -> None:
        check_fields(self, {"rows": tuple_of(instance_of(VerifyRow)), "removed": tuple_of(instance_of(VerifyRow)),
                            "compiler": as_text, "note": as_text, "seconds": _seconds})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"rows": [r.to_dict() for r in self.rows], "removed": [r.to_dict() for r in self.removed],
                "compiler": self.compiler, "note": self.note, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: Any) -> PlanVerification:
        """Inverse of :meth:`to_dict`.

        Raises:
          PlanError: not a verification; the message names the field path (``rows[0].peak_bytes``).
        """
        fields = fields_of(cls, data)
        for name in ("rows", "removed"):
            fields[name] = records(name, VerifyRow.from_dict, fields[name])
        return nested("verification", lambda: cls(**fields))


def _seconds(value: Any, what: str) -> float:
    return as_real(value, what, allow_zero=True, error=PlanError)


def _status(value: Any, what: str) -> str:
    return as_choice(value, what, STATUSES, error=PlanError)


def _bytes_or_none(value: Any, what: str) -> int | None:
    return optional(as_nonneg)(value, what)


_ROW_CHECKS = {
    "mesh": as_text, "rank": optional(as_rank), "analytic_bytes": _bytes_or_none, "budget_bytes": as_nonneg,
    "target": as_text, "argument_bytes": _bytes_or_none, "temp_bytes": _bytes_or_none,
    "peak_bytes": _bytes_or_none, "peak_source": as_text, "compile_seconds": _seconds, "error": as_text,
    "largest": tuple_of(instance_of(LiveBuffer)), "largest_note": as_text, "micro_batches": as_rank,
    "status": _status, "compiler": as_text, "range_low_bytes": _bytes_or_none, "range_high_bytes": _bytes_or_none,
    "cached": as_bool, "schedule": as_text, "compiled_schedule": as_text, "note": as_text,
    "run_high_bytes": _bytes_or_none, "deviceless": as_bool,
    "compiled_step": optional(instance_of(CompiledStep)), "step_note": as_text,
}
