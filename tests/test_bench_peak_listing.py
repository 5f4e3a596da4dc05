"""``benchmarks/research/bench_peak_listing.py --show``: the groups it prints are the fullest step's buffers, biggest first.

Read on the real XLA:CPU and XLA:TPU dumps of ``tests/pure/xla/data/buffer_report`` (no compiling).
"""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "research"))

import bench_peak_listing as bench

from meshplan.pure.xla import parse_buffer_report

DATA = ROOT / "tests" / "pure" / "xla" / "data" / "buffer_report"
FILES = ("live-range.txt", "buffer-assignment.txt", "buffer-assignment-values.txt", "memory-usage-report.txt")
LINE = re.compile(r" {4} *([0-9.]+) MiB +(\d+) x (\S+) +(\w+)")


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_the_groups_add_up_to_the_listing_biggest_first(platform: str) -> None:
    report = parse_buffer_report(*((DATA / platform / name).read_text() for name in FILES))
    every = bench.groups(report, 10**6)
    parsed = [LINE.match(line) for line in every]
    assert all(parsed), every
    sizes = [float(m.group(1)) for m in parsed if m]
    # Each buffer in one group, counted once; groups printed biggest first; --show N prints the first N.
    assert sum(int(m.group(2)) for m in parsed if m) == len(report.device_buffers)
    assert sum(sizes) == pytest.approx(report.device_bytes / 2**20, abs=0.05 * len(sizes) + 1e-9)
    assert sizes == sorted(sizes, reverse=True)
    assert bench.groups(report, 2) == every[:2]
