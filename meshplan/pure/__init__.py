"""meshplan.pure: shape-only planners over plain data.

Nothing here touches devices, backends, global state or I/O: inputs are
tuples, ordered dicts of axis sizes, dtypes and PartitionSpecs; outputs are
the same kinds of values. :mod:`meshplan.facade` binds these to live jax.

Layers, each importing only the ones below it (``tests/test_architecture.py`` holds the order):

* :mod:`meshplan.pure.mesh`: mesh shapes, strings, host/ICI/DCN splits, device layout;
* :mod:`meshplan.pure.specs`: shard geometry, leaf facts, validation, memory;
* :mod:`meshplan.pure.rules`: the rule protocol, the plan engine, the built-in rules;
* :mod:`meshplan.pure.presets`: model shapes (:class:`ModelSpec`) and their parameter trees;
* :mod:`meshplan.pure.cluster`: what the machine is: accelerators, links, clusters, TPU topologies;
* :mod:`meshplan.pure.xla`: pure parsers of the compiler's text (HLO collectives, buffer reports);
* :mod:`meshplan.pure.cost`: what a step costs: collectives, FLOPs, memory, step time;
* :mod:`meshplan.pure.search`: how to choose a mesh: the search, its ranked result, the pipeline layouts;
* :mod:`meshplan.pure.verify`: what a compiled plan is made of: rows, verdicts, which meshes to compile;
* :mod:`meshplan.pure.report`: a plan for people: the report object, its facts, terminal facts, markdown,
  HTML and SVG, and the exports to flax and MaxText.

This module re-exports the headline names of each; the rest live in the
subpackage that owns them.
"""

from meshplan.pure import errors
from meshplan.pure.errors import *  # noqa: F401,F403
from meshplan.pure.mesh import (
    DeviceInfo,
    HybridMeshShape,
    MeshShape,
    format_mesh_string,
    layout_device_ids,
    parse_mesh_string,
    per_host_mesh_shape,
    reconcile_dcn,
    resolve_mesh_shape,
    select_mesh_shape,
    split_over_granules,
)
from meshplan.pure.presets import ModelSpec, get_preset
from meshplan.pure.rules import (
    AutoRule,
    AxisKindRule,
    CompositeRule,
    Decision,
    LeafContext,
    LogicalRule,
    MemoryRule,
    PathRule,
    Plan,
    Rule,
    ShapePatternRule,
    SuggestRule,
    check_rule,
    leaf_layout,
    normalize_path,
    plan_from_specs,
    plan_tree,
)
from meshplan.pure.cluster import Cluster, DeviceSpec, parse_cluster
from meshplan.pure.report import export_plan, logical_export, maxtext_settings
from meshplan.pure.search import MeshCandidate, SearchResult, search_meshes
from meshplan.pure.specs import (
    Finding,
    HostBatchSlice,
    MemoryEstimate,
    TrainingMemoryEstimate,
    check_specs,
    estimate_memory,
    estimate_training_memory,
    host_batch_slices,
    optimizer_state_specs,
    shard_geometry,
    shard_shape,
    tree_facts,
    validate_specs,
)

__all__ = list(errors.__all__)
# mesh
__all__ += ["DeviceInfo", "HybridMeshShape", "MeshShape", "format_mesh_string", "layout_device_ids",
            "parse_mesh_string", "per_host_mesh_shape", "reconcile_dcn", "resolve_mesh_shape", "select_mesh_shape",
            "split_over_granules"]
# specs
__all__ += ["Finding", "HostBatchSlice", "MemoryEstimate", "TrainingMemoryEstimate", "check_specs",
            "estimate_memory", "estimate_training_memory", "host_batch_slices", "optimizer_state_specs",
            "shard_geometry", "shard_shape", "tree_facts", "validate_specs"]
# rules
__all__ += ["AutoRule", "AxisKindRule", "CompositeRule", "Decision", "LeafContext", "LogicalRule", "MemoryRule", "PathRule", "Plan", "Rule",
            "ShapePatternRule", "SuggestRule", "plan_from_specs", "plan_tree"]
__all__ += ["check_rule", "leaf_layout", "normalize_path"]  # tree conventions, rules checked against a tree
# search
__all__ += ["Cluster", "DeviceSpec", "MeshCandidate", "ModelSpec", "SearchResult", "get_preset", "parse_cluster",
            "search_meshes", "export_plan", "logical_export", "maxtext_settings"]
