"""``benchmarks/bench_compiled_schedule.py``: its rows, its fit, its TPU grid (no compiles here)."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_compiled_schedule as bench

from meshplan.pure.cluster import parse_cluster
from meshplan.pure.cost._roofline import SCHEDULE_FIT
from meshplan.pure.xla._schedule_records import ScheduledComputation, ScheduledOp, ScheduledProgram


def test_the_fit_rows_are_recorded_rows_and_every_h100_row_is_held_out() -> None:
    labels = {r.label for r in bench.gpu_rows()}
    assert bench.FIT_ROWS <= labels
    held_out = labels - bench.FIT_ROWS
    assert {label for label in labels if label.startswith("H100")} <= held_out
    assert any(label.startswith("H200") for label in held_out)


def test_the_fit_recovers_the_constants_that_made_the_steps() -> None:
    # Programs of one matmul and one memory-bound op each, of different sizes; "measured" steps simulated with
    # a grid point: the fit must find that point back.
    def prog(flops: float, nbytes: int) -> ScheduledProgram:
        ops = (ScheduledOp("m", "fusion", "matmul", flops=flops), ScheduledOp("e", "fusion", "memory",
                                                                                 bytes_written=nbytes))
        return ScheduledProgram("main", (ScheduledComputation("main", ops),))

    truth = (0.8, 1.6e-05, SCHEDULE_FIT["gpu"][2], SCHEDULE_FIT["gpu"][3])
    rows = []
    for k, (flops, nbytes) in enumerate([(1e9, 10**6), (1e11, 10**8), (1e13, 10**9), (3e10, 10**7)]):
        p = prog(flops, nbytes)
        measured = bench.simulated(p, "H200", truth).step_s
        row = bench.GpuRow("H200", f"m{k}", 1, 1, "full", "dot_product", measured)
        rows.append((row, p))
    assert bench.fit_constants(rows) == truth


@pytest.mark.parametrize("case", bench.TPU_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_each_tpu_case_fills_its_slice_with_a_small_model(case: tuple) -> None:
    slice_name, model, mesh, batch, seq, remat = case
    assert math.prod(mesh.values()) == parse_cluster(slice_name).num_devices
    spec = bench.small(model)
    assert spec.hidden_size == 1024 and spec.num_layers == 2 and dataclasses.is_dataclass(spec)
    assert batch % math.prod(v for k, v in mesh.items() if k in ("dp", "fsdp", "ep")) == 0
