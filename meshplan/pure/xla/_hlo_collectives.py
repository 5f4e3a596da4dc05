"""The collectives of a compiled XLA program, read from its HLO text, and their totals per kind.

A pure parser over the string ``compiled.as_text()`` returns (what
:func:`meshplan.facade.compiled_collectives` hands it): no jax, no devices. Each
collective instruction becomes a :class:`HloCollective` with its bytes defined
as :mod:`meshplan.pure.cost._collective_time` defines a collective's buffer ``B``, so the
analytic model's :class:`~meshplan.pure.CommTerm` figures and the compiler's
compare directly:

- all-gather: the gathered result (operand bytes times the group size);
- reduce-scatter, all-reduce: the operand (the unscattered buffer);
- all-to-all, collective-permute: the operand (what each device sends from).

The shapes in a partitioned (SPMD) module are per device, so every figure is
per device. Combined collectives (XLA's all-gather / all-reduce combiners make
one instruction of many, with a tuple of operands) count one call per operand,
so counts do not depend on how much the combiners merged. Async pairs
(``all-gather-start`` / ``-done``) count once, at the start.

XLA:TPU runs a collective asynchronously as a chain of fusions (the start, continuations that
advance it, the done), each holding a copy of the instruction with the same ``chain_id``: a
chain counts once, in the computation that starts it. XLA:TPU also writes a reduce-scatter as
an ``all-reduce-scatter`` fusion (all-reduce + dynamic-slice): its all-reduce is read as the
reduce-scatter it is.

Loops: an instruction inside a ``while`` body is listed once; its record's
``trips`` is the product of the enclosing loops' trip counts, and
:func:`collective_totals` counts it that many times. A trip count is XLA's
``known_trip_count`` (XLA:CPU states it in the ``while``'s backend config) or,
where XLA does not state it (XLA:TPU), the ``N`` of a loop condition
``i < N`` against a constant, the form of jax's ``lax.scan`` / ``fori_loop``
loops, whose counter starts at 0 in steps of 1 (a ``scan`` over layers or
micro-batches). Any other loop counts once (the same limit as XLA's
``cost_analysis``); to be safe, compare on unrolled steps (the reference step
with ``scan_layers=False``). Each record names its computation, so a caller
can tell loop bodies apart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.xla._hlo_text import (
    ITEMSIZE,
    array_types,
    chain_id,
    collective_base,
    computation_runs,
    group_size,
    parse_module,
)

__all__ = ["HLO_COLLECTIVE_KINDS", "HloCollective", "collective_shares", "collective_totals", "parse_hlo_collectives",
           "ratio_table"]

HLO_COLLECTIVE_KINDS: tuple[str, ...] = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                                         "collective-permute")
"""The collective opcodes read from HLO, in a fixed order."""



@dataclasses.dataclass(frozen=True, slots=True)
class HloCollective:
    """One collective instruction of a compiled program (per device).

    Attributes:
      kind: one of :data:`HLO_COLLECTIVE_KINDS`.
      name: the instruction's name in the HLO.
      computation: the computation it sits in (a ``while`` body's are listed once: see ``trips``).
      dtypes: each operand's element type (``"bf16"``, ``"f32"``, ...).
      operand_bytes: each operand's bytes per device.
      group_size: devices per replica group (0 when the HLO names no groups, e.g. collective-permute).
      nbytes: the full buffer ``B`` of the call, summed over operands (see the module docstring).
      calls: operands (a combined collective is one call per operand).
      trips: how many times the program runs it: the product of the trip counts of the ``while``
        loops around it (1 outside loops; a loop whose count cannot be read counts 1).
    """

    kind: str
    name: str
    computation: str
    dtypes: tuple[str, ...]
    operand_bytes: tuple[int, ...]
    group_size: int
    nbytes: int
    calls: int
    trips: int = 1


def _array_bytes(text: str) -> list[tuple[str, int]]:
    """Every array type in ``text`` (a type, possibly a tuple) as ``(dtype, bytes)``."""
    return [(dtype, ITEMSIZE[dtype] * math.prod(dims)) for dtype, dims in array_types(text)]


def parse_hlo_collectives(text: str) -> tuple[HloCollective, ...]:
    """The collectives of an HLO module's text, in program order.

    Args:
      text: HLO text, as ``jax.jit(f).lower(...).compile().as_text()`` returns it.

    Returns:
      One :class:`HloCollective` per collective instruction (``-done`` halves skipped).

    Raises:
      MeshplanTypeError: ``text`` is not a string.

    Example:
      >>> hlo = '''ENTRY %main (p: bf16[4,8]) -> bf16[32,8] {
      ...   %p = bf16[4,8]{1,0} parameter(0)
      ...   ROOT %ag = bf16[32,8]{1,0} all-gather(%p), replica_groups=[1,8]<=[8], dimensions={0}
      ... }'''
      >>> [(c.kind, c.nbytes, c.group_size) for c in parse_hlo_collectives(hlo)]
      [('all-gather', 512, 8)]
    """
    if not isinstance(text, str):
        raise MeshplanTypeError(f"text={text!r:.80} must be the HLO module's text (a str).")
    module = parse_module(text)
    types: dict[str, list[tuple[str, int]]] = {}
    found: list[tuple[str, str, str, tuple[str, ...], str]] = []
    chain_home: dict[str, str] = {}  # XLA:TPU async chain id -> the computation that starts it
    for computation, instrs in module.computations.items():
        for instr in instrs:
            types[instr.name] = _array_bytes(instr.shape)
            if instr.opcode.endswith("-done") or collective_base(instr) not in HLO_COLLECTIVE_KINDS:
                continue
            chain = chain_id(instr)
            if chain is not None and chain_home.setdefault(chain, computation) != computation:
                continue  # a continuation or the done half of an async collective already counted
            found.append((collective_base(instr), instr.name, computation, instr.operands, instr.attrs))
    runs = computation_runs(module)

    out = []
    for kind, name, comp, operands, attrs in found:
        arrays = [a for op in operands for a in types.get(op, [])]
        n = group_size(attrs)
        size = sum(b for _, b in arrays)
        nbytes = size * n if kind == "all-gather" else size
        out.append(HloCollective(kind, name, comp, tuple(d for d, _ in arrays), tuple(b for _, b in arrays),
                                 n, nbytes, len(arrays), runs.get(comp, 1)))
    return tuple(out)


def collective_totals(records: Iterable[HloCollective] | Iterable[object]) -> dict[str, tuple[int, int]]:
    """``{kind: (bytes, calls)}`` per step, summed over records, kinds in :data:`HLO_COLLECTIVE_KINDS` order.

    Takes :class:`HloCollective` records or :class:`~meshplan.pure.CommTerm`s (anything with
    ``kind``, ``nbytes`` and ``calls``; a CommTerm's ``nbytes`` is per call, so it counts
    ``nbytes * calls``; an HloCollective's ``nbytes`` already sums its operands, and a record
    inside loops counts ``trips`` times). Kinds with no record are left out.

    Example:
      >>> from meshplan.pure.cost import CommTerm
      >>> collective_totals([CommTerm("x", "all-reduce", ("tp",), 100, 4, "intra", 0.0)])
      {'all-reduce': (400, 4)}
    """
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise MeshplanTypeError(f"records={records!r:.80} must be a sequence of HloCollective or CommTerm records.")
    try:
        items = list(records)
    except TypeError:  # iterable by type but not in fact (a 0-d numpy array)
        raise MeshplanTypeError(f"records={records!r:.80} must be a sequence of HloCollective or CommTerm "
                                "records.") from None
    sums: dict[str, list[int]] = {}
    for r in items:
        kind, nbytes, calls = getattr(r, "kind", None), getattr(r, "nbytes", None), getattr(r, "calls", None)
        if not isinstance(kind, str) or not isinstance(nbytes, int) or not isinstance(calls, int):
            raise MeshplanTypeError(f"record {r!r:.80} must have a str kind and int nbytes and calls "
                                    "(an HloCollective or a CommTerm).")
        trips = r.trips if isinstance(r, HloCollective) else 1
        total = nbytes * trips if isinstance(r, HloCollective) else nbytes * calls
        acc = sums.setdefault(kind, [0, 0])
        acc[0] += total
        acc[1] += calls * trips
    order = {k: i for i, k in enumerate(HLO_COLLECTIVE_KINDS)}
    return {k: (v[0], v[1]) for k, v in sorted(sums.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))}


def ratio_table(analytic: Mapping[str, tuple[int, int]], compiled: Mapping[str, tuple[int, int]]
                ) -> tuple[tuple[str, int, int, float], ...]:
    """``(kind, analytic bytes, compiled bytes, ratio)`` for every kind in either, ratio = analytic / compiled.

    Example:
      >>> ratio_table({"all-reduce": (110, 1)}, {"all-reduce": (100, 2), "all-gather": (50, 1)})
      (('all-gather', 0, 50, 0.0), ('all-reduce', 110, 100, 1.1))
    """
    for name, table in (("analytic", analytic), ("compiled", compiled)):
        ok = isinstance(table, Mapping) and all(
            isinstance(k, str) and isinstance(v, tuple) and len(v) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
            for k, v in table.items())
        if not ok:
            raise MeshplanTypeError(f"{name}={table!r:.80} must map a collective kind to (bytes, calls), "
                                    "as collective_totals returns.")
    order = {k: i for i, k in enumerate(HLO_COLLECTIVE_KINDS)}
    kinds = sorted(set(analytic) | set(compiled), key=lambda k: (order.get(k, 99), k))
    rows = []
    for k in kinds:
        a, c = analytic.get(k, (0, 0))[0], compiled.get(k, (0, 0))[0]
        rows.append((k, a, c, a / c if c else (1.0 if a == 0 else math.inf)))
    return tuple(rows)


def collective_shares(table: Sequence[tuple[str, int, int, float]]) -> dict[str, float]:
    """Each kind's share of a step's collective bytes, the larger of its compiled and its priced share.

    A check that holds only the kinds above some share to a ratio must read both sides: by the compiled
    share alone, a kind the model prices and the compiler never emits (compiled 0) would pass as minor.

    Args:
      table: :func:`ratio_table` rows ``(kind, analytic bytes, compiled bytes, ratio)``.

    Returns:
      ``{kind: share}`` in the table's order; a side with no bytes at all gives its kinds 0 there.

    Example:
      >>> collective_shares(ratio_table({"all-gather": (90, 1), "reduce-scatter": (10, 1)},
      ...                               {"all-gather": (100, 1)}))
      {'all-gather': 1.0, 'reduce-scatter': 0.1}
    """
    ok = isinstance(table, Sequence) and all(
        isinstance(row, tuple) and len(row) == 4 and isinstance(row[0], str)
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row[1:3]) for row in table)
    if not ok:
        raise MeshplanTypeError(f"table={table!r:.80} must hold (kind, analytic bytes, compiled bytes, ratio) rows, "
                                "as ratio_table returns.")
    priced = sum(a for _, a, _, _ in table) or 1
    compiled = sum(c for _, _, c, _ in table) or 1
    return {kind: max(a / priced, c / compiled) for kind, a, c, _ in table}
