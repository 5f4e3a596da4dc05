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


PIPELINE_RUNS = bench_published.PIPELINE_RUNS


@pytest.mark.parametrize("run", PIPELINE_RUNS, ids=[r.key for r in PIPELINE_RUNS])
def test_pipeline_run_is_priceable(run: bench_published.PipelineRun) -> None:
    from meshplan.pure.cost import SCHEDULES, stage_layers

    spec = bench_published.PIPELINE_MODELS[run.model]
    cluster = bench_published._cluster(run.cluster)
    assert run.pp * math.prod(run.stage_layout.values()) == cluster.num_devices
    assert cluster.num_ici_domains % run.pp == 0  # the stages are blocks of whole nodes
    assert set(run.stage_layout) <= {"dp", "fsdp", "ep", "sp", "tp"}
    assert run.schedule in SCHEDULES and run.remat in bench_published.ALT_REMAT
    assert sum(stage_layers(spec.num_layers, run.pp)) == spec.num_layers
    assert run.batch % math.prod(run.stage_layout.get(a, 1) for a in ("dp", "fsdp", "ep")) == 0
    assert run.tokens_per_s > 0 and run.source.startswith("https://")


def test_the_rank_among_pipeline_layouts_is_read_from_the_same_ranking() -> None:
    # The pipelined layouts are a part of everything ranked: the published layout's place among them is at
    # most its place overall, the cell states its step over the best of them, and an unpriced run has none.
    c = bench_published.compare_pipeline(bench_published.PIPELINE_RUNS[0])
    assert c.pp_rank is not None and c.rank is not None and 1 <= c.pp_rank <= c.rank
    assert set(c.pp_steps) <= set(c.steps) and list(c.pp_steps) == sorted(c.pp_steps)
    assert c.pinned is not None and c.pinned.step is not None
    ratio = c.pinned.step.step_s / c.pp_steps[0]
    assert bench_published.pp_rank_cell(c) == f"{c.pp_rank}/{len(c.pp_steps)} ({ratio:.2f}x)"
    over = bench_published.compare_pipeline(bench_published.PIPELINE_RUNS[2])  # Llama 3: over the budget
    assert over.mem == "over" and over.pp_rank is None and bench_published.pp_rank_cell(over) == "-"


def test_pipeline_throughputs_follow_the_papers_formulas() -> None:
    runs = {r.key: r for r in PIPELINE_RUNS}
    # Narayanan et al. 2021: 502 PFLOP/s over 3072 GPUs is the 1T row's 163 TFLOP/s per GPU.
    assert 502e15 / 3072 == pytest.approx(163e12, rel=0.01)
    one_t = runs["megatron-1008b-3072xA100"]
    flops = bench_published._megatron_flops_per_token(128, 25600, 2048, 51200)
    assert one_t.tokens_per_s * flops == pytest.approx(163e12)
    # The models are the papers' sizes: 145.6B and 1008B parameters (Table 1), 405B (Llama 3).
    for key, params in (("gpt-145.6b", 145.6e9), ("gpt-1008b", 1008e9), ("llama3-405b", 405e9)):
        import jax

        from meshplan.pure.presets import build_params
        tree = build_params(bench_published.PIPELINE_MODELS[key])
        n = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))
        assert n == pytest.approx(params, rel=0.015), key


def test_pipeline_runs_price_the_schedules_the_sources_state() -> None:
    runs = {r.key: r for r in PIPELINE_RUNS}
    # Megatron-LM examples/academic_paper_scripts/sc21/run_table_1.sh: 145B MBS 2 with 5 layers per
    # virtual stage (80 / 8 / 5 = 2 chunks); 1T MBS 1 and no virtual stages.
    mt145, mt1t = runs["megatron-145.6b-1536xA100"], runs["megatron-1008b-3072xA100"]
    assert (mt145.schedule, mt145.virtual, mt145.micro_batches) == ("interleaved", 80 // 8 // 5, 2304 // 24 // 2)
    assert (mt1t.schedule, mt1t.virtual, mt1t.micro_batches) == ("1f1b", 1, 3072 // 6 // 1)
    llama, dsv3 = runs["llama3-405b-8192xH100"], runs["dsv3-pp16-2048xH800"]
    assert (llama.schedule, llama.zero) == ("interleaved", 2) and (dsv3.schedule, dsv3.zero) == ("dualpipe", 1)


def test_the_implied_efficiency_reprices_the_run_to_its_published_step() -> None:
    from meshplan.pure.search import price_pipeline

    run = PIPELINE_RUNS[0]
    spec, cluster = bench_published.PIPELINE_MODELS[run.model], bench_published._cluster(run.cluster)
    kw = dict(pp=run.pp, stage_layout=run.stage_layout, batch=run.batch, seq=run.seq, schedule=run.schedule,
              virtual=run.virtual, micro_batches=run.micro_batches, zero=run.zero,
              recipe=bench_published._pipeline_recipe(run, cluster))
    priced = price_pipeline(spec, cluster, **kw)
    pub = run.batch * run.seq / (run.tokens_per_s * cluster.num_devices)
    e = bench_published.implied_efficiency(priced, pub)
    assert e is not None and 0.4 < e < 1
    again = price_pipeline(spec, cluster, efficiency=e, **kw)
    assert again.step is not None and again.step.step_s == pytest.approx(pub, rel=0.01)


@pytest.mark.parametrize("run", RUNS + PIPELINE_RUNS, ids=[r.key for r in RUNS + PIPELINE_RUNS])
def test_a_run_whose_source_says_fp8_is_priced_fp8_on_a_device_that_has_it(run) -> None:
    from meshplan.pure.cost import MATMUL_DTYPES, fp8_peak

    assert run.matmul_dtype in MATMUL_DTYPES
    says_fp8 = "fp8 gemm" in run.notes.lower() or "float8 linears" in run.notes.lower() or (
        "float8" in run.notes.lower() and "without float8" not in run.notes.lower())
    trainy = run.source == bench_published._TRAINY  # "as above on 8 nodes": the 32-GPU run's recipe
    assert (run.matmul_dtype == "float8") == (says_fp8 or trainy), run.notes
    if run.matmul_dtype == "float8":
        assert "(priced bf16)" not in run.notes
        assert fp8_peak(bench_published._cluster(run.cluster).device, "float8") is not None


@pytest.mark.parametrize("run", RUNS + PIPELINE_RUNS, ids=[r.key for r in RUNS + PIPELINE_RUNS])
def test_an_moe_run_is_priced_with_the_dispatch_its_source_states(run, monkeypatch) -> None:
    from meshplan.pure.cost import MOE_DISPATCHES

    assert run.moe_dispatch in MOE_DISPATCHES
    notes = run.notes.lower()
    # DeepSeek-V3 drops no token (report sec. 2.1.2); MaxText's mixtral_8x7b_dropped is the capacity-1.25 einsum.
    assert (run.moe_dispatch == "dropless") == ("dropless moe" in notes), run.notes
    assert "dropping moe" not in notes or run.moe_dispatch == "einsum"
    spec = (bench_published.PIPELINE_MODELS[run.model] if isinstance(run, bench_published.PipelineRun)
            else get_preset(run.model).spec)
    assert spec.is_moe or run.moe_dispatch == "einsum"  # a dense model has nothing to dispatch
    if spec.name == "deepseek-v3":
        assert run.moe_dispatch == "dropless"
    # The recipe the script prices carries it.
    cluster = bench_published._cluster(run.cluster)
    if isinstance(run, bench_published.PipelineRun):
        assert bench_published._pipeline_recipe(run, cluster).moe_dispatch == run.moe_dispatch
    else:
        seen: dict = {}
        monkeypatch.setattr(bench_published, "search_meshes", lambda *args, **kw: seen.update(kw))
        bench_published._search(run, None, True, 1)
        assert seen["recipe"].moe_dispatch == run.moe_dispatch
