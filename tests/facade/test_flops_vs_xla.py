"""The analytic step FLOPs agree with XLA's count of the compiled reference step (within 3%).

XLA's ``cost_analysis()['flops']`` of an SPMD program is per device (the
partitioned module one device runs) and counts each loop body once, so the
reference steps here are unrolled (remat with ``prevent_cse=True``). XLA also
counts elementwise ops that the analytic model leaves out (norms, softmax, the
optimizer update): with these sizes they are 1-3% of the step. The grid over
families, meshes and remat policies is ``benchmarks/bench_flops.py``.
"""

import dataclasses

import jax
import pytest

from meshplan.facade._reference import ReferenceConfig, reference_step
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.search._flops import step_flops

_SMALL = dict(num_layers=1, hidden_size=512, num_heads=4, head_dim=128, intermediate_size=1536, vocab_size=1024,
              num_params=None)
CASES = [
    # GQA with tp not dividing the KV heads; full remat reruns the forward.
    (dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-small", num_kv_heads=2, **_SMALL),
     ((2, 4), ("fsdp", "tp")), "full"),
    # Routed experts with capacity-based dispatch: top-k work plus padding and dispatch/combine einsums.
    (dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="mixtral-small", num_kv_heads=4, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=768, **_SMALL),
     ((8,), ("fsdp",)), "none"),
]


@pytest.mark.parametrize("spec, mesh_shape, remat", CASES, ids=["llama-fsdp2-tp4-full", "mixtral-fsdp8-none"])
def test_flops_match_xla_cost_analysis(spec, mesh_shape, remat):
    shape, names = mesh_shape
    mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
    batch, seq = 8, 128
    ref = reference_step(spec, mesh, batch=batch, seq=seq,
                         config=ReferenceConfig(remat=remat, attention="plain", scan_layers=False))
    cost = ref.lower().compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    analytic = step_flops(spec, dict(zip(names, shape)), batch=batch, seq=seq, remat=remat,
                          attention="plain").per_device
    assert analytic / cost["flops"] == pytest.approx(1.0, abs=0.03)
    # Matmuls only: XLA's count (elementwise included) is never the smaller one by more than rounding.
    assert analytic <= cost["flops"] * 1.005
