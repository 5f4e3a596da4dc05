"""meshplan.facade: binds the pure planners to live jax devices and meshes.

Each function here gathers facts from jax, calls :mod:`meshplan.pure`, and
applies the answer. Decisions live in pure. Every public facade name is listed
here; compiling ahead of time (reference steps, verification) is the room
:mod:`meshplan.facade.verify`, whose names are re-exported below.
"""

__all__: list[str] = []

# --- meshes ----------------------------------------------------------------------------------------
from meshplan.facade._config import MeshConfig
from meshplan.facade._cpu import cpu_context, create_cpu_mesh, force_cpu, parse_mesh_from_string
from meshplan.facade._mesh import (
    build_mesh,
    calculate_host_mesh_shape,
    clear_mesh_cache,
    create_mesh,
    mesh_cache_info,
)

__all__ += ["MeshConfig", "build_mesh", "calculate_host_mesh_shape", "clear_mesh_cache", "cpu_context",
            "create_cpu_mesh", "create_mesh", "force_cpu", "mesh_cache_info", "parse_mesh_from_string"]

# --- logical-axis rules (flax / MaxText names) -----------------------------------------------------
from meshplan.facade._logical import LogicalShardingRule, logical_names

__all__ += ["LogicalShardingRule", "logical_names"]

# --- sharding rules, analyzer, partition helper ----------------------------------------------------
from meshplan.facade._analyzer import ShardingAnalyzer, create_monitored_function

__all__ += ["ShardingAnalyzer", "create_monitored_function"]
from meshplan.facade._partition_helper import MeshPartitionHelper
from meshplan.facade._rules import (
    AutoShardingRule,
    CompositeShardingRule,
    MemoryConstrainedShardingRule,
    ShapeBasedShardingRule,
    ShardingRule,
)

__all__ += ["AutoShardingRule", "CompositeShardingRule", "MemoryConstrainedShardingRule", "MeshPartitionHelper",
            "ShapeBasedShardingRule", "ShardingRule"]

# --- multi-host --------------------------------------------------------------------------------------
from meshplan.facade._distributed import barrier_sync, host_batch_slice, host_mesh_shape

__all__ += ["barrier_sync", "host_batch_slice", "host_mesh_shape"]

# --- model config files (Hugging Face config.json, MaxText model yml) --------------------------------
from meshplan.facade._model_file import load_model

__all__ += ["load_model"]

# --- training state ------------------------------------------------------------------------------------
from meshplan.facade._place import place

__all__ += ["place"]

# --- compiling ahead of time: XLA's figures, reference steps, verification -----------------------------
from meshplan.facade.verify import (
    PipelineStep,
    ReferenceConfig,
    ReferenceStep,
    compiled_collectives,
    compiled_memory,
    gpu_topology_mesh,
    pipeline_step,
    reference_step,
    tpu_topology_mesh,
    verify_pipelines,
    verify_plan,
)

__all__ += ["PipelineStep", "ReferenceConfig", "ReferenceStep", "compiled_collectives", "compiled_memory",
            "gpu_topology_mesh", "pipeline_step", "reference_step", "tpu_topology_mesh", "verify_pipelines",
            "verify_plan"]
