"""The step-time model's stated resolution is the recorded median error of the screen against published runs."""

from __future__ import annotations

import json
import math
import pathlib
import statistics

from meshplan.pure.cost import STEP_TIME_RESOLUTION, resolution_percent

DATA = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "published_step_ratios.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def test_the_resolution_is_the_recorded_median_error_against_published_runs() -> None:
    # Re-record with `python benchmarks/bench_screen.py --record benchmarks/data/published_step_ratios.jsonl`
    # whenever the step model changes; this test then says whether the constant still holds.
    rows = _rows()
    errors = [abs(math.log(r["ratio"])) for r in rows if r["ratio"] is not None]
    assert len(errors) >= 20
    assert abs(statistics.median(errors) - STEP_TIME_RESOLUTION) < 0.0005
    assert 5 < resolution_percent() < 25


def test_the_recorded_runs_are_the_benchmarks_runs() -> None:
    import sys

    sys.path.insert(0, str(DATA.parent.parent))
    try:
        from bench_megatron_table2 import PTDP_RUNS, ZERO_RUNS
        from bench_published import PIPELINE_RUNS, PUBLISHED_RUNS
    finally:
        sys.path.remove(str(DATA.parent.parent))
    priced_here = {r.key for r in PUBLISHED_RUNS if r.layout is not None} | {r.key for r in PIPELINE_RUNS}
    priced_here |= {r.key for r in PTDP_RUNS} | {r.key for r in ZERO_RUNS}
    assert {r["run"] for r in _rows()} == priced_here
