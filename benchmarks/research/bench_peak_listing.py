"""Do the buffers ``compiled_memory`` lists add up to XLA's peak? The fullest step against XLA's stated one.

Run: ``python benchmarks/research/bench_peak_listing.py [--case FAMILY:MESH:REMAT:ATTENTION:BxS@TARGET ...] [--show N]``
(the cases of ``bench_memory_calibration.py``; ``@cpu`` compiles on the 8 XLA:CPU devices, ``@v6e-8`` /
``@v5p-16`` ahead of time for that TPU slice). Without ``--case`` it runs the scaled-down Llama on CPU and
on v6e-8 (two meshes each, about a minute per TPU compile).

Each case compiles the reference train step once, with XLA's buffer-assignment reports dumped, and
parses them twice (:func:`meshplan.pure.xla.parse_buffer_report`): as meshplan lists them (the step
where device memory is fullest, from every value's live range) and as XLA's live-range report names its
own peak (the report without its live ranges falls back to that listing). The baseline, from the same
compile: ``memory_analysis()``'s peak (``CompiledMemory.peak_bytes``). Printed: each listing's device
bytes over that peak; with ``--show N``, also the N biggest groups of buffers live at the fullest step (same
shape and kind: count, MiB, the jax operation of the last), which is how docs/design-notes.md reads what a step holds.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/

from bench_memory_calibration import (  # noqa: E402
    _mesh_for,
    _parse_case,
    _spec,
    analytic,
)

import meshplan
from meshplan.facade.verify._compiled import _read_dump
from meshplan.facade.verify._reference import ReferenceConfig, reference_step
from meshplan.pure.xla._buffer_report import BufferReport, parse_buffer_report

CASES = ("llama:fsdp=8:full:plain:16x256@cpu", "llama:dp=2,fsdp=2,tp=2:none:plain:16x256@cpu",
         "llama:dp=2,fsdp=2,tp=2:full:flash:32x1024@v6e-8", "llama:fsdp=4,tp=2:full:flash:32x1024@v6e-8")
_MiB = 2**20


def _without_ranges(live_range: str) -> str:
    """The live-range report with its ``BufferLiveRange`` section cut: what XLA itself calls its peak."""
    return re.sub(r"  BufferLiveRange:\n(?:    [^\n]*:\d+-\d+\n)*", "", live_range)


def groups(report: BufferReport, n: int) -> list[str]:
    """The ``n`` biggest groups of device buffers in ``report`` by (shape, kind), one line each."""
    sizes: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    source: dict[tuple[str, str], str] = {}
    for b in report.device_buffers:
        sizes[b.shape, b.kind].append(b.bytes)
        source[b.shape, b.kind] = b.source
    top = sorted(sizes.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:n]
    return [f"    {sum(v) / _MiB:8.1f} MiB {len(v):3d} x {shape:28s} {kind:9s} {source[shape, kind][-70:]}"
            for (shape, kind), v in top]


def run(case: str, show: int = 0) -> list[str]:
    text, _, target = case.partition("@")
    backend = "cpu" if target in ("", "cpu") else "tpu"
    _, family, sizes, (batch, seq), remat, attention = _parse_case(text, backend)
    cand, sizes = analytic(family, sizes, remat, attention, batch, seq, backend, target or "cpu")
    mesh = _mesh_for(sizes, backend, target or "cpu")
    ref = reference_step(_spec(family), mesh, batch=batch, seq=seq, plan=cand,
                         config=ReferenceConfig(remat=remat, attention=attention))
    with tempfile.TemporaryDirectory() as d:
        mem = meshplan.compiled_memory(ref.fn, *ref.args, compiler_options={"xla_dump_to": d,
                                                                             "xla_dump_hlo_as_text": True})
        texts = _read_dump(d)
    assert texts is not None, "XLA wrote no buffer-assignment report"
    fullest, stated = parse_buffer_report(*texts), parse_buffer_report(_without_ranges(texts[0]), *texts[1:])
    peak = mem.peak_bytes
    if show:
        head = f"{case}: step {fullest.moment}, {fullest.device_bytes / _MiB:.1f} MiB"
        print("\n".join([head, *groups(fullest, show)]), flush=True)
    return [case, f"{peak / _MiB:.1f}", f"{fullest.device_bytes / _MiB:.1f}", f"{fullest.device_bytes / peak:.3f}",
            f"{stated.device_bytes / _MiB:.1f}", f"{stated.device_bytes / peak:.3f}",
            f"{fullest.moment} / {fullest.stated_moment}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="FAMILY:MESH:REMAT:ATTENTION:BxS@TARGET (repeatable)")
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="also print the N biggest groups of buffers live at the fullest step")
    args = parser.parse_args(argv)
    print("| case | XLA peak MiB | fullest step MiB | ratio | XLA's stated peak MiB | ratio | steps |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for case in args.case or CASES:
        print("| " + " | ".join(run(case, args.show)) + " |", flush=True)


if __name__ == "__main__":
    main()
