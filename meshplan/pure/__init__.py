"""meshplan.pure: shape-only planners over plain data.

Nothing here touches devices, backends, global state or I/O: inputs are
tuples, ordered dicts of axis sizes, dtypes and PartitionSpecs; outputs are
the same kinds of values. :mod:`meshplan.facade` binds these to live jax.
"""

from meshplan.pure import errors
from meshplan.pure.errors import *  # noqa: F401,F403

__all__ = list(errors.__all__)

# --- mesh planning (axes, strings, host/DCN split, layout) ---------------------------------------
from meshplan.pure.mesh._axes import MeshShape, infer_axis_dims, resolve_mesh_shape, validate_axis_names

__all__ += ["MeshShape", "infer_axis_dims", "resolve_mesh_shape", "validate_axis_names"]
from meshplan.pure.mesh._split import calculate_host_mesh_shape, split_over_granules

__all__ += ["calculate_host_mesh_shape", "split_over_granules"]
from meshplan.pure.mesh._hybrid import HybridMeshShape, reconcile_dcn, resolve_hybrid, split_mesh_shape

__all__ += ["HybridMeshShape", "reconcile_dcn", "resolve_hybrid", "split_mesh_shape"]
from meshplan.pure.mesh._axis_types import canonicalize_axis_types

__all__ += ["canonicalize_axis_types"]
from meshplan.pure.mesh._layout import DeviceInfo, group_granules, layout_device_ids

__all__ += ["DeviceInfo", "group_granules", "layout_device_ids"]
from meshplan.pure.mesh._parse import format_mesh_string, parse_mesh_string

__all__ += ["format_mesh_string", "parse_mesh_string"]
from meshplan.pure.mesh._selectors import select_mesh_shape, validate_mesh_rules

__all__ += ["select_mesh_shape", "validate_mesh_rules"]
from meshplan.pure.mesh._request import MeshRequest, resolve_mesh_request

__all__ += ["MeshRequest", "resolve_mesh_request"]

# --- shard geometry, validation, memory -----------------------------------------------------------
from meshplan.pure.specs._geometry import (
    UNCONSTRAINED,
    ShardGeometry,
    canonical_entries,
    shard_geometry,
    shard_shape,
    spec_axes,
    spec_from_entries,
)

__all__ += ["UNCONSTRAINED", "ShardGeometry", "canonical_entries", "shard_geometry", "shard_shape",
            "spec_axes", "spec_from_entries"]
from meshplan.pure.specs._tree import LeafInfo, TreeFacts, leaf_info, path_str, tree_facts

__all__ += ["LeafInfo", "TreeFacts", "leaf_info", "path_str", "tree_facts"]
from meshplan.pure.specs._dtypes import array_bytes, canonical_dtype, dtype_bits, dtype_storage_bytes

__all__ += ["array_bytes", "canonical_dtype", "dtype_bits", "dtype_storage_bytes"]
from meshplan.pure.specs._validate import FINDING_KINDS, Finding, check_specs, validate_specs

__all__ += ["FINDING_KINDS", "Finding", "check_specs", "validate_specs"]
from meshplan.pure.specs._memory import MemoryEstimate, estimate_memory, validate_and_estimate

__all__ += ["MemoryEstimate", "estimate_memory", "validate_and_estimate"]
from meshplan.pure.specs._training import TrainingMemoryEstimate, estimate_training_memory, optimizer_state_specs

__all__ += ["TrainingMemoryEstimate", "estimate_training_memory", "optimizer_state_specs"]

# --- spec assignment rules and plans --------------------------------------------------------------
from meshplan.pure.rules._base import Decision, LeafContext, PureRule, shards_something
from meshplan.pure._check import canonical_axis_sizes
from meshplan.pure._types import FrozenAxisSizes

__all__ += ["Decision", "FrozenAxisSizes", "LeafContext", "PureRule", "canonical_axis_sizes", "shards_something"]
from meshplan.pure.rules._engine import Plan, PlanRule, plan_from_specs, plan_tree

__all__ += ["Plan", "PlanRule", "plan_from_specs", "plan_tree"]
from meshplan.pure.rules._auto import DEFAULT_MIN_SHARD_SIZE, AutoRule, auto_decision
from meshplan.pure.rules._composite import CompositeRule
from meshplan.pure.rules._memory import MemoryRule, memory_decision, min_shard_bytes
from meshplan.pure.rules._shape import ShapePatternRule, shape_pattern_decision

__all__ += ["DEFAULT_MIN_SHARD_SIZE", "AutoRule", "auto_decision", "CompositeRule", "MemoryRule",
            "memory_decision", "min_shard_bytes", "ShapePatternRule", "shape_pattern_decision"]
from meshplan.pure.rules._suggest import (
    SuggestRule,
    analyze_pytree,
    create_partition_spec,
    suggest_decision,
    suggest_methods,
)

__all__ += ["SuggestRule", "analyze_pytree", "create_partition_spec", "suggest_decision", "suggest_methods"]

# --- clusters, presets, cost model, mesh search ---------------------------------------------------
from meshplan.pure.search._cost import (
    COLLECTIVE_KINDS,
    CollectiveKind,
    Link,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    collective_time,
    reduce_scatter_time,
    select_link,
)

__all__ += ["COLLECTIVE_KINDS", "CollectiveKind", "Link", "all_gather_time", "all_reduce_time",
            "all_to_all_time", "collective_time", "reduce_scatter_time", "select_link"]
from meshplan.pure.search._hardware import DEVICE_SPECS, DeviceSpec

__all__ += ["DEVICE_SPECS", "DeviceSpec"]
from meshplan.pure.search._cluster import Cluster, parse_cluster

__all__ += ["Cluster", "parse_cluster"]
from meshplan.pure.presets import (
    MODEL_PRESETS,
    MODEL_SPECS,
    MLADims,
    ModelSpec,
    Preset,
    build_params,
    count_params,
    get_preset,
    preset_names,
)

__all__ += ["MLADims", "MODEL_PRESETS", "MODEL_SPECS", "ModelSpec", "Preset", "build_params",
            "count_params", "get_preset", "preset_names"]
from meshplan.pure.rules._axis_kind import AxisKindRule, path_template
from meshplan.pure.rules._path import PathRule, path_rule_from_json
from meshplan.pure.search._candidate import CommTerm, MemoryBreakdown, MeshCandidate, ParamGroup
from meshplan.pure.search._result import Rejection, SearchRequest, SearchResult
from meshplan.pure.search._search import search_meshes
from meshplan.pure.search._step_cost import axis_domain_counts

__all__ += ["AxisKindRule", "CommTerm", "MemoryBreakdown", "MeshCandidate", "ParamGroup", "PathRule",
            "Rejection", "SearchRequest", "SearchResult", "axis_domain_counts", "path_rule_from_json",
            "path_template", "search_meshes"]
