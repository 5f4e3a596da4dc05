"""meshplan: plan JAX device meshes and parameter shardings.

Drop-in names for eformer's ``escale`` and loadax's mesh API, with a pure,
shape-only core (:mod:`meshplan.pure`) and a thin live-jax facade
(:mod:`meshplan.facade`).
"""

from meshplan import errors
from meshplan.errors import *  # noqa: F401,F403

__version__ = "0.1.0"

__all__ = ["errors", *errors.__all__]

# --- meshes ----------------------------------------------------------------------------------------
from meshplan.facade._config import MeshConfig
from meshplan.facade._cpu import cpu_context, create_cpu_mesh, force_cpu, parse_mesh_from_string
from meshplan.facade._mesh import calculate_host_mesh_shape, clear_mesh_cache, create_mesh, mesh_cache_info
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.mesh._axes import MeshShape

__all__ += ["HybridMeshShape", "MeshConfig", "MeshShape", "calculate_host_mesh_shape", "clear_mesh_cache",
            "cpu_context", "create_cpu_mesh", "create_mesh", "force_cpu", "mesh_cache_info",
            "parse_mesh_from_string"]

# --- sharding --------------------------------------------------------------------------------------
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
from meshplan.pure.specs._batch import HostBatchSlice

__all__ += ["barrier_sync", "host_batch_slice", "host_mesh_shape", "HostBatchSlice"]

# --- planning --------------------------------------------------------------------------------------
from meshplan.pure.search._cluster import Cluster, parse_cluster
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.search._result import SearchResult
from meshplan.pure.search._search import search_meshes
from meshplan.pure.presets import get_preset

__all__ += ["Cluster", "MeshCandidate", "SearchResult", "get_preset", "parse_cluster", "search_meshes"]
