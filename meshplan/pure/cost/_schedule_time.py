"""Step time of a compiled program, simulated from its schedule: a compute stream, collectives beside it.

Input: the program XLA will run (:func:`meshplan.pure.xla.read_schedule`), a :class:`Roofline` for the
device and the :class:`ScheduleLinks` of the cluster. The simulation:

- **the compute stream** runs the ops of the entry computation in schedule order, one after the
  other, each for its roofline time (:meth:`Roofline.seconds`: FLOPs at the matmul efficiency for
  its size, or bytes at HBM bandwidth, whichever is slower, plus a launch cost per kernel);
  plumbing (``free`` ops) costs nothing; an op the reader did not understand is priced as
  memory-bound and said in :attr:`ScheduleTime.approximations`;
- **an async collective** runs from its start to its done on the link its replica groups cross
  (``intra`` inside one node or slice, ``inter`` across), for the seconds meshplan's collective model
  gives it (:func:`~meshplan.pure.cost.collective_time`: ring all-gather / reduce-scatter / all-reduce /
  all-to-all; a permute or a send is one transfer, ``latency + bytes / bandwidth``). Collectives in
  flight on one link share it equally (each progresses at ``1 / k`` of its rate while ``k`` run);
  the latency term is shared like the rest, a simplification;
- **a done** waits until its collective has finished: the wait is that collective's *exposed* time;
- **a sync collective** (XLA:CPU's, XLA:TPU's outside a chain, XLA:GPU's ``is_sync``) starts and is
  waited for where it stands: all of it is exposed unless it shares the link with others;
- **an async copy** (``copy-start`` / ``copy-done``) runs beside the stream on a copy engine at HBM
  bandwidth; a copy's done waits like a collective's;
- **a loop** runs its condition and body ``trips`` times and its condition once more. Iterations are
  simulated one by one while collectives started before the loop are still in flight; once the state
  repeats (nothing in flight at an iteration's start), the remaining iterations each take what the last
  one took. A ``call`` runs its callee in place; a ``conditional`` runs its costliest branch.

The result is deterministic (no set or hash order decides anything): ``step_s = compute_s + exposed_s``,
the exposed time of each collective (kind, bytes, group size, link), and the ops that cost most.
"""

from __future__ import annotations

import dataclasses
import math
from meshplan.pure.cost._collective_time import COLLECTIVE_KINDS, collective_time
from meshplan.pure.cost._roofline import Roofline, ScheduleLinks
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.xla._schedule_records import ScheduledOp, ScheduledProgram

__all__ = ["CollectiveExposure", "OpTime", "ScheduleTime", "simulate_schedule"]

_KERNELS = frozenset({"matmul", "attention", "memory", "copy", "unknown"})
_COPY_LANE = "copy"
_MAX_DEPTH = 32


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveExposure:
    """One collective of the program: what it moved, on which link, and how much of it the step waited for.

    Attributes:
      name: the start's name (its computation's, for one inside a loop).
      kind: ``"all-gather"``, ``"reduce-scatter"``, ... (``"copy"`` for an async copy).
      nbytes: bytes per call (the buffer ``B`` of the collective model).
      group_size: devices per replica group.
      link: ``"intra"``, ``"inter"`` or ``"copy"``.
      calls: how many times the step runs it (loop trips included).
      seconds: its time alone on its link, summed over the calls.
      exposed_s: seconds the stream waited for it, summed over the calls.
    """

    name: str
    kind: str
    nbytes: int
    group_size: int
    link: str
    calls: int
    seconds: float
    exposed_s: float

    @property
    def hidden_s(self) -> float:
        """Seconds of it that ran under compute (``seconds - exposed_s``, never below 0)."""
        return max(0.0, self.seconds - self.exposed_s)


@dataclasses.dataclass(frozen=True, slots=True)
class OpTime:
    """Seconds one op costs the compute stream per step (all its runs), with its kind, FLOPs and bytes."""

    name: str
    kind: str
    seconds: float
    runs: int
    flops: float
    bytes_accessed: float


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleTime:
    """The simulated step (see the module docstring).

    Attributes:
      step_s: seconds per step, ``compute_s + exposed_s``.
      compute_s: seconds the stream computes.
      exposed_s: seconds the stream waits for collectives and copies.
      collectives: every collective and async copy, most exposed first.
      top_ops: the ops that cost the stream most, most first.
      approximations: what the simulation priced by assumption (ops the reader did not understand,
        loops of unknown trip count, groups it could not read).
    """

    step_s: float
    compute_s: float
    exposed_s: float
    collectives: tuple[CollectiveExposure, ...]
    top_ops: tuple[OpTime, ...]
    approximations: tuple[str, ...] = ()

    @property
    def hidden_s(self) -> float:
        """Seconds of collective time that ran under compute."""
        return sum(c.hidden_s for c in self.collectives)


class _Flight:
    __slots__ = ("key", "lane", "left", "total", "record")

    def __init__(self, key: str, lane: str, left: float, record: str) -> None:
        self.key, self.lane, self.left, self.total, self.record = key, lane, left, left, record


class _Scope:
    """One run of a computation: its starts not yet waited for (pair -> record) and the pairs waited for
    (a sync collective's done, a recv's done after its send's) whose dones are then no-ops."""

    __slots__ = ("name", "pending", "waited")

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending: dict[str, str] = {}
        self.waited: set[str] = set()


class _Sim:
    """The mutable state of one simulation: the stream's clock, the collectives in flight per lane."""

    def __init__(self, program: ScheduledProgram, roof: Roofline, links: ScheduleLinks) -> None:
        self.by_name = {c.name: c for c in program.computations}
        self.partitions = program.num_partitions
        self.roof, self.links = roof, links
        self.now = 0.0
        self.compute = 0.0
        self.flights: list[_Flight] = []  # in start order: a deterministic order for equal completions
        self.done: dict[str, float] = {}  # key -> completion time of collectives finished and not yet waited for
        self.records: dict[str, list[float | int | str]] = {}  # record -> [kind, bytes, group, lane, calls, s, exposed]
        self.ops: dict[str, list[float]] = {}  # op -> [seconds, runs, flops, bytes]
        self.kinds: dict[str, str] = {}
        self.notes: dict[str, int] = {}

    # --- the links --------------------------------------------------------------------------------
    def _advance(self, until: float) -> None:
        """Progress every flight to time ``until`` (processor sharing per lane)."""
        while self.flights and self.now < until:
            lanes: dict[str, list[_Flight]] = {}
            for f in self.flights:
                lanes.setdefault(f.lane, []).append(f)
            # The next completion over all lanes: a flight's remaining work at 1/k of its rate.
            step = min(min(f.left for f in fl) * len(fl) for fl in lanes.values())
            dt = min(step, until - self.now)
            for fl in lanes.values():
                k = len(fl)
                for f in fl:
                    # A flight this step finishes ends exactly: subtracting would leave a rounding residue that
                    # the next steps take in ever smaller pieces (millions on a TPU program of 3k ops).
                    f.left = 0.0 if f.left * k <= dt * (1 + 1e-9) else f.left - dt / k
            self.now += dt
            for f in [f for f in self.flights if f.left <= 1e-9 * f.total]:
                self.flights.remove(f)
                self.done[f.key] = self.now
        self.now = max(self.now, until)

    def _wait(self, key: str) -> float:
        """Block the stream until flight ``key`` completes; returns the seconds waited."""
        start = self.now
        while key not in self.done and any(f.key == key for f in self.flights):
            lanes: dict[str, list[_Flight]] = {}
            for f in self.flights:
                lanes.setdefault(f.lane, []).append(f)
            step = min(min(f.left for f in fl) * len(fl) for fl in lanes.values())
            # A step below the clock's resolution at this time still ends the flights that are due.
            self._advance(max(self.now + step, math.nextafter(self.now, math.inf)))
        self.done.pop(key, None)
        return self.now - start

    # --- pricing ------------------------------------------------------------------------------------
    def _collective_seconds(self, op: ScheduledOp) -> tuple[float, str]:
        coll = op.collective
        assert coll is not None
        try:
            lane = self.links.link_of(coll.groups, network=coll.network)
        except PlanError as err:
            self._note(f"{op.name}: {err} Priced on the fast link.")
            lane = "intra"
        n = coll.group_size or (self.links.num_domains if coll.network else 0)
        if n == 0 and coll.nbytes > 0:  # groups the reader could not size: all of the program's devices
            n = self.partitions
            self._note(f"{op.name}: replica groups not read; priced over all {n} devices")
        if n <= 1 or coll.nbytes == 0:
            return 0.0, lane
        link = self.links.link(lane)
        kind = "all-to-all" if coll.kind == "ragged-all-to-all" else coll.kind
        if kind in COLLECTIVE_KINDS:
            return float(collective_time(kind, coll.nbytes, n, link)), lane  # type: ignore[arg-type]
        # A permute, a send, a broadcast: each device sends its buffer once, one hop.
        return link.latency + coll.nbytes / link.bandwidth, lane

    def _note(self, text: str) -> None:
        self.notes[text] = self.notes.get(text, 0) + 1

    def _charge(self, op: ScheduledOp, seconds: float, scope: str) -> None:
        key = f"{scope}/{op.name}"
        acc = self.ops.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        acc[0] += seconds
        acc[1] += 1
        acc[2] += op.flops
        acc[3] += op.bytes_accessed
        self.kinds[key] = op.kind
        self.compute += seconds
        self._advance(self.now + seconds)

    def _start(self, key: str, record: str, lane: str, seconds: float, kind: str, nbytes: int, group: int) -> None:
        rec = self.records.setdefault(record, [kind, nbytes, group, lane, 0, 0.0, 0.0])
        rec[4] = int(rec[4]) + 1
        rec[5] = float(rec[5]) + seconds
        if seconds > 0:
            self.flights.append(_Flight(key, lane, seconds, record))
        else:
            self.done[key] = self.now

    def _expose(self, record: str, waited: float) -> None:
        if record in self.records:
            self.records[record][6] = float(self.records[record][6]) + waited

    # --- running computations --------------------------------------------------------------------
    def run(self, name: str, depth: int = 0) -> None:
        """Run the stream computation ``name`` at the current state."""
        if depth > _MAX_DEPTH:
            self._note(f"computations nested deeper than {_MAX_DEPTH} (recursion?): the rest not simulated")
            return
        comp = self.by_name.get(name)
        if comp is None:
            self._note(f"computation {name} is not in the program: not simulated")
            return
        scope = _Scope(name)
        for op in comp.ops:
            self._run_op(op, scope, depth)
        for pair, record in scope.pending.items():  # a start with no done here: the computation ends waiting for it
            self._note(f"{record}: no done in its computation; waited for at the computation's end")
            self._expose(record, self._wait(pair))

    def _run_op(self, op: ScheduledOp, where: _Scope, depth: int) -> None:
        scope, pending = where.name, where.pending
        kind = op.kind
        if op.note:
            self._note(f"{op.name}: {op.note}")
        if kind in _KERNELS:
            self._charge(op, self.roof.seconds(op.flops, op.bytes_accessed), scope)
        elif kind in ("collective-start", "collective"):
            seconds, lane = self._collective_seconds(op)
            coll = op.collective
            assert coll is not None
            key = f"{scope}/{op.pair or op.name}"
            record = f"{scope}/{op.name}"
            self._start(key, record, lane, seconds, coll.kind, coll.nbytes, coll.group_size)
            if kind == "collective":
                self._expose(record, self._wait(key))
                where.waited.add(op.pair or op.name)
            else:
                pending[op.pair or op.name] = record
        elif kind == "copy-start":
            key, record = f"{scope}/{op.pair or op.name}", f"{scope}/{op.name}"
            seconds = self.roof.seconds(0.0, op.bytes_accessed, kernel=False)
            self._start(key, record, _COPY_LANE, seconds, "copy", op.bytes_accessed, 1)
            pending[op.pair or op.name] = record
        elif kind in ("collective-done", "copy-done"):
            if op.pair in pending:
                self._expose(pending.pop(op.pair), self._wait(f"{scope}/{op.pair}"))
                where.waited.add(op.pair)
            elif op.pair not in where.waited:
                self._note(f"{op.name}: a done whose start is not in its computation")
            if op.flops > 0 or op.bytes_accessed > 0:  # XLA:TPU's done fusions compute too
                self._charge(op, self.roof.seconds(op.flops, op.bytes_accessed), scope)
        elif kind == "loop":
            self._loop(op, depth)
        elif kind == "call":
            for callee in op.callees:
                self.run(callee, depth + 1)
        elif kind == "conditional":
            if op.callees:
                self.run(max(op.callees, key=lambda c: (self._alone(c), c)), depth + 1)
        elif kind != "free":
            self._note(f"{op.name}: op kind {kind!r} not simulated")

    def _alone(self, name: str) -> float:
        """Compute seconds of a computation run alone (to choose a conditional's costliest branch)."""
        comp = self.by_name.get(name)
        return sum(self.roof.seconds(op.flops, op.bytes_accessed) for op in comp.ops if op.kind in _KERNELS) \
            if comp is not None else 0.0

    def _snapshot(self) -> tuple[float, float, dict[str, list[float | int | str]], dict[str, list[float]]]:
        return (self.now, self.compute, {k: list(v) for k, v in self.records.items()},
                {k: list(v) for k, v in self.ops.items()})

    def _loop(self, op: ScheduledOp, depth: int) -> None:
        body = op.callees[0] if op.callees else ""
        cond = op.callees[1] if len(op.callees) > 1 else ""
        for k in range(op.trips):
            before = self._snapshot() if not self.flights else None
            if cond:
                self.run(cond, depth + 1)
            self.run(body, depth + 1)
            if before is not None and not self.flights and k + 1 < op.trips:
                self._repeat(before, op.trips - k - 1)  # the state repeats: the rest take what this one took
                break
        if cond:
            self.run(cond, depth + 1)

    def _repeat(self, before: tuple[float, float, dict[str, list[float | int | str]], dict[str, list[float]]],
                times: int) -> None:
        now0, compute0, records0, ops0 = before
        self.now += (self.now - now0) * times
        self.compute += (self.compute - compute0) * times
        for key, rec in self.records.items():
            old = records0.get(key, [rec[0], rec[1], rec[2], rec[3], 0, 0.0, 0.0])
            for j in (4, 5, 6):
                delta = rec[j] - old[j]  # type: ignore[operator]
                rec[j] = rec[j] + delta * times  # type: ignore[operator]
        for key, acc in self.ops.items():
            old_op = ops0.get(key, [0.0, 0.0, 0.0, 0.0])
            for j in range(4):
                acc[j] += (acc[j] - old_op[j]) * times


def simulate_schedule(program: ScheduledProgram, roofline: Roofline, links: ScheduleLinks, *,
                      top: int = 5) -> ScheduleTime:
    """Simulate one step of ``program`` (see the module docstring).

    Args:
      program: the scheduled program (:func:`~meshplan.pure.xla.read_schedule`).
      roofline: the device's :class:`Roofline`.
      links: the cluster's :class:`ScheduleLinks` (one domain per device of the program).
      top: how many of the costliest ops to return.

    Returns:
      A :class:`ScheduleTime`.

    Raises:
      MeshplanTypeError: arguments of the wrong type.

    Example:
      >>> from meshplan.pure.cluster import Link
      >>> from meshplan.pure.cost._roofline import SizeEfficiency
      >>> from meshplan.pure.xla import read_schedule
      >>> program = read_schedule('''HloModule m, num_partitions=2
      ... ENTRY %main (p: bf16[1024,1024]) -> bf16[1024,1024] {
      ...   %p = bf16[1024,1024]{1,0} parameter(0)
      ...   %ag = ((bf16[1024,1024]{1,0}), bf16[2048,1024]{1,0}) all-gather-start(%p), replica_groups=[1,2]<=[2], dimensions={0}
      ...   %d = bf16[1024,1024]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
      ...   %g = bf16[2048,1024]{1,0} all-gather-done(%ag)
      ...   ROOT %t = (bf16[1024,1024]{1,0}, bf16[2048,1024]{1,0}) tuple(%d, %g)
      ... }''')
      >>> roof = Roofline(1e12, 1e15, SizeEfficiency(1.0))
      >>> t = simulate_schedule(program, roof, ScheduleLinks(Link(1e9, 0.0), Link(1e9, 0.0)))
      >>> round(t.compute_s, 6), round(t.exposed_s, 6), t.collectives[0].kind
      (0.002147, 0.0, 'all-gather')
    """
    if not isinstance(program, ScheduledProgram):
        raise MeshplanTypeError(f"program={program!r:.60} must be a ScheduledProgram (read_schedule(text)).")
    if not isinstance(roofline, Roofline):
        raise MeshplanTypeError(f"roofline={roofline!r:.60} must be a Roofline.")
    if not isinstance(links, ScheduleLinks):
        raise MeshplanTypeError(f"links={links!r:.60} must be a ScheduleLinks (schedule_links(cluster)).")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise MeshplanTypeError(f"top={top!r} must be an int >= 0.")
    sim = _Sim(program, roofline, links)
    sim.run(program.entry)
    for f in list(sim.flights):  # the step ends when its last collective does
        sim._expose(f.record, sim._wait(f.key))
    exposed = sim.now - sim.compute
    colls = tuple(sorted(
        (CollectiveExposure(name, str(r[0]), int(r[1]), int(r[2]), str(r[3]), int(r[4]), float(r[5]), float(r[6]))
         for name, r in sim.records.items()), key=lambda c: (-c.exposed_s, -c.seconds, c.name)))
    ops = tuple(sorted((OpTime(k, sim.kinds[k], v[0], int(v[1]), v[2], v[3]) for k, v in sim.ops.items()),
                       key=lambda o: (-o.seconds, o.name))[:top])
    notes = tuple(f"{text} (x{n})" if n > 1 else text for text, n in sorted(sim.notes.items()))
    return ScheduleTime(sim.now, sim.compute, max(exposed, 0.0), colls, ops, notes)

