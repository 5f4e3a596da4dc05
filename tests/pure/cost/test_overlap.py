"""The overlap rule (meshplan.pure.cost._overlap): its bounds, its shares, the step that takes it, and the fit
it ships, recomputed from the compiled programs' recorded rows."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import search_meshes
from meshplan.pure.cost import OVERLAP_FIT, OverlapRule, StepFlops, TrainingRecipe, overlap_rule, step_time, \
    window_exposure
from meshplan.pure.errors import MeshplanTypeError, PlanError

BENCHMARKS = pathlib.Path(__file__).resolve().parents[3] / "benchmarks"
seconds = st.floats(0, 10, allow_nan=False)
shares = st.floats(0, 1, allow_nan=False)
rules = st.builds(OverlapRule, shares, shares, st.floats(0, 2, allow_nan=False))


@given(rules, seconds, seconds, seconds)
def test_the_exposed_seconds_lie_between_the_fixed_part_and_all(rule: OverlapRule, g: float, r: float,
                                                                  w: float) -> None:
    e = rule.exposed(g, r, w)
    fixed = rule.gather_exposed * g + rule.grads_exposed * r
    assert fixed - 1e-12 <= e <= g + r + 1e-12
    assert rule.exposed(g, r, w + 1.0) <= e + 1e-12  # a longer window never exposes more


@given(shares, shares, seconds, seconds, seconds)
def test_a_rule_that_fixes_nothing_is_the_best_case(_a: float, _b: float, g: float, r: float, w: float) -> None:
    assert OverlapRule(0.0, 0.0, 1.0).exposed(g, r, w) == pytest.approx(max(0.0, g + r - w), abs=1e-12)
    assert OverlapRule(1.0, 1.0, 1.0).exposed(g, r, w) == pytest.approx(g + r, abs=1e-12)


@given(rules, st.lists(seconds, max_size=5), st.lists(seconds, max_size=5), seconds)
def test_the_shares_sum_to_the_window_and_each_is_bounded(rule: OverlapRule, gathers: list[float],
                                                          grads: list[float], w: float) -> None:
    g, r = window_exposure(gathers, grads, w, rule)
    assert len(g) == len(gathers) and len(r) == len(grads)
    assert sum(g) + sum(r) == pytest.approx(rule.exposed(sum(gathers), sum(grads), w), abs=1e-9)
    for share, s, a in [(x, s, rule.gather_exposed) for x, s in zip(g, gathers)] + \
            [(x, s, rule.grads_exposed) for x, s in zip(r, grads)]:
        assert a * s - 1e-9 <= share <= s + 1e-9


@given(rules, st.floats(0, 1, allow_nan=False), st.floats(0, 1, allow_nan=False), st.integers(1, 128))
def test_a_step_under_a_rule_exposes_at_most_its_collectives(rule: OverlapRule, g: float, r: float,
                                                              layers: int) -> None:
    f = StepFlops(6e15, 0.0, 0.0, 1e15, 4e12, 8e12, 4e13)
    terms = [("fsdp all-gather of params (fwd + bwd)", "all-gather", g), ("fsdp reduce-scatter of grads",
                                                                          "reduce-scatter", r)]
    kw = dict(layers=layers, tokens=2**20, devices=8, peak_flops=1e15, efficiency=0.5)
    t = step_time(f, terms, overlap=rule, **kw)
    assert 0.0 <= t.exposed_s <= g + r + 1e-12
    assert t.exposed_s >= rule.grads_exposed * r - 1e-12  # the fixed share is paid whatever the compute
    # the best-case rule exposes no more than the prefetch rule, which also exposes the first and last layer
    assert step_time(f, terms, overlap=OverlapRule(0, 0, 1), **kw).exposed_s <= \
        step_time(f, terms, **kw).exposed_s + 1e-12


def test_the_rule_is_fitted_for_xla_gpu_only() -> None:
    assert overlap_rule("gpu") is OVERLAP_FIT["gpu"]
    assert overlap_rule("tpu") is None and overlap_rule("cpu") is None
    with pytest.raises(PlanError, match="backend"):
        overlap_rule("rocm")
    with pytest.raises(PlanError, match="grads_exposed"):
        OverlapRule(0.0, 1.5, 0.5)
    with pytest.raises(MeshplanTypeError):
        step_time(StepFlops(1, 0, 0, 1, 1, 1, 1), [], layers=1, tokens=1, devices=1, peak_flops=1.0,
                  efficiency=0.5, overlap=(0.0, 0.8, 0.5))  # type: ignore[arg-type]


def test_gpu_plans_take_the_rule_and_tpu_plans_the_prefetch_rule() -> None:
    # The same mesh priced with the rule removed: a GPU step changes (its gradient syncs are mostly exposed
    # in the compiled programs), a TPU step does not.
    gpu = search_meshes("llama3-8b", "2x8xH100", batch=64, seq=2048, fixed={"fsdp": 16}, top_k=1).best
    tpu = search_meshes("llama3-8b", "v5p-32", batch=64, seq=2048, fixed={"fsdp": 16}, top_k=1).best
    saved = dict(OVERLAP_FIT)
    OVERLAP_FIT.clear()
    try:
        gpu0 = search_meshes("llama3-8b", "2x8xH100", batch=64, seq=2048, fixed={"fsdp": 16}, top_k=1).best
        tpu0 = search_meshes("llama3-8b", "v5p-32", batch=64, seq=2048, fixed={"fsdp": 16}, top_k=1).best
    finally:
        OVERLAP_FIT.update(saved)
    assert gpu.step.step_s > gpu0.step.step_s
    assert tpu.step.step_s == tpu0.step.step_s
    assert TrainingRecipe(backend="gpu").compiler == "gpu"


def test_the_shipped_fit_is_the_fit_of_the_recorded_compiled_programs() -> None:
    # Re-record with `python benchmarks/bench_overlap_grid.py --gpu --record benchmarks/data/overlap_grid.jsonl`
    # (about 10 minutes of deviceless compiles), refit with `--fit`, and update OVERLAP_FIT.
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bench_overlap_grid import fit_rule, windows
    finally:
        sys.path.remove(str(BENCHMARKS))
    rows = [json.loads(line) for line in (BENCHMARKS / "data" / "overlap_grid.jsonl").read_text().splitlines()]
    assert len(windows(rows)) >= 30
    rule = OVERLAP_FIT["gpu"]
    assert fit_rule(rows) == (rule.gather_exposed, rule.grads_exposed, rule.compute_share)


def test_the_tpu_grid_fits_the_rule_the_docs_name_and_none_is_shipped() -> None:
    # The XLA:TPU grid's fit (6 single-slice rows; the two-slice programs have one layer loop, no windows) is
    # what the module docstring and RESULTS quote; it was checked against MaxText's runs and not adopted.
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bench_overlap_grid import fit_rule, windows
    finally:
        sys.path.remove(str(BENCHMARKS))
    path = BENCHMARKS / "data" / "overlap_grid_tpu.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 9 and len(windows(rows)) == 6
    assert fit_rule(rows) == (0.4, 0.08, 0.62)
    assert "tpu" not in OVERLAP_FIT and overlap_rule("tpu") is None
