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

Declared before the held-out set was priced: ``w`` = the hidden size (variant ``A``, the one that could be
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

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import bench_published as bp  # noqa: E402
from bench_compiled import scaled  # noqa: E402

from meshplan.errors import PlanError  # noqa: E402
from meshplan.pure import search_meshes  # noqa: E402
from meshplan.pure.cost._flops import step_flops  # noqa: E402
from meshplan.pure.presets import ModelSpec  # noqa: E402
from meshplan.pure.search import DEVICE_SPECS, TrainingRecipe, price_pipeline  # noqa: E402

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


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares on ``log eff`` of ``e_max x w / (w + w0)`` over ``(w, eff)``: ``(e_max, w0)``."""
    best: tuple[float, float, float] | None = None
    for w0 in range(1, 100_001):
        logs = [math.log(e) - math.log(w / (w + w0)) for w, e in points]
        log_e = sum(logs) / len(logs)
        sse = sum((x - log_e) ** 2 for x in logs)
        if best is None or sse < best[0] - 1e-15:
            best = (sse, math.exp(log_e), float(w0))
    assert best is not None
    return best[1], best[2]


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
        table = held_out(width, eff)
        print("\n| held-out run | backend | w | eff after | pred/pub step before | after |")
        print("|---|---|---:|---:|---:|---:|")
        for key, backend, w, e, before, after in table:
            print(f"| {key} | {backend} | {w:.0f} | {e:.2f} | {before:.2f} | {after:.2f} |")
        pipe = {r.key for r in bp.PIPELINE_RUNS}
        for name, pick in (("all", lambda k: True), ("unpipelined", lambda k: k not in pipe),
                           ("pipelined", lambda k: k in pipe)):
            sel = [t for t in table if pick(t[0])]
            print(f"- {name} ({len(sel)}): before {_summary([t[4] for t in sel])}; "
                  f"after {_summary([t[5] for t in sel])}")


if __name__ == "__main__":
    main()
