"""An HLO module's text as plain records: computations, their instructions in order, the loops' trip counts.

The shared reading of ``compiled.as_text()`` that the collective reader
(:mod:`meshplan.pure.xla._hlo_collectives`) and the schedule reader
(:mod:`meshplan.pure.xla._schedule`) both build on: one parser of instruction lines, one reading of
array types and their bytes, of replica groups, and of how many times each computation runs.

A scheduled module (``is_scheduled=true``, what ``compiled.as_text()`` returns) lists each
computation's instructions in the order they run; :func:`parse_module` keeps that order.

Trip counts: a ``while`` runs its body XLA's ``known_trip_count`` times (XLA:CPU and XLA:GPU state it
in the loop's backend config) or, where XLA does not state it (XLA:TPU), ``N`` times for a condition
``ROOT compare(i, N), direction=LT`` against an integer constant ``N``: the form of jax's
``lax.scan`` / ``fori_loop`` loops, whose counter starts at 0 in steps of 1. Any other loop has no
count here (:func:`while_trips` returns ``None``; :func:`computation_runs` counts it once, the same
limit as XLA's ``cost_analysis``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from collections.abc import Mapping

from meshplan.pure.errors import MeshplanTypeError

__all__ = ["ITEMSIZE", "HloInstruction", "HloModuleText", "array_types", "callees", "chain_id", "collective_base",
           "computation_runs", "group_size", "parse_module", "replica_groups", "type_bytes", "while_trips"]

ITEMSIZE: Mapping[str, int] = types.MappingProxyType({
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1, "f8e3m4": 1, "f8e8m0fnu": 1, "f4e2m1fn": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16})
"""Bytes per element of each HLO element type (sub-byte types rounded up to a byte, as XLA stores them)."""

# `%name = <type> <opcode>(<operands>), attributes`: the type is an array type or a (nested) tuple of them.
_INSTR = re.compile(r"^\s+(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLEE = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_LISTED = re.compile(r"\b(?:branch_computations|called_computations|calls)=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONSTANT = re.compile(r"^[su](?:8|16|32|64)\[\]\S*$")
_COMMENT = re.compile(r"/\*.*?\*/")
_GROUPS_LIST = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?"
                          r"\s*\{([^}]*)\}")
_GROUPS_MESH_AXES = re.compile(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}")
_CHAIN = re.compile(r'chain_id="([^"]+)"')
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


@dataclasses.dataclass(frozen=True, slots=True)
class HloInstruction:
    """One instruction line of an HLO module.

    Attributes:
      name: its name (without ``%``).
      computation: the computation it sits in.
      opcode: ``"fusion"``, ``"all-gather-start"``, ...
      shape: the result type as written (an array type or a tuple of them, layouts included).
      operands: the names of its operands, in order.
      args: the text inside its parentheses (a constant's literal).
      attrs: the text after its operand list (``calls=...``, ``backend_config=...``).
      root: whether it is its computation's ``ROOT``.
    """

    name: str
    computation: str
    opcode: str
    shape: str
    operands: tuple[str, ...]
    args: str
    attrs: str
    root: bool


@dataclasses.dataclass(frozen=True, slots=True)
class HloModuleText:
    """An HLO module: its computations' instructions in order, and which computation is the entry.

    Attributes:
      entry: the entry computation's name (``""`` when the text names none).
      computations: computation name -> its instructions, in the order the text lists them.
      num_partitions: the module's ``num_partitions`` (1 when not stated).
    """

    entry: str
    computations: Mapping[str, tuple[HloInstruction, ...]]
    num_partitions: int = 1

    def instruction(self, computation: str, name: str) -> HloInstruction | None:
        """The instruction ``name`` of ``computation`` (``None`` when it has none)."""
        for instr in self.computations.get(computation, ()):
            if instr.name == name:
                return instr
        return None


def _split_operands(rest: str) -> tuple[str, str]:
    """``(inside, after)`` of an instruction's text after its opening parenthesis."""
    depth = 1
    for k, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[:k], rest[k + 1:]
    return rest, ""


def parse_module(text: str) -> HloModuleText:
    """The computations of an HLO module's text, each with its instructions in order.

    Args:
      text: HLO text, as ``compiled.as_text()`` returns it.

    Returns:
      A :class:`HloModuleText`. Lines that are not instructions or computation headers are skipped.

    Raises:
      MeshplanTypeError: ``text`` is not a string.

    Example:
      >>> m = parse_module('''HloModule m, num_partitions=8
      ... ENTRY %main (p: f32[4]) -> f32[4] {
      ...   %p = f32[4]{0} parameter(0)
      ...   ROOT %n = f32[4]{0} negate(%p)
      ... }''')
      >>> m.entry, [(i.name, i.opcode, i.operands) for i in m.computations["main"]], m.num_partitions
      ('main', [('p', 'parameter', ()), ('n', 'negate', ('p',))], 8)
    """
    if not isinstance(text, str):
        raise MeshplanTypeError(f"text={text!r:.80} must be the HLO module's text (a str).")
    comps: dict[str, list[HloInstruction]] = {}
    entry = computation = ""
    partitions = 1
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m is None:
            if line.startswith("HloModule"):
                found = re.search(r"\bnum_partitions=(\d+)", line)
                partitions = int(found.group(1)) if found else partitions
                continue
            # Computation headers start at column 0 (instructions are indented) and open a block.
            c = _COMPUTATION.match(line)
            if c is not None and not line[:1].isspace():
                computation = c.group(1)
                comps.setdefault(computation, [])
                entry = computation if line.startswith("ENTRY") else entry
            continue
        root, name, shape, opcode, rest = m.groups()
        inside, after = _split_operands(rest)
        operands = tuple(re.findall(r"%([\w.\-]+)", _COMMENT.sub("", inside)))
        comps.setdefault(computation, []).append(
            HloInstruction(name, computation, opcode, shape, operands, inside, after, root is not None))
    return HloModuleText(entry, types.MappingProxyType({k: tuple(v) for k, v in comps.items()}), partitions)


def array_types(shape: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Every array in a type (an array or a tuple of them) as ``(dtype, dims)``; unknown element types skipped.

    Example:
      >>> array_types("(bf16[4,8]{1,0}, f32[]{:T(128)}, token[])")
      (('bf16', (4, 8)), ('f32', ()))
    """
    return tuple((dtype, tuple(int(d) for d in dims.split(",") if d))
                 for dtype, dims in _ARRAY.findall(shape) if dtype in ITEMSIZE)


def type_bytes(shape: str) -> int:
    """Bytes of every array in a type, summed.

    Example:
      >>> type_bytes("(bf16[4,8]{1,0}, f32[2])")
      72
    """
    return sum(ITEMSIZE[d] * math.prod(dims) for d, dims in array_types(shape))


def _iota(sizes: list[int], perm: list[int] | None) -> list[int]:
    """``iota(prod(sizes))`` reshaped to ``sizes``, transposed by ``perm``, flattened."""
    n = math.prod(sizes)
    if not perm:
        return list(range(n))
    strides = [math.prod(sizes[k + 1:]) for k in range(len(sizes))]
    out_sizes = [sizes[p] for p in perm]
    out = []
    for flat in range(n):
        idx, rem = [], flat
        for s in reversed(out_sizes):
            idx.append(rem % s)
            rem //= s
        idx.reverse()
        out.append(sum(i * strides[p] for i, p in zip(idx, perm, strict=True)))
    return out


def replica_groups(attrs: str, num_partitions: int = 0, *, pairs: bool = True) -> tuple[tuple[int, ...], ...] | None:
    """The device groups of a collective's attributes: the list, iota and mesh forms, or a permute's pairs.

    Args:
      attrs: the instruction's attribute text (:attr:`HloInstruction.attrs`).
      num_partitions: devices of the program, for ``replica_groups={}`` (all devices, one group).
      pairs: read a collective-permute's ``source_target_pairs`` as its groups (one per pair).

    Returns:
      One tuple of device ids per group; ``None`` when the text states no groups this reader knows.

    Example:
      >>> replica_groups("replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}")
      ((0, 2, 4, 6), (1, 3, 5, 7))
      >>> replica_groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}")
      ((0, 4), (1, 5), (2, 6), (3, 7))
      >>> replica_groups("source_target_pairs={{0,1},{1,0}}")
      ((0, 1), (1, 0))
    """
    m = _GROUPS_IOTA.search(attrs)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        sizes = [int(x) for x in m.group(2).split(",")]
        perm = [int(x) for x in m.group(3).split(",")] if m.group(3) else None
        ids = _iota(sizes, perm)
        if len(shape) != 2 or math.prod(shape) != len(ids):
            return None
        return tuple(tuple(ids[g * shape[1]:(g + 1) * shape[1]]) for g in range(shape[0]))
    m = _GROUPS_MESH.search(attrs)
    if m:
        return _mesh_groups(m)
    m = _GROUPS_LIST.search(attrs)
    if m:
        groups = tuple(tuple(int(x) for x in g.split(",") if x) for g in re.findall(r"\{([\d,]*)\}", m.group(1)))
        if not groups and num_partitions > 0:
            return (tuple(range(num_partitions)),)
        return groups or None
    m = _PAIRS.search(attrs) if pairs else None
    if m:
        return tuple(tuple(int(x) for x in g.split(",")) for g in re.findall(r"\{(\d+,\d+)\}", m.group(1)))
    return None


def collective_base(instr: HloInstruction) -> str:
    r"""The collective an instruction runs, without its ``-start`` / ``-done``: ``all-gather-start`` ->
    ``all-gather``. XLA:TPU writes a reduce-scatter as an ``all-reduce-scatter`` fusion (all-reduce +
    dynamic-slice): its all-reduce is the reduce-scatter it computes. Any other opcode comes back as it is.

    Example:
      >>> m = parse_module("ENTRY %e () -> f32[] {\n  ROOT %a = f32[] all-reduce-start(%x), replica_groups={}\n}")
      >>> collective_base(m.computations["e"][0])
      'all-reduce'
    """
    op = instr.opcode
    base = op[:-6] if op.endswith("-start") else op[:-5] if op.endswith("-done") else op
    if base == "all-reduce" and instr.computation.startswith("all-reduce-scatter"):
        return "reduce-scatter"
    return base


def chain_id(instr: HloInstruction) -> str | None:
    r"""The ``chain_id`` XLA:TPU gives every copy of one async collective along its chain of fusions.

    Example:
      >>> m = parse_module('ENTRY %e () -> f32[] {\n  ROOT %a = f32[] all-gather(%x), '
      ...                  'frontend_attributes={chain_id="9"}\n}')
      >>> chain_id(m.computations["e"][0])
      '9'
    """
    m = _CHAIN.search(instr.attrs)
    return m.group(1) if m else None


def group_size(attrs: str) -> int:
    """Devices per replica group of a collective's attributes (0 when it names no groups, as a
    collective-permute does; for groups this reader cannot list, the size their text states).

    Example:
      >>> group_size("replica_groups=[2,4]<=[8]"), group_size("source_target_pairs={{0,1}}")
      (4, 0)
    """
    groups = replica_groups(attrs, pairs=False)
    if groups:
        return len(groups[0])
    m = _GROUPS_MESH_AXES.search(attrs)
    if m:  # a mesh form with sub-axes: the product of the named axes' sizes
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'([^']+)'", m.group(2)) if a in sizes)
    m = _GROUPS_IOTA.search(attrs)
    return int(m.group(1).split(",")[-1]) if m else 0


def _mesh_groups(m: re.Match[str]) -> tuple[tuple[int, ...], ...] | None:
    """Groups of ``mesh['a'=2,'b'=4](, device_ids=([..]T(..)))? {'b'}``: the devices along the named axes."""
    axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
    names = [a for a, _ in axes]
    sizes = [int(s) for _, s in axes]
    chosen = re.findall(r"'([^']+)'", m.group(4))
    if not axes or any(c not in names for c in chosen) or re.search(r"[:(]", m.group(4)):
        return None  # sub-axes ('a':(1)2) and other forms this reader does not know
    n = math.prod(sizes)
    if m.group(2):
        dev_sizes = [int(x) for x in m.group(2).split(",")]
        devices = _iota(dev_sizes, [int(x) for x in m.group(3).split(",")] if m.group(3) else None)
        if len(devices) != n:
            return None
    else:
        devices = list(range(n))
    keep = [k for k, a in enumerate(names) if a not in chosen]
    along = [names.index(c) for c in chosen]
    strides = [math.prod(sizes[k + 1:]) for k in range(len(sizes))]
    groups = []
    for outer in range(math.prod(sizes[k] for k in keep)):
        base, rem = 0, outer
        for k in reversed(keep):
            base += (rem % sizes[k]) * strides[k]
            rem //= sizes[k]
        members = []
        for inner in range(math.prod(sizes[k] for k in along)):
            pos, rem = base, inner
            for k in reversed(along):
                pos += (rem % sizes[k]) * strides[k]
                rem //= sizes[k]
            members.append(devices[pos])
        groups.append(tuple(members))
    return tuple(groups)


def callees(instr: HloInstruction) -> tuple[tuple[str, str], ...]:
    """``(role, computation)`` of every computation an instruction calls (``body``, ``condition``, ``calls``,
    ``to_apply``, ``branch``, ...), in the order the text names them.

    Example:
      >>> i = parse_module('''ENTRY %e () -> s32[] {
      ...   ROOT %w = s32[] while(%x), condition=%c, body=%b
      ... }''').computations["e"][0]
      >>> callees(i)
      (('condition', 'c'), ('body', 'b'))
    """
    out = [(role, callee) for role, callee in _CALLEE.findall(instr.attrs)]
    for group in _LISTED.findall(instr.attrs):
        out.extend(("branch", c) for c in re.findall(r"%?([\w.\-]+)", group))
    return tuple(out)


def _condition_bound(module: HloModuleText, condition: str) -> int | None:
    """``N`` of a loop condition ``ROOT compare(i, N), direction=LT`` with ``N`` an integer constant."""
    instrs = module.computations.get(condition, ())
    constants = {i.name: int(i.args) for i in instrs
                 if i.opcode == "constant" and _CONSTANT.match(i.shape) and re.fullmatch(r"-?\d+", i.args)}
    for i in instrs:
        if i.root and i.opcode == "compare" and re.search(r"\bdirection=LT\b", i.attrs) and len(i.operands) == 2:
            return constants.get(i.operands[1])
    return None


def while_trips(module: HloModuleText, instr: HloInstruction) -> int | None:
    """How many times a ``while`` runs its body: XLA's ``known_trip_count``, else its condition's ``i < N``
    bound (see the module docstring), else ``None``.

    Example:
      >>> m = parse_module('''ENTRY %e () -> s32[] {
      ...   ROOT %w = s32[] while(%x), condition=%c, body=%b, backend_config={"known_trip_count":{"n":"12"}}
      ... }''')
      >>> while_trips(m, m.computations["e"][0])
      12
    """
    if instr.opcode != "while":
        return None
    stated = _TRIPS.search(instr.attrs)
    if stated is not None:
        return int(stated.group(1))
    cond = re.search(r"\bcondition=%?([\w.\-]+)", instr.attrs)
    bound = _condition_bound(module, cond.group(1)) if cond else None
    return None if bound is None else max(bound, 0)


def computation_runs(module: HloModuleText) -> dict[str, int]:
    """Runs per step of every computation: summed over its call sites, a ``while`` body counting its trips.

    The entry, and a computation nothing calls, runs once; a loop whose count is unknown counts once.

    Example:
      >>> m = parse_module('''%b (p: s32[]) -> s32[] {
      ...   ROOT %p = s32[] parameter(0)
      ... }
      ... ENTRY %e () -> s32[] {
      ...   ROOT %w = s32[] while(%x), condition=%c, body=%b, backend_config={"known_trip_count":{"n":"3"}}
      ... }''')
      >>> computation_runs(m)["b"]
      3
    """
    callers: dict[str, list[tuple[str, int]]] = {}
    for comp, instrs in module.computations.items():
        for instr in instrs:
            trips = while_trips(module, instr) if instr.opcode == "while" else None
            for role, callee in callees(instr):
                count = max(trips or 1, 1) if role == "body" and instr.opcode == "while" else 1
                callers.setdefault(callee, []).append((comp, count))
    runs: dict[str, int] = {}

    def times(comp: str, seen: frozenset[str]) -> int:
        if comp not in runs:
            sites = [(c, r) for c, r in callers.get(comp, []) if c not in seen and c != comp]
            runs[comp] = (1 if comp == module.entry or not sites
                          else sum(r * times(c, seen | {comp}) for c, r in sites))
        return runs[comp]

    return {comp: max(times(comp, frozenset()), 1) for comp in module.computations}
