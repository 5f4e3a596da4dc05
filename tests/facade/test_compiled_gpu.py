"""GPU clusters compile with no GPU: meshplan's shipped target descriptions and the jax CUDA plugin.

These compile in this process (the suite runs with ``JAX_PLATFORMS=cpu``, which the plugin needs when there
is no GPU) and skip, saying so, where the plugin (``meshplan[gpu]``) is not installed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshplan
from meshplan.facade.verify._compilers import compiler_version, cuda_plugin_problem
from meshplan.facade.verify._gpu_targets import GPU_TARGETS_DIR, gpu_target_config, known_gpu_targets
from meshplan.pure.cluster import Cluster, DEVICE_SPECS, DeviceSpec
from meshplan.facade.verify._gpu_targets import ESTIMATE_ONLY

needs_plugin = pytest.mark.skipif(cuda_plugin_problem() is not None,
                                  reason=f"deviceless GPU compiles need the jax CUDA plugin: {cuda_plugin_problem()}")


def test_every_catalogue_gpu_has_a_target_description_with_its_sources_or_says_why_not():
    gpus = sorted(name for name, d in DEVICE_SPECS.items() if d.ici_scope != "slice")
    assert sorted([*known_gpu_targets(), *ESTIMATE_ONLY]) == gpus
    assert not set(known_gpu_targets()) & set(ESTIMATE_ONLY)
    gpus = list(known_gpu_targets())
    for name in gpus:
        text = gpu_target_config(DEVICE_SPECS[name])
        assert text.startswith("# XLA GpuTargetConfigProto") and "datasheet" in text, name
        assert 'platform_name: "CUDA"' in text and "device_memory_size:" in text
        kind = text.split('device_description_str: "')[1].split('"')[0]
        assert DEVICE_SPECS[name].matches_kind(kind), (name, kind)


def test_an_unknown_gpu_names_the_known_ones_and_how_to_add_one():
    mine = Cluster(DeviceSpec("B300", hbm_bytes=288 * 10**9, intra_bandwidth=900e9, inter_bandwidth=100e9,
                              intra_latency_s=3e-6, inter_latency_s=1e-5), num_nodes=1, devices_per_node=8)
    with pytest.raises(meshplan.ClusterError, match=r"no GPU target description for 'B300'; meshplan ships "
                                                    r"\['A100-80GB', 'B200', 'H100', 'H200'\]\. Add one: copy") as info:
        meshplan.gpu_topology_mesh(mine, ("fsdp",), (8,))
    assert str(GPU_TARGETS_DIR) in str(info.value) and isinstance(info.value, ValueError)
    with pytest.raises(meshplan.ClusterError, match="no GPU target description for '../H100'"):
        gpu_target_config("../H100")


@needs_plugin
@pytest.mark.parametrize(("cluster", "names", "sizes"), [("1x8xH100", ("fsdp",), (8,)),
                                                         ("2x8xA100-80GB", ("dp", "fsdp"), (2, 8)),
                                                         ("1x8xB200", ("fsdp",), (8,))])
def test_a_gpu_cluster_compiles_with_no_gpu(cluster, names, sizes):
    mesh = meshplan.gpu_topology_mesh(cluster, names, sizes)
    assert mesh.devices.shape == sizes
    kind = mesh.devices.flat[0].device_kind
    assert meshplan.parse_cluster(cluster).device.matches_kind(kind)
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P(names[-1])))
    mem = meshplan.compiled_memory(jax.jit(lambda a: a @ a.T, donate_argnums=0), x, mesh=mesh)
    assert mem.platform == "gpu" and mem.num_devices == 16 // (2 if cluster.startswith("1x") else 1)
    shard = 1024 * 1024 * 4 // sizes[-1]
    assert mem.argument_bytes == shard and mem.alias_bytes == shard
    # The sharded matmul gathers its operand: the whole f32[1024, 1024] is a temporary on every GPU.
    assert mem.temp_bytes >= 1024 * 1024 * 4 and mem.peak_bytes >= mem.temp_bytes
    assert compiler_version("gpu").startswith("XLA:GPU (jax-cuda12-plugin 0.")


@needs_plugin
def test_xla_gpu_compiles_a_step_too_big_for_the_gpu_so_the_peak_must_be_compared():
    mesh = meshplan.gpu_topology_mesh("1x8xH100", ("fsdp",), (8,))
    big = jax.ShapeDtypeStruct((8, 2**30 * 3), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))  # 12 GiB each
    mem = meshplan.compiled_memory(jax.jit(lambda a: (a * 2, a + 1, a - 1, a / 2, a * a, a + a, a ** 3)), big,
                                   top_buffers=0)
    assert mem.peak_bytes > 80 * 2**30  # no CompiledOutOfMemoryError, as on TPU: the caller compares


@needs_plugin
def test_a_given_target_config_replaces_the_shipped_one():
    text = gpu_target_config("H100").replace("NVIDIA H100 80GB HBM3", "NVIDIA H100 test description")
    mesh = meshplan.gpu_topology_mesh("1x8xH100", ("fsdp",), (8,), target_config=text)
    assert mesh.devices.flat[0].device_kind == "NVIDIA H100 test description"


@needs_plugin
def test_flash_attention_on_a_gpu_target_is_cudnns_fused_kernel():
    import dataclasses

    from meshplan.facade.verify._reference import ReferenceConfig
    from meshplan.pure import get_preset

    tiny = dataclasses.replace(get_preset("gpt2").spec, num_layers=1, num_params=None)
    mesh = meshplan.gpu_topology_mesh("1x8xH100", ("dp", "tp"), (4, 2))
    ref = meshplan.reference_step(tiny, mesh, batch=8, seq=128, config=ReferenceConfig(attention="flash"))
    text = ref.lower().compile().as_text()
    assert "__cudnn$fmha" in text  # forward and backward run cuDNN's flash attention, no s x s scores
