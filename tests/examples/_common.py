"""What the three training examples share: the model sizes, a CPU 'cluster', the data, the loop, the byte check."""

from collections.abc import Callable
from typing import Any

import jax

import meshplan

SPEC = meshplan.ModelSpec("tiny-lm", "llama", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=4, head_dim=16, intermediate_size=128)
"""The sizes the planner prices (heads bound tp, hidden/vocab/layers the activation memory)."""

TOKENS = jax.random.randint(jax.random.key(0), (8, 33), 0, SPEC.vocab_size)
"""One batch of 8 sequences of 32 next-token pairs, learnt by heart in 20 steps."""


def cpu_cluster(hbm_bytes: int = 2**20) -> meshplan.Cluster:
    """One node of the 8 CPU test devices, NVLink-like made-up links; 1 MiB each, so replication does not fit."""
    device = meshplan.DeviceSpec("cpu-sim", hbm_bytes=hbm_bytes, intra_bandwidth=100e9, inter_bandwidth=10e9,
                                 intra_latency_s=5e-6, inter_latency_s=2e-5, devices_per_node=8)
    return meshplan.Cluster(device, num_nodes=1, devices_per_node=8)


def train(step: Callable[..., Any], params: Any, opt_state: Any, steps: int = 20) -> tuple[Any, Any, list[float]]:
    """``steps`` steps on :data:`TOKENS`; returns the final state and every loss."""
    losses = []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, TOKENS[:, :-1], TOKENS[:, 1:])
        losses.append(float(loss))
    return params, opt_state, losses


def live_bytes(tree: Any, mesh: jax.sharding.Mesh) -> tuple[int, ...]:
    """Bytes each device of ``mesh`` holds for ``tree`` (the sum of its addressable shards), in mesh order."""
    per = {d: 0 for d in mesh.devices.flat}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            per[shard.device] += shard.data.nbytes
    return tuple(per[d] for d in mesh.devices.flat)


def assert_planned_bytes(best: meshplan.MeshCandidate, layout: Any, params: Any, opt_state: Any,
                         mesh: jax.sharding.Mesh) -> None:
    """The planner's parameter and optimizer bytes are the live bytes, on every device."""
    est = meshplan.estimate_training_memory(params, layout.params, best.mesh_shape, opt_state=opt_state,
                                            opt_state_specs=layout.opt_state)
    assert est.params.per_device == live_bytes(params, mesh)
    assert est.opt_state.per_device == live_bytes(opt_state, mesh)
    # The search's own figures (fullest device): Adam as 2 fp32 copies, plus adamw's int32 step count here.
    assert best.memory.params == max(live_bytes(params, mesh))
    assert best.memory.optimizer + 4 == max(live_bytes(opt_state, mesh))
