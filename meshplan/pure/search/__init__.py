"""How to choose a mesh: the search space of axis sizes over a cluster, parameter groups and their specs, the
search itself (:func:`search_meshes`), its JSON-ready result (:class:`SearchResult`, :class:`MeshCandidate`)
and the exports to flax logical rules and MaxText settings. It prices meshes with :mod:`meshplan.pure.cost` on
the machines of :mod:`meshplan.pure.cluster`.

The names of :mod:`meshplan.pure.cluster`, :mod:`meshplan.pure.cost` and :mod:`meshplan.pure.xla` that this
package held before they had rooms of their own are re-exported here, so code written against
``meshplan.pure.search`` keeps working; new code imports them from their own package.
"""

from meshplan.pure.cluster import (
    DEVICE_SPECS,
    Cluster,
    DeviceSpec,
    Link,
    TpuTopology,
    parse_cluster,
    select_link,
    tpu_topology,
)
from meshplan.pure.cost import (
    ATTENTION_KINDS,
    COLLECTIVE_KINDS,
    OPTIMIZER_COPIES,
    REMAT_POLICIES,
    SPREADS,
    CollectiveKind,
    CommTerm,
    MemoryBreakdown,
    Spread,
    StepMemory,
    TrainingRecipe,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    attention_class,
    axis_domain_counts,
    calibration_spread,
    collective_time,
    describe_spread,
    layer_dims,
    outside_recorded,
    peak_bounds,
    reduce_scatter_time,
    step_memory,
    xla_collectives,
)
from meshplan.pure.search._candidate import MeshCandidate, ParamGroup
from meshplan.pure.search._export import (
    EXPORT_FORMATS,
    MAXTEXT_AXIS_MAP,
    MAXTEXT_MESH_AXES,
    LogicalExport,
    export_plan,
    logical_export,
    maxtext_settings,
)
from meshplan.pure.search._html import mesh_html, plan_html
from meshplan.pure.search._markdown import plan_markdown
from meshplan.pure.search._pipeline_search import PipelineSearch, price_pipeline, search_pipelines
from meshplan.pure.search._result import Rejection, SearchRequest, SearchResult
from meshplan.pure.search._search import search_meshes
from meshplan.pure.xla import (
    BUFFER_KINDS,
    HLO_COLLECTIVE_KINDS,
    BufferReport,
    HloCollective,
    LiveBuffer,
    collective_shares,
    collective_totals,
    parse_buffer_report,
    parse_hlo_collectives,
    ratio_table,
)

# The search's own names.
__all__ = [
    "EXPORT_FORMATS",
    "MAXTEXT_AXIS_MAP",
    "MAXTEXT_MESH_AXES",
    "LogicalExport",
    "MeshCandidate",
    "ParamGroup",
    "Rejection",
    "SearchRequest",
    "SearchResult",
    "export_plan",
    "logical_export",
    "maxtext_settings",
    "search_meshes",
]
# The plan as markdown and as a self-contained HTML page (what SearchResult's notebook reprs show).
__all__ += ["mesh_html", "plan_html", "plan_markdown"]
# Pipeline layouts (a pp axis outermost, each stage searched as a smaller model).
__all__ += ["PipelineSearch", "price_pipeline", "search_pipelines"]
# Re-exported from the rooms they moved to (see the module docstring).
__all__ += [
    "DEVICE_SPECS",
    "Cluster",
    "DeviceSpec",
    "Link",
    "TpuTopology",
    "parse_cluster",
    "select_link",
    "tpu_topology",
]
__all__ += [
    "ATTENTION_KINDS",
    "COLLECTIVE_KINDS",
    "OPTIMIZER_COPIES",
    "REMAT_POLICIES",
    "SPREADS",
    "CollectiveKind",
    "CommTerm",
    "MemoryBreakdown",
    "Spread",
    "StepMemory",
    "TrainingRecipe",
    "all_gather_time",
    "all_reduce_time",
    "all_to_all_time",
    "attention_class",
    "axis_domain_counts",
    "calibration_spread",
    "collective_time",
    "describe_spread",
    "layer_dims",
    "outside_recorded",
    "peak_bounds",
    "reduce_scatter_time",
    "step_memory",
    "xla_collectives",
]
__all__ += [
    "BUFFER_KINDS",
    "HLO_COLLECTIVE_KINDS",
    "BufferReport",
    "HloCollective",
    "LiveBuffer",
    "collective_shares",
    "collective_totals",
    "parse_buffer_report",
    "parse_hlo_collectives",
    "ratio_table",
]
