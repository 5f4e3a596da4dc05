"""The verification's decisions: a compiled peak against the budget, an outcome as a row, what to compile next."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.verify import (
    OOM_SOURCE,
    CompileOutcome,
    VerifyRow,
    compiled_fit,
    next_to_compile,
    outcome_row,
)
from meshplan.pure.xla import CompiledMemory, deviceless_gpu_run_range

peaks = st.integers(0, 2**40)


@given(peaks, peaks)
def test_a_deviceless_gpu_peak_fits_only_when_a_run_six_percent_higher_would(peak, budget):
    over, high, why = compiled_fit(peak, budget, deviceless=True)
    assert high == deviceless_gpu_run_range(peak)[1]
    assert over == (high > budget)
    assert (why != "") == over and (not over or "a run up to" in why)


@given(peaks, peaks)
def test_any_other_compiled_peak_is_the_runs_own(peak, budget):
    over, high, why = compiled_fit(peak, budget, deviceless=False)
    assert high is None and over == (peak > budget) and (why != "") == over


@given(peaks, peaks, st.booleans())
def test_the_rows_fit_agrees_with_the_rule_the_status_was_set_by(peak, budget, deviceless):
    over, high, _ = compiled_fit(peak, budget, deviceless=deviceless)
    row = VerifyRow("fsdp=8", 1, None, budget, "", peak_bytes=peak, run_high_bytes=high,
                    status="over budget" if over else "exact", deviceless=deviceless)
    assert row.fits is (not over)
    assert ("a run <=" in row.summary()) == (high is not None)


def test_a_peak_just_under_the_budget_is_over_it_for_a_deviceless_gpu_and_not_for_a_tpu():
    # The case the rule exists for: 74 GiB compiled on a 75.2 GiB allocator needs up to 78.4 GiB on the GPU.
    gib = 2**30
    peak, budget = 74 * gib, round(75.2 * gib)
    assert compiled_fit(peak, budget, deviceless=True)[0] is True
    assert compiled_fit(peak, budget, deviceless=False)[0] is False


def _memory(peak: int) -> CompiledMemory:
    return CompiledMemory(argument_bytes=peak // 2, output_bytes=0, alias_bytes=0, temp_bytes=peak - peak // 2,
                          peak_bytes=peak, peak_source="peak_memory_in_bytes", reported_peak_bytes=peak,
                          generated_code_bytes=0, host_temp_bytes=0, platform="tpu", device_kind="TPU v5",
                          num_devices=8, compile_seconds=1.5)


outcomes = st.one_of(
    st.builds(lambda p, d: CompileOutcome("target", _memory(p), seconds=2.0, deviceless=d), peaks, st.booleans()),
    st.builds(lambda p: CompileOutcome("target", None, oom=True, oom_required_bytes=p, error="does not fit: XLA"),
              peaks),
    st.builds(lambda e: CompileOutcome("target", None, error=e), st.sampled_from(["timed out after 9 s", "crash"])),
)


@given(outcomes, peaks, st.booleans())
def test_every_outcome_becomes_exactly_one_verdict_that_keeps_the_estimate(outcome, budget, cached):
    base = VerifyRow("fsdp=8", 3, 12345, budget, "", status="estimate", range_low_bytes=1, range_high_bytes=2)
    row = outcome_row(base, outcome, compiler="XLA:TPU (libtpu 1)", cached=cached)
    # The estimate's facts stay; the compile's are added.
    assert (row.mesh, row.rank, row.analytic_bytes, row.budget_bytes) == ("fsdp=8", 3, 12345, budget)
    assert (row.range_low_bytes, row.range_high_bytes) == (1, 2)
    assert row.target == "target" and row.deviceless == outcome.deviceless
    if outcome.memory is not None:
        assert row.peak_bytes == outcome.memory.peak_bytes and row.cached == cached
        assert row.status == ("over budget" if compiled_fit(row.peak_bytes, budget,
                                                            deviceless=outcome.deviceless)[0] else "exact")
    elif outcome.oom:
        assert row.status == "over budget" and row.peak_source == OOM_SOURCE
        assert row.peak_bytes == outcome.oom_required_bytes and row.error == outcome.error
    else:
        assert row.status == "not verified" and row.error == f"not verified: {outcome.error}"
        assert row.peak_bytes is None and not row.cached


def test_a_pipeline_rows_schedule_is_kept_only_with_a_compiled_figure():
    base = VerifyRow("pp=2,fsdp=4", 1, 10, 100, "", status="estimate", schedule="1f1b m=8")
    exact = outcome_row(base, CompileOutcome("t", _memory(50)), compiler="c", cached=False,
                        compiled_schedule="circular v=1 m=8", note="compiled as the circular schedule")
    failed = outcome_row(base, CompileOutcome("t", None, error="crash"), compiler="c", cached=False,
                         compiled_schedule="circular v=1 m=8", note="compiled as the circular schedule")
    assert (exact.compiled_schedule, exact.schedule) == ("circular v=1 m=8", "1f1b m=8") and exact.note
    assert (failed.compiled_schedule, failed.note) == ("", "")


highs = st.lists(st.one_of(st.none(), st.integers(0, 100)), max_size=12)


@given(highs, st.integers(0, 100), st.integers(1, 5), st.data())
def test_a_plan_compiles_its_best_meshes_until_top_fit_and_every_straddling_one(ranges, budget, top, data):
    decided: dict[int, str] = {}
    start = 0
    rounds = 0
    while True:
        want, start = next_to_compile(ranges, budget, decided, top=top, start=start)
        if not want:
            break
        assert not set(want) & set(decided), "a mesh is never compiled twice"
        for i in want:
            decided[i] = data.draw(st.sampled_from(["exact", "over budget", "not verified"]))
        rounds += 1
        assert rounds <= len(ranges) + 1
    fitting = sum(s == "exact" for s in decided.values())
    # Stopped because top meshes fit or the ranking ran out; every straddling mesh was compiled.
    assert fitting >= top or start == len(ranges)
    assert {i for i, h in enumerate(ranges) if (h or 0) > budget} <= set(decided)
    # The ranked meshes were taken in order: every one above where the walk stopped was compiled, and
    # below it only straddling ones.
    assert set(range(start)) <= set(decided)
    assert all((ranges[i] or 0) > budget for i in decided if i >= start)


def test_an_over_budget_mesh_is_replaced_by_the_next_ranked_one():
    want, start = next_to_compile([10, 10, 10], 20, {}, top=1, start=0)
    assert (want, start) == ((0,), 1)
    assert next_to_compile([10, 10, 10], 20, {0: "over budget"}, top=1, start=1) == ((1,), 2)
    assert next_to_compile([10, 10, 10], 20, {0: "over budget", 1: "exact"}, top=1, start=2) == ((), 2)


def test_the_outcome_row_is_the_estimate_row_with_the_compiles_fields_replaced():
    base = VerifyRow("dp=8", 1, 10, 100, "", status="estimate")
    row = outcome_row(base, CompileOutcome("8 x XLA:CPU", _memory(40)), compiler="XLA:CPU", cached=True)
    changed = {f.name for f in dataclasses.fields(VerifyRow) if getattr(row, f.name) != getattr(base, f.name)}
    assert changed <= {"status", "target", "argument_bytes", "temp_bytes", "peak_bytes", "peak_source",
                       "compile_seconds", "largest", "largest_note", "compiler", "cached", "run_high_bytes", "error",
                       "deviceless", "compiled_schedule", "note"}
    assert row.status == "exact" and row.describe().endswith("(XLA:CPU)")


@pytest.mark.parametrize("bad", [{"status": "great"}, {"rank": 0}, {"peak_bytes": -1}, {"mesh": 3}])
def test_a_row_with_a_bad_field_is_a_typed_error_naming_it(bad):
    from meshplan.errors import MeshplanError

    fields = {"mesh": "dp=8", "rank": 1, "analytic_bytes": 1, "budget_bytes": 2, "target": "", **bad}
    with pytest.raises(MeshplanError, match=next(iter(bad))):
        VerifyRow(**fields)


@given(st.lists(st.one_of(st.none(), st.integers(0, 100)), max_size=12), st.integers(0, 100), st.integers(0, 5))
def test_the_near_misses_are_the_leanest_rejected_meshes_whose_range_reaches_the_budget(lows, budget, limit):
    from meshplan.pure.verify import near_misses

    got = near_misses(lows, budget, limit=limit)
    reaching = [i for i, low in enumerate(lows) if low is not None and low <= budget]
    assert got == tuple(reaching[:limit])  # in the search's order (leanest first), each once
    assert all(lows[i] is not None and lows[i] <= budget for i in got)


def test_a_rejected_mesh_the_compiler_fits_is_ranked_by_its_step_and_the_others_stay_rejected():
    from meshplan.pure.search import search_meshes
    from meshplan.pure.verify import ADMITTED, PlanVerification, VerifyRow, admit_compiled

    result = search_meshes("llama3-8b", "1x8xH100", batch=32, seq=4096, top_k=4)
    fits, over = result.rejected[1], result.rejected[0]
    rows = (VerifyRow(fits.text, None, 1, result.request.budget, "", status="exact", peak_bytes=result.request.budget),
            VerifyRow(result.candidates[0].text, 1, 1, result.request.budget, "", status="exact", peak_bytes=1))
    removed = (VerifyRow(over.text, None, 1, result.request.budget, "", status="over budget", peak_bytes=2**50),)
    admitted, checked = admit_compiled(result, PlanVerification(rows, removed, "XLA:GPU", "", 1.0))
    texts = [c.text for c in admitted.candidates]
    assert fits.text in texts and over.text in [c.text for c in admitted.rejected]
    assert fits.text not in [c.text for c in admitted.rejected]
    assert [c.rank for c in admitted.candidates] == list(range(1, len(texts) + 1))
    assert admitted.num_fitting == result.num_fitting + 1
    placed = next(c for c in admitted.candidates if c.text == fits.text)
    assert placed.verdict == ADMITTED
    # in front of the first ranked mesh its predicted step is faster than; every other mesh in its order
    others = [c.text for c in admitted.candidates if c.text != fits.text]
    assert others == [c.text for c in result.candidates]
    after = [c for c in admitted.candidates if (c.rank or 0) > (placed.rank or 0)]
    assert all(c.step.step_s >= placed.step.step_s for c in after[:1])
    assert {r.mesh: r.rank for r in checked.rows}[fits.text] == placed.rank
    # nothing compiled within the budget: the result is untouched
    same, _ = admit_compiled(result, PlanVerification((), removed, "XLA:GPU", "", 1.0))
    assert same is result
