"""The pipelined reference step's compiled memory against the stage model (meshplan.pure.cost._pipeline).

Run: ``python benchmarks/bench_pipeline_memory.py [--markdown] [--target tpu|gpu|both]`` (``tpu`` needs
libtpu: the step is compiled ahead of time for a TPU v5e-8 topology; ``gpu`` needs the CUDA plugin, run with
``JAX_PLATFORMS=cpu``: compiled ahead of time for a 1x8xH100 node with no GPU present; nothing runs on either).

For each schedule (``pp`` stages over a ``pp x dp`` mesh, ``m`` micro-batches, ``v`` circular repeats) the
script compiles :func:`meshplan.facade.verify._pipeline_step.pipeline_step` and compares XLA's figures with the model:

- **state**: :func:`meshplan.pure.cost.plan_stages`' fullest stage's parameters and Adam moments per device
  (``state_factor`` 5: bf16 weights and two fp32 moments), plus what the step keeps outside the pipeline on
  every stage (embedding, final norm and head, replicated as MaxText keeps them) and the tokens, against XLA's
  argument bytes;
- **kept** (MiB): what :func:`meshplan.pure.cost.schedule_memory` says the circular schedule keeps: every
  loop iteration's saved stage inputs (``v*m + pp - 1`` iterations, the bubble's included), the backward's
  copy of the current one (with ``v > 1`` its weight slice too: "current"), three whole-batch buffers and two
  of the ring ("buffers"), and the stage's weights as residuals, one slice per iteration with ``v > 1``, one
  copy with ``v = 1``;
- **peak**: what :func:`meshplan.pure.search.search_pipelines` charges a stage: the calibrated step peak of
  the stage's layers with one micro-batch (:func:`meshplan.pure.cost.step_memory`, that compiler's
  coefficients) plus ``kept`` less the one micro-batch's saved inputs it already counts and its fp32 gradient
  accumulator (the circular loop accumulates in bf16), against XLA's peak (MiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

from meshplan.facade.verify._compiled import compiled_memory
from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import gpu_topology_mesh, tpu_topology_mesh
from meshplan.facade.verify._pipeline_step import pipeline_step
from meshplan.pure.cost import TrainingRecipe, layer_dims, plan_stages, schedule_memory, step_memory
from meshplan.pure.presets import MODEL_SPECS

MODEL = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-1k", num_layers=8, hidden_size=1024,
                            num_heads=8, num_kv_heads=8, head_dim=128, intermediate_size=4096, vocab_size=1024,
                            num_params=None)
BATCH, SEQ = 32, 2048
TARGETS = {"tpu": ("v5e-8", TrainingRecipe(remat="full", attention="dot_product", backend="tpu", device="v5e")),
           "gpu": ("1x8xH100", TrainingRecipe(remat="full", attention="dot_product", backend="gpu", device="H100"))}
# (pp, dp, m, v); a TPU compile takes ~2 min on 2 cores, a GPU one ~10 s. The model's terms were read off the
# buffers of the first three; the last two were held out.
CASES = ((4, 2, 4, 1), (4, 2, 8, 1), (4, 2, 4, 2), (2, 4, 4, 2), (8, 1, 8, 1))


def _bytes(tree: object) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(target: str, pp: int, dp: int, m: int, v: int) -> dict[str, float]:
    """Compile one schedule for ``target`` and return XLA's and the stage model's figures (bytes per device)."""
    cluster, base = TARGETS[target]
    mesh = (tpu_topology_mesh if target == "tpu" else gpu_topology_mesh)(cluster, ("pp", "dp"), (pp, dp))
    step = pipeline_step(MODEL, mesh, batch=BATCH, seq=SEQ, micro_batches=m, repeats=v)
    mem = compiled_memory(step.fn, *step.args, top_buffers=0)
    params = step.args[0][0]
    layers = params["model"]["layers"]["dense"]
    layer_bytes = _bytes(layers) // MODEL.num_layers
    outside = _bytes(params) - _bytes(layers)  # embedding, final norm, head: on every stage
    act = (BATCH // m // dp) * SEQ * MODEL.hidden_size * 2  # one micro-batch's stage input, bf16, per device
    plan = plan_stages(MODEL.num_layers, pp, micro_batches=m, layer_param_bytes=layer_bytes, embed_param_bytes=0,
                       head_param_bytes=0, layer_activation_bytes=act, state_factor=5.0, schedule="circular",
                       virtual=v)
    tokens = 2 * (BATCH // dp) * SEQ * 4
    state = plan.state_bytes[plan.fullest] + 5 * outside + tokens + 4  # + Adam's int32 step count
    # The search's charge for this stage: its layers' calibrated peak at one micro-batch, plus what the
    # schedule keeps besides, less the fp32 gradient accumulator the circular loop does not have.
    stage = dataclasses.replace(MODEL, num_layers=plan.layers[plan.fullest])
    weights = plan.param_bytes[plan.fullest] + outside
    recipe = dataclasses.replace(base, micro_batches=m)
    sm = step_memory(layer_dims(stage), {"dp": dp}, recipe, batch=BATCH, seq=SEQ, params=weights, grads=weights,
                     optimizer=4 * weights)
    parts = dict(sm.parts)
    kept = schedule_memory(pp, m, saved_bytes=parts["saved"], input_bytes=act,
                           weight_bytes=plan.param_bytes[plan.fullest], schedule="circular", virtual=v)[plan.fullest]
    phase = max(sm.phases, key=lambda p: p[1])[0]
    accum = parts["accumulator"] if phase in ("backward", "update") else 0
    # The head and loss run once after the pipeline: the whole local batch's fp32 logits gradient stays live
    # through the backward (what search_pipelines charges a circular stage whose peak is the backward).
    logits = (BATCH // dp) * SEQ * MODEL.vocab_size * 4 if phase == "backward" else 0
    planner = sm.peak + kept.total - parts["saved"] - accum + logits
    return {"target": target, "pp": pp, "dp": dp, "m": m, "v": v, "xla_args": mem.argument_bytes,
            "model_state": state, "kept": kept, "xla_peak": mem.peak_bytes, "planner_peak": planner,
            "bubble": plan.bubble, "platform": f"{mem.device_kind}", "compile_s": mem.compile_seconds}


def full_size(top: int = 5) -> None:
    """The plan's own check at full size: the best circular layouts of llama3-70b on 8x8xH100 (batch 64 x 4096,
    the jax allocator's 75% budget) compiled for the cluster with no GPU, against search_pipelines' charge."""
    from meshplan.facade.verify._pipelines import verify_pipelines
    from meshplan.pure import search_meshes
    from meshplan.pure.search import search_pipelines

    result = search_meshes("llama3-70b", "8x8xH100", batch=64, seq=4096, headroom=0.25, top_k=3)
    found = search_pipelines("llama3-70b", "8x8xH100", batch=64, seq=4096, headroom=0.25, top_k=top,
                             schedules=("circular",))
    layouts = {(c.text, c.pipeline.text): c for c in found.candidates if c.pipeline}  # one per mesh and schedule
    checked = verify_pipelines(list(layouts.values()), result, top=len(layouts), stream=sys.stderr)
    print(f"llama3-70b on 8x8xH100, batch 64 x 4096, circular layouts; {checked.compiler}\n")
    print("| stage mesh | schedule | estimate | XLA peak | peak/estimate |")
    print("|---|---|---:|---:|---:|")
    for (mesh, text), row in zip(layouts, checked.rows, strict=True):
        peak = row.peak_bytes
        print(f"| {mesh} | {text.split(' bubble')[0]} | {row.analytic_bytes / 2**30:.1f} GiB | "
              + (f"{peak / 2**30:.1f} GiB | {peak / row.analytic_bytes:.2f} |" if peak else f"{row.error} | - |"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="(the table is markdown either way)")
    parser.add_argument("--target", choices=("tpu", "gpu", "both"), default="tpu")
    parser.add_argument("--full-size", action="store_true",
                        help="the best circular layouts of llama3-70b on 8x8xH100, compiled with no GPU (needs "
                             "meshplan[gpu]; about 2 minutes)")
    args = parser.parse_args()
    if args.full_size:
        full_size()
        return
    targets = ("tpu", "gpu") if args.target == "both" else (args.target,)
    if "tpu" in targets and not libtpu_available():
        sys.exit("libtpu is not installed: the tpu target compiles for a TPU topology (pip install 'meshplan[tpu]').")
    rows = [measure(t, *case) for t in targets for case in CASES]
    cols = ("target", "pp x dp", "m", "v", "bubble", "XLA args", "model state", "saved inputs", "current",
            "buffers", "weight copies", "XLA peak", "model peak", "peak/model")
    print(f"pipelined reference step ({MODEL.name}: {MODEL.num_layers} layers, width {MODEL.hidden_size}; batch "
          f"{BATCH} x seq {SEQ}; remat full, adamw, bf16), jax {jax.__version__}\n")
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "|".join("---:" for _ in cols[1:]) + "|")
    mib = 2.0**20
    for r in rows:
        k = r["kept"]
        print(f"| {r['platform']} | {r['pp']} x {r['dp']} | {r['m']} | {r['v']} | {r['bubble']:.1%} | "
              f"{r['xla_args'] / mib:.1f} | {r['model_state'] / mib:.1f} | {k.saved / mib:.0f} | "
              f"{k.current / mib:.0f} | {k.buffers / mib:.0f} | {k.weights / mib:.0f} | {r['xla_peak'] / mib:.1f} | "
              f"{r['planner_peak'] / mib:.1f} | {r['xla_peak'] / r['planner_peak']:.2f} |")


if __name__ == "__main__":
    main()
