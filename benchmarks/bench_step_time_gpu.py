"""Predicted against measured step time on one GPU: the compute half of the step-time model.

Run (on a machine with one NVIDIA GPU): ``python benchmarks/bench_step_time_gpu.py [--jsonl FILE]``.

For every case (model, batch x seq, remat, attention) it

- asks the search for the one-device mesh (``search_meshes(..., fixed={"fsdp": 1})`` on
  ``1x1x<the local GPU>``, H200 or H100): the *predicted* step is the candidate's ``step.step_s`` (FLOPs at the device's
  peak bf16 FLOP/s times the default efficiency; one device, so no communication);
- builds the reference train step (:func:`meshplan.facade.verify._reference.reference_step`: scanned
  layers, donated state, AdamW with fp32 state, bf16 weights and compute) and runs it on zeros:
  the *measured* step is the mean of 5 steps after one warm-up, in the same process;
- prints predicted, measured, their ratio and the efficiency the measurement implies
  (the model's executed FLOPs / (measured seconds x peak)).

The efficiency is the documented default (:func:`meshplan.pure.cost._flops.default_efficiency`),
whose GPU curve was fit on the rows this script recorded (``benchmarks/data/step_time_h200.jsonl``;
``benchmarks/research/bench_efficiency_model.py``): on those rows the ratio is a residual of
the fit, not a check; new rows (other models, another GPU) are checks.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
from bench_compiled import scaled  # the compiled-memory table's scaled-down presets

from meshplan.facade.verify._reference import ReferenceConfig, reference_step
from meshplan.pure import search_meshes
from meshplan.pure.cluster import DEVICE_SPECS
from meshplan.pure.cost._recipe import TrainingRecipe



def local_gpu() -> str:
    """The catalogue name of this process's GPU (the step runs on it; the prediction is for it)."""
    kind = jax.devices()[0].device_kind
    return "H200" if "H200" in kind else "H100" if "H100" in kind else "H200"  # (H200: the rows recorded so far)

# (model, layers or None for full size, batch, seq, remat, attention)
CASES: tuple[tuple[str, int | None, int, int, str, str], ...] = (
    ("llama3-8b", 16, 2, 4096, "full", "dot_product"),
    ("llama3-8b", 8, 8, 2048, "full", "dot_product"),
    ("llama3-8b", 4, 8, 2048, "none", "dot_product"),
    ("llama3-8b", 8, 4, 2048, "none", "plain"),
    ("llama3-70b", 2, 4, 4096, "full", "dot_product"),
    ("mixtral-8x7b", 2, 4, 2048, "full", "dot_product"),
    ("gpt2", None, 16, 1024, "full", "dot_product"),
    ("gpt2", None, 16, 1024, "none", "plain"),
)


def measure(ref: Any, steps: int = 5) -> float:
    """Seconds per step of the compiled reference step on zeros (one warm-up, then ``steps``)."""
    state_abs, batch_abs = ref.args
    zeros = jax.jit(lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (state_abs, batch_abs)),
                    out_shardings=jax.tree.map(lambda s: s.sharding, (state_abs, batch_abs)))
    state, batch = zeros()
    compiled = ref.fn.lower(*ref.args).compile()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    return (time.perf_counter() - start) / steps


def run_case(name: str, layers: int | None, batch: int, seq: int, remat: str, attention: str) -> dict[str, Any]:
    spec = scaled(name, layers)
    fixed = {"fsdp": 1, "ep": 1} if spec.is_moe else {"fsdp": 1}
    recipe = TrainingRecipe(remat=remat, attention=attention, backend="gpu", residual_split=False)
    gpu = local_gpu()
    cand = search_meshes(spec, f"1x1x{gpu}", axes=tuple(fixed), fixed=fixed, batch=batch, seq=seq, recipe=recipe,
                         headroom=0.0, top_k=1, micro_batches=1).best
    assert cand.step is not None
    mesh = jax.make_mesh(tuple(fixed.values()), tuple(fixed), axis_types=(jax.sharding.AxisType.Auto,) * len(fixed))
    ref = reference_step(spec, mesh, batch=batch, seq=seq, plan=cand,
                         config=ReferenceConfig(remat=remat, attention=attention))
    measured = measure(ref)
    peak = DEVICE_SPECS[gpu].peak_bf16_flops
    return {"model": spec.name, "batch": batch, "seq": seq, "remat": remat, "attention": attention,
            "predicted_s": cand.step.step_s, "measured_s": measured, "ratio": cand.step.step_s / measured,
            "flops": cand.step.flops, "efficiency": cand.step.efficiency,
            "implied_efficiency": cand.step.flops / (measured * peak), "predicted_mfu": cand.step.mfu,
            "measured_mfu": cand.step.mfu * cand.step.step_s / measured, "device": str(jax.devices()[0].device_kind),
            "jax": jax.__version__}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jsonl", help="append each row as JSON to this file")
    parser.add_argument("--only", type=int, help="run only this case (index into CASES)")
    args = parser.parse_args(argv)
    cases = CASES if args.only is None else CASES[args.only: args.only + 1]
    print("| model | b x s | remat | attention | predicted s | measured s | predicted / measured | "
          "implied efficiency | measured MFU |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for case in cases:
        row = run_case(*case)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")
        print(f"| {row['model']} | {row['batch']}x{row['seq']} | {row['remat']} | {row['attention']} | "
              f"{row['predicted_s']:.3f} | {row['measured_s']:.3f} | {row['ratio']:.2f} | "
              f"{row['implied_efficiency']:.2f} | {row['measured_mfu']:.0%} |", flush=True)


if __name__ == "__main__":
    main()
