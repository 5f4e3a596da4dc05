"""A compiled peak against the budget: a GPU compiled with no GPU is checked at the top of a run's range."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplan.facade._verify_row import VerifyRow, compiled_fit
from meshplan.facade._worker import deviceless_gpu
from meshplan.pure.xla import deviceless_gpu_run_range

DEVICELESS = ("64 x NVIDIA H100 80GB HBM3 (no GPU: meshplan's shipped description)",
              "16 x NVIDIA H200 (compiled ahead of time)")
RUN_OWN = ("8 x XLA:CPU", "8 x NVIDIA H100 80GB HBM3", "v5:2x2x2 (v5p-16)", "")

peaks = st.integers(0, 2**40)


@given(peaks, peaks, st.sampled_from(DEVICELESS))
def test_a_deviceless_gpu_peak_fits_only_when_a_run_six_percent_higher_would(peak, budget, target):
    over, high, why = compiled_fit(peak, budget, target)
    assert high == deviceless_gpu_run_range(peak)[1]
    assert over == (high > budget)
    assert (why != "") == over and (not over or "a run up to" in why)


@given(peaks, peaks, st.sampled_from(RUN_OWN))
def test_any_other_compiled_peak_is_the_runs_own(peak, budget, target):
    assert not deviceless_gpu(target)
    over, high, why = compiled_fit(peak, budget, target)
    assert high is None and over == (peak > budget) and (why != "") == over


@given(peaks, peaks, st.sampled_from(DEVICELESS + RUN_OWN))
def test_the_rows_fit_agrees_with_the_rule_the_status_was_set_by(peak, budget, target):
    over, high, _ = compiled_fit(peak, budget, target)
    row = VerifyRow("fsdp=8", 1, None, budget, target, peak_bytes=peak, run_high_bytes=high,
                    status="over budget" if over else "exact")
    assert row.fits is (not over)
    assert ("a run <=" in row.summary()) == (high is not None)


def test_a_peak_just_under_the_budget_is_over_it_for_a_deviceless_gpu_and_not_for_a_tpu():
    # The case the rule exists for: 74 GiB compiled on a 75.2 GiB allocator needs up to 78.4 GiB on the GPU.
    gib = 2**30
    peak, budget = 74 * gib, round(75.2 * gib)
    assert compiled_fit(peak, budget, DEVICELESS[0])[0] is True
    assert compiled_fit(peak, budget, RUN_OWN[2])[0] is False
