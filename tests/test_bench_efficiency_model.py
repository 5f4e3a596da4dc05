"""``benchmarks/research/bench_efficiency_model.py``: the fit behind the default GPU efficiency curve.

``fit`` is checked by its properties (it recovers a curve it is given exactly; it does not depend on the order of
the points), and the default's parameters are pinned to what it fits on the recorded H200 steps.
"""

from __future__ import annotations

import math
import pathlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "research"))

import bench_efficiency_model as model

from meshplan.pure.cost._flops import DEFAULT_EFFICIENCY

WIDTHS = st.lists(st.integers(64, 65536), min_size=2, max_size=8, unique=True)


@settings(max_examples=25, deadline=None)
@given(st.floats(0.05, 0.95), st.integers(1, 20_000), WIDTHS)
def test_fit_recovers_a_curve_it_is_given_exactly(e_max: float, w0: int, widths: list[int]) -> None:
    points = [(float(w), e_max * w / (w + w0)) for w in widths]
    got_e, got_w0 = model.fit(points, max_w0=20_000)
    assert got_w0 == w0
    assert abs(got_e - e_max) < 1e-9 * e_max


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(64, 65536), st.floats(0.05, 0.95)), min_size=2, max_size=8), st.randoms())
def test_fit_does_not_depend_on_the_order_of_the_points(raw: list[tuple[int, float]], rnd) -> None:
    points = [(float(w), e) for w, e in raw]
    shuffled = list(points)
    rnd.shuffle(shuffled)
    a, b = model.fit(points, max_w0=5_000), model.fit(shuffled, max_w0=5_000)
    # The same optimum; only an exact tie in the summed squares (rounding) could pick another w0.
    assert _loss(points, *a) == pytest.approx(_loss(points, *b), rel=1e-9, abs=1e-12)


def _loss(points: list[tuple[float, float]], e_max: float, w0: float) -> float:
    return sum((math.log(e) - math.log(e_max * w / (w + w0))) ** 2 for w, e in points)


def test_the_default_gpu_curve_is_the_fit_on_the_h200_steps() -> None:
    e_max, w0 = model.fit([(model.width_hidden(spec, 1), e) for spec, e in model.fit_rows()])
    assert (round(e_max, 3), w0) == DEFAULT_EFFICIENCY["gpu"]
