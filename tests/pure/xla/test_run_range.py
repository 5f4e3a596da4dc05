"""The range a GPU run peaks in, from a deviceless compile's peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.xla import DEVICELESS_GPU_RUN_RATIO, deviceless_gpu_run_range

RECORDED = Path(__file__).parents[3] / "benchmarks" / "data" / "deviceless_vs_gpu_h100.jsonl"


@given(st.integers(0, 10**18))
def test_the_range_starts_at_the_compiled_peak_and_ends_six_percent_above_rounded_up(peak):
    low, high = deviceless_gpu_run_range(peak)
    assert low == peak
    assert high * 100 >= peak * 106 > (high - 1) * 100  # the ceiling, exactly, at any size


@given(st.integers(0, 10**17), st.integers(0, 10**17))
def test_a_bigger_peak_never_has_a_smaller_range(a, b):
    small, big = sorted((a, b))
    assert all(x <= y for x, y in zip(deviceless_gpu_run_range(small), deviceless_gpu_run_range(big), strict=True))


def test_every_recorded_h100_run_is_inside_the_range_of_its_deviceless_compile():
    # The measurement the ratio comes from: a change of the ratio that leaves a recorded run out fails here.
    rows = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    runs = [(r["deviceless"]["peak"], r["device"]["real_peak"]) for r in rows if r["device"].get("real_peak")]
    assert len(runs) == 5
    for peak, real in runs:
        low, high = deviceless_gpu_run_range(peak)
        assert low <= real <= high, (peak, real)
    worst = max(real / peak for peak, real in runs)
    assert worst <= DEVICELESS_GPU_RUN_RATIO[1] < worst + 0.01  # rounded out, not padded


@pytest.mark.parametrize("bad, error", [(-1, PlanError), (1.5, MeshplanTypeError), ("1", MeshplanTypeError),
                                        (True, MeshplanTypeError)])
def test_bad_peaks_are_typed_errors(bad, error):
    with pytest.raises(error, match="peak_bytes"):
        deviceless_gpu_run_range(bad)
