"""A verified row's step time, read off the program XLA compiled (:class:`CompiledStep`). Plain data.

The worker that compiles a mesh's reference step also reads the compiled program's schedule
(:func:`meshplan.pure.xla.read_schedule`) and simulates it (:func:`meshplan.pure.cost.simulate_schedule`): the
compute stream op by op, each collective beside it from its start to the done that waits for it, on the link
its replica groups cross. :func:`compiled_step_of` keeps what a reader needs of that simulation to see why a
layout is slow: the step, its compute and what the stream waited for, the collectives by kind and link, the ops
that cost most, what was priced by assumption, and on XLA:TPU the compiler's own floor.

Example:
  >>> step = CompiledStep(5.8, 5.6, 0.2, (ExposedCollective("all-gather", "inter", 80, 1.9, 0.2),))
  >>> step.describe(), step.hidden_s
  ('5.80 s (compute 5.60 s + waiting 200.0 ms)', 1.7)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan.pure._check import as_real
from meshplan.pure._fields import (
    as_nonneg,
    as_text,
    as_texts,
    check_fields,
    fields_of,
    instance_of,
    optional,
    records,
    tuple_of,
)
from meshplan.pure.cost import ScheduleTime
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = ["CompiledStep", "CostlyOp", "ExposedCollective", "compiled_step_of"]

_TOP_OPS = 5


def _seconds(value: Any, what: str) -> float:
    return as_real(value, what, allow_zero=True, error=PlanError)


def _fmt(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


@dataclasses.dataclass(frozen=True, slots=True)
class ExposedCollective:
    """The collectives of one kind on one link, summed over the step: their time and what the stream waited.

    Attributes:
      kind: ``"all-gather"``, ``"reduce-scatter"``, ``"all-reduce"``, ``"all-to-all"``, ``"collective-permute"``
        (``"copy"``: an async copy, e.g. a host offload).
      link: ``"intra"`` (inside a node or slice), ``"inter"`` (across them) or ``"copy"``.
      calls: how many the step runs (loop trips counted).
      seconds: their time on the link.
      exposed_s: seconds the compute stream waited for them.
    """

    kind: str
    link: str
    calls: int
    seconds: float
    exposed_s: float

    def __post_init__(self) -> None:
        check_fields(self, {"kind": as_text, "link": as_text, "calls": as_nonneg, "seconds": _seconds,
                            "exposed_s": _seconds})


@dataclasses.dataclass(frozen=True, slots=True)
class CostlyOp:
    """One of the ops that cost the compute stream most: its name in the program, its kind, its seconds."""

    name: str
    kind: str
    seconds: float

    def __post_init__(self) -> None:
        check_fields(self, {"name": as_text, "kind": as_text, "seconds": _seconds})


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledStep:
    """The compiled program's step, simulated from its schedule.

    Attributes:
      step_s: seconds per step: the compute stream's time plus what it waited for.
      compute_s: seconds the stream computes (each op at its roofline).
      exposed_s: seconds it waits for collectives and copies.
      collectives: the collectives by kind and link, most waited for first.
      top_ops: the ops that cost the stream most, most first.
      approximations: what was priced by assumption (an op the reader did not understand, ...).
      xla_floor_s: XLA:TPU's own ``optimal_seconds`` for the program (each op at its bottleneck rate, no
        interconnect), a floor beside the simulation; ``None`` where XLA gives none (XLA:GPU with no device).
    """

    step_s: float
    compute_s: float
    exposed_s: float
    collectives: tuple[ExposedCollective, ...] = ()
    top_ops: tuple[CostlyOp, ...] = ()
    approximations: tuple[str, ...] = ()
    xla_floor_s: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, {"step_s": _seconds, "compute_s": _seconds, "exposed_s": _seconds,
                            "collectives": tuple_of(instance_of(ExposedCollective)),
                            "top_ops": tuple_of(instance_of(CostlyOp)), "approximations": as_texts,
                            "xla_floor_s": optional(_seconds)})

    @property
    def hidden_s(self) -> float:
        """Seconds of collective time that ran under compute."""
        return round(sum(max(0.0, c.seconds - c.exposed_s) for c in self.collectives), 12)

    def describe(self) -> str:
        """``'5.80 s (compute 5.60 s + waiting 200.0 ms)'``, with XLA's floor where it gives one."""
        floor = "" if self.xla_floor_s is None else f"; XLA's floor {_fmt(self.xla_floor_s)}"
        return f"{_fmt(self.step_s)} (compute {_fmt(self.compute_s)} + waiting {_fmt(self.exposed_s)}{floor})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :meth:`from_dict` inverts it."""
        return {"step_s": self.step_s, "compute_s": self.compute_s, "exposed_s": self.exposed_s,
                "collectives": [dataclasses.asdict(c) for c in self.collectives],
                "top_ops": [dataclasses.asdict(o) for o in self.top_ops],
                "approximations": list(self.approximations), "xla_floor_s": self.xla_floor_s}

    @classmethod
    def from_dict(cls, data: Any) -> CompiledStep:
        """Inverse of :meth:`to_dict`.

        Raises:
          PlanError: not a compiled step; the message names the field.
        """
        fields = fields_of(cls, data)
        if "collectives" in fields:
            fields["collectives"] = records("collectives", lambda d: ExposedCollective(**fields_of(ExposedCollective, d)),
                                            fields["collectives"])
        if "top_ops" in fields:
            fields["top_ops"] = records("top_ops", lambda d: CostlyOp(**fields_of(CostlyOp, d)), fields["top_ops"])
        if "approximations" in fields:
            fields["approximations"] = as_texts(fields["approximations"], "approximations")
        return cls(**fields)


def compiled_step_of(schedule: ScheduleTime, *, xla_floor_s: float | None = None,
                     top: int = _TOP_OPS) -> CompiledStep:
    """What a verified row keeps of a simulated schedule: the step, the collectives summed by kind and link
    (most waited for first; ties by kind, link), the ``top`` costliest ops, the approximations, XLA's floor.

    Raises:
      MeshplanTypeError: ``schedule`` is not a :class:`~meshplan.pure.cost.ScheduleTime`.

    Example:
      >>> from meshplan.pure.cost import CollectiveExposure, OpTime, ScheduleTime
      >>> sim = ScheduleTime(1.0, 0.9, 0.1, (CollectiveExposure("ag.1", "all-gather", 8, 8, "intra", 2, 0.3, 0.1),),
      ...                    (OpTime("fusion.3", "matmul", 0.5, 2, 1e12, 1e9),))
      >>> compiled_step_of(sim).collectives[0].calls, compiled_step_of(sim).top_ops[0].name
      (2, 'fusion.3')
    """
    if not isinstance(schedule, ScheduleTime):
        raise MeshplanTypeError(f"schedule={schedule!r:.80} must be a ScheduleTime (simulate_schedule's result).")
    summed: dict[tuple[str, str], list[float]] = {}
    for c in schedule.collectives:
        acc = summed.setdefault((c.kind, c.link), [0, 0.0, 0.0])
        acc[0] += c.calls
        acc[1] += c.seconds
        acc[2] += c.exposed_s
    collectives = tuple(ExposedCollective(k, link, int(n), s, e) for (k, link), (n, s, e) in
                        sorted(summed.items(), key=lambda kv: (-kv[1][2], -kv[1][1], kv[0])))
    ops = tuple(CostlyOp(o.name, o.kind, o.seconds) for o in schedule.top_ops[:top])
    return CompiledStep(schedule.step_s, schedule.compute_s, schedule.exposed_s, collectives, ops,
                        tuple(schedule.approximations), xla_floor_s)
