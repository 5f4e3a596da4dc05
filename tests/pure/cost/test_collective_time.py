"""Tests for the alpha-beta collective cost model (meshplan.pure.cost._collective_time)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.cost._collective_time import (
    COLLECTIVE_KINDS,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    collective_time,
    reduce_scatter_time,
)
from meshplan.pure.cluster._link import Link, select_link
from meshplan.pure.errors import ClusterError, MeshplanTypeError, PlanError

ONE_PASS = (all_gather_time, reduce_scatter_time, all_to_all_time)
ALL = (*ONE_PASS, all_reduce_time)

links = st.builds(
    Link,
    bandwidth=st.floats(1e6, 1e13, allow_nan=False),
    latency=st.floats(0.0, 1e-3, allow_nan=False),
)
byte_counts = st.integers(0, 10**12)
counts = st.integers(1, 8192)


def test_one_pass_formula_matches_hand_computation() -> None:
    link = Link(bandwidth=100e9, latency=2e-6)
    # 8 devices, 1 GB: 7 steps of alpha + 7/8 of a GB at 100 GB/s.
    expected = 7 * 2e-6 + (7 / 8) * 1e9 / 100e9
    for fn in ONE_PASS:
        assert fn(1e9, 8, link) == pytest.approx(expected, rel=1e-12)


def test_all_reduce_doubles_the_one_pass_cost() -> None:
    link = Link(bandwidth=100e9, latency=2e-6)
    expected = 2 * 7 * 2e-6 + 2 * (7 / 8) * 1e9 / 100e9
    assert all_reduce_time(1e9, 8, link) == pytest.approx(expected, rel=1e-12)


@given(byte_counts, counts, links)
def test_all_reduce_equals_reduce_scatter_plus_all_gather(nbytes: int, n: int, link: Link) -> None:
    assert all_reduce_time(nbytes, n, link) == reduce_scatter_time(nbytes, n, link) + all_gather_time(
        nbytes, n, link
    )


@given(byte_counts, links)
def test_every_collective_is_free_with_one_participant(nbytes: int, link: Link) -> None:
    for fn in ALL:
        assert fn(nbytes, 1, link) == 0.0


@given(byte_counts, byte_counts, counts, links)
def test_time_grows_with_bytes(a: int, b: int, n: int, link: Link) -> None:
    lo, hi = sorted((a, b))
    for fn in ALL:
        assert fn(lo, n, link) <= fn(hi, n, link)
        if n > 1 and hi > lo:
            assert fn(lo, n, link) < fn(hi, n, link)


@given(byte_counts, counts, counts, links)
def test_time_grows_with_participants(nbytes: int, m: int, k: int, link: Link) -> None:
    lo, hi = sorted((m, k))
    for fn in ALL:
        assert fn(nbytes, lo, link) <= fn(nbytes, hi, link)


@given(byte_counts, counts, links)
def test_time_is_bounded_by_full_buffer_over_bandwidth_plus_latency(nbytes: int, n: int, link: Link) -> None:
    # The ring factor (n-1)/n < 1: a one-pass collective never costs more than
    # sending the whole buffer once plus n-1 latencies.
    bound = (n - 1) * link.latency + nbytes / link.bandwidth
    for fn in ONE_PASS:
        assert fn(nbytes, n, link) <= bound * (1 + 1e-12)


@given(byte_counts, counts, links)
def test_faster_link_is_never_slower(nbytes: int, n: int, link: Link) -> None:
    faster = Link(link.bandwidth * 2, link.latency / 2)
    for fn in ALL:
        assert fn(nbytes, n, faster) <= fn(nbytes, n, link)


def test_units_are_seconds_for_realistic_figures() -> None:
    # All-gathering Llama-3-8B's bf16 weights (~16 GB) over 8 H100s on NVLink
    # (450 GB/s) takes tens of milliseconds, not microseconds or hours.
    t = all_gather_time(16e9, 8, Link(bandwidth=450e9, latency=3e-6))
    assert 0.02 < t < 0.05


def test_vectorized_call_matches_scalar_calls() -> None:
    link = Link(bandwidth=50e9, latency=1e-5)
    nbytes = np.array([0, 1e6, 1e9, 3e10])
    ns = np.array([[1], [2], [64]])
    grid = all_reduce_time(nbytes, ns, link)
    assert isinstance(grid, np.ndarray) and grid.shape == (3, 4)
    for i, n in enumerate(ns[:, 0]):
        for j, b in enumerate(nbytes):
            assert grid[i, j] == pytest.approx(all_reduce_time(float(b), int(n), link), rel=1e-12)


def test_scalar_inputs_return_a_python_float() -> None:
    out = all_gather_time(np.int64(10), np.int32(2), Link(1.0, 0.0))
    assert type(out) is float and out == 5.0


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_collective_time_dispatches_to_the_named_function(kind: str) -> None:
    link = Link(bandwidth=10e9, latency=1e-6)
    fn = {"all-gather": all_gather_time, "reduce-scatter": reduce_scatter_time,
          "all-reduce": all_reduce_time, "all-to-all": all_to_all_time}[kind]
    assert collective_time(kind, 5e8, 16, link) == fn(5e8, 16, link)
    assert collective_time(kind.upper().replace("-", "_"), 5e8, 16, link) == fn(5e8, 16, link)


def test_unknown_collective_kind_lists_the_valid_ones() -> None:
    with pytest.raises(PlanError, match="all-gather") as info:
        collective_time("broadcast", 1, 2, Link(1.0, 0.0))
    assert "broadcast" in str(info.value)


@pytest.mark.parametrize(
    ("nbytes", "n", "error"),
    [
        (-1, 2, PlanError),
        (float("nan"), 2, PlanError),
        (float("inf"), 2, PlanError),
        (np.array([1.0, -2.0]), 2, PlanError),
        (10, 0, PlanError),
        (10, -3, PlanError),
        (10, np.array([2, 0]), PlanError),
        (10, 2.0, MeshplanTypeError),
        (10, True, MeshplanTypeError),
        ("10", 2, MeshplanTypeError),
        (None, 2, MeshplanTypeError),
        (10, "2", MeshplanTypeError),
        (np.array(["a"]), 2, MeshplanTypeError),
    ],
)
def test_bad_inputs_raise_typed_errors_naming_the_value(nbytes: object, n: object, error: type) -> None:
    for fn in ALL:
        with pytest.raises(error):
            fn(nbytes, n, Link(1e9, 0.0))


def test_negative_bytes_message_says_what_is_valid() -> None:
    with pytest.raises(PlanError, match=r"nbytes=-5.*>= 0"):
        all_gather_time(-5, 2, Link(1e9, 0.0))


def test_link_argument_must_be_a_link() -> None:
    with pytest.raises(MeshplanTypeError, match="Link"):
        all_gather_time(1, 2, (1e9, 0.0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bandwidth", "latency", "error"),
    [
        (0.0, 0.0, ClusterError),
        (-1.0, 0.0, ClusterError),
        (math.inf, 0.0, ClusterError),
        (1.0, -1e-6, ClusterError),
        (1.0, math.nan, ClusterError),
        ("fast", 0.0, MeshplanTypeError),
        (1.0, None, MeshplanTypeError),
        (True, 0.0, MeshplanTypeError),
    ],
)
def test_link_rejects_bad_figures(bandwidth: object, latency: object, error: type) -> None:
    with pytest.raises(error):
        Link(bandwidth, latency)  # type: ignore[arg-type]


def test_link_is_frozen_and_canonicalizes_to_floats() -> None:
    link = Link(np.int64(5), 0)
    assert type(link.bandwidth) is float and type(link.latency) is float
    with pytest.raises(AttributeError):
        link.bandwidth = 2.0  # type: ignore[misc]


def test_select_link_uses_the_network_for_groups_that_span_nodes() -> None:
    intra, inter = Link(450e9, 3e-6), Link(50e9, 1e-5)
    assert select_link(intra, inter, spans_nodes=False) is intra
    assert select_link(intra, inter, spans_nodes=True) is inter
    with pytest.raises(MeshplanTypeError):
        select_link(intra, inter, spans_nodes="yes")  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError):
        select_link(intra, "ib", spans_nodes=True)  # type: ignore[arg-type]
