"""The profile's fits: each recovers the figures that made its timings, under the cost model's own formulas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import MeshplanTypeError, ProfileError
from meshplan.pure.cluster import CollectiveTiming, Link, MatmulTiming, StepTiming
from meshplan.pure.cost import fit_link, fit_matmuls, fit_steps, matmul_shapes, ring_terms, sweep_shapes
from meshplan.pure.cost._collective_time import collective_time
from meshplan.pure.presets import MODEL_SPECS

_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")


@given(st.sampled_from(_KINDS), st.integers(1, 4096), st.floats(1e6, 1e13), st.floats(0, 1e-3),
       st.integers(0, 2**34))
def test_ring_terms_are_the_cost_models_formula(kind: str, n: int, bw: float, lat: float, nbytes: int) -> None:
    a, b = ring_terms(kind, n)
    assert math.isclose(a * lat + b * nbytes / bw, float(collective_time(kind, nbytes, n, Link(bw, lat))),
                        rel_tol=1e-9, abs_tol=1e-15)


def _timings(link: str, bw: float, lat: float, kinds: list[str], sizes: list[int], n: int) -> list[CollectiveTiming]:
    out = []
    for kind in kinds:
        a, b = ring_terms(kind, n)
        out += [CollectiveTiming(link, kind, n, s, a * lat + b * s / bw) for s in sizes]
    return out


@given(st.floats(1e8, 1e12), st.floats(1e-7, 1e-4), st.lists(st.sampled_from([*_KINDS, "collective-permute"]),
       min_size=1, max_size=5, unique=True), st.integers(2, 16))
def test_the_link_fit_recovers_the_latency_and_bandwidth_that_made_the_timings(bw, lat, kinds, n) -> None:
    fit = fit_link(_timings("intra", bw, lat, kinds, [2**12, 2**20, 2**26], n), "intra")
    assert math.isclose(fit.bandwidth, bw, rel_tol=1e-6) and math.isclose(fit.latency, lat, rel_tol=1e-4,
                                                                          abs_tol=1e-12)
    assert fit.max_error < 1e-6 and fit.kind == "all"


def test_the_link_fit_keeps_latency_non_negative_and_fits_each_link_apart() -> None:
    rows = _timings("intra", 1e11, 0.0, ["all-reduce"], [2**20, 2**24], 8)
    rows += [CollectiveTiming("intra", "all-reduce", 8, 2**16, 1e-9)]  # faster than light: pulls alpha below 0
    rows += _timings("inter", 1e9, 1e-5, ["all-gather"], [2**20, 2**24], 2)
    assert fit_link(rows, "intra").latency == 0.0
    assert math.isclose(fit_link(rows, "inter").bandwidth, 1e9, rel_tol=1e-6)


def test_the_link_fit_refuses_one_size_and_times_that_do_not_grow() -> None:
    with pytest.raises(ProfileError, match="at least two sizes"):
        fit_link(_timings("intra", 1e11, 1e-6, ["all-reduce"], [2**20], 8), "intra")
    flat = [CollectiveTiming("intra", "all-reduce", 8, s, 1e-3 / s) for s in (2**10, 2**20)]
    with pytest.raises(ProfileError, match="do not grow with the bytes"):
        fit_link(flat, "intra")
    with pytest.raises(MeshplanTypeError):
        fit_link(["x"], "intra")  # type: ignore[list-item]


@given(st.floats(0.2, 1.0), st.floats(0, 5000))
def test_the_matmul_fit_recovers_a_curve_of_the_catalogues_form(e_max: float, w0: float) -> None:
    peak = 1e15
    rows = [MatmulTiming("sweep up", h, 1, 4096, h, 4 * h, "bfloat16", 2 * 4096 * h * 4 * h / (peak * e_max * h / (h + w0)))
            for h in (512, 1024, 4096, 16384)]
    fit = fit_matmuls(rows, peak)
    assert fit is not None and fit.peak_source == "catalogue"
    for h in (768, 2048, 8192):
        assert math.isclose(fit.at(h), e_max * h / (h + w0), rel_tol=2e-2)
    for h, e in fit.points:  # a hidden size timed is priced at its measured figure
        assert math.isclose(fit.at(h), e_max * h / (h + w0), rel_tol=1e-9)


def test_the_matmul_fit_without_a_datasheet_peak_is_relative_to_the_fastest_matmul() -> None:
    rows = [MatmulTiming("sweep up", h, 1, 64, h, 4 * h, "bfloat16", 2 * 64 * h * 4 * h / r)
            for h, r in ((32, 1e9), (64, 4e9))]
    fit = fit_matmuls(rows, None)
    assert fit is not None and fit.peak == pytest.approx(4e9) and fit.peak_source == "fastest matmul timed"
    assert fit.points == ((32, pytest.approx(0.25)), (64, pytest.approx(1.0)))
    assert fit.e_max <= 1.0 and fit.at(10**6) <= 1.0
    assert fit_matmuls([], None) is None


def test_the_fp8_ratio_is_measured_at_the_same_shapes_and_reported() -> None:
    rows = [MatmulTiming("sweep up", 1024, 1, 4096, 1024, 4096, "bfloat16", 2e-4),
            MatmulTiming("sweep up", 1024, 1, 4096, 1024, 4096, "float8_e4m3fn", 1.25e-4)]
    assert fit_matmuls(rows, 1e15).fp8_ratio == pytest.approx(1.6)


def _step(mesh: str, compute_at_peak: float, exposed: float, measured: float, hidden: int = 64) -> StepTiming:
    return StepTiming("m", hidden, mesh, 8, 32, 3, measured, measured, measured, None, "", compute_at_peak / 0.5 + exposed,
                      compute_at_peak / 0.5, exposed, 0.5, 10, None)


@given(st.floats(0.05, 1.0), st.lists(st.tuples(st.floats(1e-4, 1.0), st.floats(0, 0.5)), min_size=2, max_size=5))
def test_the_step_fit_recovers_the_factor_that_made_the_steps(scale: float, parts: list) -> None:
    base = 0.6
    rows = [_step(f"m{i}", c, x, c / (base * scale) + x) for i, (c, x) in enumerate(parts)]
    fit = fit_steps(rows, lambda h: base)
    assert fit is not None and math.isclose(fit.scale, scale, rel_tol=1e-3)
    assert fit.max_error < 1e-3 and fit.loo_max_error is not None and fit.loo_max_error < 1e-3


def test_the_step_fit_states_its_leave_one_out_error_as_the_check() -> None:
    rows = [_step("a", 0.1, 0.0, 0.2), _step("b", 0.1, 0.0, 0.4), _step("c", 0.1, 0.0, 0.3)]
    fit = fit_steps(rows, lambda h: 1.0)
    assert fit is not None and fit.loo_max_error > fit.max_error > 0
    assert fit_steps([_step("a", 0.1, 0.0, 0.2)], lambda h: 1.0).loo_max_error is None
    unpriced = StepTiming("m", 64, "x", 8, 32, 3, 0.2, 0.2, 0.2, None, "", 0.1, 0.0, 0.1, None, 10, None)
    assert fit_steps([unpriced], lambda h: 1.0) is None  # no compute priced: nothing to scale


@given(st.sampled_from(sorted(MODEL_SPECS)), st.sampled_from([1, 2, 4, 8]), st.integers(1, 8192))
def test_the_layer_shapes_split_their_widths_by_tp(name: str, tp: int, tokens: int) -> None:
    spec = MODEL_SPECS[name]
    whole = {s[0]: s for s in matmul_shapes(spec, tokens=tokens)}
    split = {s[0]: s for s in matmul_shapes(spec, tokens=tokens, tp=tp)}
    assert whole.keys() == split.keys()
    for label, (_, m, k, n) in split.items():
        assert m == tokens and min(k, n) >= 1
        assert k * n <= whole[label][2] * whole[label][3]  # a split never grows a matmul
    assert ("gate" in whole) == (spec.family != "gpt2")


def test_the_sweep_times_an_mlps_up_and_down_at_each_hidden_size() -> None:
    assert [s for _, s in sweep_shapes([64, 128], tokens=8)] == [
        ("sweep up", 8, 64, 256), ("sweep down", 8, 256, 64), ("sweep up", 8, 128, 512), ("sweep down", 8, 512, 128)]
