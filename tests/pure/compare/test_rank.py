"""A comparison's verdicts: ranking, the smallest fit, the knee, costs; built from real searches."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import CompareError, MeshplanTypeError
from meshplan.pure import get_preset, search_meshes
from meshplan.pure.compare import (
    CRITERIA,
    CompareOption,
    Verified,
    build_comparison,
    cost_per_million_tokens,
    option_from_search,
    rank_options,
    scaling_knees,
    smallest_fitting,
    train_figures,
)

GIB = 2**30


def _option(n: int, step: float, *, device: str = "H100", fits: bool = True, price: float | None = 2.0,
            tokens: int = 8 * 4096) -> CompareOption:
    return CompareOption(f"{n}x8x{device}", device, 8 * n, fits, "fsdp=8" if fits else "",
                         "estimate" if fits else "none fits", 40 * GIB if fits else None, 60 * GIB,
                         step if fits else 0.0, tokens, 0.4 if fits else 0.0, price_per_device_hour=price)


options = st.lists(
    st.builds(_option, st.integers(1, 64), st.floats(0.01, 100.0), device=st.sampled_from(["H100", "B200", "v5p"]),
              fits=st.booleans(), price=st.one_of(st.none(), st.floats(0.1, 50.0)),
              tokens=st.integers(1, 10**7)),
    min_size=1, max_size=12)


@given(options, st.sampled_from([c for c in CRITERIA if c != "cost"]))
def test_ranking_is_a_permutation_with_every_fitting_option_first_and_best_first(opts: list, by: str) -> None:
    ranked = rank_options(opts, by)
    assert sorted(map(id, ranked)) == sorted(map(id, opts))
    fits = [o.fits for o in ranked]
    assert fits == sorted(fits, reverse=True)
    score = [o.tokens_per_s if by == "time" else o.tokens_per_s_per_device for o in ranked if o.fits]
    assert score == sorted(score, reverse=True)


@given(options)
def test_ranking_ignores_the_order_options_come_in(opts: list) -> None:
    for by in CRITERIA:
        if by == "cost" and all(o.price_per_device_hour is None for o in opts):
            continue
        assert rank_options(opts, by) == rank_options(list(reversed(opts)), by)


@given(options)
def test_by_cost_the_cheapest_token_comes_first_and_unpriced_ones_after_the_priced(opts: list) -> None:
    if all(o.price_per_device_hour is None for o in opts):
        with pytest.raises(CompareError, match="--by cost needs prices"):
            rank_options(opts, "cost")
        return
    ranked = rank_options(opts, "cost")
    costs = [o.cost_per_million_tokens for o in ranked if o.fits and o.price_per_device_hour is not None]
    assert costs == sorted(costs)
    kinds = [0 if o.fits and o.price_per_device_hour is not None else 1 if o.fits else 2 for o in ranked]
    assert kinds == sorted(kinds)


@given(options)
def test_the_smallest_fit_fits_and_no_fitting_option_has_fewer_devices(opts: list) -> None:
    small = smallest_fitting(opts)
    fitting = [o for o in opts if o.fits]
    assert (small is None) == (not fitting)
    if small is not None:
        assert small.fits and small.devices == min(o.devices for o in fitting)


@given(st.floats(0.01, 100.0), st.integers(1, 64), st.integers(1, 10**7), st.floats(0.01, 100.0))
def test_cost_per_token_is_price_times_devices_over_throughput(price: float, devices: int, tokens: int,
                                                              step: float) -> None:
    tps = tokens / step
    cost = cost_per_million_tokens(price, devices, tps)
    hours, usd = train_figures(10**6, tps, devices, price)
    assert math.isclose(cost, usd)  # a million tokens cost what the per-million figure says
    assert math.isclose(hours * 3600 * tps, 10**6)


def test_perfect_scaling_has_no_knee_and_a_flat_step_has_one_at_its_first_size() -> None:
    linear = [_option(n, 8.0 / n) for n in (1, 2, 4, 8)]
    (k,) = scaling_knees(linear)
    assert k.knee is None and all(math.isclose(s.efficiency, 1.0) for s in k.steps)
    flat = [_option(n, 2.0) for n in (1, 2, 4)]  # one global batch whose step never falls: no step pays
    (k,) = scaling_knees(flat)
    assert k.knee == "1x8xH100" and math.isclose(k.steps[0].efficiency, 0.5)
    assert "stops paying" in k.describe() and "2.00x" in k.describe()


@given(st.lists(st.floats(0.05, 50.0), min_size=2, max_size=6), st.floats(0.05, 1.0))
def test_the_knee_is_the_first_size_whose_next_step_is_below_the_threshold(steps: list, threshold: float) -> None:
    opts = [_option(2**i, s) for i, s in enumerate(steps)]
    (k,) = scaling_knees(opts, threshold=threshold)
    assert len(k.steps) == len(steps) - 1
    for s in k.steps:
        assert math.isclose(s.efficiency * s.ratio, s.speedup)
    below = [s.small for s in k.steps if s.efficiency < threshold]
    assert k.knee == (below[0] if below else None)


def test_knees_are_per_kind_and_skip_sizes_that_do_not_fit() -> None:
    opts = [_option(1, 4.0), _option(2, 2.0), _option(4, 0.0, fits=False), _option(1, 3.0, device="B200")]
    ks = {k.device: k for k in scaling_knees(opts)}
    assert [(s.small, s.large) for s in ks["H100"].steps] == [("1x8xH100", "2x8xH100")]
    assert ks["B200"].steps == () and "fewer than two sizes fit" in ks["B200"].describe()
    with pytest.raises(CompareError, match="threshold"):
        scaling_knees(opts, threshold=0)


def test_a_comparison_of_real_searches_ranks_them_and_its_json_has_the_issue_fields() -> None:
    tiny = dataclasses.replace(get_preset("gpt2").spec, num_layers=2, num_params=None)
    results = [search_meshes(tiny, c, batch=16, seq=256, top_k=2) for c in ("1x8xH100", "2x8xH100", "v5e-16")]
    prices = {"H100": 2.5, "v5e": 1.2}
    opts = [option_from_search(r, price_per_device_hour=prices[r.request.cluster.device.name]) for r in results]
    c = build_comparison(tiny.name, 16, 256, opts, by="cost", tokens=10**9)
    rows = json.loads(json.dumps(c.to_dict()))["rows"]
    for row in rows:
        for key in ("cluster", "devices", "fits", "mesh", "step_s", "tokens_per_s", "mfu", "verified",
                    "cost_per_million_tokens", "train_hours", "train_cost"):
            assert key in row, key
    assert [r["cluster"] for r in rows] == [o.cluster for o in c.options]
    costs = [r["cost_per_million_tokens"] for r in rows]
    assert costs == sorted(costs)
    for r, result in zip(opts, results):
        assert r.step_s == result.best.step.step_s and r.mesh == result.best.text
        assert math.isclose(r.tokens_per_s, 16 * 256 / result.best.step.step_s)


def test_a_verified_option_takes_the_compiled_peak_and_an_over_budget_one_does_not_fit() -> None:
    found = search_meshes("gpt2", "1x8xH100", batch=8, seq=256, top_k=3)
    best = found.best
    exact = option_from_search(found, Verified(best.text, "exact", peak_bytes=123456789, compiler="XLA:GPU (x)"))
    assert exact.status == "exact" and exact.memory_bytes == 123456789 and exact.fits and exact.compiler
    over = option_from_search(found, Verified(best.text, "over budget", peak_bytes=found.request.budget + 1))
    assert not over.fits and over.tokens_per_s == 0 and "over the" in over.note
    with pytest.raises(CompareError, match="not a ranked mesh"):
        option_from_search(found, Verified("tp=64", "exact", peak_bytes=1))
    with pytest.raises(CompareError, match="needs peak_bytes"):
        Verified(best.text, "exact")
    with pytest.raises(MeshplanTypeError):
        option_from_search("not a result")  # type: ignore[arg-type]


def test_a_bad_option_is_a_typed_error() -> None:
    with pytest.raises(CompareError, match="status"):
        CompareOption("x", "H100", 8, True, "fsdp=8", "great", 1, 2, 1.0, 8, 0.4)
    with pytest.raises(CompareError, match="step time > 0"):
        CompareOption("x", "H100", 8, True, "fsdp=8", "estimate", 1, 2, 0.0, 8, 0.4)
    with pytest.raises(MeshplanTypeError):
        CompareOption("x", "H100", 8, "yes", "fsdp=8", "estimate", 1, 2, 1.0, 8, 0.4)  # type: ignore[arg-type]
    with pytest.raises(CompareError, match="--by"):
        rank_options([_option(1, 1.0)], "speed")
