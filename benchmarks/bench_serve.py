"""meshplan's serving time model against published decode and prefill measurements, with part held out.

Run: ``python benchmarks/bench_serve.py [--markdown]`` prints predicted / measured per published row (the rows and
their sources are ``benchmarks/data/serving_published.json``); ``--fit`` refits the four coefficients of
:data:`meshplan.pure.serve.SERVE_CALIBRATION` on the rows marked ``fit`` (least squares on log(measured /
predicted)) and prints them with the range and held-out error the module states. Pure code only, no devices.

What each kind of row measures and how it is predicted is the data file's ``mapping``: ``decode`` (gpt-fast,
batch 1 on A100s), ``itl`` and ``ttft`` (TensorRT-LLM's online serving table, H100 and H200, BF16), ``saturation``
(JetStream-PyTorch's ShareGPT throughput on TPU v5e-8, an upper-bound check that is neither fitted nor counted
as held-out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's meshplan

import numpy as np

from meshplan.pure.cluster import parse_cluster
from meshplan.pure.presets import MODEL_SPECS, ModelSpec, model_spec_from_hf_config
from meshplan.pure.serve import (
    SERVE_CALIBRATION,
    CacheFormat,
    ServeCalibration,
    ServeLayout,
    decode_step_time,
    kv_geometry,
    prefill_time,
    weight_bytes,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "serving_published.json"


def models() -> dict[str, ModelSpec]:
    """The specs the rows name."""
    l2 = model_spec_from_hf_config(json.loads((ROOT / "tests/data/models/llama-2-7b.json").read_text()),
                                   name="llama2-7b")
    l2_70 = dataclasses.replace(l2, name="llama2-70b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                                intermediate_size=28672)
    return {"llama2-7b": l2, "llama2-70b": l2_70, "llama3.1-8b": MODEL_SPECS["llama3-8b"],
            "llama3.1-70b": MODEL_SPECS["llama3-70b"], "llama3-8b": MODEL_SPECS["llama3-8b"]}


_UNIT = ServeCalibration(1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0, 0, 0.0, "components")
_LATENCY = dataclasses.replace(_UNIT, collective_latency_scale=1.0)


@dataclasses.dataclass(frozen=True)
class Parts:
    """A step's terms at unit coefficients: memory and compute seconds at 100% efficiency, the collectives'
    bandwidth seconds and latency seconds at scale 1, and the layers."""

    memory: float
    compute: float
    coll_bw: float
    coll_latency: float
    layers: int

    def seconds(self, c: ServeCalibration) -> float:
        return (max(self.memory / c.hbm_efficiency, self.compute / c.matmul_efficiency) + self.coll_bw
                + self.coll_latency * c.collective_latency_scale + self.layers * c.layer_overhead_s)


def _parts(fn: Any) -> Parts:
    a, b = fn(_UNIT), fn(_LATENCY)
    return Parts(a.memory_s, a.compute_s, a.collective_s, b.collective_s - a.collective_s, 0)


def row_parts(row: dict[str, Any], specs: dict[str, ModelSpec]) -> dict[str, Parts]:
    """The decode (and prefill) terms of one published row."""
    spec = specs[row["model"]]
    cluster = parse_cluster(row["cluster"])
    layout = ServeLayout(1, row["tp"])
    w = weight_bytes(spec, layout, row["weight_dtype"])
    contiguous = row["kind"] == "saturation"
    fmt = CacheFormat("contiguous", scales="token") if contiguous else CacheFormat("paged", 16)
    kv = kv_geometry(spec, layout, row["kv_dtype"], fmt)
    if row["kind"] in ("decode", "saturation"):
        seqs, ctx = row["sequences"], row["context"]
    else:
        seqs = max(1, round(row["qps"] * (row["ttft_ms"] + row["osl"] * row["itl_ms"]) / 1e3))
        ctx = row["isl"] + row["osl"] // 2
    decode = _parts(lambda c: decode_step_time(spec, cluster, layout, w, kv, sequences=seqs, context=ctx,
                                               calibration=c))
    out = {"decode": dataclasses.replace(decode, layers=spec.num_layers)}
    if row["kind"] in ("itl", "ttft"):
        pre = _parts(lambda c: prefill_time(spec, cluster, layout, w, tokens=row["isl"], calibration=c))
        out["prefill"] = dataclasses.replace(pre, layers=spec.num_layers)
    return out


def predict(row: dict[str, Any], parts: dict[str, Parts], c: ServeCalibration) -> float:
    """The row's predicted value in its measured unit (seconds; tokens/s for saturation rows)."""
    decode = parts["decode"].seconds(c)
    if row["kind"] == "decode":
        return decode
    if row["kind"] == "saturation":
        return row["sequences"] / decode
    prefill = parts["prefill"].seconds(c)
    if row["kind"] == "ttft":
        return prefill + decode
    busy = row["qps"] * prefill
    return decode / (1.0 - busy) if busy < 1 else math.inf


def ratio(row: dict[str, Any], pred: float) -> float:
    """measured / predicted for times; predicted / measured for throughput (so > 1 is always 'slower than
    predicted')."""
    return pred / row["measured"] if row["kind"] == "saturation" else row["measured"] / pred


def _loss(rows: Sequence[dict[str, Any]], parts: Sequence[dict[str, Parts]], c: ServeCalibration) -> float:
    return sum(math.log(ratio(r, predict(r, p, c))) ** 2 for r, p in zip(rows, parts, strict=True))


def fit(rows: Sequence[dict[str, Any]], parts: Sequence[dict[str, Parts]]) -> ServeCalibration:
    """Least squares on log ratio over ``rows``: a coarse grid, then coordinate refinement."""
    grids = {"hbm_efficiency": np.linspace(0.5, 1.0, 11), "layer_overhead_s": np.linspace(0.0, 150e-6, 16),
             "collective_latency_scale": np.linspace(0.0, 3.0, 13), "matmul_efficiency": np.linspace(0.2, 0.9, 8)}
    best, best_loss = SERVE_CALIBRATION, math.inf
    for h in grids["hbm_efficiency"]:
        for o in grids["layer_overhead_s"]:
            for s in grids["collective_latency_scale"]:
                for m in grids["matmul_efficiency"]:
                    c = dataclasses.replace(_UNIT, hbm_efficiency=float(h), layer_overhead_s=float(o),
                                            collective_latency_scale=float(s), matmul_efficiency=float(m))
                    loss = _loss(rows, parts, c)
                    if loss < best_loss:
                        best, best_loss = c, loss
    bounds = {"hbm_efficiency": (0.3, 1.0), "layer_overhead_s": (0.0, 2e-4), "collective_latency_scale": (0.0, 10.0),
              "matmul_efficiency": (0.1, 1.0)}
    steps = {"hbm_efficiency": 0.025, "layer_overhead_s": 2.5e-6, "collective_latency_scale": 0.125,
             "matmul_efficiency": 0.05}
    for _ in range(8):
        for name in steps:
            for sign in (-1, 1):
                while True:
                    lo, hi = bounds[name]
                    value = min(hi, max(lo, getattr(best, name) + sign * steps[name]))
                    trial = dataclasses.replace(best, **{name: value})
                    loss = _loss(rows, parts, trial)
                    if loss >= best_loss - 1e-12:
                        break
                    best, best_loss = trial, loss
            steps[name] /= 2
    return best


def _table(rows: Sequence[dict[str, Any]], ratios: Sequence[float], markdown: bool) -> None:
    head = ("row", "split", "kind", "published", "predicted", "measured/pred")
    lines = []
    for r, q in zip(rows, ratios, strict=True):
        pred = r["measured"] / q if r["kind"] != "saturation" else r["measured"] * q
        shown = f"{pred:,.0f} tok/s" if r["kind"] == "saturation" else f"{pred * 1e3:.2f} ms"
        lines.append((r["key"], r["split"], r["kind"], r["published"], shown, f"{q:.2f}"))
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|---|---|---|---|---:|---:|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="serving: predicted vs published (ratio measured / predicted; saturation: predicted / "
                        "measured)")
    for col in head:
        table.add_column(col, justify="right" if col in ("predicted", "measured/pred") else "left")
    for line in lines:
        table.add_row(*line)
    Console(width=160).print(table)


def summary(rows: Sequence[dict[str, Any]], ratios: Sequence[float]) -> dict[str, Any]:
    """The span over fitted and held-out rows and the held-out median error."""
    counted = [q for r, q in zip(rows, ratios, strict=True) if r["split"] in ("fit", "held_out")]
    held = [q for r, q in zip(rows, ratios, strict=True) if r["split"] == "held_out"]
    fitted = [q for r, q in zip(rows, ratios, strict=True) if r["split"] == "fit"]
    return {"low": min(counted), "high": max(counted), "fitted_rows": len(fitted), "held_out_rows": len(held),
            "held_out_error": statistics.median(abs(q - 1) for q in held),
            "fit_error": statistics.median(abs(q - 1) for q in fitted),
            "held_out_span": (min(held), max(held))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="refit the coefficients on the 'fit' rows and print them")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    doc = json.loads(DATA.read_text())
    rows = doc["rows"]
    specs = models()
    parts = [row_parts(r, specs) for r in rows]
    cal = SERVE_CALIBRATION
    if args.fit:
        fitted = [(r, p) for r, p in zip(rows, parts, strict=True) if r["split"] == "fit"]
        cal = fit([r for r, _ in fitted], [p for _, p in fitted])
    ratios = [ratio(r, predict(r, p, cal)) for r, p in zip(rows, parts, strict=True)]
    _table(rows, ratios, args.markdown)
    s = summary(rows, ratios)
    print(f"coefficients: hbm_efficiency={cal.hbm_efficiency:.3f} layer_overhead_s={cal.layer_overhead_s:.3g} "
          f"collective_latency_scale={cal.collective_latency_scale:.3f} matmul_efficiency={cal.matmul_efficiency:.3f}")
    print(f"measured/predicted over {s['fitted_rows']} fitted + {s['held_out_rows']} held-out rows: "
          f"{s['low']:.2f}-{s['high']:.2f}; median |error| fitted {s['fit_error']:.1%}, held out "
          f"{s['held_out_error']:.1%} (held-out span {s['held_out_span'][0]:.2f}-{s['held_out_span'][1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
