"""Tests for the recorded spread an estimate is stated with (meshplan.pure.cost._memory_spread).

The table itself is held equal to the recorded compiles by ``tests/test_bench_memory_spread.py``; here are
its invariants, the lookup's agreement with the coefficients a recipe is priced with, and the bounds.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.cost import (
    MemoryBreakdown,
    SPREADS,
    Spread,
    attention_class,
    calibration_spread,
    describe_spread,
    peak_bounds,
)
from meshplan.pure.cost._memory_spread import outside_recorded
from meshplan.pure.cluster._devices import DEVICE_SPECS
from meshplan.pure.cost._recipe import ATTENTION_KINDS, BACKENDS, REMAT_POLICIES, TrainingRecipe
from meshplan.pure.cost._step_memory import CALIBRATIONS, calibration_key

BYTES = st.integers(min_value=0, max_value=2**50)
RATIO = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
RECIPES = st.builds(TrainingRecipe, remat=st.sampled_from(REMAT_POLICIES), backend=st.sampled_from(BACKENDS),
                    attention=st.sampled_from(ATTENTION_KINDS), device=st.sampled_from([None, *sorted(DEVICE_SPECS)]))


@st.composite
def memories(draw: st.DrawFn) -> MemoryBreakdown:
    return MemoryBreakdown(draw(BYTES), draw(BYTES), draw(BYTES), draw(BYTES), draw(BYTES),
                           draw(st.sampled_from(["forward", "backward", "update"])), draw(st.booleans()))


@st.composite
def spreads(draw: st.DrawFn) -> Spread:
    low, high = sorted((draw(RATIO), draw(RATIO)))
    return Spread(low, high, draw(st.integers(1, 1000)))


def test_every_recorded_spread_names_known_coefficients_remat_and_attention_and_holds_one_row_at_least() -> None:
    for (key, remat, kind), s in SPREADS.items():
        assert key in CALIBRATIONS and remat in REMAT_POLICIES
        assert kind in {attention_class(a) for a in ATTENTION_KINDS} == {"flash", "scores"}
        assert 0 < s.low <= s.high and s.rows >= 1


@given(RECIPES)
def test_a_spread_is_measured_on_the_coefficients_the_recipe_is_priced_with(recipe: TrainingRecipe) -> None:
    found = calibration_spread(recipe)
    if found is None:
        # Only when no recorded key with these very coefficients has a row with this remat policy.
        same = [k for k in CALIBRATIONS if CALIBRATIONS[k] is CALIBRATIONS[calibration_key(recipe)]]
        assert all((k, recipe.remat, attention_class(recipe.attention)) not in SPREADS for k in same)
    else:
        key, s = found
        assert CALIBRATIONS[key] is CALIBRATIONS[calibration_key(recipe)]
        assert SPREADS[key, recipe.remat, attention_class(recipe.attention)] == s


def test_v4_and_v5e_state_the_v6e_compiles_that_measured_their_coefficients() -> None:
    for device in ("v4", "v5e", None):
        found = calibration_spread(TrainingRecipe(remat="full", device=device))
        assert found is not None and found[0] == "tpu-v6e"
    # v5p has coefficients and compiles of its own.
    assert calibration_spread(TrainingRecipe(remat="full", device="v5p")) == ("tpu-v5p",
                                                                             SPREADS["tpu-v5p", "full", "scores"])
    # Plain and XLA's dot_product attention compile to the same peak: one spread; flash has its own.
    plain, dot, flash = (calibration_spread(TrainingRecipe(remat="full", attention=a, device="v6e"))
                         for a in ("plain", "dot_product", "flash"))
    assert plain == dot != flash


@given(RECIPES)
def test_the_sentence_states_the_rows_and_both_bounds_or_that_none_is_recorded(recipe: TrainingRecipe) -> None:
    text, found = describe_spread(recipe), calibration_spread(recipe)
    if found is None:
        assert text.startswith("no recorded compile") and f"remat {recipe.remat} and " in text
    else:
        s = found[1]
        assert f" {s.rows} recorded " in text and f"{s.low:.2f}-{s.high:.2f}x" in text
        # A device whose own compiles are not recorded is said to borrow another's coefficients.
        measured = {"tpu-v6e": "v6e", "tpu-v5p": "v5p", "gpu": "H200"}.get(found[0])
        borrowed = recipe.device is not None and measured is not None and recipe.device != measured
        note = f"{recipe.device} has no compiled grid: it is priced with {measured}'s coefficients"
        assert (note in text) == borrowed


@given(memories(), spreads())
def test_the_bounds_keep_the_exact_state_and_scale_only_the_calibrated_part(m: MemoryBreakdown, s: Spread) -> None:
    low, high = peak_bounds(m, s)
    state = m.total - m.activations
    assert state <= low <= high
    # Within a byte of the exact products (rationals: floats lose bytes at these sizes), rounded outwards.
    assert state + Fraction(s.low) * m.activations - 1 < low <= state + Fraction(s.low) * m.activations
    assert state + Fraction(s.high) * m.activations <= high < state + Fraction(s.high) * m.activations + 1
    if s.low <= 1 <= s.high:
        assert low <= m.total <= high


@given(memories(), spreads(), RATIO)
def test_a_wider_spread_never_narrows_the_bounds(m: MemoryBreakdown, s: Spread, more: float) -> None:
    low, high = peak_bounds(m, s)
    wider = peak_bounds(m, Spread(max(s.low - more, 0.0), s.high + more, s.rows))
    assert wider[0] <= low and high <= wider[1]


@given(memories())
def test_a_spread_of_one_is_the_estimate(m: MemoryBreakdown) -> None:
    assert peak_bounds(m, Spread(1.0, 1.0, 1)) == (m.total, m.total)


def test_bad_input_is_a_typed_error_naming_the_value() -> None:
    m = MemoryBreakdown(1, 1, 1, 1, 10)
    for fn in (calibration_spread, describe_spread, outside_recorded):
        with pytest.raises(MeshplanTypeError, match="TrainingRecipe"):
            fn("full")  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError, match="MemoryBreakdown"):
        peak_bounds({"total": 1}, Spread(1.0, 1.0, 1))  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError, match="must be a Spread"):
        peak_bounds(m, (1.0, 2.0, 3))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="low > high"):
        peak_bounds(m, Spread(2.0, 1.0, 1))
    with pytest.raises(PlanError, match="spread.high=inf"):
        peak_bounds(m, Spread(1.0, float("inf"), 1))
    with pytest.raises(PlanError, match="attention='fused'"):
        attention_class("fused")
    with pytest.raises(MeshplanTypeError, match="spread.low"):
        peak_bounds(m, Spread("1", 2.0, 1))  # type: ignore[arg-type]


@given(RECIPES, st.sampled_from(["lion", "sgd", "adafactor"]), st.integers(2, 64), st.integers(2, 8), st.booleans())
def test_what_no_recorded_compile_ran_is_named_and_nothing_else(recipe: TrainingRecipe, optimizer: str, micro: int,
                                                               tiles: int, master: bool) -> None:
    # The recorded steps' choices (any remat, attention, compiler or device) are inside.
    assert outside_recorded(recipe) == ()
    assert "outside them" not in describe_spread(recipe)
    other = dataclasses.replace(recipe, optimizer=optimizer, micro_batches=micro, vocab_tiles=tiles,
                                master_weights=master, weight_dtype="float32")
    named = outside_recorded(other)
    assert named[:1] == (f"optimizer {optimizer}",) and "weights float32" in named and "grads float32" in named
    assert f"{micro} micro-batches" in named and f"{tiles} vocab tiles" in named
    assert ("master weights" in named) == master
    if calibration_spread(other) is not None:
        assert all(text in describe_spread(other) for text in named)
    with pytest.raises(MeshplanTypeError, match="TrainingRecipe"):
        outside_recorded({"optimizer": optimizer})  # type: ignore[arg-type]
