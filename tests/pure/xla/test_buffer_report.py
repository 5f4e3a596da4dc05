"""parse_buffer_report: the buffers live at XLA's peak, from its dump's text reports.

Two kinds of evidence: real dumps (``data/buffer_report``: one small train step
compiled on XLA:CPU and ahead of time for a TPU v5e-4, see its README) checked
against XLA's own totals and memory_analysis(); and a round trip, where buffers
drawn by hypothesis are written in XLA's report format and parsed back.
"""

from __future__ import annotations

import math
import pathlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import MeshplanTypeError, PlanError
from meshplan.pure.xla._buffer_report import (
    BUFFER_KINDS,
    BufferReport,
    LiveBuffer,
    parse_buffer_report,
)

DATA = pathlib.Path(__file__).parent / "data" / "buffer_report"
FILES = ("live-range.txt", "buffer-assignment.txt", "buffer-assignment-values.txt", "memory-usage-report.txt")
# memory_analysis() of the dumped steps (data/buffer_report/README.md): meshplan's peak_bytes per device.
PEAK = {"cpu": 71712, "tpu": 176640}
ARGUMENT = {"cpu": 22528, "tpu": 45056}


def _texts(platform: str) -> list[str]:
    return [(DATA / platform / name).read_text() for name in FILES]


def _stated(live: str) -> str:
    """The live-range text without its ``BufferLiveRange`` section: the report falls back to XLA's own listing."""
    head, rest = live.split("  BufferLiveRange:\n")
    return head + rest[rest.index("  Live ranges at"):]


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_a_real_dump_lists_the_device_memory_peak(platform):
    texts = _texts(platform)
    report = parse_buffer_report(*texts)
    assert report.moment >= 0 and report.stated_moment >= 0
    # Every value was found in the buffer assignment (a miss would read shape 'unknown').
    assert all(b.shape != "unknown" and b.kind in BUFFER_KINDS for b in report.buffers)
    # Device bytes include layout padding, never less than the shape's bytes.
    assert all(b.bytes >= b.logical_bytes for b in report.buffers)
    # What is live in device memory at one moment fits under the whole program's peak; on CPU, where
    # memory_analysis() has no padding or scratch of its own, it is that peak (71680 of 71712 bytes).
    assert 0 < report.device_bytes <= PEAK[platform]
    if platform == "cpu":
        assert report.device_bytes >= 0.99 * PEAK[platform]
    # The fullest moment holds at least what is live at the step XLA's live-range report calls its peak.
    stated = parse_buffer_report(_stated(texts[0]), *texts[1:])
    assert stated.moment == report.stated_moment and stated.device_bytes <= report.device_bytes
    # XLA's own total of that listing equals what its records add up to.
    listed = sum(1 for line in texts[0].split("(peak):")[1].splitlines() if "(cumulative:" in line)
    assert len(stated.buffers) == listed > 0 and stated.stated_bytes == stated.logical_bytes
    params = [b for b in report.device_buffers if b.kind == "parameter"]
    assert params and sum(b.bytes for b in params) <= ARGUMENT[platform]
    # A parameter's source is the jitted function's argument path.
    assert {b.source.split("[")[0] for b in params} <= {"w", "x"}


def test_a_tpu_dump_shows_tiling_padding_and_other_memory_spaces():
    texts = _texts("tpu")
    report = parse_buffer_report(*texts)
    w0 = next(b for b in report.buffers if b.source == "w[0]")
    # f32[64,64] is 16 KiB of data; TPU's (8, 128) tiles pad its minor dim to 128.
    assert (w0.shape, w0.logical_bytes, w0.bytes) == ("f32[64,64]", 16384, 32768)
    # XLA's stated peak ranks steps over every memory space: at it, on-chip VMEM holds values too.
    stated = parse_buffer_report(_stated(texts[0]), *texts[1:])
    assert {b.memory_space for b in stated.buffers} >= {"default", "vmem"}
    assert all(b.memory_space == "default" for b in stated.largest(100) + report.largest(100))


def test_the_cpu_dump_names_temporaries_by_their_jax_operation():
    report = parse_buffer_report(*_texts("cpu"))
    temps = [b for b in report.buffers if b.kind == "temp"]
    assert temps and all("dot_general" in b.source or "add_any" in b.source for b in temps)
    assert report.largest(2)[0].describe().startswith(report.buffers[0].name)


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_the_order_of_xlas_listing_does_not_change_the_report(platform):
    live, *rest = _texts(platform)
    head, peak = live.split("(peak):\n")
    items, tail = peak.split("  Stack trace")
    lines = items.splitlines(keepends=True)
    random.Random(0).shuffle(lines)
    shuffled = head + "(peak):\n" + "".join(lines) + "  Stack trace" + tail
    assert parse_buffer_report(shuffled, *rest) == parse_buffer_report(live, *rest)


def test_without_the_values_report_the_sources_are_empty_and_the_rest_is_the_same():
    live, assign, values, usage = _texts("cpu")
    full, bare = parse_buffer_report(live, assign, values, usage), parse_buffer_report(live, assign)
    assert [(b.name, b.bytes, b.kind) for b in bare.buffers] == [(b.name, b.bytes, b.kind) for b in full.buffers]
    assert all(b.source == "" for b in bare.buffers)


# --- the round trip: buffers written in XLA's format and read back -------------------------------------------

_DTYPES = {"f32": 4, "bf16": 2, "s32": 4, "pred": 1, "u8": 1}
_SPACES = {1: "vmem", 2: "smem", 4: "host"}
_names = st.from_regex(r"[a-z][a-z_\-]{0,8}(\.[0-9]{1,3})?", fullmatch=True)
_sources = st.text(st.sampled_from('abc/()[]\'"\\ .-_'), max_size=20)


@st.composite
def _buffers(draw: st.DrawFn) -> list[LiveBuffer]:
    names = draw(st.lists(_names, unique=True, max_size=12))
    out = []
    for name in names:
        dtype = draw(st.sampled_from(sorted(_DTYPES)))
        dims = draw(st.lists(st.integers(1, 64), max_size=3))
        logical = _DTYPES[dtype] * math.prod(dims)
        index = draw(st.sampled_from(["", "{0}", "{2}", "{1,0}"]))
        color = draw(st.sampled_from([0, 0, 0, 1, 4]))
        out.append(LiveBuffer(name=name + index, bytes=logical + draw(st.sampled_from([0, 0, 128, 4096])),
                              shape=f"{dtype}[{','.join(map(str, dims))}]", dtype=dtype,
                              kind=draw(st.sampled_from(BUFFER_KINDS)), source=draw(_sources),
                              memory_space=_SPACES.get(color, "default"), logical_bytes=logical))
    return out


def _color(b: LiveBuffer) -> int:
    return {v: k for k, v in _SPACES.items()}.get(b.memory_space, 0)


def _write(buffers: list[LiveBuffer], moment: int) -> tuple[str, str, str, str]:
    """The four reports as XLA writes them (jax 0.10.2's formats), holding ``buffers`` live at ``moment``."""
    live = [f"HloLiveRange (max {moment + 2}):", "  InstructionSequence:", "    0:p.0", "  BufferLiveRange:"]
    live += [f"    {b.name if '{' in b.name else b.name + '{}'}:0-{moment}" for b in buffers]
    live.append(f"  Live ranges at {moment} (peak):")
    cumulative = 0
    for b in buffers:
        cumulative += b.logical_bytes
        name = b.name if "{" in b.name else b.name + "{}"
        live.append(f"    {name}: {b.logical_bytes} bytes (cumulative: {cumulative} bytes)")
    live.append(f"  Stack trace breakdown for peak usage: {cumulative:,} bytes".replace(",", " "))
    live.append(f"    main (100.0%, total: {cumulative:,} bytes, current: 0 bytes)".replace(",", " "))
    assign, values = ["BufferAssignment:"], []
    flags = {"parameter": ", parameter {i}, shape |{s}| at ShapeIndex {{}}, maybe-live-out",
             "output": ", output shape is |({s})|, maybe-live-out", "constant": ", constant",
             "thread-local": ", thread-local", "temp": ", preallocated-temp"}
    for i, b in enumerate(buffers):
        color = _color(b)
        where = f", color {color}" if color else ""
        assign.append(f"allocation {i}: size {b.bytes}{where}{flags[b.kind].format(i=i, s=b.shape)}:")
        tag = f"<{100 + i} {b.name} @{color}>"
        assign.append(f" value: {tag} (size={b.bytes},offset=0): {b.shape}{{0:T(8,128)}}")
        inst = b.name.split("{")[0]
        escaped = b.source.replace("\\", "\\\\").replace('"', '\\"')
        values += [tag, " positions:", f"  {inst}", " uses:", "  (none)",
                   (f" from instruction: %{inst} = {b.shape} fusion(), metadata={{op_name=\"{escaped}\" "
                    "stack_frame_id=1}")]
    usage = ["Memory Space: default (color=0)", "Total bytes: 0 (0B)"]
    usage += [f"Memory Space: {name} (color={c})" for c, name in sorted(_SPACES.items())]
    return "\n".join(live) + "\n", "\n".join(assign) + "\n", "\n".join(values) + "\n", "\n".join(usage) + "\n"


@given(_buffers(), st.integers(0, 10_000))
def test_buffers_written_in_xlas_format_read_back_the_same(buffers, moment):
    report = parse_buffer_report(*_write(buffers, moment))
    assert sorted(report.buffers, key=repr) == sorted(buffers, key=repr)
    # Everything is live from the first step, so the fullest step is the first; XLA's is the one it states
    # (and the report's, when nothing is in device memory).
    in_device = any(b.memory_space == "default" for b in buffers)
    assert (report.moment, report.stated_moment) == (0 if in_device else moment, moment)
    assert report.stated_bytes == report.logical_bytes == sum(b.logical_bytes for b in buffers)


@given(_buffers(), st.integers(0, 20))
def test_a_report_is_biggest_first_and_largest_is_its_device_prefix(buffers, n):
    report = parse_buffer_report(*_write(buffers, 1))
    sizes = [b.bytes for b in report.buffers]
    assert sizes == sorted(sizes, reverse=True)
    top = report.largest(n)
    assert top == report.device_buffers[:n] and len(top) <= n
    assert all(b.memory_space == "default" for b in top)
    assert sum(b.bytes for b in top) <= report.device_bytes <= sum(sizes)


@given(st.text(max_size=400), st.text(max_size=400))
def test_any_text_parses_to_a_report_and_never_raises(live, assign):
    report = parse_buffer_report(live, assign, live, assign)
    assert isinstance(report, BufferReport)
    assert report.moment >= 0 or report.buffers == ()


def test_text_that_is_not_text_is_a_typed_error_naming_it():
    with pytest.raises(MeshplanTypeError, match="buffer_assignment=3"):
        parse_buffer_report("", 3)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="n=-1"):
        BufferReport(0, ()).largest(-1)
    assert parse_buffer_report(b"", b"").buffers == ()


# --- the device-memory peak against a step-by-step count ------------------------------------------------------

@st.composite
def _program(draw: st.DrawFn) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int, int, tuple[int, int] | None]]]:
    """Allocations ``(kind, colour, index)`` and values ``(name, allocation, offset, bytes, live range)``:
    values may share a buffer (same allocation and offset), parameters may have a range or none."""
    allocations = [(draw(st.sampled_from(["temp", "parameter"])), draw(st.sampled_from([0, 0, 1])), i)
                   for i in range(draw(st.integers(1, 4)))]
    values = []
    for i in range(draw(st.integers(0, 12))):
        kind, _, alloc = draw(st.sampled_from(allocations))
        start = draw(st.integers(0, 20))
        span = (start, start + draw(st.integers(0, 8)))
        if kind == "parameter" and draw(st.booleans()):
            span = None
        values.append((f"v.{i}", alloc, draw(st.sampled_from([0, 512, 1024])),
                       draw(st.sampled_from([512, 1024, 4096])), span))
    return allocations, values


def _write_program(allocations, values) -> tuple[str, str]:
    live = ["HloLiveRange (max 40):", "  InstructionSequence:", "    0:p", "  BufferLiveRange:"]
    live += [f"    {name}{{}}:{span[0]}-{span[1]}" for name, _, _, _, span in values if span is not None]
    assign = ["BufferAssignment:"]
    for kind, color, index in allocations:
        where = f", color {color}" if color else ""
        flag = f", parameter {index}, shape |f32[1]| at ShapeIndex {{}}" if kind == "parameter" else ", preallocated-temp"
        assign.append(f"allocation {index}: size 8192{where}{flag}:")
        assign += [f" value: <{i} {name} @{color}> (size={size},offset={offset}): f32[{size // 4}]{{0}}"
                   for i, (name, alloc, offset, size, _) in enumerate(values) if alloc == index]
    return "\n".join(live) + "\n", "\n".join(assign) + "\n"


@given(_program())
def test_the_peak_is_the_fullest_step_counting_a_shared_buffer_once(program):
    allocations, values = program
    report = parse_buffer_report(*_write_program(allocations, values))
    colors = {index: color for _, color, index in allocations}
    kinds = {index: kind for kind, _, index in allocations}
    last = max((span[1] for *_, span in values if span is not None), default=0)
    totals = []
    for step in range(last + 1):
        slots: dict[tuple[int, int], int] = {}
        for _, alloc, offset, size, span in values:
            # A parameter's buffer is held throughout; a temporary's while its value lives.
            lo, hi = (0, last) if kinds[alloc] == "parameter" else span if span is not None else (1, 0)
            if colors[alloc] == 0 and lo <= step <= hi:
                slots[(alloc, offset)] = max(slots.get((alloc, offset), 0), size)
        totals.append(sum(slots.values()))
    if not any(span is not None for *_, span in values):
        assert report.moment == -1 and report.buffers == ()  # no live ranges, no stated peak: nothing to list
    elif not any(totals):
        assert report.device_bytes == 0
    else:
        assert report.device_bytes == max(totals)
        assert report.moment == totals.index(max(totals))  # the first fullest step
        # One value per buffer, each live then.
        assert len({(b.name) for b in report.buffers}) == len(report.buffers)


def test_a_live_range_that_ends_before_it_starts_holds_nothing():
    live = "  BufferLiveRange:\n    a{}:5-3\n    b{}:1-2\n"
    assign = ("allocation 0: size 64, preallocated-temp:\n"
              " value: <1 a @0> (size=64,offset=0): f32[16]{0}\n"
              " value: <2 b @0> (size=32,offset=32): f32[8]{0}\n")
    report = parse_buffer_report(live, assign)
    assert (report.moment, [b.name for b in report.buffers], report.device_bytes) == (1, ["b"], 32)
