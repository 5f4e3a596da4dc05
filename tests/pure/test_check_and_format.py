"""The shared validators added for issue 8 (as_real, collect, unresolved_shape_problems) and fmt_bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure._check import as_count, as_real, collect, unresolved_shape_problems
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import ClusterError, MeshplanTypeError, PlanError


@given(st.floats(min_value=1e-300, max_value=1e300) | st.integers(1, 10**12))
def test_as_real_returns_the_same_number_as_a_float(value):
    out = as_real(value, "bandwidth", error=ClusterError)
    assert type(out) is float and out == float(value)


@given(st.floats(max_value=0.0) | st.sampled_from([math.inf, -math.inf, math.nan]))
def test_as_real_refuses_non_positive_and_non_finite_values(value):
    with pytest.raises(ClusterError, match="bandwidth="):
        as_real(value, "bandwidth", error=ClusterError)


def test_as_real_allows_zero_only_when_asked():
    assert as_real(0, "latency", allow_zero=True, error=ClusterError) == 0.0
    assert as_real(np.float32(0.25), "latency", error=ClusterError) == 0.25
    for bad in (True, "1", None, [1.0]):
        with pytest.raises(MeshplanTypeError, match="latency="):
            as_real(bad, "latency", allow_zero=True, error=ClusterError)


def test_collect_files_type_and_value_errors_apart_and_returns_the_value():
    types: list[str] = []
    values: list[str] = []
    assert collect(types, values, as_count, np.int64(3), "n") == 3
    assert collect(types, values, as_count, 0, "n", error=PlanError) is None
    assert collect(types, values, as_count, 2.0, "m") is None
    assert values == ["n=0 must be >= 1"] and types == ["m=2.0 has type float; expected an int"]


@given(st.lists(st.integers(-3, 4), max_size=5).map(tuple))
def test_unresolved_shape_problems_is_empty_exactly_for_sizes_ge_1_and_one_minus_one(shape):
    ok = all(d >= 1 or d == -1 for d in shape) and shape.count(-1) <= 1
    assert (unresolved_shape_problems(shape, "s") == []) == ok


@given(st.integers(0, 2**50))
def test_exact_style_is_whole_gib_or_decimal_gb(n):
    text = fmt_bytes(n, style="exact")
    if n % 2**30 == 0:
        assert text == f"{n // 2**30} GiB"
    else:
        assert text.endswith(" GB") and float(text[:-3]) == pytest.approx(n / 1e9, rel=1e-5)


def test_binary_style_switches_to_gib_at_one_gib():
    assert fmt_bytes(2**30 - 2**20) == "1023.0 MiB"
    assert fmt_bytes(2**30) == "1.0 GiB"
    assert fmt_bytes(-3 * 2**29) == "-1.5 GiB"
    assert fmt_bytes(80 * 10**9, style="exact") == "80 GB"
