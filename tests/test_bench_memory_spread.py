"""``benchmarks/bench_memory_spread.py``: the spread the CLI states is what the recorded compiles say today.

:data:`meshplan.pure.cost.SPREADS` is a literal the script prints; this holds the two equal, so a model
change that moves a recorded ratio fails here until the table is printed again (and RESULTS.md says so).
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_memory_spread as bench

from meshplan.pure.cost import SPREADS


def test_the_stated_spreads_are_the_recorded_compiles_repriced_today() -> None:
    assert bench.spreads(bench.recorded_rows()) == SPREADS


def test_each_spread_holds_every_row_it_was_read_from(tmp_path: pathlib.Path) -> None:
    # One calibration's rows in a file of their own: the bounds hold each row's ratio, and are the
    # lowest and highest of them rounded outwards (no wider than a hundredth).
    rows = [r for r in bench.recorded_rows()
            if bench.key_of(r) == "tpu-v5p" and r["remat"] == "none" and r["attention"] != "flash"]
    (tmp_path / "memory_calibration_x.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    ratios = [bench.calibrated_ratio(r) for r in rows]
    s = bench.spreads(bench.recorded_rows(tmp_path))[("tpu-v5p", "none", "scores")]
    assert s.rows == len(rows) and s.low <= min(ratios) and max(ratios) <= s.high
    assert min(ratios) - s.low < 0.01 and s.high - max(ratios) < 0.01


def test_the_16x256_rows_are_left_out_and_every_other_recorded_row_is_read() -> None:
    def lines(path: pathlib.Path) -> list[str]:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    every = [line for path in sorted(bench.DATA.glob("memory_calibration_*.jsonl")) for line in lines(path)]
    left = [line for name in bench.LEFT_OUT for line in lines(bench.DATA / name)]
    assert left and sum(s.rows for s in SPREADS.values()) == len(every) - len(left)
