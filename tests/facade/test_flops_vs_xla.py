"""The analytic step FLOPs agree with XLA's count of the compiled reference step (within 3%).

XLA's ``cost_analysis()['flops']`` of an SPMD program is per device (the
partitioned module one device runs) and counts each loop body once, so the
reference steps here are unrolled (remat with ``prevent_cse=True``). XLA also
counts elementwise ops (norms, softmax, GELU, the optimizer update): 1-4% of
the step at these sizes, in ``StepFlops.elementwise``. The grid over families,
meshes and remat policies is ``benchmarks/bench_flops.py`` (``--tpu CLUSTER`` for XLA:TPU).
The matmul part is also held to the ``dot`` FLOPs read from the compiled HLO (the benchmark's
``matmul_flops``), which the elementwise term cannot blur.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import TPU_WINDOWED_EINSUM_OFF
from meshplan.facade.verify._reference import ReferenceConfig, reference_step
from meshplan.pure.presets import MODEL_SPECS, MLADims
from meshplan.pure.cost._flops import step_flops

_SMALL = dict(num_layers=1, hidden_size=512, num_heads=4, head_dim=128, intermediate_size=1536, vocab_size=1024,
              num_params=None)
CASES = [
    # GPT-2 with tp: LayerNorms, biases and GELU, the residual stream's elementwise work repeated on the tp
    # shards (3.5% under XLA when only matmuls were counted); full remat reruns the forward.
    (dataclasses.replace(MODEL_SPECS["gpt2"], name="gpt2-small", num_kv_heads=4, max_position_embeddings=256,
                         **{**_SMALL, "intermediate_size": 2048}),
     ((2, 4), ("fsdp", "tp")), "full"),
    # Routed experts with capacity-based dispatch: top-k work plus padding and dispatch/combine einsums.
    (dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="mixtral-small", num_kv_heads=4, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=768, **_SMALL),
     ((8,), ("fsdp",)), "none"),
    # K/V split gcd(tp, 2) = 2 of tp=4 ways: repeated on the tp shards in the forward, the recompute and the
    # input gradient, but not the weight gradient (XLA splits it: both its operands are whole on each shard).
    # Counting the weight gradient repeated too read 1.9% over the HLO's matmuls.
    (dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-small", num_kv_heads=2, **_SMALL),
     ((2, 4), ("fsdp", "tp")), "full"),
    # MLA's down projections (q_a, kv_a), whole on every tp shard: with fsdp the only batch axis and fewer
    # tokens per batch shard (2 x 128 / 2 = 128) than hidden (256), XLA's partitioner splits their forward
    # over the 4 tp shards (slices the input, all-reduces partial sums) instead of repeating it
    # (tp_replicated_splits). Counting it repeated read 3-7% over the HLO's matmuls.
    (dataclasses.replace(MODEL_SPECS["deepseek-v3"], name="mla-small", num_kv_heads=4, num_dense_layers=1,
                         mla=MLADims(q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
                                     v_head_dim=32),
                         **{**_SMALL, "hidden_size": 256, "head_dim": 64, "intermediate_size": 512, "vocab_size": 256}),
     ((2, 4), ("fsdp", "tp")), "none", 2),
]


def _matmul_flops(hlo: str) -> float:
    """``benchmarks/bench_flops.py``'s HLO matmul count (dots; XLA:TPU's convolutions)."""
    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "bench_flops.py"
    spec = importlib.util.spec_from_file_location("bench_flops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.matmul_flops(hlo))


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.parametrize("spec, mesh_shape, remat, batch", [c if len(c) == 4 else (*c, 8) for c in CASES],
                         ids=["gpt2-fsdp2-tp4-full", "mixtral-fsdp8-none", "llama-gqa-fsdp2-tp4-full",
                              "mla-fsdp2-tp4-none-split"])
def test_flops_match_xla_cost_analysis(spec, mesh_shape, remat, batch):
    shape, names = mesh_shape
    mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
    seq = 128
    ref = reference_step(spec, mesh, batch=batch, seq=seq,
                         config=ReferenceConfig(remat=remat, attention="plain", scan_layers=False))
    compiled = ref.lower().compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = step_flops(spec, dict(zip(names, shape)), batch=batch, seq=seq, remat=remat, attention="plain")
    assert flops.per_device / cost["flops"] == pytest.approx(1.0, abs=0.03)
    # The matmuls alone fall short of XLA's count by about the elementwise term, which is no model FLOP,
    # and are the HLO's own dot FLOPs (within 0.5%).
    matmuls = flops.per_device - flops.elementwise
    assert matmuls < cost["flops"] * 1.005 and flops.elementwise > 0.005 * cost["flops"]
    assert matmuls / _matmul_flops(compiled.as_text()) == pytest.approx(1.0, abs=0.005)


_TPU_CASE = """
import dataclasses, json, sys
import meshplan
from meshplan.facade.verify._reference import ReferenceConfig, reference_step
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.cost._flops import step_flops
spec = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-small", num_layers=1, hidden_size=512, num_heads=4,
                           num_kv_heads=2, head_dim=128, intermediate_size=1536, vocab_size=1024, num_params=None)
mesh = meshplan.tpu_topology_mesh("v5e-8", ("fsdp", "tp"), (2, 4))
ref = reference_step(spec, mesh, batch=8, seq=128, config=ReferenceConfig(remat="full", attention="plain",
                                                                            scan_layers=False))
compiled = ref.lower().compile()
cost = compiled.cost_analysis()
cost = cost[0] if isinstance(cost, list) else cost
open(sys.argv[1], "w").write(compiled.as_text())
flops = step_flops(spec, {"fsdp": 2, "tp": 4}, batch=8, seq=128, remat="full", attention="plain")
print(json.dumps([flops.per_device, flops.elementwise, cost["flops"]]))
"""


@pytest.mark.skipif(not libtpu_available(), reason="libtpu is not installed (pip install 'meshplan[tpu]'): no TPU AOT")
def test_flops_match_xla_tpu_cost_analysis(tmp_path):
    # XLA:TPU compiled ahead of time for a v5e-8 slice, in its own process: the windowed-einsum flags
    # (which run a matmul as a loop that cost_analysis counts once) must be set before libtpu starts.
    # Llama's 2 KV heads under tp=4: the matmuls, which XLA:TPU writes as convolutions, are the model's
    # exactly (K/V repeated on 2 shards, their weight gradient split over fsdp=2), as on XLA:CPU.
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1", LIBTPU_INIT_ARGS=TPU_WINDOWED_EINSUM_OFF)
    hlo = tmp_path / "step.hlo"
    out = subprocess.run([sys.executable, "-c", _TPU_CASE, str(hlo)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    analytic, elementwise, xla = json.loads(out.stdout.strip().splitlines()[-1])
    assert analytic / xla == pytest.approx(1.0, abs=0.03)
    assert (analytic - elementwise) / _matmul_flops(hlo.read_text()) == pytest.approx(1.0, abs=0.005)
