"""Does an efficiency that grows with the model's matmul size predict published runs better than a flat one?

Run from the repository root: ``python benchmarks/research/bench_efficiency_model.py``. Pure code only.

**Fit set** (the only data the curve sees): the eight single-H200 steps of
``benchmarks/data/step_time_h200.jsonl`` (measured seconds, exact for those runs). Each row's implied
efficiency is recomputed with today's ``step_flops`` (one device, no communication: ``flops / (measured x
peak)``). The form ``eff(w) = e_max x w / (w + w0)`` is fit by least squares on ``log eff``: for each
``w0`` on a 1-token grid the best ``e_max`` is closed-form, the best ``w0`` is kept (ties: the smaller).

**Held-out set** (never fitted to): every published run of ``benchmarks/bench_published.py`` with a
published layout: the eight unpipelined runs (``PUBLISHED_RUNS`` less DeepSeek-V3, whose unpipelined row
prices meshplan's best mesh, not the published layout) and the four pipelined runs (``PIPELINE_RUNS``).
Each is priced twice, with the flat default and with the curve, and the table gives predicted / published
step (> 1: predicted slower), the share within 25% (``0.75 <= ratio <= 1.25``) and the mean ``|ln ratio|``.

**Megatron-LM Table 1** (Narayanan et al. 2021, arXiv 2104.04473: GPT 1.7B to 1T on A100s, achieved
TFLOP/s per GPU, end to end, full recompute) is a second held-out set, added after the first was priced:
its eight rows not already above, with the layouts of Megatron's
``examples/academic_paper_scripts/sc21/run_table_1.sh`` (d98e8a6; TP, PP, micro-batch, global batch, the
virtual stages). 137, 135, 163 TFLOP/s (1.7B, 18.4B, 529.6B) were checked against a second transcription of
the table; 138, 142, 138, 140, 155 (3.6B, 7.5B, 39.1B, 76.1B, 310.1B) are the paper's as read, not re-checked.

Declared before the first held-out set was priced: ``w`` = the hidden size (variant ``A``, the one that could be
adopted); variant ``B`` (the per-device MLP width, ``intermediate / tp``) is printed as a sensitivity only.
TPU keeps its flat 0.5: no TPU step was measured, so there is nothing to fit a TPU curve to.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import bench_published as bp
from bench_compiled import scaled

from meshplan.errors import PlanError
from meshplan.pure import search_meshes
from meshplan.pure.cost._flops import step_flops
from meshplan.pure.presets import ModelSpec
from meshplan.pure.cluster import DEVICE_SPECS
from meshplan.pure.cost import TrainingRecipe
from meshplan.pure.search import price_pipeline

DATA = os.path.join(os.path.dirname(HERE), "data", "step_time_h200.jsonl")
PEAK = DEVICE_SPECS["H200"].peak_bf16_flops
FLAT = {"gpu": 0.4, "tpu": 0.5}  # the flat default the curve is compared with (meshplan's until 2026-11-27)

Width = Callable[[ModelSpec, int], float]


def width_hidden(spec: ModelSpec, tp: int) -> float:
    """Variant A: the hidden size (every weight matmul has it as one dim; tp never splits it)."""
    del tp
    return float(spec.hidden_size)


def width_mlp_per_device(spec: ModelSpec, tp: int) -> float:
    """Variant B: the MLP's per-device width (MoE: one expert's), after tp splits it."""
    return float((spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size) or spec.intermediate_size) / tp


def fit_rows() -> list[tuple[ModelSpec, float]]:
    """(model, implied efficiency) of each H200 row, with today's FLOPs count."""
    rows = []
    with open(DATA, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            name, _, layers = r["model"].partition("/")
            spec = scaled(name, int(layers[:-1]) if layers else None)
            sizes = {"fsdp": 1, "ep": 1} if spec.is_moe else {"fsdp": 1}
            flops = step_flops(spec, sizes, batch=r["batch"], seq=r["seq"], remat=r["remat"],
                               attention=r["attention"]).per_device
            rows.append((spec, flops / (r["measured_s"] * PEAK)))
    return rows


def fit(points: Sequence[tuple[float, float]], *, max_w0: int = 100_000) -> tuple[float, float]:
    """Least squares on ``log eff`` of ``e_max x w / (w + w0)`` over ``(w, eff)``: ``(e_max, w0)``, ``w0`` an
    integer in ``[1, max_w0]`` (ties: the smallest), ``e_max`` closed-form for each ``w0``."""
    w = np.array([p[0] for p in points], dtype=float)
    logs = np.log([p[1] for p in points])[None, :] - np.log(w[None, :] / (w[None, :] + np.arange(1, max_w0 + 1)[:, None]))
    log_e = logs.mean(axis=1)
    sse = ((logs - log_e[:, None]) ** 2).sum(axis=1)
    best = int(np.argmin(sse))  # the first minimum: the smallest w0
    return float(np.exp(log_e[best])), float(best + 1)


def curve(e_max: float, w0: float) -> Callable[[float], float]:
    return lambda w: e_max * w / (w + w0)


def _unpipelined(run: bp.PublishedRun, efficiency: float) -> float:
    """Predicted step of ``run``'s published layout (as bench_published prices it) at ``efficiency``."""
    cluster = bp._cluster(run.cluster)
    backend = "tpu" if cluster.device.ici_scope == "slice" else "gpu"
    recipe = TrainingRecipe(remat=run.remat, attention="flash", backend=backend)
    assert run.layout is not None
    fixed = {a: run.layout.get(a, 1) for a in bp._axes(run.model)}
    for activations in (True, False):
        try:
            best = search_meshes(run.model, cluster, batch=run.batch, seq=run.seq, axes=bp._axes(run.model),
                                 fixed=fixed, recipe=recipe, activations=activations, top_k=1,
                                 efficiency=efficiency).best
        except PlanError:
            continue
        assert best.step is not None
        return best.step.step_s
    raise RuntimeError(run.key)


def _pipelined(run: bp.PipelineRun, efficiency: float) -> float:
    spec, cluster = bp.PIPELINE_MODELS[run.model], bp._cluster(run.cluster)
    kwargs: dict[str, Any] = {"pp": run.pp, "stage_layout": run.stage_layout, "batch": run.batch, "seq": run.seq,
                              "schedule": run.schedule, "virtual": run.virtual, "micro_batches": run.micro_batches,
                              "recipe": bp._pipeline_recipe(run, cluster), "zero": run.zero,
                              "efficiency": efficiency}
    try:
        cand = price_pipeline(spec, cluster, **kwargs)
    except PlanError:
        cand = price_pipeline(spec, cluster, activations=False, **kwargs)
    assert cand.step is not None
    return cand.step.step_s


# (params, layers, hidden, heads, tp, pp, micro-batch size, global batch, nodes, layers per virtual stage or 0,
#  achieved TFLOP/s per GPU): Table 1 rows and run_table_1.sh layouts; the 145.6B and 1T rows are in PIPELINE_RUNS.
MEGATRON_TABLE_1: tuple[tuple[str, int, int, int, int, int, int, int, int, int, float], ...] = (
    ("1.7b", 24, 2304, 24, 1, 1, 16, 512, 4, 0, 137.0),
    ("3.6b", 30, 3072, 32, 2, 1, 16, 512, 8, 0, 138.0),
    ("7.5b", 36, 4096, 32, 4, 1, 16, 512, 16, 0, 142.0),
    ("18.4b", 40, 6144, 48, 8, 1, 8, 1024, 32, 0, 135.0),
    ("39.1b", 48, 8192, 64, 8, 2, 4, 1536, 64, 0, 138.0),
    ("76.1b", 60, 10240, 80, 8, 4, 2, 1792, 128, 5, 140.0),
    ("310.1b", 96, 16384, 128, 8, 16, 1, 2160, 240, 3, 155.0),
    ("529.6b", 105, 20480, 128, 8, 35, 1, 2520, 315, 1, 163.0),
)


def megatron_rows(eff: Callable[[float], float]) -> list[tuple[str, str, float, float, float, float]]:
    """(run, backend, width, eff after, ratio before, ratio after) for the Megatron Table 1 rows."""
    out = []
    for name, layers, hidden, heads, tp, pp, mbs, gbs, nodes, per_virtual, tflops in MEGATRON_TABLE_1:
        spec = bp._gpt(f"gpt-{name}", heads, hidden, layers)
        cluster = bp._cluster(f"{nodes}x8xA100-80GB")
        dp = cluster.num_devices // (tp * pp)
        pub = gbs * 2048 * bp._megatron_flops_per_token(layers, hidden, 2048, 51200) / (cluster.num_devices
                                                                                       * tflops * 1e12)
        recipe = TrainingRecipe(remat="full", attention="flash", backend="gpu")
        ratios = []
        for e in (FLAT["gpu"], eff(hidden)):
            if pp == 1:
                fixed = {"dp": dp, "fsdp": 1, "sp": 1, "tp": tp}
                cand = None
                for activations in (True, False):
                    try:
                        cand = search_meshes(spec, cluster, batch=gbs, seq=2048, axes=tuple(fixed), fixed=fixed,
                                             recipe=recipe, activations=activations, top_k=1, efficiency=e).best
                        break
                    except PlanError:
                        continue
                assert cand is not None and cand.step is not None
                ratios.append(cand.step.step_s / pub)
            else:
                virtual = layers // pp // per_virtual if per_virtual else 1
                kwargs: dict[str, Any] = {"pp": pp, "stage_layout": {"dp": dp, "tp": tp}, "batch": gbs, "seq": 2048,
                                          "schedule": "interleaved" if virtual > 1 else "1f1b", "virtual": virtual,
                                          "micro_batches": gbs // (dp * mbs), "recipe": recipe, "efficiency": e}
                try:
                    pc = price_pipeline(spec, cluster, **kwargs)
                except PlanError:
                    pc = price_pipeline(spec, cluster, activations=False, **kwargs)
                assert pc.step is not None
                ratios.append(pc.step.step_s / pub)
        out.append((f"megatron-{name} (Table 1)", "gpu", float(hidden), eff(hidden), ratios[0], ratios[1]))
    return out


def held_out(width: Width, eff: Callable[[float], float]) -> list[tuple[str, str, float, float, float, float]]:
    """(run, backend, width, eff after, ratio before, ratio after) for each held-out run."""
    out = []
    for run in bp.PUBLISHED_RUNS:
        if run.layout is None:
            continue
        cluster = bp._cluster(run.cluster)
        tpu = cluster.device.ici_scope == "slice"
        spec = bp.MODEL_SPECS[run.model]
        w = width(spec, run.layout.get("tp", 1))
        flat = FLAT["tpu" if tpu else "gpu"]
        after = flat if tpu else eff(w)
        pub = run.batch * run.seq / (run.tokens_per_s * cluster.num_devices)
        out.append((run.key, "tpu" if tpu else "gpu", w, after, _unpipelined(run, flat) / pub,
                    _unpipelined(run, after) / pub))
    for prun in bp.PIPELINE_RUNS:
        cluster = bp._cluster(prun.cluster)
        spec = bp.PIPELINE_MODELS[prun.model]
        w = width(spec, prun.stage_layout.get("tp", 1))
        pub = prun.batch * prun.seq / (prun.tokens_per_s * cluster.num_devices)
        after = eff(w)
        out.append((prun.key, "gpu", w, after, _pipelined(prun, FLAT["gpu"]) / pub,
                    _pipelined(prun, after) / pub))
    return out


def _summary(ratios: Sequence[float]) -> str:
    within = sum(1 for r in ratios if 0.75 <= r <= 1.25)
    err = sum(abs(math.log(r)) for r in ratios) / len(ratios)
    return f"{within}/{len(ratios)} within 25%, mean |ln ratio| {err:.3f}"


def main() -> None:
    rows = fit_rows()
    for label, width in (("A (hidden size)", width_hidden), ("B (MLP width / tp; sensitivity only)",
                                                             width_mlp_per_device)):
        points = [(width(spec, 1), e) for spec, e in rows]
        e_max, w0 = fit(points)
        eff = curve(e_max, w0)
        print(f"\n### Variant {label}: eff(w) = {e_max:.3f} x w / (w + {w0:.0f}), fit on the 8 H200 rows\n")
        print("| H200 row (fit set) | w | implied eff | curve | flat 0.4 |")
        print("|---|---:|---:|---:|---:|")
        for (spec, e), (w, _) in zip(rows, points):
            print(f"| {spec.name} | {w:.0f} | {e:.2f} | {eff(w):.2f} | 0.40 |")
        table = held_out(width, eff) + (megatron_rows(eff) if width is width_hidden else [])
        print("\n| held-out run | backend | w | eff after | pred/pub step before | after |")
        print("|---|---|---:|---:|---:|---:|")
        for key, backend, w, e, before, after in table:
            print(f"| {key} | {backend} | {w:.0f} | {e:.2f} | {before:.2f} | {after:.2f} |")
        pipe = {r.key for r in bp.PIPELINE_RUNS}
        first = {r.key for r in bp.PUBLISHED_RUNS} | pipe
        megatron = {t[0] for t in table if t[0].startswith("megatron")}
        groups: list[tuple[str, set[str]]] = [("first set", first), ("first set, unpipelined", first - pipe),
                                              ("first set, pipelined", pipe)]
        if width is width_hidden:  # the Megatron Table 1 rows are priced for the declared variant only
            groups += [("Megatron Table 1 (all 10 rows)", megatron), ("everything", {t[0] for t in table})]
        for name, keys in groups:
            sel = [t for t in table if t[0] in keys]
            print(f"- {name} ({len(sel)}): before {_summary([t[4] for t in sel])}; "
                  f"after {_summary([t[5] for t in sel])}")


if __name__ == "__main__":
    main()
