"""A mesh as the search scores it (:class:`Scored`), and the verdict its rank gives it (:func:`verdict`).

Most meshes of a search are scored and never priced: a :class:`Scored` holds the sizes, the plan's key and the
memory from the start, and the collectives, their seconds and the step only once a pricing pass reaches it
(:mod:`meshplan.pure.search._search`). The meshes shown get a verdict: the best one's step (or communication)
and its largest exposed term, the others' difference from it, each with the room it leaves in the budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from meshplan.pure._format import fmt_bytes
from meshplan.pure.cost._estimates import MemoryBreakdown
from meshplan.pure.cost._placement import AxisPlacement, Pending, to_terms
from meshplan.pure.cost._step_time import StepTime

__all__ = ["Scored", "verdict"]


@dataclasses.dataclass(slots=True)
class Scored:
    """One mesh as the search scores it: its sizes, plan and memory, and once priced its collectives and step."""

    sizes: tuple[int, ...]
    plan_key: tuple[Any, ...]
    memory: MemoryBreakdown
    micro_batches: int = 1  # gradient-accumulation steps (chosen per mesh or fixed)
    # Both set when priced (_price_steps): most meshes are never priced.
    placement: AxisPlacement | None = None
    pending: Sequence[Pending] = ()
    seconds: Any = 0.0  # filled in by one vectorized pricing pass over every mesh
    # Compute + exposed communication, from the same pass: the step ranked (step_seconds), and its
    # whole StepTime (a record per collective term) only for the meshes shown (_Search.timed).
    step_s: float = 0.0
    time: StepTime | None = None
    # Seconds of each pending collective, from that pass (numpy's elementwise arithmetic gives each
    # the same value whatever else is priced with it, so candidates reuse them).
    term_seconds: Sequence[float] = ()
    # Its activation collectives and their seconds, when priced before the rest (_Search._pass's bound).
    activations: list[Pending] | None = None
    activation_seconds: Sequence[float] = ()


def verdict(s: Scored, best: Scored, rank: int, budget: int, rank_by: str = "comm", *, tied: bool = False) -> str:
    """The sentence a ranked mesh ``s`` shows against the ``best`` one (``rank`` 1: the best itself): its step
    (``rank_by="time"``) or its communication, and the room it leaves in the ``budget``. A ``tied`` mesh is within
    the step-time model's resolution of the best (:mod:`meshplan.pure.search._ties`): it says so rather than a
    difference the model cannot see."""
    room = f"{fmt_bytes(s.memory.total)} of {fmt_bytes(budget)} budget"
    if s.micro_batches > 1:
        room += f" with {s.micro_batches} micro-batches"
    if rank_by == "time" and s.time is not None and best.time is not None:
        t = s.time
        worst = max(t.terms, key=lambda e: e.exposed, default=None)
        exposed = (f"; most exposed: {worst.what} {worst.exposed:.3g} s"
                   if worst is not None and worst.exposed > 0 else "")
        assert s.placement is not None  # a mesh shown was priced, so placed
        device = s.placement.cluster.device
        if device.peak_bf16_flops is None:
            # No peak FLOP/s for this device: compute is not priced, so neither a compute
            # time nor an MFU is claimed; the step is its exposed communication alone.
            what = (f"{t.step_s:.3g} s of exposed communication; compute not priced: no peak FLOP/s for "
                    f"{device.name!r}{exposed}")
        else:
            what = (f"{t.step_s:.3g} s = compute {t.compute_s:.3g} s + exposed communication {t.exposed_s:.3g} s "
                    f"(hidden {t.hidden_s:.3g} s), MFU {t.mfu:.0%}{exposed}")
        if rank == 1:
            lead = ("first of the meshes tied within the step-time model's resolution: the fewest bytes over the "
                    "network" if tied else "fastest predicted step")
            return f"best: {lead} ({what}); {room}"
        if tied:
            return f"rank {rank}: tied with the best, within the step-time model's resolution ({what}); {room}"
        extra = f"{(t.step_s / best.step_s - 1) * 100:+.1f}%" if best.step_s > 0 else f"+{t.step_s:.3g} s"
        return f"rank {rank}: {extra} step time vs best ({what}); {room}"
    top = max(to_terms(s.pending, s.term_seconds), key=lambda t: t.seconds, default=None)
    largest = f"; largest: {top.what} {top.seconds:.3g} s" if top is not None and top.seconds > 0 else ""
    if rank == 1:
        return f"best: least step communication ({s.seconds:.3g} s{largest}); {room}"
    extra = f"{(s.seconds / best.seconds - 1) * 100:+.0f}%" if best.seconds > 0 else f"+{s.seconds:.3g} s"
    return f"rank {rank}: {extra} communication vs best ({s.seconds:.3g} s{largest}); {room}"
