"""``benchmarks/bench_megatron_table2.py``: Table 2's rows as transcribed, and one priced row of each kind.

The whole script takes about 15 s (six PTD-P rankings); these tests price one ZeRO-3 row, the proxy of a
GPU count that splits no weight, and the smallest PTD-P row (a few seconds).
"""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_megatron_table2 as t2


def _days(tflops: float, gpus: int, model: str) -> float:
    # Table 2's last column: 300B tokens at the row's TFLOP/s per GPU by formula (3).
    return 300e9 * t2.flops_per_token(model) / (tflops * 1e12 * gpus) / 86400


@pytest.mark.parametrize("run", t2.ZERO_RUNS, ids=[r.key for r in t2.ZERO_RUNS])
def test_zero3_rows_reproduce_table2s_training_days(run: t2.ZeroRun) -> None:
    assert _days(run.tflops, run.gpus, run.model) == pytest.approx(t2.PUBLISHED_DAYS[run.key], abs=1)
    assert run.batch == run.gpus * run.micro_batch  # Table 2's micro-batch is the whole per-GPU batch


@pytest.mark.parametrize("run", t2.PTDP_RUNS, ids=[r.key for r in t2.PTDP_RUNS])
def test_ptdp_rows_reproduce_table2s_training_days(run: t2.PipelineRun) -> None:
    gpus = t2._cluster(run.cluster).num_devices
    tflops = run.tokens_per_s * t2.flops_per_token(run.model) / 1e12
    assert _days(tflops, gpus, run.model) == pytest.approx(t2.PUBLISHED_DAYS[run.key], abs=1)
    dp = run.stage_layout["dp"]
    assert run.pp * dp * run.stage_layout["tp"] == gpus and run.micro_batches == run.batch // dp  # micro-batch 1
    assert t2.MODELS[run.model].num_layers % (run.pp * run.virtual) == 0


def test_the_models_have_table2s_parameter_counts() -> None:
    import math

    import jax

    from meshplan.pure.presets import build_params

    for name, billions in (("gpt-174.6b", 174.6), ("gpt-529.6b", 529.6)):
        n = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(build_params(t2.MODELS[name])))
        assert n / 1e9 == pytest.approx(billions, rel=0.01), name


def test_a_zero3_row_and_its_bandwidth_row_are_built() -> None:
    z = t2.price_zero3(t2.ZERO_RUNS[0])
    cells = t2.zero_row(z)
    assert len(cells) == len(t2.ZERO_COLUMNS) and z.proxy == 0
    assert 0 < z.exposed_s <= z.comm_s and z.step_s == pytest.approx(z.compute_s + z.exposed_s)
    assert len(t2.bandwidth_row(z)) == len(t2.BANDWIDTH_COLUMNS)
    ring, inter = t2.ring_bytes(z)
    assert inter < ring / 7  # the two-level schedule sends an eighth of each buffer over the network


def test_a_gpu_count_that_splits_no_weight_is_priced_by_proxy_over_all_its_gpus() -> None:
    (run,) = [r for r in t2.ZERO_RUNS if r.gpus == 1120]
    assert not t2._splits_a_weight(run.model, 1120)
    z = t2.price_zero3(run)
    assert z.proxy == 1024 and "re-priced over 1120" in t2.zero_row(z)[4]
    # The ring over 1120 GPUs pays more latency than the proxy's over 1024, for the same bytes.
    proxy = t2._mesh(t2.MODELS[run.model], 1024, 2048)[0]
    assert z.comm_s > sum(t.seconds for t in proxy.comm)
    assert [t.nbytes for t in z.comm] == [t.nbytes for t in proxy.comm]


def test_a_ptdp_row_is_built_with_its_rank_and_the_speed_ratio_line() -> None:
    c = t2.compare_pipeline(t2.PTDP_RUNS[0], models=t2.MODELS)
    cells = t2.ptdp_row(c)
    assert len(cells) == len(t2.PTDP_COLUMNS) and c.rank is not None and c.ranked == len(c.steps)
    assert list(c.steps) == sorted(c.steps) and c.steps[0] == c.best_step_s
    assert t2.within(c)[0] >= 1 and "rank" in t2.sensitivity(c)
    (line,) = t2.speed_ratios([t2.price_zero3(t2.ZERO_RUNS[0])], [c])
    assert "measured 1.06" in line  # 153 / 144 TFLOP/s
