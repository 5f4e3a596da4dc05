"""The program a device runs, read off a compiled module's scheduled HLO: its ops in order, priced in FLOPs
and bytes, its async collectives paired start to done, its loops with their trip counts.

A pure reader of the text ``compiled.as_text()`` returns (scheduled, optimized HLO) for XLA:GPU,
XLA:TPU and XLA:CPU. :func:`read_schedule` returns a :class:`ScheduledProgram`: every computation a
device's stream runs (the entry, ``while`` bodies and conditions, ``call`` targets, ``conditional``
branches; not fusion bodies or reducers, which are parts of one op), each as its instructions in
schedule order, one :class:`ScheduledOp` each, with

- its **kind** (:data:`OP_KINDS`): a matmul (``dot`` / ``convolution``, a fusion holding one, a Triton
  gemm fusion, a cuBLAS call), cuDNN fused attention, memory-bound work (elementwise fusions, reductions,
  slices), a copy, an async collective's start or done, a collective the stream waits on (``sync``),
  an async copy's start or done, control flow (``loop``, ``call``, ``conditional``), the plumbing that
  costs nothing (``free``: parameters, constants, tuples, bitcasts), or ``unknown``;
- its FLOPs and bytes (:mod:`meshplan.pure.xla._op_cost`), per device;
- for a collective, a :class:`ScheduledCollective`: kind, replica groups (list, iota and mesh forms;
  a permute's source-target pairs), bytes ``B`` as :mod:`meshplan.pure.cost._collective_time` defines
  them, and whether XLA runs it synchronously;
- for a start or a done, ``pair``: the name of the start both halves share.

Async collectives, by backend:

- XLA:GPU: ``all-gather-start`` / ``-done`` and the like; a start whose backend config says
  ``"is_sync":true`` runs on the compute stream (kind ``collective``); ``async-start`` / ``-done`` wrap
  a collective (``calls=``) the same way;
- XLA:TPU: a chain of fusions sharing a ``chain_id`` (:mod:`meshplan.pure.xla._hlo_collectives`): the
  fusion whose root is the ``AsyncCollectiveStart`` call starts it, the one whose root is
  ``AsyncCollectiveDone`` waits for it, the fusions between run compute while it proceeds (their
  FLOPs are counted, their copy of the collective is not); a fusion holding a collective with no chain
  runs it synchronously (the ``all-reduce-scatter`` fusion is read as the reduce-scatter it is);
- XLA:CPU: collectives are synchronous.

Anything the reader does not understand becomes an op of kind ``unknown`` (priced as memory-bound by
the simulator) or an op with a ``note`` saying what is missing (a loop of unknown trip count counts
once; a dot whose shapes are unreadable counts no FLOPs): never a crash, never a silent zero.
"""

from __future__ import annotations

import re

from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.xla._hlo_text import (
    HloInstruction,
    HloModuleText,
    array_types,
    callees,
    chain_id,
    collective_base,
    group_size,
    parse_module,
    replica_groups,
    type_bytes,
    while_trips,
)
from meshplan.pure.xla._op_cost import FREE_OPCODES, InstructionCost, instruction_cost, shape_table
from meshplan.pure.xla._schedule_records import (
    ScheduledCollective,
    ScheduledComputation,
    ScheduledOp,
    ScheduledProgram,
)

__all__ = ["read_schedule"]

_COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute",
                "collective-broadcast", "ragged-all-to-all")
_RENDEZVOUS = re.compile(r'_xla_host_transfer_rendezvous="([^"]+)"')
_TRANSFER = re.compile(r'_xla_megascale_transfer_type="([^"]+)"')
_MEGASCALE = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather", "REDUCE_SCATTER": "reduce-scatter",
              "ALL_TO_ALL": "all-to-all"}
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
# ConcatBitcast (XLA:TPU) joins pieces that already lie side by side in memory: a view, like a bitcast;
# PrepareAsyncCallStart / -Done (XLA:TPU) hand a token to an async call on the SparseCore: bookkeeping.
_FREE_TARGETS = frozenset({"AllocateBuffer", "AssumeGatherIndicesInBound", "ConcatBitcast", "PrepareAsyncCallDone",
                           "PrepareAsyncCallStart", "SliceId", "Sharding",
                           "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost", "MoveToDevice"})
_MEMORY_TARGETS = frozenset({"ZeroCrop", "GatherScatterIndicesBitpacked", "TopK", "PadToStatic", "SliceToDynamic"})
_MEMORY_OPCODES = frozenset({
    "broadcast", "reduce", "reduce-window", "select-and-scatter", "transpose", "reshape", "dynamic-reshape",
    "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "gather", "scatter", "iota", "sort",
    "reverse", "rng", "rng-bit-generator", "rng-get-and-update-state", "map", "cholesky", "triangular-solve",
    "fft", "batch-norm-training", "batch-norm-inference", "batch-norm-grad", "top-k", "ragged-dot"})


def _fused(module: HloModuleText, instr: HloInstruction) -> tuple[HloInstruction, ...]:
    m = re.search(r"\bcalls=%?([\w.\-]+)", instr.attrs)
    return module.computations.get(m.group(1), ()) if m else ()


def _collective(module: HloModuleText, coll: HloInstruction, shapes: dict[str, str], *, sync: bool,
                kind: str | None = None) -> ScheduledCollective:
    """The collective instruction ``coll`` (wherever it sits: the stream, a fusion, an async wrapper)."""
    base = kind or collective_base(coll)
    arrays = [a for o in coll.operands for a in array_types(shapes.get(o, ""))]
    size = sum(type_bytes(shapes.get(o, "")) for o in coll.operands)
    groups = replica_groups(coll.attrs, module.num_partitions) or ()
    n = 2 if base in ("collective-permute", "send", "recv") else (len(groups[0]) if groups else group_size(coll.attrs))
    if not groups and base in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all") and n == 0:
        n = module.num_partitions  # no groups stated: every device
    nbytes = size * max(n, 1) if base == "all-gather" else size
    return ScheduledCollective(base, groups, n, nbytes, tuple(d for d, _ in arrays), sync)


def _is_sync(instr: HloInstruction) -> bool:
    return '"is_sync":true' in instr.attrs.replace(" ", "")


def _done_pair(module: HloModuleText, instr: HloInstruction) -> str:
    """The start a ``-done`` (or ``async-done``) waits for: its operand, through any ``async-update``."""
    name = instr.operands[0] if instr.operands else ""
    for _ in range(64):
        prev = module.instruction(instr.computation, name)
        if prev is None or prev.opcode != "async-update" or not prev.operands:
            break
        name = prev.operands[0]
    return name


def _priced(instr: HloInstruction, kind: str, cost: InstructionCost | None, *, note: str = "",
            collective: ScheduledCollective | None = None, pair: str = "", target: str = "") -> ScheduledOp:
    """A :class:`ScheduledOp` of ``instr`` carrying ``cost`` (``None``: it costs the stream nothing)."""
    notes = "; ".join(x for x in ((cost.notes if cost else []) + [note]) if x)
    if cost is None:
        return ScheduledOp(instr.name, instr.opcode, kind, collective=collective, pair=pair, note=notes,
                           target=target)
    return ScheduledOp(instr.name, instr.opcode, kind, cost.matmul, cost.other, cost.read, cost.written,
                       collective=collective, pair=pair, note=notes, target=target)


def _read_op(module: HloModuleText, instr: HloInstruction, shapes: dict[str, str]) -> ScheduledOp:
    """One stream instruction as a :class:`ScheduledOp` (the module docstring)."""
    op = instr.opcode
    if op in FREE_OPCODES:
        return ScheduledOp(instr.name, op, "free")
    if op == "while":
        body = re.search(r"\bbody=%?([\w.\-]+)", instr.attrs)
        cond = re.search(r"\bcondition=%?([\w.\-]+)", instr.attrs)
        trips = while_trips(module, instr)
        note = "" if trips is not None else "trip count not stated and not read from the condition: counted once"
        return ScheduledOp(instr.name, op, "loop", callees=tuple(m.group(1) for m in (body, cond) if m),
                           trips=1 if trips is None else trips, note=note)
    if op in ("call", "conditional"):
        called = tuple(c for role, c in callees(instr) if role in ("to_apply", "calls", "branch",
                                                                   "true_computation", "false_computation"))
        return ScheduledOp(instr.name, op, op, callees=called)
    base = collective_base(instr)
    if base in _COLLECTIVES or base in ("send", "recv"):
        return _read_collective(module, instr, shapes, base)
    if op in ("async-start", "async-update", "async-done"):
        return _read_async(module, instr, shapes)
    if op.endswith("-start") or op.endswith("-done"):
        return _read_async_copy(module, instr, shapes, base)
    cost = instruction_cost(module, instr, shapes)
    if op == "fusion":
        return _read_fusion(module, instr, shapes, cost)
    if op == "custom-call":
        target = _TARGET.search(instr.attrs)
        name = target.group(1) if target else "?"
        if name in _FREE_TARGETS:
            return _priced(instr, "free", None, target=name)
        if cost.attention or cost.matmul > 0:
            return _priced(instr, "attention" if cost.attention else "matmul", cost, target=name)
        if name in _MEMORY_TARGETS:
            return _priced(instr, "memory", cost, target=name)
        return _priced(instr, "unknown", cost, note=f"unknown custom call {name}: priced as memory-bound",
                       target=name)
    if op in ("dot", "convolution"):
        return _priced(instr, "matmul", cost)
    if op == "copy":
        return _priced(instr, "copy", cost)
    if op in _MEMORY_OPCODES or cost.other > 0:
        return _priced(instr, "memory", cost)
    return _priced(instr, "unknown", cost, note=f"unknown opcode {op}: priced as memory-bound")


def _pair_key(instr: HloInstruction | None, name: str) -> str:
    """The key both halves of an async op share: a send's and its recv's rendezvous, else the start's name."""
    found = _RENDEZVOUS.search(instr.attrs) if instr is not None else None
    return "rendezvous:" + found.group(1) if found else name


def _read_collective(module: HloModuleText, instr: HloInstruction, shapes: dict[str, str], base: str) -> ScheduledOp:
    """A collective instruction on the stream: sync, a start, a done; send / recv and their dones."""
    op = instr.opcode
    if op.endswith("-done"):
        start = _done_pair(module, instr)
        return ScheduledOp(instr.name, op, "collective-done",
                           pair=_pair_key(module.instruction(instr.computation, start), start))
    if op == "recv":  # the bytes move with the matching send (its rendezvous)
        return ScheduledOp(instr.name, op, "free", pair=_pair_key(instr, instr.name))
    if op == "send":
        transfer = _TRANSFER.search(instr.attrs)
        kind = _MEGASCALE.get(transfer.group(1), "send") if transfer else "send"
        data = instr.operands[:1]
        coll = ScheduledCollective(kind, (), 0 if transfer else 2, sum(type_bytes(shapes.get(o, "")) for o in data),
                                   tuple(d for o in data for d, _ in array_types(shapes.get(o, ""))),
                                   False, network=transfer is not None or "is_host_transfer=true" in instr.attrs)
        return ScheduledOp(instr.name, op, "collective-start", collective=coll, pair=_pair_key(instr, instr.name))
    coll = _collective(module, instr, shapes, sync=not op.endswith("-start") or _is_sync(instr))
    return ScheduledOp(instr.name, op, "collective" if coll.sync else "collective-start", collective=coll,
                       pair=instr.name)


def _read_async_copy(module: HloModuleText, instr: HloInstruction, shapes: dict[str, str], base: str) -> ScheduledOp:
    """``copy-start`` / ``-done`` (a copy between memory spaces), ``slice-start`` / ``-done`` (XLA:TPU's
    async slices into on-chip memory) and any other async op that is not a collective: a transfer beside
    the stream, of the bytes it moves (read once, written once)."""
    op = instr.opcode
    if op.endswith("-done"):
        return ScheduledOp(instr.name, op, "copy-done", pair=_done_pair(module, instr))
    arrays = array_types(instr.shape)
    operands = sum(len(array_types(shapes.get(o, ""))) for o in instr.operands)
    if base == "copy" or len(arrays) <= operands:
        moved = sum(type_bytes(shapes.get(o, "")) for o in instr.operands)
    else:  # ((operands), the piece it makes, context): the piece
        dtype, dims = arrays[operands]
        moved = type_bytes(f"{dtype}[{','.join(map(str, dims))}]")
    note = "" if base in ("copy", "slice") else f"async {base} priced as a copy of its operands"
    return ScheduledOp(instr.name, op, "copy-start", bytes_read=moved, bytes_written=moved, pair=instr.name,
                       note=note)


def _read_async(module: HloModuleText, instr: HloInstruction, shapes: dict[str, str]) -> ScheduledOp:
    """``async-start`` / ``-update`` / ``-done``: a wrapped collective, or other work priced on the stream."""
    op = instr.opcode
    if op == "async-update":
        return ScheduledOp(instr.name, op, "free")
    start = instr if op == "async-start" else module.instruction(instr.computation, _done_pair(module, instr))
    wrapped = _fused(module, start) if start is not None else ()
    colls = [i for i in wrapped if collective_base(i) in _COLLECTIVES]
    if op == "async-done":
        return ScheduledOp(instr.name, op, "collective-done" if colls else "free", pair=_done_pair(module, instr))
    if colls:
        coll = _collective(module, colls[0], shapes, sync=_is_sync(instr))
        return ScheduledOp(instr.name, op, "collective" if coll.sync else "collective-start", collective=coll,
                           pair=instr.name)
    # An async computation that is not a collective (a host offload, an async fusion): priced on the stream.
    total = InstructionCost()
    for i in wrapped:
        part = instruction_cost(module, i, shapes)
        total.matmul += part.matmul
        total.other += part.other
        total.read += part.read
        total.written += part.written
        total.notes += part.notes
    return _priced(instr, "matmul" if total.matmul > 0 else "memory", total,
                   note="an async computation that is not a collective: priced on the compute stream")


def _read_fusion(module: HloModuleText, instr: HloInstruction, shapes: dict[str, str],
                 cost: InstructionCost) -> ScheduledOp:
    """A fusion: a matmul or memory-bound kernel, or (XLA:TPU) one link of an async collective's chain."""
    body = _fused(module, instr)
    colls = [i for i in body if collective_base(i) in _COLLECTIVES]
    root = next((i for i in reversed(body) if i.root), None)
    target = _TARGET.search(root.attrs) if root is not None and root.opcode == "custom-call" else None
    chained = [(c, chain) for c in colls if (chain := chain_id(c)) is not None]
    compute = "matmul" if cost.matmul > 0 else "memory"
    if chained:
        coll, chain = chained[0][0], "chain:" + chained[0][1]
        if target is not None and target.group(1) == "AsyncCollectiveStart":
            return _priced(instr, "collective-start", None, collective=_collective(module, coll, shapes, sync=False),
                           pair=chain)
        if target is not None and target.group(1) == "AsyncCollectiveDone":
            return _priced(instr, "collective-done", cost, pair=chain)
        return _priced(instr, compute, cost)  # a continuation: compute beside the collective in flight
    if colls:  # a collective fused with no chain: the stream runs it where it stands
        return _priced(instr, "collective", cost, collective=_collective(module, colls[0], shapes, sync=True),
                       pair=instr.name)
    return _priced(instr, compute, cost)


def read_schedule(text: str) -> ScheduledProgram:
    """The scheduled program of a compiled module's text (see the module docstring).

    Args:
      text: HLO text, as ``compiled.as_text()`` returns it (scheduled: each computation lists its
        instructions in the order they run).

    Returns:
      A :class:`ScheduledProgram`.

    Raises:
      MeshplanTypeError: ``text`` is not a string.

    Example:
      >>> p = read_schedule('''HloModule m, is_scheduled=true, num_partitions=8
      ... ENTRY %main (p: bf16[4,8]) -> bf16[32,8] {
      ...   %p = bf16[4,8]{1,0} parameter(0)
      ...   %ag = ((bf16[4,8]{1,0}), bf16[32,8]{1,0}) all-gather-start(%p), replica_groups=[1,8]<=[8], dimensions={0}
      ...   ROOT %d = bf16[32,8]{1,0} all-gather-done(%ag)
      ... }''')
      >>> [(op.kind, op.pair) for op in p.computation("main").ops]
      [('free', ''), ('collective-start', 'ag'), ('collective-done', 'ag')]
      >>> c = p.computation("main").ops[1].collective
      >>> c.kind, c.nbytes, c.group_size
      ('all-gather', 512, 8)
    """
    if not isinstance(text, str):
        raise MeshplanTypeError(f"text={text!r:.80} must be the HLO module's text (a str).")
    module = parse_module(text)
    shapes = shape_table(module)
    order: list[str] = [module.entry] if module.entry in module.computations else []
    read: dict[str, ScheduledComputation] = {}
    k = 0
    while k < len(order):
        comp = order[k]
        ops = tuple(_read_op(module, instr, shapes) for instr in module.computations[comp])
        read[comp] = ScheduledComputation(comp, ops)
        for op in ops:
            for callee in op.callees:
                if callee in module.computations and callee not in order:
                    order.append(callee)
        k += 1
    return ScheduledProgram(module.entry, tuple(read[c] for c in order), module.num_partitions)
