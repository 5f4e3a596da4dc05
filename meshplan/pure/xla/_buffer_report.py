"""The buffers live at a compiled program's memory peak, read from XLA's buffer-assignment dump.

XLA writes, for a module compiled with ``xla_dump_to`` set (the facade,
:func:`meshplan.compiled_memory`, asks for it per compile and reads the files
back), three text reports this module parses; plain text in, records out:

- ``*-live-range.txt``: the schedule, each value's live range, and the section
  ``Live ranges at T (peak):`` listing every value live at XLA's peak moment
  with its logical size (shape bytes, no layout padding) and a running total;
- ``*-buffer-assignment.txt``: the allocations (parameter, output, constant,
  thread-local, temp; their memory-space colour) and the values each holds,
  with the bytes the value takes on the device (layout padding included; on TPU
  an ``f32[2,32,32]`` tiled ``T(8,128)`` takes 32 KiB, not 8) and its shape;
- ``*-buffer-assignment-values.txt`` (optional): the instruction defining each
  value with its metadata; ``op_name`` is the jax source of a temporary
  (``jit(step)/transpose(jvp(...))/dot_general``) or the argument's path for a
  parameter (``state[0]['lm_head']['weight']``);
- ``*-memory-usage-report.txt`` (optional): names the memory spaces
  (``Memory Space: vmem (color=1)``).

What "the peak" is: the schedule step where the program's device memory
(colour 0) is fullest, each value at its device size, a buffer that several
values share (an in-place update, a loop-carried tuple element) counted once,
and a parameter's buffer held the whole program (allocated before it runs and,
donated, receiving its output); computed from every value's live range
(``BufferLiveRange``) and where the buffer assignment puts it (allocation,
offset). That is the moment ``compiled.memory_analysis()`` reports: on XLA:TPU
its ``peak_memory_in_bytes`` (2026-11-23, libtpu 0.0.42.1, seven of nine train
steps to 0.1 MiB, up to Mixtral-8x7B/2L's 8382.2 MiB on v5p-16, one 130.0 of
133.4 MiB; ``benchmarks/research/bench_peak_listing.py``). XLA's own ``Live ranges at
T (peak)`` section is a different moment: it ranks steps by logical (unpadded)
sizes over every memory space, the TPU's on-chip VMEM included, and counts
each value of a shared buffer, so its listing held 0.18-1.82x the peak on
those TPU steps. Its moment and total are kept (``stated_moment``,
``stated_bytes``); a report without live ranges falls back to its listing.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import NamedTuple

from meshplan.pure._check import as_count, as_sequence, as_str
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = ["BUFFER_KINDS", "BufferReport", "LiveBuffer", "parse_buffer_report"]

BUFFER_KINDS: tuple[str, ...] = ("parameter", "output", "temp", "constant", "thread-local")
"""What an allocation holds, as XLA's buffer assignment labels it (temp: none of the others)."""

DEFAULT_SPACE = "default"
"""The memory space of colour 0: the device's main memory (HBM on TPU and GPU, RAM on CPU)."""

_PEAK_HEADER = re.compile(r"^\s*Live ranges at (\d+) \(peak\):\s*$")
_PEAK_ITEM = re.compile(r"^\s+([\w.\-]+)(\{[\d,]*\})?: (\d+) bytes \(cumulative: (\d+) bytes\)\s*$")
_PEAK_TOTAL = re.compile(r"^\s*Stack trace breakdown for peak usage: ([\d ]+) bytes\s*$")
_RANGES_HEADER = re.compile(r"^\s*BufferLiveRange:\s*$")
_RANGE = re.compile(r"^\s+([\w.\-]+)(\{[\d,]*\}):(\d+)-(\d+)\s*$")
_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
# `<ID NAME{INDEX} (phi) @COLOR>`: the index only for a tuple-shaped instruction, the colour only once assigned.
_VALUE = re.compile(r"^\s+value: <(\d+) ([\w.\-]+)(\{[\d,]*\})?(?: \(phi\))?(?: @(\d+))?> "
                    r"\(size=(\d+),offset=(\d+)\): (.*?)\s*$")
_COLOR = re.compile(r", color (\d+)")
_SPACE = re.compile(r"^Memory Space: (\S+) \(color=(\d+)\)\s*$")
_DEFINED = re.compile(r"^\s*from instruction: %?([\w.\-]+) = .*?\bop_name=\"((?:[^\"\\]|\\.)*)\"")
_ARRAY_SHAPE = re.compile(r"^([a-z][a-z0-9]*)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True, slots=True)
class LiveBuffer:
    """One value live at the peak of a compiled program, on one device.

    Attributes:
      name: XLA's value: the instruction, with the tuple index when its shape is a
        tuple (``"fusion.7"``, ``"while.48{2}"``).
      bytes: what it takes on the device (layout padding included).
      shape: its type without layout (``"f32[2,32,32]"``).
      dtype: the element type (``"f32"``; ``"tuple"`` / ``"token"`` for those).
      kind: one of :data:`BUFFER_KINDS`: the allocation it lives in (an output written in place
        into a donated argument lives in that argument's buffer, so it reads ``"parameter"``).
      source: the jax operation or argument path that made it (XLA's ``op_name``), ``""`` when unknown.
      memory_space: ``"default"`` (device memory) or the space XLA names (``"vmem"``, ``"host"``, ...).
      logical_bytes: its shape's bytes as XLA's live-range report counts them (no padding).

    Example:
      >>> b = LiveBuffer("fusion.7", 32768, "f32[2,32,32]", "f32", "temp", "jit(step)/dot_general")
      >>> b.describe()
      'fusion.7 32.0 KiB f32[2,32,32] temp (jit(step)/dot_general)'
    """

    name: str
    bytes: int
    shape: str
    dtype: str
    kind: str
    source: str = ""
    memory_space: str = DEFAULT_SPACE
    logical_bytes: int = 0

    def __post_init__(self) -> None:
        for field in ("name", "shape", "dtype", "source", "memory_space"):
            object.__setattr__(self, field, as_str(getattr(self, field), field))
        for field in ("bytes", "logical_bytes"):
            object.__setattr__(self, field, as_count(getattr(self, field), field, minimum=0, error=PlanError))
        if not isinstance(self.kind, str) or self.kind not in BUFFER_KINDS:
            raise PlanError(f"kind={self.kind!r:.60} must be one of {', '.join(BUFFER_KINDS)}.")

    def describe(self) -> str:
        """``'fusion.7 32.0 KiB f32[2,32,32] temp (jit(step)/dot_general)'``."""
        where = "" if self.memory_space == DEFAULT_SPACE else f" in {self.memory_space}"
        src = f" ({self.source})" if self.source else ""
        return f"{self.name} {_size_text(self.bytes)} {self.shape} {self.kind}{where}{src}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True, slots=True)
class BufferReport:
    """Every value live at the device-memory peak, biggest first (device bytes, then name).

    Attributes:
      moment: the schedule step where device memory is fullest (see the module docstring); XLA's
        stated step when the report has no live ranges; -1 when it has neither.
      buffers: the values live then, every memory space, biggest first; a buffer several values
        share is listed once, as its biggest value.
      stated_bytes: XLA's own total of the logical bytes live at *its* peak (``Stack trace breakdown
        for peak usage``), or the last running total; 0 when the report states none.
      stated_moment: the step XLA's live-range report calls its peak (-1: none stated).

    Example:
      >>> r = BufferReport(3, (LiveBuffer("a", 64, "f32[16]", "f32", "parameter"),), 64)
      >>> [b.name for b in r.largest(5)], r.device_bytes
      (['a'], 64)
    """

    moment: int
    buffers: tuple[LiveBuffer, ...]
    stated_bytes: int = 0
    stated_moment: int = -1

    def __post_init__(self) -> None:
        for field in ("moment", "stated_moment"):
            object.__setattr__(self, field, as_count(getattr(self, field), field, minimum=-1, error=PlanError))
        object.__setattr__(self, "stated_bytes", as_count(self.stated_bytes, "stated_bytes", minimum=0,
                                                          error=PlanError))
        buffers = as_sequence(self.buffers, "buffers")
        for i, b in enumerate(buffers):
            if not isinstance(b, LiveBuffer):
                raise MeshplanTypeError(f"buffers[{i}]={b!r:.60} must be a LiveBuffer, not {type(b).__name__}.")
        object.__setattr__(self, "buffers", buffers)

    @property
    def device_buffers(self) -> tuple[LiveBuffer, ...]:
        """The buffers in the device's main memory (colour 0), biggest first."""
        return tuple(b for b in self.buffers if b.memory_space == DEFAULT_SPACE)

    @property
    def device_bytes(self) -> int:
        """Their device bytes summed: what is live in device memory at the peak moment."""
        return sum(b.bytes for b in self.device_buffers)

    @property
    def logical_bytes(self) -> int:
        """Every listed buffer's logical bytes summed (``stated_bytes`` when the moment is XLA's)."""
        return sum(b.logical_bytes for b in self.buffers)

    def largest(self, n: int) -> tuple[LiveBuffer, ...]:
        """The ``n`` biggest buffers in device memory, biggest first (ties by name)."""
        return self.device_buffers[: as_count(n, "n", minimum=0, error=PlanError)]


def _size_text(nbytes: int) -> str:
    # fmt_bytes starts at MiB; a small program's buffers would all read "0.0 MiB".
    if nbytes >= 1 << 20:
        return fmt_bytes(nbytes)
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{nbytes} B"


def _text(value: object, what: str) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise MeshplanTypeError(f"{what}={value!r:.60} must be the text of XLA's dump file (str or bytes), "
                                f"not {type(value).__name__}.")
    return value


def _peak_values(live_range: str) -> tuple[int, list[tuple[str, int]], int]:
    """(moment, [(value name, logical bytes)], XLA's stated total) from the live-range report."""
    moment, items, stated, last = -1, [], 0, 0
    inside = False
    for line in live_range.splitlines():
        header = _PEAK_HEADER.match(line)
        if header:
            moment, inside = int(header.group(1)), True
            continue
        total = _PEAK_TOTAL.match(line)
        if total:
            stated, inside = int(total.group(1).replace(" ", "")), False
            continue
        if not inside:
            continue
        item = _PEAK_ITEM.match(line)
        if item is None:
            inside = False  # the section ends at the first line of another shape
            continue
        index = item.group(2) or "{}"
        items.append((item.group(1) + ("" if index == "{}" else index), int(item.group(3))))
        last = int(item.group(4))
    return moment, items, stated or last


def _live_ranges(live_range: str) -> dict[str, tuple[int, int]]:
    """Value name -> (first step, last step) from the report's ``BufferLiveRange`` section."""
    out: dict[str, tuple[int, int]] = {}
    inside = False
    for line in live_range.splitlines():
        if _RANGES_HEADER.match(line):
            inside = True
            continue
        if not inside:
            continue
        m = _RANGE.match(line)
        if m is None:
            if line.strip():
                inside = False  # the section ends at the first line of another shape
            continue
        index = m.group(2)
        out.setdefault(m.group(1) + ("" if index == "{}" else index), (int(m.group(3)), int(m.group(4))))
    return out


class _Assigned(NamedTuple):
    """Where the buffer assignment puts one value."""

    bytes: int
    shape: str
    kind: str
    color: int
    allocation: int
    offset: int


def _device_peak(ranges: dict[str, tuple[int, int]], assigned: dict[str, _Assigned]) -> int:
    """The first step at which the colour-0 values live then take the most device bytes, a buffer
    (allocation, offset) counted once at its biggest live value; -1 when no such value has a range.

    A parameter's or constant's buffer is held for the whole program (the arguments are allocated
    before it runs and, donated, receive its outputs), whatever its values' live ranges say.
    """
    last = _last_step(ranges)
    spans: list[tuple[int, int, tuple[int, int], int]] = []
    for name, a in assigned.items():
        if a.color != 0:
            continue
        span = _span(name, a, ranges, last)
        if span is not None and span[0] <= span[1]:
            spans.append((span[0], span[1], (a.allocation, a.offset), a.bytes))
    if not spans:
        return -1
    events: dict[int, list[tuple[int, tuple[int, int], int]]] = {}
    for start, end, slot, size in spans:
        events.setdefault(start, []).append((1, slot, size))
        events.setdefault(end + 1, []).append((-1, slot, size))
    active: dict[tuple[int, int], dict[int, int]] = {}  # slot -> {size: how many live values have it}
    total, best, moment = 0, -1, -1
    for step in sorted(events):
        for sign, slot, size in events[step]:
            sizes = active.setdefault(slot, {})
            before = max(sizes, default=0)
            sizes[size] = sizes.get(size, 0) + sign
            if not sizes[size]:
                del sizes[size]
            total += max(sizes, default=0) - before
        if total > best:
            best, moment = total, step
    return moment


def _last_step(ranges: dict[str, tuple[int, int]]) -> int:
    """The program's last step that any live range reaches (0 for none)."""
    return max((end for _, end in ranges.values()), default=0)


def _span(name: str, a: _Assigned, ranges: dict[str, tuple[int, int]], last: int) -> tuple[int, int] | None:
    """The steps a value's buffer is held: its live range, steps 0 to ``last`` for a parameter or constant."""
    if a.kind in ("parameter", "constant"):
        return 0, last
    return ranges.get(name)


def _live_at(moment: int, ranges: dict[str, tuple[int, int]], assigned: dict[str, _Assigned]) -> list[str]:
    """The values live at ``moment``, one per buffer, every memory space.

    A buffer is named by its biggest value, and among values as big by the one its live range says it
    holds then; a parameter's buffer whose values are all dead then (read, not yet written back) by the
    first of them, the argument itself; ties by name.
    """
    last = _last_step(ranges)
    chosen: dict[tuple[int, int], tuple[int, bool, int, str]] = {}
    for name, a in assigned.items():
        span = _span(name, a, ranges, last) or (-1, -2)
        if span[0] <= moment <= span[1]:
            own = ranges.get(name, (0, -1))
            key = (-a.bytes, not own[0] <= moment <= own[1], own[0], name)
            slot = (a.allocation, a.offset)
            if slot not in chosen or key < chosen[slot]:
                chosen[slot] = key
    return sorted(key[-1] for key in chosen.values())


# Bytes per element of XLA's primitive types (sub-byte types: a half), for a value's logical size.
_ELEMENT_BYTES = {"pred": 1.0, "s4": 0.5, "u4": 0.5, "s8": 1.0, "u8": 1.0, "s16": 2.0, "u16": 2.0, "f16": 2.0,
                  "bf16": 2.0, "s32": 4.0, "u32": 4.0, "f32": 4.0, "s64": 8.0, "u64": 8.0, "f64": 8.0,
                  "c64": 8.0, "c128": 16.0}


def _logical(shape: str, dtype: str, device: int) -> int:
    """A value's shape bytes without layout padding (``device`` for tuples and unknown types)."""
    m = _ARRAY_SHAPE.match(shape)
    per = _ELEMENT_BYTES.get(dtype, 1.0 if dtype.startswith("f8") else 0.0)
    if m is None or not per:
        return device
    elements = math.prod(int(d) for d in m.group(2).split(",") if d)
    return min(device, math.ceil(elements * per))


def _kind(flags: str) -> str:
    """An allocation's kind from the flags after its size (``, parameter 3, shape |..| at ShapeIndex {}``)."""
    if ", parameter " in flags:
        return "parameter"
    if ", output shape is " in flags or ", maybe-live-out" in flags:
        return "output"
    if ", constant" in flags:
        return "constant"
    if ", thread-local" in flags:
        return "thread-local"
    return "temp"


def _assigned_values(buffer_assignment: str) -> dict[str, _Assigned]:
    """Value name -> where the buffer-assignment report puts it."""
    out: dict[str, _Assigned] = {}
    kind, alloc_color, allocation = "temp", 0, -1
    for line in buffer_assignment.splitlines():
        alloc = _ALLOCATION.match(line)
        if alloc:
            # Shapes between |...| may hold anything but '|'; drop them before looking for flags.
            flags = re.sub(r"\|[^|]*\|", "||", alloc.group(3))
            kind, allocation = _kind(flags), int(alloc.group(1))
            color = _COLOR.search(flags)
            alloc_color = int(color.group(1)) if color else 0
            continue
        value = _VALUE.match(line)
        if value is None:
            continue
        name = value.group(2) + (value.group(3) or "")
        color_text = value.group(4)
        out.setdefault(name, _Assigned(int(value.group(5)), value.group(7), kind,
                                       int(color_text) if color_text is not None else alloc_color,
                                       allocation, int(value.group(6))))
    return out


def _sources(values: str) -> dict[str, str]:
    """Instruction name -> its ``op_name`` metadata, from the buffer-assignment values report."""
    out: dict[str, str] = {}
    for line in values.splitlines():
        m = _DEFINED.match(line)
        if m:
            out.setdefault(m.group(1), re.sub(r"\\(.)", r"\1", m.group(2)))
    return out


def _spaces(report: str) -> dict[int, str]:
    out = {0: DEFAULT_SPACE}
    for line in report.splitlines():
        m = _SPACE.match(line)
        if m and int(m.group(2)) != 0:
            out[int(m.group(2))] = m.group(1)
    return out


def _shape_and_dtype(text: str) -> tuple[str, str]:
    """``'f32[2,32]{1,0:T(8,128)}'`` -> ``('f32[2,32]', 'f32')``; tuples and tokens keep their text."""
    if text.startswith("("):
        return re.sub(r"\{[^{}]*\}", "", text), "tuple"
    m = _ARRAY_SHAPE.match(text)
    if m is None:
        return text, text.split("[", 1)[0] or "unknown"
    return f"{m.group(1)}[{m.group(2)}]", m.group(1)


def parse_buffer_report(live_range: str, buffer_assignment: str, values: str = "",
                        memory_usage: str = "") -> BufferReport:
    """The values live at XLA's peak, from its dump's text reports (see the module docstring).

    Args:
      live_range: the ``*-live-range.txt`` text.
      buffer_assignment: the ``*-buffer-assignment.txt`` text (sizes, shapes, kinds).
      values: the ``*-buffer-assignment-values.txt`` text, for each value's ``op_name`` (optional).
      memory_usage: the ``*-memory-usage-report.txt`` text, for memory-space names (optional).

    Returns:
      A :class:`BufferReport`; XLA's own listing when the live-range text has no live ranges of
      device-memory values, and no buffers when it has no peak section either. A value missing from
      the buffer assignment keeps its logical size and an unknown shape.

    Raises:
      MeshplanTypeError: an argument that is not text.

    Example:
      >>> live = ("  Live ranges at 5 (peak):\\n"
      ...         "    a.1{}: 1024 bytes (cumulative: 1024 bytes)\\n"
      ...         "    fusion{}: 4 bytes (cumulative: 1028 bytes)\\n")
      >>> assign = ("allocation 0: size 1024, parameter 0, shape |f32[256]| at ShapeIndex {}:\\n"
      ...           " value: <22 a.1 @0> (size=1024,offset=0): f32[256]{0}\\n"
      ...           "allocation 1: size 4, preallocated-temp:\\n"
      ...           " value: <25 fusion @0> (size=4,offset=0): f32[]\\n")
      >>> r = parse_buffer_report(live, assign)
      >>> [(b.name, b.bytes, b.shape, b.kind) for b in r.buffers], r.stated_bytes
      ([('a.1', 1024, 'f32[256]', 'parameter'), ('fusion', 4, 'f32[]', 'temp')], 1028)
    """
    live_text = _text(live_range, "live_range")
    assigned = _assigned_values(_text(buffer_assignment, "buffer_assignment"))
    sources = _sources(_text(values, "values"))
    spaces = _spaces(_text(memory_usage, "memory_usage"))
    del live_range, buffer_assignment, values, memory_usage
    stated_moment, items, stated = _peak_values(live_text)
    ranges = _live_ranges(live_text)
    moment = _device_peak(ranges, assigned) if ranges else -1
    stated_logical = dict(items)
    if moment < 0:  # no live ranges: what XLA lists at its own peak
        moment, names = stated_moment, [name for name, _ in items]
    else:
        names = _live_at(moment, ranges, assigned)
        if moment != stated_moment:
            stated_logical = {}
    buffers = []
    for name in names:
        logical = stated_logical.get(name)
        a = assigned.get(name, _Assigned(logical or 0, "unknown", "temp", 0, -1, 0))
        shape, dtype = _shape_and_dtype(a.shape)
        buffers.append(LiveBuffer(name=name, bytes=a.bytes, shape=shape, dtype=dtype, kind=a.kind,
                                  source=sources.get(name.split("{", 1)[0], ""),
                                  memory_space=spaces.get(a.color, f"color {a.color}"),
                                  logical_bytes=logical if logical is not None else _logical(shape, dtype, a.bytes)))
    return BufferReport(moment, _biggest_first(buffers), stated, stated_moment)


def _biggest_first(buffers: Iterable[LiveBuffer]) -> tuple[LiveBuffer, ...]:
    # Ties by name, so the order never depends on XLA's listing order.
    return tuple(sorted(buffers, key=lambda b: (-b.bytes, b.name, b.logical_bytes)))
