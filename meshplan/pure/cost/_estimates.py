"""What the cost model says of one mesh, as JSON-ready frozen records: the fullest device's bytes at the step's
peak (:class:`MemoryBreakdown`), one priced collective (:class:`CommTerm`) and the step time (:class:`StepEstimate`).

Every ``to_dict`` returns JSON types only and ``from_dict`` inverts it exactly.

Example:
  >>> m = MemoryBreakdown(params=2**30, grads=2**30, optimizer=2**31, activations=0, budget=2**34)
  >>> m.fits, MemoryBreakdown.from_dict(m.to_dict()) == m
  (True, True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from meshplan.pure._format import fmt_bytes
from meshplan.pure._fields import (
    as_bool,
    as_nonneg,
    as_rank,
    as_seconds,
    as_text,
    as_texts,
    check_fields,
    fields_of,
    optional,
    unchecked,
)
from meshplan.pure.errors import MeshplanTypeError

__all__ = ["CommTerm", "MemoryBreakdown", "StepEstimate"]


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on the fullest device at the step's peak, by kind.

    ``params``, ``grads`` and ``optimizer`` are exact (what live arrays hold);
    ``activations`` is calibrated: what the peak phase holds beyond the state
    (see :mod:`meshplan.pure.cost._step_memory`). ``phase`` names the peak
    phase (``"forward"``, ``"backward"``, ``"update"``; ``""`` in plans saved
    before phases existed) and ``grads_live`` says whether the gradients exist
    then (not at the end of the forward pass).
    """

    params: int
    grads: int
    optimizer: int
    activations: int
    budget: int
    phase: str = ""
    grads_live: bool = True

    def __post_init__(self) -> None:
        check_fields(self, dict.fromkeys(("params", "grads", "optimizer", "activations", "budget"), as_nonneg)
                     | {"phase": as_text, "grads_live": as_bool})

    @classmethod
    def trusted(cls, params: int, grads: int, optimizer: int, activations: int, budget: int, phase: str = "",
                grads_live: bool = True) -> MemoryBreakdown:
        """The record from figures the search computed itself (Python ints >= 0, a phase name, a
        bool), without :meth:`__post_init__`'s checks: a 4096-device search builds about a thousand
        and checking them again cost a tenth of it. Everything else (``from_dict``, a user's
        ``MemoryBreakdown(...)``) goes through the checks.

        Example:
          >>> MemoryBreakdown.trusted(1, 1, 1, 1, 10, "update") == MemoryBreakdown(1, 1, 1, 1, 10, "update")
          True
        """
        return unchecked(cls, (params, grads, optimizer, activations, budget, phase, grads_live))

    @property
    def total(self) -> int:
        """The step's peak on the fullest device: the state live in the peak phase plus its activations."""
        return self.params + self.optimizer + self.activations + (self.grads if self.grads_live else 0)

    @property
    def fits(self) -> bool:
        """Whether the total fits the budget."""
        return self.total <= self.budget

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``total`` for readers; ignored by :meth:`from_dict`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["total"] = self.total
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryBreakdown:
        """Inverse of :meth:`to_dict`."""
        return cls(**fields_of(cls, data, ignore=("total",)))

    def parts(self) -> str:
        """``'params 8.2 GiB, grads 8.2 GiB, optimizer 16.4 GiB, activations 8.4 GiB at the backward peak'``."""
        keys = ("params", "grads", "optimizer", "activations") if self.grads_live else (
            "params", "optimizer", "activations")
        text = ", ".join(f"{self.label(k)} {fmt_bytes(getattr(self, k))}" for k in keys)
        return text + (f" at the {self.phase} peak" if self.phase else "")

    def label(self, part: str) -> str:
        """The name of ``part`` as the peak phase holds it: at the update peak the bytes
        beyond the state are the optimizer's temporaries, not activations.

        Example:
          >>> MemoryBreakdown(1, 1, 1, 1, 10, phase="update").label("activations")
          'update temporaries'
        """
        if not isinstance(part, str):  # an array would compare elementwise below
            raise MeshplanTypeError(f"part={part!r:.60} must be a str naming a part (e.g. 'activations').")
        return "update temporaries" if part == "activations" and self.phase == "update" else part

    def describe(self) -> str:
        """``'41.2 GiB (params 8.2, grads 8.2, optimizer 16.4, activations 8.4 GiB)'``."""
        return f"{fmt_bytes(self.total)} ({self.parts()})"


@dataclasses.dataclass(frozen=True, slots=True)
class CommTerm:
    """One kind of collective a training step runs, priced by the alpha-beta model.

    Attributes:
      what: what moves, e.g. ``"fsdp all-gather of params"``.
      kind: the collective (see :data:`~meshplan.pure.COLLECTIVE_KINDS`).
      axes: the mesh axes of the device group.
      nbytes: the full buffer of one call (as :mod:`meshplan.pure.cost._collective_time` defines it).
      calls: calls per step.
      link: ``"intra"`` (inside ICI domains), ``"inter"`` or ``"intra+inter"`` (two-level).
      seconds: the estimated time of all calls.
      exposed: of ``seconds``, those not hidden under compute (see
        :mod:`meshplan.pure.cost._step_time`); ``None`` in plans saved before step times.
    """

    what: str
    kind: str
    axes: tuple[str, ...]
    nbytes: int
    calls: int
    link: str
    seconds: float
    exposed: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, {"what": as_text, "kind": as_text, "axes": as_texts, "nbytes": as_nonneg,
                            "calls": as_nonneg, "link": as_text, "seconds": as_seconds,
                            "exposed": optional(as_seconds)})

    def with_exposed(self, exposed: float) -> CommTerm:
        """This term with ``exposed`` seconds of it not hidden (a float in ``[0, seconds]``, from
        :func:`~meshplan.pure.cost._step_time.step_time`): only ``exposed`` is checked, the other
        fields were when this term was made.

        Raises:
          PlanError: ``exposed`` is not a finite number >= 0 (MeshplanTypeError: not a number).

        Example:
          >>> CommTerm("x", "all-gather", ("fsdp",), 8, 1, "intra", 0.5).with_exposed(0.25).hidden
          0.25
        """
        return unchecked(CommTerm, (self.what, self.kind, self.axes, self.nbytes, self.calls, self.link,
                                     self.seconds, as_seconds(exposed, "CommTerm.exposed")))

    @property
    def hidden(self) -> float | None:
        """Seconds hidden under compute (``None`` when not priced)."""
        return None if self.exposed is None else max(0.0, self.seconds - self.exposed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {f.name: list(self.axes) if f.name == "axes" else getattr(self, f.name)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommTerm:
        """Inverse of :meth:`to_dict`."""
        return cls(**fields_of(cls, data))


@dataclasses.dataclass(frozen=True, slots=True)
class StepEstimate:
    """A mesh's predicted step time (see :mod:`meshplan.pure.cost._step_time`).

    Attributes:
      compute_s: seconds of compute per device (FLOPs at peak x efficiency).
      exposed_s: seconds of communication not hidden under compute.
      tokens_per_s: tokens per second per device.
      mfu: model FLOPs utilisation (model FLOPs without recompute / (step x peak)); 0 when the peak is unknown.
      flops: executed FLOPs per device per step (recompute included).
      efficiency: the fraction of peak FLOP/s assumed.
      micro_batches: gradient-accumulation steps the step runs (chosen by the search or fixed; 1 = none).
    """

    compute_s: float
    exposed_s: float
    tokens_per_s: float
    mfu: float
    flops: float
    efficiency: float
    micro_batches: int = 1

    def __post_init__(self) -> None:
        check_fields(self, {**dict.fromkeys(("compute_s", "exposed_s", "tokens_per_s", "mfu", "flops", "efficiency"),
                                            as_seconds), "micro_batches": as_rank})

    @property
    def step_s(self) -> float:
        """Predicted seconds per step: compute plus exposed communication."""
        return self.compute_s + self.exposed_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``step_s`` for readers; ignored by :meth:`from_dict`)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["step_s"] = self.step_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepEstimate:
        """Inverse of :meth:`to_dict`."""
        return cls(**fields_of(cls, data, ignore=("step_s",)))

