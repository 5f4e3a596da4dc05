"""The serving calibration: the data file's rows are sourced and split, the module's coefficients are what the
fit on the 'fit' rows gives, and its stated range and held-out error are what the rows show."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_serve

from meshplan.pure.serve import SERVE_CALIBRATION, TPU_CHECK

DOC = json.loads(bench_serve.DATA.read_text())
ROWS = DOC["rows"]


def test_every_row_names_its_source_and_split() -> None:
    assert {r["source"] for r in ROWS} <= set(DOC["sources"])
    for source in DOC["sources"].values():
        assert source["url"].startswith("https://github.com/") and "/blob/" in source["url"]
    assert {r["split"] for r in ROWS} == {"fit", "held_out", "check"}
    assert {r["kind"] for r in ROWS} <= set(DOC["mapping"])
    assert len({r["key"] for r in ROWS}) == len(ROWS)
    # nothing the fit saw is held out: the held-out rows differ by device, lengths or quantization
    fit = {(r["cluster"], r.get("isl"), r["weight_dtype"]) for r in ROWS if r["split"] == "fit"}
    assert not [r["key"] for r in ROWS if r["split"] == "held_out" and r["kind"] != "decode"
                and (r["cluster"], r.get("isl"), r["weight_dtype"]) in fit]


@pytest.fixture(scope="module")
def parts() -> list:  # type: ignore[type-arg]
    specs = bench_serve.models()
    return [bench_serve.row_parts(r, specs) for r in ROWS]


def test_the_module_coefficients_are_the_fit(parts: list) -> None:  # type: ignore[type-arg]
    fitted = [(r, p) for r, p in zip(ROWS, parts) if r["split"] == "fit"]
    c = bench_serve.fit([r for r, _ in fitted], [p for _, p in fitted])
    assert c.hbm_efficiency == pytest.approx(SERVE_CALIBRATION.hbm_efficiency, abs=0.005)
    assert c.layer_overhead_s == pytest.approx(SERVE_CALIBRATION.layer_overhead_s, rel=0.02)
    assert c.collective_latency_scale == pytest.approx(SERVE_CALIBRATION.collective_latency_scale, abs=0.005)
    assert c.matmul_efficiency == pytest.approx(SERVE_CALIBRATION.matmul_efficiency, abs=0.005)


def test_the_stated_range_and_held_out_error_are_the_rows(parts: list) -> None:  # type: ignore[type-arg]
    ratios = [bench_serve.ratio(r, bench_serve.predict(r, p, SERVE_CALIBRATION)) for r, p in zip(ROWS, parts)]
    s = bench_serve.summary(ROWS, ratios)
    assert SERVE_CALIBRATION.low <= s["low"] and s["high"] <= SERVE_CALIBRATION.high
    assert s["low"] - SERVE_CALIBRATION.low < 0.01 and SERVE_CALIBRATION.high - s["high"] < 0.01
    assert s["held_out_error"] == pytest.approx(SERVE_CALIBRATION.held_out_error, abs=0.001)
    assert (s["fitted_rows"], s["held_out_rows"]) == (SERVE_CALIBRATION.fitted_rows, SERVE_CALIBRATION.held_out_rows)
    check = [q for r, q in zip(ROWS, ratios) if r["split"] == "check"]
    assert TPU_CHECK[0] <= min(check) and max(check) <= TPU_CHECK[1]
    assert min(check) >= 1  # the TPU rows are upper-bound checks: measured never beats the prediction
