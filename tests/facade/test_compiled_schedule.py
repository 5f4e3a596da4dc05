"""compiled_step_time: a step compiled live (XLA:CPU), deviceless (XLA:GPU) and ahead of time (XLA:TPU), its
schedule read and simulated, and the reader held to XLA's own count of the same program."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import gpu_topology_mesh, tpu_topology_mesh
from meshplan.facade.verify._compiled_schedule import compiled_step_time
from meshplan.facade.verify._compilers import cuda_plugin_problem
from meshplan.facade.verify._reference import ReferenceConfig, reference_step
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.xla._schedule import read_schedule

TINY = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=2, hidden_size=128, num_heads=4,
                           num_kv_heads=2, head_dim=32, intermediate_size=256, vocab_size=256, num_params=None)


def test_a_live_cpu_step_agrees_with_xla_cost_analysis_and_simulates() -> None:
    mesh = jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    ref = reference_step(TINY, mesh, batch=4, seq=32, config=ReferenceConfig(scan_layers=False))
    compiled = ref.fn.lower(*ref.args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    totals = read_schedule(compiled.as_text()).totals(loops_once=True)
    # The property that matters: the reader counts what XLA counts, on the same program.
    assert totals.flops + totals.other_flops == pytest.approx(cost["flops"], rel=0.01)
    t = compiled_step_time(compiled, cluster="1x8xH100")
    assert t.xla_flops == cost["flops"] and t.xla_optimal_seconds is None  # XLA:CPU gives no time
    assert t.platform == "cpu" and t.num_devices == 8 and t.domains_note == ""
    s = t.schedule
    assert s.step_s == pytest.approx(s.compute_s + s.exposed_s, rel=1e-12) and s.step_s > 0
    assert {c.link for c in s.collectives} == {"intra"}  # one node
    assert {c.kind for c in s.collectives} >= {"all-gather", "all-reduce"}
    assert s.approximations == ()


def test_a_function_is_compiled_and_bad_arguments_are_typed_errors() -> None:
    mesh = jax.make_mesh((8,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P("dp")))
    t = compiled_step_time(lambda a: (a @ a.T).sum(), x, cluster="1x8xH100")
    assert t.totals.flops == 2 * 8 * 64 * 64 and t.compile_seconds > 0
    with pytest.raises(MeshplanTypeError, match="cluster"):
        compiled_step_time(lambda a: a, x, cluster=8)
    with pytest.raises(MeshplanTypeError, match="roofline"):
        compiled_step_time(lambda a: a, x, cluster="1x8xH100", roofline=0.5)
    with pytest.raises(MeshplanTypeError, match="step"):
        compiled_step_time(3, x, cluster="1x8xH100")


@pytest.mark.skipif(cuda_plugin_problem() is not None, reason=f"needs the jax CUDA plugin: {cuda_plugin_problem()}")
def test_a_deviceless_gpu_step_crosses_nodes_only_on_its_data_parallel_axis() -> None:
    mesh = gpu_topology_mesh("2x8xH100", ("dp", "fsdp"), (2, 8))
    ref = reference_step(TINY, mesh, batch=16, seq=32)
    t = compiled_step_time(ref.fn, *ref.args, cluster="2x8xH100")
    assert t.platform == "gpu" and t.num_devices == 16 and t.xla_optimal_seconds is None
    links = {c.group_size: c.link for c in t.schedule.collectives if c.kind != "copy"}
    assert links.get(8) == "intra" and links.get(2) == "inter"


@pytest.mark.skipif(not libtpu_available(), reason="needs libtpu")
def test_a_tpu_step_is_no_faster_than_xla_own_floor() -> None:
    mesh = tpu_topology_mesh("v5e-4", ("fsdp",), (4,))
    ref = reference_step(TINY, mesh, batch=4, seq=64)
    t = compiled_step_time(ref.fn, *ref.args, cluster="v5e-4")
    assert t.platform == "tpu" and t.xla_optimal_seconds is not None and t.xla_optimal_seconds > 0
    assert t.step_s >= t.xla_optimal_seconds
