"""``benchmarks/research/bench_memory_ceiling.py``: when one activation figure can put two recorded peaks in band.

The script bounds what any shape-level memory model can reach on the recorded XLA:TPU grid (pairs of
meshes whose devices hold the same activation shapes); its verdict is :func:`feasible`, checked here by
its properties, and its reading of the recorded scaled-down grid is pinned (docs/design-notes.md, "A ceiling for shape-level models").
"""

from __future__ import annotations

import json
import pathlib
import sys

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "research"))

import bench_memory_ceiling as ceiling

BYTES = st.floats(min_value=1.0, max_value=1e12, allow_nan=False)
PAIR = st.tuples(BYTES, BYTES)


@given(PAIR, PAIR, st.floats(min_value=0.0, max_value=1e12))
def test_the_verdict_does_not_depend_on_which_mesh_comes_first(exact: tuple[float, float],
                                                                state: tuple[float, float], slack: float) -> None:
    assert ceiling.feasible(exact, state, slack) == ceiling.feasible(exact[::-1], state[::-1], slack)


@given(PAIR, PAIR, st.floats(min_value=0.0, max_value=1e12), st.floats(min_value=0.0, max_value=1e12))
def test_more_slack_never_makes_a_pair_infeasible(exact: tuple[float, float], state: tuple[float, float],
                                                   slack: float, more: float) -> None:
    if ceiling.feasible(exact, state, slack):
        assert ceiling.feasible(exact, state, slack + more)


@given(PAIR, BYTES, st.floats(min_value=0.951, max_value=1.099), st.floats(min_value=0.951, max_value=1.099))
def test_a_pair_a_common_figure_prices_within_the_band_is_feasible(state: tuple[float, float], activation: float,
                                                                    r0: float, r1: float) -> None:
    # Peaks that one activation figure prices at ratios r0 and r1, both in band: E_i = (S_i + A) / r_i
    # (inside by a thousandth, so that rounding at the edge does not decide).
    exact = ((state[0] + activation) / r0, (state[1] + activation) / r1)
    assert ceiling.feasible(exact, state, 0.0)


@given(PAIR, PAIR, st.floats(min_value=0.0, max_value=1e6))
def test_a_pair_whose_activations_differ_beyond_the_band_and_slack_is_not(
        state: tuple[float, float], base: tuple[float, float], slack: float) -> None:
    # Second mesh's activation bytes (exact - state) far above what 1.10 / 0.95 and the slack allow.
    a0 = base[0]
    a1 = 2.0 * (a0 + state[0]) + 2.0 * slack + state[1] + 1.0
    exact = (state[0] + a0, state[1] + a1)
    assert not ceiling.feasible(exact, state, slack)


def test_the_recorded_scaled_down_grid_reads_as_recorded() -> None:
    # Scaled-down grid (160 rows, 80 pairs): v5p's and v6e's remat-none pairs and v5p's tp pairs agree
    # (ratios 0.94-1.03); v6e's remat-full pairs differ by up to 1.98x, so a model that gives a pair the same
    # activation bytes keeps at most 28 of v6e's 40 remat-full rows in band. The whole model's weights and
    # fp32 gradients (the slack) cover every pair but one.
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks/data/memory_calibration_tpu.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    found = ceiling.pairs(rows)
    assert len(found) == 80
    def misses(attr: str) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for p in found:
            key = (ceiling.target(p.first), str(p.first["remat"]))
            out[key] = out.get(key, 0) + (not getattr(p, attr))
        return out

    assert misses("rigid") == {("v5p-16", "full"): 3, ("v5p-16", "none"): 0, ("v6e-8", "full"): 12,
                               ("v6e-8", "none"): 0}
    assert misses("feasible") == {("v5p-16", "full"): 0, ("v5p-16", "none"): 0, ("v6e-8", "full"): 1,
                                  ("v6e-8", "none"): 0}
    assert max(p.activations[1] / p.activations[0] for p in found) < 2.0
