"""The pipelined reference step's compiled memory against the stage model (meshplan.pure.cost._pipeline).

Run: ``python benchmarks/bench_pipeline_memory.py [--markdown]`` (needs libtpu: the step is compiled ahead of
time for a TPU v5e-8 topology on this machine; nothing runs on a TPU).

For each schedule (``pp`` stages over a ``pp x dp`` mesh, ``m`` micro-batches, ``v`` circular repeats) the
script compiles :func:`meshplan.facade._pipeline_step.pipeline_step` and compares XLA's figures with
:func:`meshplan.pure.cost.plan_stages`:

- **state**: the fullest stage's parameters and Adam moments per device (``state_factor`` 5: bf16 weights and
  two fp32 moments), plus what the step keeps outside the pipeline on every stage (embedding, final norm and
  head, replicated as MaxText keeps them) and the tokens, against XLA's argument bytes;
- **saved activations**: ``in_flight x layers x`` one micro-batch's layer input per device (remat ``full``
  saves only each layer's input): the part the schedule multiplies. XLA's temp bytes hold that and every
  working buffer (fp32 attention scores, logits, gradients, the update), so they are not comparable alone;
- **peak**: what :func:`meshplan.pure.search.search_pipelines` charges a stage: the calibrated step peak of
  the stage's layers with one micro-batch (:func:`meshplan.pure.cost.step_memory`) plus ``in_flight - 1``
  more micro-batches of saved layer inputs, against XLA's peak.
"""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

from meshplan.facade._compiled import compiled_memory, libtpu_available, tpu_topology_mesh
from meshplan.facade._pipeline_step import pipeline_step
from meshplan.pure.cost import TrainingRecipe, in_flight, layer_dims, plan_stages, step_memory
from meshplan.pure.presets import MODEL_SPECS

MODEL = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-1k", num_layers=8, hidden_size=1024,
                            num_heads=8, num_kv_heads=8, head_dim=128, intermediate_size=4096, vocab_size=1024,
                            num_params=None)
CLUSTER, BATCH, SEQ = "v5e-8", 32, 2048
CASES = ((4, 2, 4, 1), (4, 2, 8, 1), (4, 2, 4, 2))  # (pp, dp, m, v); each compiles in ~2 min on 2 cores


def _bytes(tree: object) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(pp: int, dp: int, m: int, v: int) -> dict[str, float]:
    """Compile one schedule and return XLA's and the stage model's figures (bytes per device)."""
    step = pipeline_step(MODEL, tpu_topology_mesh(CLUSTER, ("pp", "dp"), (pp, dp)), batch=BATCH, seq=SEQ,
                         micro_batches=m, repeats=v)
    mem = compiled_memory(step.fn, *step.args, top_buffers=0)
    params = step.args[0][0]
    layers = params["model"]["layers"]["dense"]
    layer_bytes = _bytes(layers) // MODEL.num_layers
    outside = _bytes(params) - _bytes(layers)  # embedding, final norm, head: on every stage
    act = (BATCH // m // dp) * SEQ * MODEL.hidden_size * 2  # one micro-batch's layer input, bf16, per device
    plan = plan_stages(MODEL.num_layers, pp, micro_batches=m, layer_param_bytes=layer_bytes, embed_param_bytes=0,
                       head_param_bytes=0, layer_activation_bytes=act, state_factor=5.0, schedule="circular",
                       virtual=v)
    tokens = 2 * (BATCH // dp) * SEQ * 4
    state = plan.state_bytes[plan.fullest] + 5 * outside + tokens + 4  # + Adam's int32 step count
    # The search's charge for this stage: its layers' calibrated peak at one micro-batch, plus the
    # schedule's other micro-batches of saved layer inputs.
    stage = dataclasses.replace(MODEL, num_layers=plan.layers[plan.fullest])
    weights = plan.param_bytes[plan.fullest] + outside
    recipe = TrainingRecipe(remat="full", attention="dot_product", backend="tpu", device="v5e", micro_batches=m)
    sm = step_memory(layer_dims(stage), {"dp": dp}, recipe, batch=BATCH, seq=SEQ, params=weights, grads=weights,
                     optimizer=4 * weights)
    flight = max(in_flight(pp, m, schedule="circular", virtual=v))
    planner = sm.peak + (flight - 1) * dict(sm.parts)["saved"]
    return {"pp": pp, "dp": dp, "m": m, "v": v, "xla_args": mem.argument_bytes, "model_state": state,
            "xla_temp": mem.temp_bytes, "model_acts": plan.activation_bytes[plan.fullest],
            "xla_peak": mem.peak_bytes, "planner_peak": planner, "bubble": plan.bubble,
            "platform": f"{mem.device_kind}"}


def main() -> None:
    if not libtpu_available():
        sys.exit("libtpu is not installed: this benchmark compiles for a TPU topology (pip install 'meshplan[tpu]').")
    rows = [measure(*case) for case in CASES]
    cols = ("pp x dp", "m", "v", "bubble", "XLA args", "model state", "args/model", "XLA temp",
            "model saved acts", "XLA peak", "planner peak", "peak/planner")
    print(f"pipelined reference step ({MODEL.name}: {MODEL.num_layers} layers, width {MODEL.hidden_size}; batch "
          f"{BATCH} x seq {SEQ}; remat full, adamw, bf16) compiled for {CLUSTER} ({rows[0]['platform']}), "
          f"jax {jax.__version__}\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    mib = 2.0**20
    for r in rows:
        print(f"| {r['pp']} x {r['dp']} | {r['m']} | {r['v']} | {r['bubble']:.1%} | {r['xla_args'] / mib:.1f} MiB | "
              f"{r['model_state'] / mib:.1f} MiB | {r['xla_args'] / r['model_state']:.3f} | "
              f"{r['xla_temp'] / mib:.1f} MiB | {r['model_acts'] / mib:.1f} MiB | {r['xla_peak'] / mib:.1f} MiB | "
              f"{r['planner_peak'] / mib:.1f} MiB | {r['xla_peak'] / r['planner_peak']:.2f} |")


if __name__ == "__main__":
    main()
