"""meshplan's predicted step time against published training runs of the preset families.

Run: ``python benchmarks/bench_published.py [--markdown]``. Pure code only: no devices are used.

For each run in :data:`PUBLISHED_RUNS` (model, hardware, global batch x sequence,
parallelism layout, what was measured, where it was published) the script asks
:func:`meshplan.pure.search_meshes` for

- the predicted step time, tokens/s per device and MFU of the *published layout*
  (every mesh axis pinned with ``fixed=``), and the ratio predicted / published
  of tokens/s per device (> 1: meshplan predicts faster than was measured);
- the rank of the published layout among all fitting meshes of the search
  (ranked by predicted step time), and the layout meshplan predicts fastest.

Nothing is fitted to these runs: every prediction uses the documented default
efficiency (``meshplan.pure.cost._flops.default_efficiency``: on GPU a curve in the
hidden size fit on single-H200 steps only, 0.41 at 4096 and 0.50 at 8192; 0.5 on TPU). Runs whose sources
say their GEMMs are FP8 (``matmul_dtype="float8"``) have their weight matmuls priced at the FP8 peak, at
``FP8_EFFICIENCY_RATIO`` times that efficiency. Axis names map data -> dp, fsdp -> fsdp, tensor -> tp,
expert -> ep, context/sequence -> sp. Runs that use pipeline parallelism are in
:data:`PIPELINE_RUNS` (a second table, ``--pipeline-only`` prints it alone): their
published layout is priced by :func:`meshplan.pure.search.price_pipeline` and
ranked among :func:`meshplan.pure.search.search_pipelines`' layouts and the
unpipelined meshes.

Where the published run fits but meshplan's memory model says it does not
(``mem`` column ``over``), the search is repeated with ``activations=False``
(the fit counts parameters, gradients and optimizer state only) so that the step
time can still be priced; that disagreement is itself a finding.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

from meshplan.errors import PlanError
from meshplan.pure import (
    Cluster,
    DeviceSpec,
    MeshCandidate,
    SearchResult,
    parse_cluster,
    search_meshes,
)
from meshplan.pure.cost._estimates import StepEstimate
from meshplan.pure.cost._flops import DEFAULT_EFFICIENCY
from meshplan.pure.presets import MODEL_SPECS, ModelSpec
from meshplan.pure.cluster import DEVICE_SPECS
from meshplan.pure.cost import TrainingRecipe

# H800: the export H100 (same SXM compute, 989 TFLOP/s dense bf16, 1979 dense FP8) with NVLink cut to 400 GB/s
# bidirectional, i.e. 200 GB/s per direction where meshplan's H100 has 450 GB/s (NVIDIA H800
# product brief); the InfiniBand per GPU in DeepSeek's cluster is 400 Gb/s = 50 GB/s, as for H100.
H800 = dataclasses.replace(DEVICE_SPECS["H100"], name="H800", intra_bandwidth=200e9)
EXTRA_DEVICES: Mapping[str, DeviceSpec] = types.MappingProxyType({"H800": H800})

# The published runs are priced against HBM less 10% on every device (the figures recorded in RESULTS.md);
# the library's own default on GPUs is jax's allocator share (meshplan.pure.cluster.default_headroom).
HEADROOM = 0.1


def _cluster(text: str) -> Cluster:
    # parse_cluster reads TPU slice names ("v6e-256") only with its own device table, so the
    # extra table is passed for the H800 cluster alone.
    return parse_cluster(text, devices={**DEVICE_SPECS, **EXTRA_DEVICES}) if "H800" in text else parse_cluster(text)


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """One published training run and what it measured.

    Attributes:
      key: short label.
      model: meshplan preset.
      cluster: meshplan cluster text.
      batch, seq: global batch in sequences and tokens per sequence.
      layout: the published mesh in meshplan's axis names (axes left out are 1); ``None`` when
        the run uses an axis meshplan cannot express (pipeline).
      remat: the meshplan remat policy closest to the run's activation checkpointing.
      tokens_per_s: published tokens/s per device.
      mfu: published MFU, if stated.
      notes: precision, remat and layout details that meshplan does not model.
      source: URL and commit the numbers come from.
      matmul_dtype: what the run's weight matmuls ran in, as the source says: ``"float8"`` (priced at the
        FP8 peak) or ``"bfloat16"``.
      moe_dispatch: how the run's MoE layers reach their experts, as the source says (``TrainingRecipe.
        moe_dispatch``): ``"einsum"`` (GShard's capacity dispatch, a dropping MoE) or ``"dropless"`` (grouped
        GEMMs over the routed tokens).
    """

    key: str
    model: str
    cluster: str
    batch: int
    seq: int
    layout: Mapping[str, int] | None
    remat: str
    tokens_per_s: float
    mfu: float | None
    notes: str
    source: str
    matmul_dtype: str = "bfloat16"
    moe_dispatch: str = "einsum"


_TT = ("https://github.com/pytorch/torchtitan/blob/820504e20d1149fbf0b98c567af24c4b0433b22d/"
       "benchmarks/llama3_h100_202412_torchtitan.md")
_TRAINY = ("https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/"
           "benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md")
_MT_TIERS = ("https://github.com/AI-Hypercomputer/maxtext/blob/20a91e12a17cbaa7b786ac388b192b63392cd855/"
             "docs/reference/models/tiering.md")
_MT_CFG = "benchmarks/maxtext_trillium_model_configs.py (MaxText; per_device_batch_size, ici_fsdp_parallelism=-1)"
_DSV3 = "https://arxiv.org/abs/2412.19437 (DeepSeek-V3 Technical Report, sections 2.1.2, 3.2-3.3"
# DeepSeek-V3's MoE is dropless ("DeepSeek-V3 does not drop any tokens during training", sec. 2.1.2; grouped
# GEMMs over the routed tokens, DeepGEMM / DeepEP): priced moe_dispatch="dropless". Its precision (sec. 3.3: AdamW
# moments in BF16, master weights and the gradients used for accumulation in FP32) holds the bytes of the default
# recipe: one fp32 master copy + two bf16 moments = 8 bytes per parameter = two fp32 moments
# (TrainingRecipe(optimizer_dtype="bfloat16", master_weights=True) prices the same; a test holds master copies at
# fp32), and with micro-batches (every pipeline step) an fp32 gradient accumulator beside bf16 gradients (JAX's
# accumulation; the run's fp32 accumulation buffer alone would be 2 bytes per parameter less).

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun("tt-8b-8xH100", "llama3-8b", "1x8xH100", 16, 8192, {"fsdp": 8}, "dots", 5762.0, None,
                 "torchtitan FSDP2 eager bf16, selective AC, H100 HBM2e 96 GB at 500 W (below SXM peak); "
                 "text says 8B 1D without Float8 reaches 33-39% MFU", _TT + " Table 1"),
    PublishedRun("tt-8b-128xH100", "llama3-8b", "16x8xH100", 256, 8192, {"fsdp": 128}, "dots", 5605.0, None,
                 "torchtitan FSDP2 eager bf16, selective AC, 500 W H100", _TT + " Table 3"),
    PublishedRun("tt-70b-256xH100", "llama3-70b", "32x8xH100", 512, 8192, {"fsdp": 32, "tp": 8}, "full", 829.0,
                 None, "torchtitan FSDP 32 x TP 8, torch.compile + Float8 linears (priced fp8), full AC, 500 W H100",
                 _TT + " Table 4", "float8"),
    PublishedRun("trainy-8b-32xH200", "llama3-8b", "4x8xH200", 64, 8192, {"fsdp": 32}, "dots", 10938.0, None,
                 "torchtitan FSDP, torch.compile + Float8 (priced fp8; its fp8 all-gather is priced bf16), AC per "
                 "llama3_8b.toml (selective)", _TRAINY, "float8"),
    PublishedRun("trainy-8b-64xH200", "llama3-8b", "8x8xH200", 128, 8192, {"fsdp": 64}, "dots", 10753.0, None,
                 "as above on 8 nodes", _TRAINY, "float8"),
    PublishedRun("mt-8b-v6e-256", "llama3-8b", "v6e-256", 1024, 8192, {"fsdp": 256}, "offload", 7207.0, 0.4546,
                 "MaxText bf16, per-device batch 4, custom remat (offloads layer input and q/k/v/out "
                 "projections to host), flash attention", _MT_TIERS + "; layout " + _MT_CFG),
    PublishedRun("mt-70b-v6e-256", "llama3-70b", "v6e-256", 1024, 8192, {"fsdp": 256}, "offload", 960.0, 0.5033,
                 "MaxText bf16, per-device batch 4 (5 in a later revision of the config), custom remat "
                 "(offload layer input, q/k/v), flash attention", _MT_TIERS + "; layout " + _MT_CFG),
    # MaxText's mixtral_8x7b_dropped sets megablox: False, sparse_matmul: False, capacity_factor: 1.25 (the dropping
    # einsum path; its default, sparse_matmul: True, capacity_factor: -1, is dropless): priced "einsum".
    PublishedRun("mt-mixtral-v6e-256", "mixtral-8x7b", "v6e-256", 3072, 4096, {"fsdp": 256}, "offload", 3899.0,
                 0.3523, "MaxText bf16, per-device batch 12, dropping MoE (capacity factor 1.25, sparse_matmul "
                 "False: einsum dispatch), custom remat (offload), all 256 chips fsdp (no ep)",
                 _MT_TIERS + "; layout " + _MT_CFG + " mixtral_8x7b_dropped"),
    PublishedRun("dsv3-2048xH800", "deepseek-v3", "256x8xH800", 15360, 4096, None, "dots", 1543.0, None,
                 "DeepSeek-V3: PP 16 x EP 64 (across 8 nodes) x ZeRO-1 DP, FP8 GEMMs (priced fp8), dropless MoE "
                 "(priced dropless), DualPipe; 180K H800 GPU-hours per trillion tokens = 1543 tokens/s/GPU; batch "
                 "ramps 3072 -> 15360, priced at 15360; recompute of RMSNorm and MLA up-projections only",
                 _DSV3 + ", 4.2, Table 1)", "float8", "dropless"),
)
"""Published runs with the measured tokens/s per device. Pipeline runs carry ``layout=None`` here and are priced in :data:`PIPELINE_RUNS`."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """meshplan's answer for one :class:`PublishedRun`."""

    run: PublishedRun
    mem: str  # "fits" or "over" (meshplan's memory model rejects the published layout's fit)
    pinned_step_s: float | None
    pinned_tokens_per_s: float | None
    pinned_mfu: float | None
    rank: int | None
    num_fitting: int
    best_text: str
    best_step_s: float
    best_tokens_per_s: float
    alt_tokens_per_s: float | None  # the published layout under ALT_REMAT[run.remat]
    micro_batches: int | None  # gradient-accumulation steps the search chose for the published layout


ALT_REMAT: Mapping[str, str] = types.MappingProxyType({"dots": "full", "full": "dots", "offload": "dots"})
"""The other reading of a run's activation checkpointing: selective AC and MaxText's custom offload
policy sit between "dots" (no matmul recomputed) and "full"/"offload" (the whole forward rerun)."""


def _axes(model: str) -> tuple[str, ...]:
    return ("dp", "fsdp", "ep", "sp", "tp") if model in ("mixtral-8x7b", "deepseek-v3") else (
        "dp", "fsdp", "sp", "tp")


def _search(run: PublishedRun, fixed: Mapping[str, int] | None, activations: bool,
            top_k: int, remat: str | None = None) -> SearchResult:
    cluster = _cluster(run.cluster)
    backend = "tpu" if cluster.device.ici_scope == "slice" else "gpu"
    # Every published run uses a flash-attention kernel (torchtitan SDPA, MaxText splash).
    recipe = TrainingRecipe(remat=remat or run.remat, attention="flash", backend=backend,
                            matmul_dtype=run.matmul_dtype, moe_dispatch=run.moe_dispatch)
    return search_meshes(run.model, cluster, batch=run.batch, seq=run.seq, axes=_axes(run.model),
                         fixed=fixed, recipe=recipe, activations=activations, top_k=top_k, headroom=HEADROOM)


def compare(run: PublishedRun) -> Comparison:
    """Price ``run``'s published layout and rank it among the searched meshes."""
    mem = "fits"
    try:
        everything = _search(run, None, True, 100_000)
        if run.layout is not None:
            _search(run, {a: run.layout.get(a, 1) for a in _axes(run.model)}, True, 1)
    except PlanError:
        mem = "over"
        everything = _search(run, None, False, 100_000)
    fitting = [c for c in everything.candidates if c.fits]
    best = fitting[0]
    rank = pinned = None
    if run.layout is not None:
        want = {a: run.layout.get(a, 1) for a in _axes(run.model)}
        for position, cand in enumerate(fitting, 1):
            if dict(zip(cand.axis_names, cand.axis_sizes)) == want:
                rank, pinned = position, cand
                break
        if pinned is None:  # over budget even without activations: price it alone
            pinned = _search(run, want, False, 1).best
    alt = None
    if run.layout is not None:
        alt = _estimate(_search(run, {a: run.layout.get(a, 1) for a in _axes(run.model)}, False, 1,
                                ALT_REMAT[run.remat]).best).tokens_per_s
    top = _estimate(best)
    if pinned is None:
        return Comparison(run, mem, None, None, None, rank, len(fitting), best.text,
                          top.compute_s + top.exposed_s, top.tokens_per_s, alt, None)
    step = _estimate(pinned)
    return Comparison(run, mem, step.compute_s + step.exposed_s, step.tokens_per_s, step.mfu, rank,
                      len(fitting), best.text, top.compute_s + top.exposed_s, top.tokens_per_s, alt,
                      getattr(step, "micro_batches", 1))


def _estimate(candidate: MeshCandidate) -> StepEstimate:
    if candidate.step is None:  # the search prices every candidate it ranks by time
        raise RuntimeError(f"{candidate.text}: no step estimate")
    return candidate.step


def _layout_text(layout: Mapping[str, int] | None) -> str:
    return "PP (pipeline table)" if layout is None else ",".join(f"{a}={n}" for a, n in layout.items())


COLUMNS: tuple[str, ...] = (
    "run", "cluster", "batch x seq", "published layout", "remat", "mem", "micro", "pred step", "pub step",
    "pred tok/s/dev", "pub tok/s/dev", "pred/pub", "alt remat", "pred MFU", "pub MFU", "rank", "vs best",
    "meshplan best", "best tok/s/dev")


def row(run: PublishedRun, c: Comparison) -> tuple[str, ...]:
    """One table row, in :data:`COLUMNS` order."""
    pub_step = run.batch * run.seq / (run.tokens_per_s * _cluster(run.cluster).num_devices)
    return (
        run.key, run.cluster, f"{run.batch} x {run.seq}", _layout_text(run.layout), run.remat, c.mem,
        "-" if c.micro_batches is None else str(c.micro_batches),
        "-" if c.pinned_step_s is None else f"{c.pinned_step_s:.2f} s", f"{pub_step:.2f} s",
        "-" if c.pinned_tokens_per_s is None else f"{c.pinned_tokens_per_s:,.0f}",
        f"{run.tokens_per_s:,.0f}",
        f"{(c.pinned_tokens_per_s or c.best_tokens_per_s) / run.tokens_per_s:.2f}"
        + ("" if c.pinned_tokens_per_s else " (best)"),
        "-" if c.alt_tokens_per_s is None else f"{ALT_REMAT[run.remat]} {c.alt_tokens_per_s / run.tokens_per_s:.2f}",
        "-" if c.pinned_mfu is None else f"{c.pinned_mfu:.1%}",
        "-" if run.mfu is None else f"{run.mfu:.1%}",
        "-" if c.rank is None else f"{c.rank}/{c.num_fitting}",
        "-" if c.pinned_step_s is None else f"{c.pinned_step_s / c.best_step_s:.3f}",
        c.best_text, f"{c.best_tokens_per_s:,.0f}")


LEGEND = (
    "pub step = batch x seq / (published tokens/s/device x devices); pred/pub = predicted / published tokens/s"
    " per device of the published layout ('(best)': meshplan's best mesh, no pinned layout); alt remat ="
    " pred/pub under the other remat reading (ALT_REMAT); vs best = predicted step of the published layout /"
    " of meshplan's best; rank among the meshes that fit (mem 'over': the published layout does not fit"
    " meshplan's memory model with activations, so the fit and the rank count state only); micro = the"
    " gradient-accumulation steps meshplan chose for the published layout.")


# ---------------------------------------------------------------------------------------------------
# Pipeline-parallel runs: priced with meshplan.pure.search.price_pipeline (pp over the network, the
# published stage mesh pinned) and ranked among search_pipelines' layouts and search_meshes' meshes.

def _gpt(name: str, heads: int, hidden: int, layers: int) -> ModelSpec:
    """Megatron-LM's GPT of Narayanan et al. 2021, Table 1: GPT-2 blocks, vocabulary 51,200, seq 2048, tied."""
    return dataclasses.replace(MODEL_SPECS["gpt2"], name=name, vocab_size=51200, hidden_size=hidden,
                               num_layers=layers, num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
                               intermediate_size=4 * hidden, max_position_embeddings=2048, num_params=None)


# Llama 3 405B (Llama 3 paper, Table 3): 126 layers, width 16,384, FFN 53,248, 128 heads, 8 kv heads.
LLAMA3_405B = dataclasses.replace(MODEL_SPECS["llama3-70b"], name="llama3-405b", hidden_size=16384, num_layers=126,
                                  num_heads=128, num_kv_heads=8, head_dim=128, intermediate_size=53248,
                                  num_params=None)
PIPELINE_MODELS: Mapping[str, ModelSpec] = types.MappingProxyType({
    "gpt-145.6b": _gpt("gpt-145.6b", 96, 12288, 80),
    "gpt-1008b": _gpt("gpt-1008b", 160, 25600, 128),
    "llama3-405b": LLAMA3_405B,
    "deepseek-v3": MODEL_SPECS["deepseek-v3"],
})
"""The models of the pipeline runs (two are not presets: built from the papers' stated dimensions)."""

_MEGATRON = ("https://arxiv.org/abs/2104.04473 (Narayanan et al. 2021, Efficient Large-Scale Language Model "
             "Training on GPU Clusters Using Megatron-LM, Table 1; the Megatron-LM README states the 145B row "
             "as TP 8 x PP 8)")
_LLAMA3 = "https://arxiv.org/abs/2407.21783 (The Llama 3 Herd of Models, Table 4)"


def _megatron_flops_per_token(layers: int, hidden: int, seq: int, vocab: int) -> float:
    # Narayanan et al. 2021, eq. (3) per token: 96 l h^2 (1 + s/(6h) + V/(16 l h)), recompute included.
    return 96 * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """One published pipeline-parallel run.

    Attributes:
      key, cluster, batch, seq, remat, notes, source: as :class:`PublishedRun`.
      model: a key of :data:`PIPELINE_MODELS`.
      pp: pipeline stages (over the network: blocks of whole nodes).
      stage_layout: each stage's mesh in meshplan's axis names.
      schedule, virtual: the schedule priced (the closest meshplan has to the published one).
      micro_batches: the published micro-batch count, or ``None`` when not stated (meshplan chooses).
      tokens_per_s: published (or derived from published TFLOP/s) tokens/s per device.
      zero: the run's optimizer sharding over ``dp`` (``price_pipeline``'s ``zero``: 0, 1 or 2).
      matmul_dtype, moe_dispatch: as :class:`PublishedRun`.
    """

    key: str
    model: str
    cluster: str
    batch: int
    seq: int
    pp: int
    stage_layout: Mapping[str, int]
    schedule: str
    virtual: int
    micro_batches: int | None
    remat: str
    tokens_per_s: float
    notes: str
    source: str
    zero: int = 0
    matmul_dtype: str = "bfloat16"
    moe_dispatch: str = "einsum"


PIPELINE_RUNS: tuple[PipelineRun, ...] = (
    # Schedules and micro-batches from Megatron-LM's examples/academic_paper_scripts/sc21/run_table_1.sh
    # (d98e8a6): 145B: TP 8, PP 8, MBS 2, GBS 2304, --num-layers-per-virtual-pipeline-stage 5 (80 layers / 8
    # stages / 5 = 2 chunks); 1T: TP 8, PP 64, MBS 1, GBS 3072, no virtual stages (plain 1F1B).
    PipelineRun("megatron-145.6b-1536xA100", "gpt-145.6b", "192x8xA100-80GB", 2304, 2048, 8, {"dp": 24, "tp": 8},
                "interleaved", 2, 48, "full", 148e12 / _megatron_flops_per_token(80, 12288, 2048, 51200),
                "148 TFLOP/s per A100 (47% of peak) measured end to end, full activation recompute; tokens/s "
                "derived with the paper's FLOPs formula; interleaved v=2, micro-batch 2 (m = 2304/24/2 = 48) "
                "per run_table_1.sh", _MEGATRON + "; examples/academic_paper_scripts/sc21/run_table_1.sh"),
    PipelineRun("megatron-1008b-3072xA100", "gpt-1008b", "384x8xA100-80GB", 3072, 2048, 64, {"dp": 6, "tp": 8},
                "1f1b", 1, 512, "full", 163e12 / _megatron_flops_per_token(128, 25600, 2048, 51200),
                "163 TFLOP/s per A100 (52%; 502 PFLOP/s aggregate, abstract); full recompute; 1F1B with "
                "micro-batch 1 (m = 3072/6 = 512) per run_table_1.sh", _MEGATRON
                + "; examples/academic_paper_scripts/sc21/run_table_1.sh"),
    PipelineRun("llama3-405b-8192xH100", "llama3-405b", "1024x8xH100", 2048, 8192, 16, {"dp": 64, "tp": 8},
                "interleaved", 2, 32, "dots", 430e12 / (6 * 405e9 + 12 * 126 * 16384 * 8192),
                "430 TFLOP/s per GPU (43% BF16 MFU) at 16M tokens per batch, TP 8 x CP 1 x PP 16 x DP 64; "
                "tokens/s derived with 6N + 12 l h s FLOPs per token; interleaved schedule over 126 layers with "
                "one fewer on the first and last stage (sec. 3.3.2; v not stated: v=2 priced), one sequence per "
                "micro-batch assumed (m = 2048/64 = 32); FSDP that shards optimizer state and gradients but "
                "keeps the parameters after the forward: ZeRO-2 priced", _LLAMA3 + " and sec. 3.3.2", 2),
    PipelineRun("dsv3-pp16-2048xH800", "deepseek-v3", "256x8xH800", 15360, 4096, 16, {"dp": 2, "ep": 64},
                "dualpipe", 1, None, "dots", 1e12 / (180e3 * 3600),
                "PP 16 x EP 64 (8 nodes) x ZeRO-1 DP 2 per stage, DualPipe (its bubble, 2x parameters, PP+1 "
                "activations and all-to-alls hidden under the paired chunk's compute), FP8 GEMMs (priced fp8), "
                "dropless MoE (priced dropless); 180K H800 GPU-hours per trillion tokens; micro-batch size not "
                "published (m chosen)",
                _DSV3 + ", Table 1); github.com/deepseek-ai/DualPipe README (3da1bbe)", 1, "float8", "dropless"),
)
"""Published pipeline-parallel runs (layout, batch, measured throughput, source)."""


@dataclasses.dataclass(frozen=True)
class PipelineComparison:
    """meshplan's answer for one :class:`PipelineRun`."""

    run: PipelineRun
    mem: str  # "fits" or "over" (priced with the state only)
    pinned: MeshCandidate | None
    reason: str  # why there is no pinned price, else ""
    rank: int | None
    ranked: int
    best_text: str
    best_step_s: float | None
    peak_bytes: int | None = None  # the fullest stage's estimated peak per device (fitting or not)
    budget_bytes: int | None = None  # HBM less the search's headroom
    steps: tuple[float, ...] = ()  # every ranked layout's predicted step, fastest first
    pp_rank: int | None = None  # the published layout's place among the pipeline layouts alone
    pp_steps: tuple[float, ...] = ()  # search_pipelines' layouts' predicted steps, fastest first


def stage_peak(run: PipelineRun, kwargs: Mapping[str, Any],
               models: Mapping[str, ModelSpec] | None = None) -> tuple[int, int] | None:
    """The fullest stage's estimated peak per device and the budget it is held to, fitting or not.

    An "over" verdict alone hides whether the layout misses by a gigabyte or by half the HBM. The
    layout is priced again on the same device with four times the HBM (so the stage search keeps it) and
    its memory read back: the state the peak phase holds plus the activations; the budget is the real
    device's HBM less the search's 10% headroom. ``None`` where even that prices nothing.
    """
    from meshplan.pure.search import price_pipeline

    spec, cluster = (PIPELINE_MODELS if models is None else models)[run.model], _cluster(run.cluster)
    roomy = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device,
                                                                    hbm_bytes=4 * cluster.device.hbm_bytes))
    try:
        m = price_pipeline(spec, roomy, **kwargs).memory
    except PlanError:
        return None
    peak = m.params + (m.grads if m.grads_live else 0) + m.optimizer + m.activations
    return peak, round(cluster.device.hbm_bytes * 0.9)


def _pipeline_recipe(run: PipelineRun, cluster: Cluster) -> TrainingRecipe:
    backend = "tpu" if cluster.device.ici_scope == "slice" else "gpu"
    return TrainingRecipe(remat=run.remat, attention="flash", backend=backend, matmul_dtype=run.matmul_dtype,
                          moe_dispatch=run.moe_dispatch)


def compare_pipeline(run: PipelineRun, *, models: Mapping[str, ModelSpec] = PIPELINE_MODELS) -> PipelineComparison:
    """Price ``run``'s published pipeline layout and rank it among meshplan's layouts (pipelined or not).

    ``models`` maps ``run.model`` to its :class:`ModelSpec` (another script's models: Table 2's GPTs).
    """
    from meshplan.pure.search import price_pipeline, search_pipelines

    spec, cluster = models[run.model], _cluster(run.cluster)
    recipe = _pipeline_recipe(run, cluster)
    kwargs: dict[str, Any] = {"pp": run.pp, "stage_layout": run.stage_layout, "batch": run.batch, "seq": run.seq,
                              "schedule": run.schedule, "virtual": run.virtual, "micro_batches": run.micro_batches,
                              "recipe": recipe, "zero": run.zero}
    mem, pinned, reason = "fits", None, ""
    try:
        pinned = price_pipeline(spec, cluster, **kwargs)
    except PlanError as err:
        mem, reason = "over", str(err)
        try:
            pinned = price_pipeline(spec, cluster, activations=False, **kwargs)
        except PlanError as again:
            reason = str(again)
    steps: list[tuple[float, str]] = []
    try:
        steps += [(c.step.step_s, c.text) for c in search_pipelines(spec, cluster, batch=run.batch, seq=run.seq,
                                                                     recipe=recipe, top_k=1000,
                                                                     headroom=HEADROOM).candidates
                  if c.step is not None]
    except PlanError:
        pass
    pipelined = sorted(s for s, _ in steps)  # the pipeline layouts alone: the choice of pp, schedule and stage mesh
    try:
        steps += [(c.step.step_s, c.text) for c in search_meshes(spec, cluster, batch=run.batch, seq=run.seq,
                                                                 recipe=recipe, top_k=1000,
                                                                 headroom=HEADROOM).candidates
                  if c.step is not None and c.fits]
    except PlanError:
        pass
    steps.sort()
    best_text, best_step = (steps[0][1], steps[0][0]) if steps else ("none fits", None)
    rank = pp_rank = None
    if pinned is not None and pinned.step is not None and mem == "fits":
        rank = 1 + sum(1 for s, _ in steps if s < pinned.step.step_s)
        pp_rank = 1 + sum(1 for s in pipelined if s < pinned.step.step_s)
    peak = stage_peak(run, kwargs, models)
    return PipelineComparison(run, mem, pinned, reason, rank, len(steps), best_text, best_step,
                              *(peak if peak is not None else (None, None)), tuple(s for s, _ in steps),
                              pp_rank, tuple(pipelined))


PIPELINE_COLUMNS: tuple[str, ...] = (
    "run", "cluster", "batch x seq", "published layout", "schedule priced", "mem", "m", "bubble", "pred step",
    "pub step", "pred/pub tok/s", "implied eff", "rank", "rank among pp", "alt remat", "meshplan best", "best step")


def alt_remat_cell(run: PipelineRun) -> str:
    """The run under the other reading of its recompute (:data:`ALT_REMAT`): fit, pred/pub tok/s, rank."""
    alt = ALT_REMAT[run.remat]
    c = compare_pipeline(dataclasses.replace(run, remat=alt))
    p = c.pinned
    if p is None or p.step is None:
        return f"{alt}: {c.mem}"
    pub_step = run.batch * run.seq / (run.tokens_per_s * _cluster(run.cluster).num_devices)
    rank = "" if c.rank is None else f", {c.rank}/{c.ranked}"
    return f"{alt}: {c.mem}, {pub_step / p.step.step_s:.2f}{rank}"


def implied_efficiency(p: MeshCandidate, pub_step: float) -> float | None:
    """The efficiency at which ``p``'s predicted step equals ``pub_step``, all else as priced.

    The step is ``(C + X) / (1 - b) + S`` with ``C`` the stage's compute at the priced efficiency ``e0``,
    ``X`` its exposed communication (after any schedule overlap), ``b`` the bubble fraction and ``S`` the
    exposed sends; compute scales as ``1 / e``, so ``e = e0 C / ((pub - S)(1 - b) - X)``. ``None`` when the
    communication alone exceeds the published step.
    """
    assert p.step is not None and p.pipeline is not None
    b, c = p.pipeline.bubble, p.step.compute_s
    sends = sum(t.exposed for t in p.comm if t.kind == "send")
    exposed = (p.step.step_s - sends) * (1 - b) - c
    room = (pub_step - sends) * (1 - b) - exposed
    return p.step.efficiency * c / room if room > 0 else None


def pp_rank_cell(c: PipelineComparison) -> str:
    """The published layout's rank among the pipeline layouts alone, and its step over the best of them."""
    if c.pp_rank is None or c.pinned is None or c.pinned.step is None or not c.pp_steps:
        return "-"
    return f"{c.pp_rank}/{len(c.pp_steps)} ({c.pinned.step.step_s / c.pp_steps[0]:.2f}x)"


def _mem_cell(c: PipelineComparison) -> str:
    if c.peak_bytes is None or c.budget_bytes is None:
        return c.mem
    return f"{c.mem} ({c.peak_bytes / 1e9:.1f} of {c.budget_bytes / 1e9:.1f} GB)"


def pipeline_row(c: PipelineComparison) -> tuple[str, ...]:
    """One row of the pipeline table, in :data:`PIPELINE_COLUMNS` order."""
    run, p = c.run, c.pinned
    devices = _cluster(run.cluster).num_devices
    pub_step = run.batch * run.seq / (run.tokens_per_s * devices)
    layout = f"pp={run.pp}," + ",".join(f"{a}={n}" for a, n in run.stage_layout.items())
    sched = run.schedule + (f" v={run.virtual}" if run.virtual > 1 else "")
    if p is None or p.step is None or p.pipeline is None:
        return (run.key, run.cluster, f"{run.batch} x {run.seq}", layout, sched, _mem_cell(c), "-", "-", "-",
                f"{pub_step:.2f} s", "-", "-", "-", "-", alt_remat_cell(run), c.best_text,
                "-" if c.best_step_s is None else f"{c.best_step_s:.2f} s")
    return (run.key, run.cluster, f"{run.batch} x {run.seq}", layout, sched, _mem_cell(c), str(p.pipeline.micro_batches),
            f"{p.pipeline.bubble:.1%}", f"{p.step.step_s:.2f} s", f"{pub_step:.2f} s",
            f"{pub_step / p.step.step_s:.2f}",
            "-" if (e := implied_efficiency(p, pub_step)) is None else f"{e:.2f}",
            "-" if c.rank is None else f"{c.rank}/{c.ranked}", pp_rank_cell(c), alt_remat_cell(run), c.best_text,
            "-" if c.best_step_s is None else f"{c.best_step_s:.2f} s")


PIPELINE_LEGEND = (
    "Pipeline runs: pred step = meshplan.pure.search.price_pipeline of the published layout (pp over the network,"
    " the stage mesh pinned, m = the fastest of pp x (1, 2, 4, 8) unless published); pred/pub tok/s = published"
    " step / predicted step (> 1: meshplan predicts faster); implied eff = the efficiency at which the predicted"
    " step equals the published one, bubble, exposed communication and sends as priced (priced: the default,"
    " 0.49-0.60 by hidden size; an fp8 run's weight matmuls at FP8_EFFICIENCY_RATIO x it of the FP8 peak);"
    " rank among search_pipelines' layouts (best per pp and placement) and"
    " search_meshes' fitting meshes, by predicted step; mem: the fullest stage's estimated peak per device against"
    " HBM less 10% (stage_peak); 'over': meshplan's memory model rejects the published layout, whose step is then"
    " priced with the state only (no rank); alt remat: the same under the other reading of the run's recompute"
    " (ALT_REMAT: fit, pred/pub tok/s, rank); rank among pp: among search_pipelines' layouts alone (pipelined"
    " step / the best pipelined one).")


def _print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[str]) -> None:
    if "--markdown" in sys.argv:
        print(f"{title}\n")
        print("| " + " | ".join(columns) + " |")
        print("|" + "|".join("---" if col in left else "---:" for col in columns) + "|")
        for cells in rows:
            print("| " + " | ".join(cells) + " |")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for col in columns:
            table.add_column(col, justify="left" if col in left else "right")
        for cells in rows:
            table.add_row(*cells)
        Console(width=250).print(table)


def main() -> None:
    if "--pipeline-only" in sys.argv:
        return _main_pipeline()
    rows = [row(run, compare(run)) for run in PUBLISHED_RUNS]
    title = f"meshplan vs published runs (efficiency: default (e_max, w0) {dict(DEFAULT_EFFICIENCY)})"
    if "--markdown" in sys.argv:
        print(f"{title}\n")
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "|".join("---" if col in ("run", "published layout", "meshplan best") else "---:"
                             for col in COLUMNS) + "|")
        for cells in rows:
            print("| " + " | ".join(cells) + " |")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for col in COLUMNS:
            table.add_column(col, justify="left" if col in ("run", "published layout", "meshplan best") else "right")
        for cells in rows:
            table.add_row(*cells)
        Console(width=250).print(table)
    print("\n" + LEGEND + "\n")
    for run in PUBLISHED_RUNS:
        print(f"- {run.key}: {run.notes}. Source: {run.source}")
    print()
    _main_pipeline()


def _main_pipeline() -> None:
    comparisons = [compare_pipeline(run) for run in PIPELINE_RUNS]
    _print_table("meshplan vs published pipeline-parallel runs", PIPELINE_COLUMNS,
                 [pipeline_row(c) for c in comparisons], ("run", "published layout", "meshplan best"))
    print("\n" + PIPELINE_LEGEND + "\n")
    for c in comparisons:
        extra = f" (no price: {c.reason})" if c.pinned is None else (f" ({c.reason})" if c.reason else "")
        print(f"- {c.run.key}: {c.run.notes}{extra}. Source: {c.run.source}")


if __name__ == "__main__":
    main()
