"""What a training step costs on a mesh: the recipe priced (:class:`TrainingRecipe`), the collectives' alpha-beta
times (:func:`collective_time`), a compiled program's step simulated from its schedule
(:func:`simulate_schedule`), the collectives a sharded step runs and their bytes
(:func:`xla_collectives`), its FLOPs (:func:`step_flops`), the fullest device's bytes at the step's peak
(:func:`step_memory`) with the spread XLA's compiles showed around it (:func:`calibration_spread`), and the step
time with the communication left exposed (:func:`step_time`), an FP8 recipe's weight matmuls at the FP8 peak
(:func:`fp8_peak`), an MoE layer's dispatch as the recipe runs it (:class:`MoeDispatch`). Every figure is an
estimate; the ``meshplan.facade`` compiles the step when the exact one is wanted.

Example:
  >>> from meshplan.pure.cluster import Link
  >>> all_reduce_time(1e9, 2, Link(bandwidth=1e9, latency=0.0))
  1.0
"""

from meshplan.pure.cost._collective_time import (
    COLLECTIVE_KINDS,
    CollectiveKind,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    collective_time,
    reduce_scatter_time,
)
from meshplan.pure.cost._estimates import CommTerm, MemoryBreakdown, StepEstimate
from meshplan.pure.cost._flops import LayerFlops, StepFlops, layer_flops, step_flops
from meshplan.pure.cost._matmul_dtype import FP8_EFFICIENCY_RATIO, MATMUL_DTYPES, fp8_peak
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MOE_DISPATCHES, MoeDispatch
from meshplan.pure.cost._memory_spread import (
    SPREADS,
    Spread,
    attention_class,
    calibration_spread,
    describe_spread,
    outside_recorded,
    peak_bounds,
)
from meshplan.pure.cost._pipeline import (
    SCHEDULES,
    PipelinePlan,
    PipelineTime,
    ScheduleMemory,
    bubble_fraction,
    in_flight,
    pipeline_time,
    plan_stages,
    schedule_memory,
    send_bytes,
    send_time,
    stage_layers,
)
from meshplan.pure.cost._profile_fit import LinkFit, MatmulFit, StepFit, fit_link, fit_matmuls, fit_steps, ring_terms
from meshplan.pure.cost._profile_shapes import matmul_shapes, sweep_shapes
from meshplan.pure.cost._profile_pricing import (
    ProfileFigures,
    ProfilePricing,
    profile_document,
    profile_figures,
    profiled_cluster,
    profiled_device,
    refine_profile,
)
from meshplan.pure.cost._roofline import (
    SCHEDULE_FIT,
    Roofline,
    ScheduleLinks,
    SizeEfficiency,
    default_roofline,
    roofline,
    schedule_links,
)
from meshplan.pure.cost._schedule_time import CollectiveExposure, OpTime, ScheduleTime, simulate_schedule
from meshplan.pure.cost._recipe import (
    ATTENTION_KINDS,
    OPTIMIZER_COPIES,
    REMAT_POLICIES,
    TrainingRecipe,
)
from meshplan.pure.cost._placement import axis_domain_counts
from meshplan.pure.cost._xla_collectives import xla_collectives
from meshplan.pure.cost._step_memory import StepMemory, layer_dims, step_memory
from meshplan.pure.cost._step_time import StepTime, step_time

__all__ = [
    "ATTENTION_KINDS",
    "COLLECTIVE_KINDS",
    "OPTIMIZER_COPIES",
    "REMAT_POLICIES",
    "SPREADS",
    "CollectiveKind",
    "CommTerm",
    "LayerFlops",
    "MemoryBreakdown",
    "Spread",
    "StepEstimate",
    "StepFlops",
    "StepMemory",
    "StepTime",
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
    "layer_flops",
    "outside_recorded",
    "peak_bounds",
    "reduce_scatter_time",
    "step_flops",
    "step_memory",
    "step_time",
    "xla_collectives",
]
# FP8 weight matmuls: the recipe's choices, the peak they run at, their efficiency over bf16's
__all__ += ["FP8_EFFICIENCY_RATIO", "MATMUL_DTYPES", "fp8_peak"]
# MoE dispatch: GShard's capacity einsums or dropless grouped GEMMs, and what each costs
__all__ += ["CAPACITY_FACTOR", "MOE_DISPATCHES", "MoeDispatch"]
# pipeline parallelism: layers per stage, the bubble, the stage-boundary sends
__all__ += ["SCHEDULES", "PipelinePlan", "PipelineTime", "ScheduleMemory", "bubble_fraction", "in_flight",
            "pipeline_time", "plan_stages", "schedule_memory", "send_bytes", "send_time", "stage_layers"]
# how finely the step-time estimate tells layouts apart (its median error against published runs)
from meshplan.pure.cost._resolution import STEP_TIME_RESOLUTION, resolution_percent

__all__ += ["STEP_TIME_RESOLUTION", "resolution_percent"]
# a machine profile's timings fitted, and a plan priced by them (the catalogue's figures where it has none)
__all__ += ["LinkFit", "MatmulFit", "ProfileFigures", "ProfilePricing", "StepFit", "fit_link", "fit_matmuls",
            "fit_steps", "profile_document", "profile_figures", "profiled_cluster", "profiled_device",
            "matmul_shapes", "refine_profile", "ring_terms", "sweep_shapes"]
# a compiled program's schedule simulated: the device's roofline, the links its collectives cross
__all__ += ["SCHEDULE_FIT", "CollectiveExposure", "OpTime", "Roofline", "ScheduleLinks", "ScheduleTime",
            "SizeEfficiency", "default_roofline", "roofline", "schedule_links", "simulate_schedule"]
# how much of a layer's parameter collectives a compiled step leaves exposed (fitted to XLA:GPU's programs)
from meshplan.pure.cost._overlap import OVERLAP_FIT, OverlapRule, overlap_rule, window_exposure

__all__ += ["OVERLAP_FIT", "OverlapRule", "overlap_rule", "window_exposure"]
