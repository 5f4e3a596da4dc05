"""The records of a compiled program as one device runs it: what :func:`~meshplan.pure.xla.read_schedule`
returns and :func:`~meshplan.pure.cost.simulate_schedule` takes.

A :class:`ScheduledProgram` holds the stream computations (the entry first), each a
:class:`ScheduledComputation` of :class:`ScheduledOp` records in schedule order; a collective's op carries a
:class:`ScheduledCollective`. :meth:`ScheduledProgram.totals` sums a step's work, loops counted by their trips
or once (as XLA's ``cost_analysis`` counts them).

Example:
  >>> op = ScheduledOp("d", "dot", "matmul", flops=1024.0, bytes_read=512, bytes_written=256)
  >>> ScheduledProgram("main", (ScheduledComputation("main", (op,)),)).totals().bytes_accessed
  768.0
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from meshplan.pure._check import as_flag
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = ["OP_KINDS", "ProgramTotals", "ScheduledCollective", "ScheduledComputation", "ScheduledOp",
           "ScheduledProgram"]

OP_KINDS: tuple[str, ...] = ("matmul", "attention", "memory", "copy", "collective-start", "collective-done",
                             "collective", "copy-start", "copy-done", "loop", "call", "conditional", "free",
                             "unknown")
"""Every :attr:`ScheduledOp.kind`, in a fixed order."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check(owner: str, fields: list[tuple[str, Any, str]]) -> None:
    """Raise on the first field of ``owner`` that is not what it must be: ``(name, value, kind)`` with kind
    ``str``, ``count`` (an int >= 0), ``amount`` (a finite number >= 0), ``flag``, ``strs`` (a tuple of str)."""
    for name, value, kind in fields:
        if kind == "str":
            ok = isinstance(value, str)
        elif kind == "flag":
            ok = isinstance(value, bool)
        elif kind == "strs":
            ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        elif kind == "count":
            ok = _is_int(value)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            expected = {"str": "a str", "flag": "True or False", "strs": "a tuple of str", "count": "an int",
                        "amount": "a number"}[kind]
            raise MeshplanTypeError(f"{owner}.{name}={value!r:.60} must be {expected}.")
        if kind == "count" and value < 0 or kind == "amount" and not (value >= 0 and math.isfinite(float(value)
                                                                                       if value < 2**1000 else math.inf)):
            raise PlanError(f"{owner}.{name}={value!r:.60} must be finite and >= 0.")


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledCollective:
    """A collective as one device runs it.

    Attributes:
      kind: ``"all-gather"``, ``"reduce-scatter"``, ``"all-reduce"``, ``"all-to-all"``,
        ``"collective-permute"``, ``"send"``, ``"recv"``, ...
      groups: the device (partition) ids of each replica group; a permute's (source, target) pairs;
        ``()`` when the HLO states none this reader knows.
      group_size: devices per group (2 for a permute's pairs; 0 when not known).
      nbytes: the buffer ``B`` the cost model prices (all-gather: the gathered result; the others: the
        operand), per device.
      dtypes: each operand's element type.
      sync: whether the stream waits for it where it starts (XLA:CPU, XLA:TPU without a chain,
        XLA:GPU's ``is_sync`` starts).
      network: whether the HLO says it crosses slices over the data-center network (XLA:TPU's multislice
        ``send`` / ``recv`` pairs to its megascale runtime, which name no device groups).
    """

    kind: str
    groups: tuple[tuple[int, ...], ...]
    group_size: int
    nbytes: int
    dtypes: tuple[str, ...] = ()
    sync: bool = False
    network: bool = False

    def __post_init__(self) -> None:
        _check("ScheduledCollective", [("kind", self.kind, "str"), ("group_size", self.group_size, "count"),
                                       ("nbytes", self.nbytes, "count"), ("dtypes", self.dtypes, "strs"),
                                       ("sync", self.sync, "flag"), ("network", self.network, "flag")])
        if not (isinstance(self.groups, tuple) and all(
                isinstance(g, tuple) and all(_is_int(d) and d >= 0 for d in g) for g in self.groups)):
            raise MeshplanTypeError(f"ScheduledCollective.groups={self.groups!r:.60} must be a tuple of tuples of "
                                    "device ids (ints >= 0).")


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledOp:
    """One instruction of a stream computation (see the module docstring).

    Attributes:
      name: the instruction's name.
      opcode: its opcode.
      kind: one of :data:`OP_KINDS`.
      flops: matmul FLOPs (dots, convolutions, cuBLAS and cuDNN calls), per device.
      other_flops: XLA-counted FLOPs of its elementwise work and reductions.
      bytes_read, bytes_written: memory traffic, per device.
      callees: computations it runs: a loop's ``(body, condition)``, a call's target, a conditional's
        branches.
      trips: a loop's trip count (1 for other ops, and for a loop whose count is not known).
      collective: the collective it starts or runs (``None`` for other ops).
      pair: for a start or a done (collective or copy), the name both halves share.
      note: what the reader could not read about it (``""``: nothing).
      target: a custom call's target (``"__cublas$gemm"``, ``"ConcatBitcast"``; ``""`` for other ops).
    """

    name: str
    opcode: str
    kind: str
    flops: float = 0.0
    other_flops: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    callees: tuple[str, ...] = ()
    trips: int = 1
    collective: ScheduledCollective | None = None
    pair: str = ""
    note: str = ""
    target: str = ""

    def __post_init__(self) -> None:
        _check("ScheduledOp", [("name", self.name, "str"), ("opcode", self.opcode, "str"), ("kind", self.kind, "str"),
                               ("flops", self.flops, "amount"), ("other_flops", self.other_flops, "amount"),
                               ("bytes_read", self.bytes_read, "count"),
                               ("bytes_written", self.bytes_written, "count"), ("callees", self.callees, "strs"),
                               ("trips", self.trips, "count"), ("pair", self.pair, "str"),
                               ("note", self.note, "str"), ("target", self.target, "str")])
        if self.kind not in OP_KINDS:
            raise PlanError(f"ScheduledOp.kind={self.kind!r} must be one of {OP_KINDS}.")
        if self.collective is not None and not isinstance(self.collective, ScheduledCollective):
            raise MeshplanTypeError(f"ScheduledOp.collective={self.collective!r:.60} must be a ScheduledCollective "
                                    "or None.")
        if self.kind in ("collective", "collective-start") and self.collective is None:
            raise PlanError(f"ScheduledOp {self.name!r} of kind {self.kind!r} needs its collective.")

    @property
    def bytes_accessed(self) -> int:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledComputation:
    """A computation a device's stream runs: its ops in schedule order."""

    name: str
    ops: tuple[ScheduledOp, ...]

    def __post_init__(self) -> None:
        _check("ScheduledComputation", [("name", self.name, "str")])
        if not (isinstance(self.ops, tuple) and all(isinstance(op, ScheduledOp) for op in self.ops)):
            raise MeshplanTypeError(f"ScheduledComputation.ops={self.ops!r:.60} must be a tuple of ScheduledOp.")


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramTotals:
    """A program's work per step: matmul and other FLOPs, bytes, collective bytes, ops read as unknown."""

    flops: float
    other_flops: float
    bytes_accessed: float
    collective_bytes: float
    unknown_ops: int


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledProgram:
    """What :func:`read_schedule` returns: the stream computations of a compiled module.

    Attributes:
      entry: the entry computation's name.
      computations: the entry first, then every computation it runs, in the order first called.
      num_partitions: devices the program is partitioned over.
    """

    entry: str
    computations: tuple[ScheduledComputation, ...]
    num_partitions: int = 1

    def __post_init__(self) -> None:
        _check("ScheduledProgram", [("entry", self.entry, "str"), ("num_partitions", self.num_partitions, "count")])
        if not (isinstance(self.computations, tuple)
                and all(isinstance(c, ScheduledComputation) for c in self.computations)):
            raise MeshplanTypeError(f"ScheduledProgram.computations={self.computations!r:.60} must be a tuple of "
                                    "ScheduledComputation.")

    def computation(self, name: str) -> ScheduledComputation:
        """The stream computation ``name``.

        Raises:
          MeshplanTypeError: no such computation (the message lists the known ones).
        """
        if not isinstance(name, str):
            raise MeshplanTypeError(f"name={name!r:.60} must be a computation's name (a str).")
        for comp in self.computations:
            if comp.name == name:
                return comp
        raise MeshplanTypeError(f"computation {name!r} is not a stream computation of this program; known: "
                                f"{[c.name for c in self.computations][:20]}.")

    @property
    def notes(self) -> tuple[str, ...]:
        """Every op's note (what the reader could not read), in program order."""
        return tuple(f"{op.name}: {op.note}" for comp in self.computations for op in comp.ops if op.note)

    def totals(self, *, loops_once: bool = False) -> ProgramTotals:
        """The work of one step: loop bodies times their trip counts (``loops_once``: once each, as
        XLA's ``cost_analysis`` counts them); a conditional counts its costliest branch.

        Example:
          >>> body = ScheduledComputation("body", (ScheduledOp("d", "dot", "matmul", flops=1024.0),))
          >>> loop = ScheduledOp("w", "while", "loop", callees=("body",), trips=3)
          >>> p = ScheduledProgram("main", (ScheduledComputation("main", (loop,)), body))
          >>> p.totals().flops, p.totals(loops_once=True).flops
          (3072.0, 1024.0)
        """
        loops_once = as_flag(loops_once, "loops_once")
        by_name = {c.name: c for c in self.computations}
        memo: dict[str, list[float]] = {}

        def total(name: str, stack: frozenset[str]) -> list[float]:
            # [matmul flops, other flops, bytes, collective bytes, unknown ops] of one run of `name`.
            if name in memo:
                return memo[name]
            acc = [0.0] * 5
            for op in by_name[name].ops if name in by_name else ():
                coll = float(op.collective.nbytes) if op.collective and op.kind != "collective-done" else 0.0
                parts = [[op.flops, op.other_flops, float(op.bytes_accessed), coll, float(op.kind == "unknown")]]
                inner = [c for c in op.callees if c in by_name and c not in stack]
                if op.kind == "loop" and inner:
                    trips = 1 if loops_once else op.trips
                    for k, c in enumerate(inner):  # the body runs `trips` times, the condition once more
                        runs = trips if k == 0 or loops_once else trips + 1
                        parts.append([x * runs for x in total(c, stack | {name})])
                elif op.kind == "conditional" and inner:
                    parts.append(max((total(c, stack | {name}) for c in inner), key=lambda t: (t[0] + t[2], t)))
                else:
                    parts.extend(total(c, stack | {name}) for c in inner)
                for p in parts:
                    for k in range(5):
                        acc[k] += p[k]
            memo[name] = acc
            return acc

        f, o, b, c, u = total(self.entry, frozenset())
        return ProgramTotals(f, o, b, c, int(u))
