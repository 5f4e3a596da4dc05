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
efficiency (``meshplan.pure.cost._flops.DEFAULT_EFFICIENCY``: 0.4 of peak bf16
on GPU, 0.5 on TPU). Axis names map data -> dp, fsdp -> fsdp, tensor -> tp,
expert -> ep, context/sequence -> sp. meshplan has no pipeline axis, so runs
that use pipeline parallelism get no pinned prediction (their row shows only the
search's best mesh next to the published throughput).

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
from collections.abc import Mapping

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
from meshplan.pure.search import DEVICE_SPECS, TrainingRecipe
from meshplan.pure.cost._estimates import StepEstimate
from meshplan.pure.cost._flops import DEFAULT_EFFICIENCY

# H800: the export H100 (same SXM compute, 989 TFLOP/s dense bf16) with NVLink cut to 400 GB/s
# bidirectional, i.e. 200 GB/s per direction where meshplan's H100 has 450 GB/s (NVIDIA H800
# product brief); the InfiniBand per GPU in DeepSeek's cluster is 400 Gb/s = 50 GB/s, as for H100.
H800 = dataclasses.replace(DEVICE_SPECS["H100"], name="H800", intra_bandwidth=200e9)
EXTRA_DEVICES: Mapping[str, DeviceSpec] = types.MappingProxyType({"H800": H800})


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


_TT = ("https://github.com/pytorch/torchtitan/blob/820504e20d1149fbf0b98c567af24c4b0433b22d/"
       "benchmarks/llama3_h100_202412_torchtitan.md")
_TRAINY = ("https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/"
           "benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md")
_MT_TIERS = ("https://github.com/AI-Hypercomputer/maxtext/blob/20a91e12a17cbaa7b786ac388b192b63392cd855/"
             "docs/reference/models/tiering.md")
_MT_CFG = "benchmarks/maxtext_trillium_model_configs.py (MaxText; per_device_batch_size, ici_fsdp_parallelism=-1)"

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun("tt-8b-8xH100", "llama3-8b", "1x8xH100", 16, 8192, {"fsdp": 8}, "dots", 5762.0, None,
                 "torchtitan FSDP2 eager bf16, selective AC, H100 HBM2e 96 GB at 500 W (below SXM peak); "
                 "text says 8B 1D without Float8 reaches 33-39% MFU", _TT + " Table 1"),
    PublishedRun("tt-8b-128xH100", "llama3-8b", "16x8xH100", 256, 8192, {"fsdp": 128}, "dots", 5605.0, None,
                 "torchtitan FSDP2 eager bf16, selective AC, 500 W H100", _TT + " Table 3"),
    PublishedRun("tt-70b-256xH100", "llama3-70b", "32x8xH100", 512, 8192, {"fsdp": 32, "tp": 8}, "full", 829.0,
                 None, "torchtitan FSDP 32 x TP 8, torch.compile + Float8 linears, full AC, 500 W H100",
                 _TT + " Table 4"),
    PublishedRun("trainy-8b-32xH200", "llama3-8b", "4x8xH200", 64, 8192, {"fsdp": 32}, "dots", 10938.0, None,
                 "torchtitan FSDP, torch.compile + Float8 (fp8 all-gather), AC per llama3_8b.toml (selective)",
                 _TRAINY),
    PublishedRun("trainy-8b-64xH200", "llama3-8b", "8x8xH200", 128, 8192, {"fsdp": 64}, "dots", 10753.0, None,
                 "as above on 8 nodes", _TRAINY),
    PublishedRun("mt-8b-v6e-256", "llama3-8b", "v6e-256", 1024, 8192, {"fsdp": 256}, "offload", 7207.0, 0.4546,
                 "MaxText bf16, per-device batch 4, custom remat (offloads layer input and q/k/v/out "
                 "projections to host), flash attention", _MT_TIERS + "; layout " + _MT_CFG),
    PublishedRun("mt-70b-v6e-256", "llama3-70b", "v6e-256", 1024, 8192, {"fsdp": 256}, "offload", 960.0, 0.5033,
                 "MaxText bf16, per-device batch 4 (5 in a later revision of the config), custom remat "
                 "(offload layer input, q/k/v), flash attention", _MT_TIERS + "; layout " + _MT_CFG),
    PublishedRun("mt-mixtral-v6e-256", "mixtral-8x7b", "v6e-256", 3072, 4096, {"fsdp": 256}, "offload", 3899.0,
                 0.3523, "MaxText bf16, per-device batch 12, dropping MoE (capacity factor 1.25), custom remat "
                 "(offload), all 256 chips fsdp (no ep)", _MT_TIERS + "; layout " + _MT_CFG
                 + " mixtral_8x7b_dropped"),
    PublishedRun("dsv3-2048xH800", "deepseek-v3", "256x8xH800", 15360, 4096, None, "dots", 1543.0, None,
                 "DeepSeek-V3: PP 16 x EP 64 (across 8 nodes) x ZeRO-1 DP, FP8 GEMMs, DualPipe; "
                 "180K H800 GPU-hours per trillion tokens = 1543 tokens/s/GPU; batch ramps 3072 -> 15360, "
                 "priced at 15360; recompute of RMSNorm and MLA up-projections only",
                 "https://arxiv.org/abs/2412.19437 (DeepSeek-V3 Technical Report, sections 3.2-3.3, 4.2, Table 1)"),
)
"""Published runs with the measured tokens/s per device. Pipeline runs carry ``layout=None``."""


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
    recipe = TrainingRecipe(remat=remat or run.remat, attention="flash", backend=backend)
    return search_meshes(run.model, cluster, batch=run.batch, seq=run.seq, axes=_axes(run.model),
                         fixed=fixed, recipe=recipe, activations=activations, top_k=top_k)


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
    return "PP (not modelled)" if layout is None else ",".join(f"{a}={n}" for a, n in layout.items())


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


def main() -> None:
    rows = [row(run, compare(run)) for run in PUBLISHED_RUNS]
    title = f"meshplan vs published runs (efficiency: default {dict(DEFAULT_EFFICIENCY)})"
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


if __name__ == "__main__":
    main()
