"""meshplan against Megatron-LM's Table 2: PTD-P against ZeRO-3 without model parallelism, on the same GPUs.

Run: ``python benchmarks/bench_megatron_table2.py [--markdown]`` (about 15 s). Pure code only: no devices.

Narayanan et al. 2021 (arXiv 2104.04473, section 5.2 and Table 2) trained GPT-3's 174.6B model (96 layers,
hidden 12,288, 96 heads) and the 529.6B model of their Table 1 (105 layers, hidden 20,480, 128 heads) on
Selene (DGX A100 80 GB nodes: 8 GPUs on NVLink 3, 8 HDR InfiniBand 200 Gb/s ports per node), sequence 2048,
vocabulary 51,200, full activation recompute, keeping the global batch while the GPU count grows: once with
PTD-P (Megatron's tensor x pipeline x data parallelism) and once with DeepSpeed's ZeRO-3 and no model
parallelism. The paper gives TFLOP/s per GPU by its formula (3); the published step here is
``batch x seq x (3)'s FLOPs per token / (TFLOP/s x GPUs)``.

Figures: the paper's Table 2, as transcribed by cli99/llm-analysis (examples/megatron-lm/run_train.sh and
run_train_zero.sh at b60b392f: TP, PP, batch, GPUs and TFLOP/s of each row; its model configs
megatron-lm-175b / -530b for the dimensions). Table 2's micro-batch column, which the transcription
leaves out: ZeRO-3 4, 2, 1 sequences per GPU (the whole per-GPU batch: no gradient accumulation); PTD-P 1.
Table 2 does not name the PTD-P schedule: priced interleaved with the virtual stages of Megatron-LM's own
scripts for these shapes (examples/academic_paper_scripts/sc21 at d98e8a6: run_figure_12.sh and
run_figure_18.sh run the 175B at TP 8 x PP 12 with 2 layers per virtual stage, v = 4; run_table_1.sh the
530B at TP 8 x PP 35 with 1, v = 3), ``m = batch / dp`` micro-batches and no ZeRO over ``dp`` (DDP local).

- **ZeRO-3 rows**: :func:`meshplan.pure.search_meshes` with every GPU on ``fsdp`` (dp = sp = tp = 1),
  remat full, flash attention, backend gpu, one micro-batch. Where meshplan's memory model rejects the
  published micro-batch (``mem`` over) the step is priced with the state only. 1120 and 2240 GPUs are no mesh
  meshplan can plan for the 529.6B model: 1120 = 2^5 x 5 x 7 and 2240 = 2^6 x 5 x 7 divide no dimension of
  its weights (all 2^a x 3^b x 5^c: 20,480, 61,440, 81,920, 51,200, 2048) and meshplan splits whole dims
  evenly, while DeepSpeed flattens each weight and pads it to a multiple of the GPU count. Those rows are
  priced by proxy: the same sequences per GPU on the largest whole-node ``fsdp`` group that splits the
  weights (1024, 2048), whose collectives move the same bytes per call (the gathered weight), each
  collective re-priced over the published GPU count by meshplan's own alpha-beta model
  (:func:`~meshplan.pure.cost._placement.group_time`) and the step overlapped again
  (:func:`~meshplan.pure.cost.step_time`).
- **PTD-P rows**: :func:`bench_published.compare_pipeline`: the published layout priced by
  ``price_pipeline`` and ranked among ``search_pipelines``' and ``search_meshes``' layouts.
- **Bandwidth table** (ZeRO-3): the bytes each GPU's rings move per step (``(n-1)/n x B`` per call, all
  calls), the part meshplan's two-level schedule sends over InfiniBand, the bus bandwidth meshplan's price
  amounts to, and the one the measured step implies if it were all communication (the rows whose step does
  not shrink with more GPUs are communication-bound); alpha: the latency term per step, two-level as
  priced and as one flat ring over all GPUs.

Nothing is fitted: the default efficiency, the shipped A100 links (NVLink 300 GB/s, InfiniBand 25 GB/s
per GPU, latency 3 us / 10 us per ring step).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import types
from collections.abc import Mapping, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

from bench_published import (
    HEADROOM,
    PIPELINE_RUNS,
    PipelineComparison,
    PipelineRun,
    _cluster,
    _gpt,
    _megatron_flops_per_token,
    _print_table,
    compare_pipeline,
    pp_rank_cell,
)

from meshplan.pure import MeshCandidate, search_meshes
from meshplan.pure.cost import CommTerm, step_flops, step_time
from meshplan.pure.cost._placement import AxisPlacement, group_time
from meshplan.pure.presets import ModelSpec, build_params
from meshplan.pure.cost import TrainingRecipe

SEQ = 2048
MODELS: Mapping[str, ModelSpec] = types.MappingProxyType({
    "gpt-174.6b": _gpt("gpt-174.6b", 96, 12288, 96),
    "gpt-529.6b": _gpt("gpt-529.6b", 128, 20480, 105),
})
"""Table 2's models (GPT-2 blocks, vocabulary 51,200, tied embedding; llm-analysis's configs give the same
layers, hidden and heads)."""

_PAPER = ("https://arxiv.org/abs/2104.04473 (Narayanan et al. 2021, Efficient Large-Scale Language Model Training "
          "on GPU Clusters Using Megatron-LM, section 5.2, Table 2)")
_LLM_ANALYSIS = ("https://github.com/cli99/llm-analysis/blob/b60b392f747850d198145889205d8a3586d00282/"
                 "examples/megatron-lm/")
_SC21 = ("https://github.com/NVIDIA/Megatron-LM/tree/d98e8a64dd/examples/academic_paper_scripts/sc21 "
         "(run_figure_12.sh, run_figure_18.sh: 175B TP 8 x PP 12, 2 layers per virtual stage; run_table_1.sh: "
         "530B TP 8 x PP 35, 1 layer per virtual stage)")


def flops_per_token(model: str) -> float:
    """The paper's formula (3) per token (recompute included) for one of :data:`MODELS`."""
    spec = MODELS[model]
    return _megatron_flops_per_token(spec.num_layers, spec.hidden_size, SEQ, spec.vocab_size)


@dataclasses.dataclass(frozen=True)
class ZeroRun:
    """One ZeRO-3 row of Table 2: DeepSpeed ZeRO-3 over every GPU, no model parallelism.

    Attributes:
      key: short label; model: a key of :data:`MODELS`; gpus: A100s (8 per node); batch: global batch in
      sequences; micro_batch: sequences per GPU per micro-batch (Table 2's column); tflops: measured TFLOP/s
      per GPU (formula (3)); days: Table 2's training time for 300B tokens (a check of the transcription).
    """

    key: str
    model: str
    gpus: int
    batch: int
    micro_batch: int
    tflops: float
    days: int

    @property
    def cluster(self) -> str:
        return f"{self.gpus // 8}x8xA100-80GB"

    @property
    def pub_step(self) -> float:
        return self.batch * SEQ * flops_per_token(self.model) / (self.tflops * 1e12 * self.gpus)


ZERO_RUNS: tuple[ZeroRun, ...] = (
    ZeroRun("zero3-174.6b-384", "gpt-174.6b", 384, 1536, 4, 144, 90),
    ZeroRun("zero3-174.6b-768", "gpt-174.6b", 768, 1536, 2, 88, 74),
    ZeroRun("zero3-174.6b-1536", "gpt-174.6b", 1536, 1536, 1, 44, 74),
    # (Table 2: the 529.6B did not fit 560 GPUs at micro-batch 4, so 640 GPUs and batch 2560 were used.)
    ZeroRun("zero3-529.6b-640", "gpt-529.6b", 640, 2560, 4, 138, 169),
    ZeroRun("zero3-529.6b-1120", "gpt-529.6b", 1120, 2240, 2, 98, 137),
    ZeroRun("zero3-529.6b-2240", "gpt-529.6b", 2240, 2240, 1, 48, 140),
)
"""Table 2's ZeRO-3 half."""


def _ptdp(model: str, pp: int, virtual: int, batch: int, gpus: int, tflops: float) -> PipelineRun:
    dp = gpus // (8 * pp)
    return PipelineRun(
        key=f"ptdp-{model.removeprefix('gpt-')}-{gpus}", model=model, cluster=f"{gpus // 8}x8xA100-80GB",
        batch=batch, seq=SEQ, pp=pp, stage_layout={"dp": dp, "tp": 8}, schedule="interleaved", virtual=virtual,
        micro_batches=batch // dp, remat="full", tokens_per_s=tflops * 1e12 / flops_per_token(model),
        notes=f"{tflops:g} TFLOP/s per GPU; TP 8 x PP {pp} x DP {dp}, micro-batch 1 (Table 2), interleaved "
              f"v={virtual} (the sc21 scripts' virtual stages)",
        source=f"{_PAPER}; {_LLM_ANALYSIS}run_train.sh; {_SC21}")


PTDP_RUNS: tuple[PipelineRun, ...] = (
    _ptdp("gpt-174.6b", 12, 4, 1536, 384, 153),
    _ptdp("gpt-174.6b", 12, 4, 1536, 768, 149),
    _ptdp("gpt-174.6b", 12, 4, 1536, 1536, 141),
    _ptdp("gpt-529.6b", 35, 3, 2240, 560, 171),
    _ptdp("gpt-529.6b", 35, 3, 2240, 1120, 167),
    _ptdp("gpt-529.6b", 35, 3, 2240, 2240, 159),
)
"""Table 2's PTD-P half."""

PUBLISHED_DAYS: Mapping[str, int] = types.MappingProxyType({
    **{r.key: r.days for r in ZERO_RUNS},
    **dict(zip((r.key for r in PTDP_RUNS), (84, 43, 23, 156, 80, 42), strict=True)),
})
"""Table 2's training time for 300B tokens, in days, per row."""


# ---------------------------------------------------------------------------------------------------
# ZeRO-3: every GPU on fsdp.

@dataclasses.dataclass(frozen=True)
class ZeroPrice:
    """meshplan's price of one :class:`ZeroRun`.

    ``comm`` holds the collectives priced over ``run.gpus`` (each with its exposed seconds); ``proxy`` is the
    fsdp size planned in place of ``run.gpus`` (0: the published mesh itself); ``mem`` "fits" or "over".
    """

    run: ZeroRun
    proxy: int
    mem: str
    compute_s: float
    exposed_s: float
    comm: tuple[CommTerm, ...]

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s

    @property
    def comm_s(self) -> float:
        return sum(t.seconds for t in self.comm)


@functools.cache
def _weight_dims(model: str) -> tuple[int, ...]:
    import jax

    return tuple(sorted({d for leaf in jax.tree.leaves(build_params(MODELS[model])) for d in leaf.shape}))


def _splits_a_weight(model: str, n: int) -> bool:
    """Whether some dim of some weight of ``model`` divides by ``n`` (else meshplan's rules split nothing)."""
    return any(d % n == 0 for d in _weight_dims(model))


def _mesh(spec: ModelSpec, gpus: int, batch: int) -> tuple[MeshCandidate, str]:
    """The fsdp-only mesh priced at one micro-batch (with the state only where the memory model rejects it)."""
    from meshplan.errors import PlanError

    recipe = TrainingRecipe(remat="full", attention="flash", backend="gpu")
    kw = dict(batch=batch, seq=SEQ, axes=("dp", "fsdp", "sp", "tp"), fixed={"dp": 1, "fsdp": gpus, "sp": 1, "tp": 1},
              recipe=recipe, top_k=1, micro_batches=1, headroom=HEADROOM)
    try:
        return search_meshes(spec, _cluster(f"{gpus // 8}x8xA100-80GB"), **kw).best, "fits"
    except PlanError:
        return search_meshes(spec, _cluster(f"{gpus // 8}x8xA100-80GB"), activations=False, **kw).best, "over"


def price_zero3(run: ZeroRun) -> ZeroPrice:
    """Price ``run`` (see the module docstring for the proxy of a GPU count that splits no weight)."""
    spec = MODELS[run.model]
    if _splits_a_weight(run.model, run.gpus):
        c, mem = _mesh(spec, run.gpus, run.batch)
        assert c.step is not None
        return ZeroPrice(run, 0, mem, c.step.compute_s, c.step.exposed_s, c.comm)
    per_gpu = run.batch // run.gpus
    proxy = next(n for n in range(run.gpus - 8, 7, -8) if _splits_a_weight(run.model, n))
    c, mem = _mesh(spec, proxy, proxy * per_gpu)
    assert c.step is not None
    # The same work per GPU and bytes per call; only the group grows: re-price every collective over it.
    cluster = _cluster(run.cluster)
    where = AxisPlacement(("dp", "fsdp", "sp", "tp"), (1, 8, 1, 1), (1, run.gpus // 8, 1, 1), cluster)
    seconds = [t.calls * group_time(t.kind, t.nbytes, t.axes, where)[0] for t in c.comm]
    flops = step_flops(spec, {"fsdp": proxy}, batch=proxy * per_gpu, seq=SEQ, remat="full", attention="flash")
    timed = step_time(flops, [(t.what, t.kind, s) for t, s in zip(c.comm, seconds, strict=True)],
                      layers=spec.num_layers, tokens=proxy * per_gpu * SEQ, devices=proxy,
                      peak_flops=cluster.device.peak_bf16_flops, efficiency=c.step.efficiency)
    comm = tuple(dataclasses.replace(t, seconds=s, exposed=e.exposed)
                 for t, s, e in zip(c.comm, seconds, timed.terms, strict=True))
    return ZeroPrice(run, proxy, mem, timed.compute_s, timed.exposed_s, comm)


ZERO_COLUMNS: tuple[str, ...] = (
    "row", "GPUs", "batch x seq", "micro", "priced as", "mem", "pred step", "pub step", "pred/pub tok/s",
    "compute", "comm", "exposed")


def zero_row(z: ZeroPrice) -> tuple[str, ...]:
    """One row of the ZeRO-3 table, in :data:`ZERO_COLUMNS` order."""
    r = z.run
    priced = f"fsdp={r.gpus}" if not z.proxy else f"fsdp={z.proxy} re-priced over {r.gpus}"
    return (r.key, str(r.gpus), f"{r.batch} x {SEQ}", str(r.micro_batch), priced, z.mem, f"{z.step_s:.1f} s",
            f"{r.pub_step:.1f} s", f"{r.pub_step / z.step_s:.2f}", f"{z.compute_s:.1f} s", f"{z.comm_s:.1f} s",
            f"{z.exposed_s:.2f} s")


def ring_bytes(z: ZeroPrice) -> tuple[float, float]:
    """Bytes per GPU per step: what its rings move (``(n-1)/n x B`` per call; twice for an all-reduce), and the
    part of it meshplan's two-level schedule sends over the network (the inter-node ring of ``B / 8``)."""
    n, d = z.run.gpus, z.run.gpus // 8
    passes = {"all-gather": 1, "reduce-scatter": 1, "all-reduce": 2}
    ring = sum(t.calls * passes[t.kind] * (n - 1) / n * t.nbytes for t in z.comm)
    inter = sum(t.calls * passes[t.kind] * (d - 1) / d * t.nbytes / 8 for t in z.comm)
    return ring, inter


BANDWIDTH_COLUMNS: tuple[str, ...] = (
    "row", "ring bytes/GPU", "over IB (two-level)", "meshplan comm", "= bus bw", "alpha two-level",
    "alpha flat ring", "pub step", "implied bus bw", "/ IB line rate")


def bandwidth_row(z: ZeroPrice) -> tuple[str, ...]:
    """One row of the bandwidth table, in :data:`BANDWIDTH_COLUMNS` order."""
    cluster = _cluster(z.run.cluster)
    n, calls = z.run.gpus, sum(t.calls for t in z.comm)
    ring, inter = ring_bytes(z)
    alpha = calls * (7 * cluster.intra_link.latency + (n // 8 - 1) * cluster.inter_link.latency)
    flat = calls * (n - 1) * cluster.inter_link.latency
    implied = ring / z.run.pub_step
    return (z.run.key, f"{ring / 1e12:.2f} TB", f"{inter / 1e9:.0f} GB", f"{z.comm_s:.1f} s",
            f"{ring / z.comm_s / 1e9:.0f} GB/s", f"{alpha:.2f} s", f"{flat:.1f} s", f"{z.run.pub_step:.1f} s",
            f"{implied / 1e9:.1f} GB/s", f"{implied / cluster.inter_link.bandwidth:.2f}")


# ---------------------------------------------------------------------------------------------------
# PTD-P: bench_published's pipeline machinery on Table 2's models.

PTDP_COLUMNS: tuple[str, ...] = (
    "row", "GPUs", "batch x seq", "layout", "schedule", "m", "bubble", "pred step", "pub step", "pred/pub tok/s",
    "compute", "comm", "exposed", "rank", "rank among pp", "within 5/10/25%", "meshplan best", "best step")


def within(c: PipelineComparison, fractions: Sequence[float] = (0.05, 0.10, 0.25)) -> tuple[int, ...]:
    """How many ranked layouts lie within each fraction of the best predicted step (the best included)."""
    if not c.steps:
        return tuple(0 for _ in fractions)
    return tuple(sum(1 for s in c.steps if s <= c.steps[0] * (1 + f)) for f in fractions)


def ptdp_row(c: PipelineComparison) -> tuple[str, ...]:
    """One row of the PTD-P table, in :data:`PTDP_COLUMNS` order."""
    run, p = c.run, c.pinned
    gpus = _cluster(run.cluster).num_devices
    pub = run.batch * run.seq / (run.tokens_per_s * gpus)
    layout = f"pp={run.pp}," + ",".join(f"{a}={n}" for a, n in run.stage_layout.items())
    best = "-" if c.best_step_s is None else f"{c.best_step_s:.1f} s"
    if p is None or p.step is None or p.pipeline is None:
        return (run.key, str(gpus), f"{run.batch} x {run.seq}", layout, f"{run.schedule} v={run.virtual}", "-", "-",
                "-", f"{pub:.1f} s", "-", "-", "-", "-", "-", "-", "/".join(map(str, within(c))), c.best_text, best)
    comm = sum(t.seconds for t in p.comm)
    exposed = sum(t.exposed or 0.0 for t in p.comm)
    return (run.key, str(gpus), f"{run.batch} x {run.seq}", layout, f"{run.schedule} v={run.virtual}",
            str(p.pipeline.micro_batches), f"{p.pipeline.bubble:.1%}", f"{p.step.step_s:.1f} s", f"{pub:.1f} s",
            f"{pub / p.step.step_s:.2f}", f"{p.step.compute_s:.1f} s", f"{comm:.1f} s", f"{exposed:.2f} s",
            "-" if c.rank is None else f"{c.rank}/{c.ranked}", pp_rank_cell(c), "/".join(map(str, within(c))),
            c.best_text, best)


def speed_ratios(zeros: Sequence[ZeroPrice], ptdps: Sequence[PipelineComparison]) -> list[str]:
    """Per GPU count, PTD-P's tokens/s per GPU over ZeRO-3's: measured and predicted (rows paired in order)."""
    lines = []
    for z, c in zip(zeros, ptdps, strict=True):
        if c.pinned is None or c.pinned.step is None:
            continue
        gpus = _cluster(c.run.cluster).num_devices
        measured = c.run.tokens_per_s / (z.run.tflops * 1e12 / flops_per_token(z.run.model))
        pred_ptdp = c.run.batch * SEQ / (c.pinned.step.step_s * gpus)
        pred_zero = z.run.batch * SEQ / (z.step_s * z.run.gpus)
        lines.append(f"{z.run.model} on {gpus} (PTD-P) / {z.run.gpus} (ZeRO-3) GPUs: PTD-P / ZeRO-3 tokens/s per GPU "
                     f"measured {measured:.2f}, meshplan {pred_ptdp / pred_zero:.2f}")
    return lines


def sensitivity(c: PipelineComparison) -> str:
    """How far the published layout's predicted step is from the best, and how many layouts lie near the best."""
    if c.pinned is None or c.pinned.step is None or c.best_step_s is None:
        return f"{c.run.key}: not ranked ({c.reason or c.mem})"
    a, b, d = within(c)
    return (f"{c.run.key}: published layout {c.pinned.step.step_s / c.best_step_s:.3f} x the best predicted step, "
            f"rank {c.rank}/{c.ranked}; layouts within 5% / 10% / 25% of the best: {a} / {b} / {d}")


LEGEND = (
    "pub step = batch x seq x formula (3)'s FLOPs per token / (published TFLOP/s per GPU x GPUs); pred/pub tok/s ="
    " pub step / pred step (> 1: meshplan predicts faster); comm = the seconds of all priced collectives (and"
    " pipeline sends), exposed = the part not hidden under compute; micro = Table 2's sequences per GPU per"
    " micro-batch; within 5/10/25% = ranked layouts whose predicted step is within that fraction of the best; the"
    " bandwidth table's bus bw = ring bytes per GPU / seconds (nccl-tests' bus bandwidth), implied = if the"
    " measured step were all communication.")


def main() -> None:
    zeros = [price_zero3(r) for r in ZERO_RUNS]
    ptdps = [compare_pipeline(r, models=MODELS) for r in PTDP_RUNS]
    left = ("row", "priced as", "layout", "meshplan best")
    _print_table("Table 2, ZeRO-3 without model parallelism (every GPU on fsdp)", ZERO_COLUMNS,
                 [zero_row(z) for z in zeros], left)
    print()
    _print_table("Table 2, PTD-P (pp over the network, tp 8 in each node)", PTDP_COLUMNS,
                 [ptdp_row(c) for c in ptdps], left)
    print()
    _print_table("ZeRO-3: the bytes each GPU moves and the bandwidth the measured steps imply", BANDWIDTH_COLUMNS,
                 [bandwidth_row(z) for z in zeros], left)
    print("\n" + LEGEND + "\n")
    for line in speed_ratios(zeros, ptdps):
        print(f"- {line}")
    table1 = compare_pipeline(PIPELINE_RUNS[0])
    for c in (table1, *ptdps):
        print(f"- {sensitivity(c)}")
    print(f"\n- ZeRO-3 rows: DeepSpeed ZeRO-3, batch and TFLOP/s per GPU from Table 2. Source: {_PAPER}; "
          f"{_LLM_ANALYSIS}run_train_zero.sh")
    print(f"- PTD-P rows: TP 8 x PP 12 (174.6B) or 35 (529.6B) x DP, micro-batch 1 (Table 2), interleaved with v = 4 "
          f"or 3 (the sc21 scripts' virtual stages), m = batch / dp. Source: {PTDP_RUNS[0].source}")
    print(f"- {table1.run.key} (Table 1, bench_published): {table1.run.notes}")


if __name__ == "__main__":
    main()
