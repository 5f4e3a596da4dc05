"""meshplan.facade.verify: compile reference steps ahead of time and read XLA's figures.

One room for everything that compiles: the reference train step and the pipelined step, the compile-only
meshes of TPU slices and GPU clusters (no TPU or GPU needed) and their shipped GPU descriptions, which
compiler is installed, the worker subprocesses, the compile cache, and one driver (jobs, cache, workers,
rows) behind plan verification, pipeline verification and ``meshplan check``. What the figures decide (the
rows, the verdicts, which meshes to compile next) is pure: :mod:`meshplan.pure.verify`.
"""

from meshplan.facade.verify._cache import CacheInfo, cache_dir, cache_info, clear_cache
from meshplan.facade.verify._check import check_layout
from meshplan.facade.verify._compiled import compiled_memory
from meshplan.facade.verify._compilers import (
    COMPILE_TARGETS,
    Compiler,
    compiler_for,
    compiler_version,
    cuda_plugin_available,
    cuda_plugin_problem,
    deviceless_gpu_ready,
    installed_versions,
    libtpu_available,
)
from meshplan.facade.verify._driver import Compile, compile_rows
from meshplan.facade.verify._executor import dask_executor, resolve_executor
from meshplan.facade.verify._gpu_targets import GPU_TARGETS_DIR, gpu_target_config, known_gpu_targets
from meshplan.facade.verify._hlo import compiled_collectives
from meshplan.facade.verify._jobs import CompileJob, reference_config
from meshplan.facade.verify._pipeline_step import PipelineStep, pipeline_step
from meshplan.facade.verify._pipelines import verify_pipelines
from meshplan.facade.verify._plan import verify_plan
from meshplan.facade.verify._reference import ReferenceConfig, ReferenceStep, reference_step
from meshplan.facade.verify._targets import TPU_WINDOWED_EINSUM_OFF, gpu_topology_mesh, tpu_topology_mesh
from meshplan.facade.verify._worker import run_jobs

# compiling one step: XLA's memory and collectives, on compile-only TPU / GPU meshes
__all__ = ["TPU_WINDOWED_EINSUM_OFF", "compiled_collectives", "compiled_memory", "gpu_topology_mesh",
           "tpu_topology_mesh"]
# the steps compiled: the reference train step and the pipelined step
__all__ += ["PipelineStep", "ReferenceConfig", "ReferenceStep", "pipeline_step", "reference_config", "reference_step"]
# which compiler, and whether it is installed
__all__ += ["COMPILE_TARGETS", "GPU_TARGETS_DIR", "Compiler", "compiler_for", "compiler_version",
            "cuda_plugin_available", "cuda_plugin_problem", "deviceless_gpu_ready", "gpu_target_config", "installed_versions",
            "known_gpu_targets", "libtpu_available"]
# verification: one driver (jobs -> cache -> workers -> rows) and its three callers; workers local or on Dask
__all__ += ["CacheInfo", "Compile", "CompileJob", "cache_dir", "cache_info", "check_layout", "clear_cache",
            "compile_rows", "dask_executor", "resolve_executor", "run_jobs", "verify_pipelines", "verify_plan"]
