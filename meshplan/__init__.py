"""meshplan: plan JAX device meshes and parameter shardings.

Drop-in names for eformer's ``escale`` and loadax's mesh API, with a pure,
shape-only core (:mod:`meshplan.pure`) and a thin live-jax facade
(:mod:`meshplan.facade`).

The facade's names (``create_mesh``, ``AutoShardingRule``, ...) load on first
use, so ``import meshplan.pure`` (a tool that only plans) never imports the
facade, and ``import meshplan`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meshplan import errors
from meshplan.errors import *  # noqa: F401,F403
from meshplan.pure import (
    Cluster,
    DeviceSpec,
    HostBatchSlice,
    HybridMeshShape,
    LogicalRule,
    MemoryEstimate,
    MeshCandidate,
    MeshShape,
    ModelSpec,
    Plan,
    SearchResult,
    TrainingMemoryEstimate,
    estimate_memory,
    estimate_training_memory,
    get_preset,
    optimizer_state_specs,
    parse_cluster,
    plan_from_specs,
    plan_tree,
    search_meshes,
    validate_specs,
)
from meshplan.pure.report import export_plan, logical_export, maxtext_settings
from meshplan.pure.verify import PlanVerification, VerifyRow
from meshplan.pure.xla import CompiledMemory
from meshplan.pure.compare import CompareOption, Comparison

__version__ = "0.1.0"

# Facade name -> the module that defines it; read by __getattr__ on first use.
_FACADE = {
    "MeshConfig": "meshplan.facade._config",
    "cpu_context": "meshplan.facade._cpu", "create_cpu_mesh": "meshplan.facade._cpu",
    "force_cpu": "meshplan.facade._cpu", "parse_mesh_from_string": "meshplan.facade._cpu",
    "calculate_host_mesh_shape": "meshplan.facade._mesh", "clear_mesh_cache": "meshplan.facade._mesh",
    "create_mesh": "meshplan.facade._mesh", "mesh_cache_info": "meshplan.facade._mesh",
    "ShardingAnalyzer": "meshplan.facade._analyzer", "create_monitored_function": "meshplan.facade._analyzer",
    "MeshPartitionHelper": "meshplan.facade._partition_helper",
    "AutoShardingRule": "meshplan.facade._rules", "CompositeShardingRule": "meshplan.facade._rules",
    "MemoryConstrainedShardingRule": "meshplan.facade._rules", "ShapeBasedShardingRule": "meshplan.facade._rules",
    "ShardingRule": "meshplan.facade._rules",
    "LogicalShardingRule": "meshplan.facade._logical", "logical_names": "meshplan.facade._logical",
    "barrier_sync": "meshplan.facade._distributed", "host_batch_slice": "meshplan.facade._distributed",
    "host_mesh_shape": "meshplan.facade._distributed",
    "place": "meshplan.facade._place",
    "load_model": "meshplan.facade._model_file",
    **dict.fromkeys(("compiled_memory", "tpu_topology_mesh", "gpu_topology_mesh", "ReferenceConfig", "ReferenceStep",
                     "reference_step", "PipelineStep", "pipeline_step", "compiled_collectives", "verify_plan",
                     "verify_pipelines"), "meshplan.facade.verify"),
    "Measurement": "meshplan.facade._measure", "measure_plan": "meshplan.facade._measure",
    **dict.fromkeys(("ProfileSettings", "load_profile", "profile_machine", "save_profile"), "meshplan.facade._profile"),
    "live_cluster": "meshplan.facade._machine",
    "compare_clusters": "meshplan.facade._compare", "dask_executor": "meshplan.facade.verify._executor",
}

__all__ = ["errors", *errors.__all__]
# meshes
__all__ += ["HybridMeshShape", "MeshConfig", "MeshShape", "calculate_host_mesh_shape", "clear_mesh_cache",
            "cpu_context", "create_cpu_mesh", "create_mesh", "force_cpu", "mesh_cache_info",
            "parse_mesh_from_string"]
# sharding
__all__ += ["AutoShardingRule", "CompositeShardingRule", "MemoryConstrainedShardingRule", "MeshPartitionHelper",
            "ShapeBasedShardingRule", "ShardingAnalyzer", "ShardingRule", "create_monitored_function"]
# plans and memory, for training code that asks why a spec was chosen and what it costs
__all__ += ["MemoryEstimate", "Plan", "TrainingMemoryEstimate", "estimate_memory", "estimate_training_memory",
            "optimizer_state_specs", "plan_from_specs", "plan_tree", "validate_specs"]
# training state: one device_put for params + optimizer state
__all__ += ["place"]
# multi-host
__all__ += ["HostBatchSlice", "barrier_sync", "host_batch_slice", "host_mesh_shape"]
# planning
__all__ += ["Cluster", "DeviceSpec", "MeshCandidate", "ModelSpec", "SearchResult", "get_preset", "load_model",
            "parse_cluster", "search_meshes"]
# logical-axis rules and exports (flax / MaxText)
__all__ += ["LogicalRule", "LogicalShardingRule", "export_plan", "logical_export", "logical_names", "maxtext_settings"]
# exact step memory: compile ahead of time and ask XLA
__all__ += ["CompiledMemory", "ReferenceConfig", "ReferenceStep", "compiled_memory", "gpu_topology_mesh",
            "reference_step", "tpu_topology_mesh"]
# the collectives a compiled step runs (checked against the comm model)
__all__ += ["compiled_collectives"]
# a plan verified by compiling its top meshes (worker subprocesses, a compile cache)
__all__ += ["PlanVerification", "VerifyRow", "verify_pipelines", "verify_plan"]
# a pipelined train step (stage-stacked weights over pp, ppermute under shard_map)
__all__ += ["PipelineStep", "pipeline_step"]
# the hardware decides: time a plan's layouts on the live devices, profile the machine, price plans with it
__all__ += ["Measurement", "ProfileSettings", "live_cluster", "load_profile", "measure_plan", "profile_machine",
            "save_profile"]
# which cluster to rent: one model on several clusters, ranked; compiles on local workers or a Dask cluster
__all__ += ["CompareOption", "Comparison", "compare_clusters", "dask_executor"]


def __getattr__(name: str) -> Any:
    module = _FACADE.get(name)
    if module is None:
        raise AttributeError(f"module 'meshplan' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACADE))


if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from meshplan.facade._analyzer import ShardingAnalyzer, create_monitored_function
    from meshplan.facade._config import MeshConfig
    from meshplan.facade._cpu import cpu_context, create_cpu_mesh, force_cpu, parse_mesh_from_string
    from meshplan.facade._distributed import barrier_sync, host_batch_slice, host_mesh_shape
    from meshplan.facade._logical import LogicalShardingRule, logical_names
    from meshplan.facade._compare import compare_clusters
    from meshplan.facade._machine import live_cluster
    from meshplan.facade.verify._executor import dask_executor
    from meshplan.facade._measure import Measurement, measure_plan
    from meshplan.facade._profile import ProfileSettings, load_profile, profile_machine, save_profile
    from meshplan.facade._mesh import calculate_host_mesh_shape, clear_mesh_cache, create_mesh, mesh_cache_info
    from meshplan.facade._model_file import load_model
    from meshplan.facade._partition_helper import MeshPartitionHelper
    from meshplan.facade._place import place
    from meshplan.facade._rules import (
        AutoShardingRule,
        CompositeShardingRule,
        MemoryConstrainedShardingRule,
        ShapeBasedShardingRule,
        ShardingRule,
    )
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
