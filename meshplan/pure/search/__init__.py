"""The mesh search: the hardware catalogue, clusters, the collective cost and step models, the search
space, and the ranked result. Builds on :mod:`meshplan.pure.rules` and the presets.
"""

from meshplan.pure.search._buffer_report import BUFFER_KINDS, BufferReport, LiveBuffer, parse_buffer_report
from meshplan.pure.search._calibration_spread import (
    attention_class,
    calibration_spread,
    describe_spread,
    outside_recorded,
    peak_bounds,
    Spread,
    SPREADS,
)
from meshplan.pure.search._candidate import CommTerm, MemoryBreakdown, MeshCandidate, ParamGroup
from meshplan.pure.search._cluster import Cluster, parse_cluster
from meshplan.pure.search._cost import (
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    COLLECTIVE_KINDS,
    collective_time,
    CollectiveKind,
    Link,
    reduce_scatter_time,
    select_link,
)
from meshplan.pure.search._export import (
    EXPORT_FORMATS,
    export_plan,
    logical_export,
    LogicalExport,
    MAXTEXT_AXIS_MAP,
    MAXTEXT_MESH_AXES,
    maxtext_settings,
)
from meshplan.pure.search._hardware import DEVICE_SPECS, DeviceSpec
from meshplan.pure.search._recipe import ATTENTION_KINDS, OPTIMIZER_COPIES, REMAT_POLICIES, TrainingRecipe
from meshplan.pure.search._step_memory import StepMemory, layer_dims, step_memory
from meshplan.pure.search._result import Rejection, SearchRequest, SearchResult
from meshplan.pure.search._search import search_meshes
from meshplan.pure.search._step_cost import axis_domain_counts, xla_collectives
from meshplan.pure.search._hlo_collectives import (
    collective_shares,
    collective_totals,
    HLO_COLLECTIVE_KINDS,
    HloCollective,
    parse_hlo_collectives,
    ratio_table,
)
from meshplan.pure.search._topology import TpuTopology, tpu_topology

__all__ = [
    "ATTENTION_KINDS",
    "attention_class",
    "calibration_spread",
    "describe_spread",
    "outside_recorded",
    "peak_bounds",
    "Spread",
    "SPREADS",
    "OPTIMIZER_COPIES",
    "REMAT_POLICIES",
    "StepMemory",
    "TrainingRecipe",
    "layer_dims",
    "step_memory",
    "all_gather_time",
    "all_reduce_time",
    "all_to_all_time",
    "axis_domain_counts",
    "Cluster",
    "COLLECTIVE_KINDS",
    "collective_time",
    "CollectiveKind",
    "CommTerm",
    "DEVICE_SPECS",
    "DeviceSpec",
    "EXPORT_FORMATS",
    "export_plan",
    "Link",
    "logical_export",
    "LogicalExport",
    "MAXTEXT_AXIS_MAP",
    "MAXTEXT_MESH_AXES",
    "maxtext_settings",
    "MemoryBreakdown",
    "MeshCandidate",
    "ParamGroup",
    "parse_cluster",
    "reduce_scatter_time",
    "Rejection",
    "search_meshes",
    "SearchRequest",
    "SearchResult",
    "select_link",
    "TpuTopology",
    "tpu_topology",
    "collective_shares",
    "collective_totals",
    "HLO_COLLECTIVE_KINDS",
    "HloCollective",
    "parse_hlo_collectives",
    "ratio_table",
    "xla_collectives",
    "BUFFER_KINDS",
    "BufferReport",
    "LiveBuffer",
    "parse_buffer_report",
]
