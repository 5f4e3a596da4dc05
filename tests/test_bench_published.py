"""The data table of ``benchmarks/bench_published.py`` is consistent with itself and with meshplan.

The script prices published runs; a run whose layout does not multiply to its device count, whose
batch the layout cannot split, or whose model/cluster meshplan does not know would make its row
silently wrong (or raise mid-table), so the table is checked here without running any search.
"""

from __future__ import annotations

import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_published

from meshplan.pure import get_preset

RUNS = bench_published.PUBLISHED_RUNS


@pytest.mark.parametrize("run", RUNS, ids=[r.key for r in RUNS])
def test_run_is_priceable(run: bench_published.PublishedRun) -> None:
    get_preset(run.model)  # raises on an unknown preset
    cluster = bench_published._cluster(run.cluster)
    assert run.remat in bench_published.ALT_REMAT
    assert run.tokens_per_s > 0 and run.batch > 0 and run.seq > 0
    assert run.mfu is None or 0 < run.mfu < 1
    assert run.source.startswith("https://")
    if run.layout is not None:
        axes = bench_published._axes(run.model)
        assert set(run.layout) <= set(axes), run.layout
        assert math.prod(run.layout.values()) == cluster.num_devices
        batch_ways = math.prod(run.layout.get(a, 1) for a in ("dp", "fsdp", "ep"))
        assert run.batch % batch_ways == 0


def test_keys_unique_and_deepseek_rate() -> None:
    assert len({r.key for r in RUNS}) == len(RUNS)
    # 180K H800 GPU-hours per trillion tokens (DeepSeek-V3 report, Table 1) as tokens/s per GPU.
    (dsv3,) = [r for r in RUNS if r.model == "deepseek-v3"]
    assert dsv3.tokens_per_s == pytest.approx(1e12 / (180e3 * 3600), abs=1)
