"""One serving step to compile (:class:`ServeJob`) and its compile in a worker (:func:`compile_serve_job`).

What the worker subprocesses need of a serving verification, apart from the verification itself
(:mod:`meshplan.facade.verify._serve`), so the worker pool and the serving rows import it without importing
each other.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from meshplan.facade.verify._targets import compile_target
from meshplan.pure.cluster import Cluster
from meshplan.pure.errors import CompiledOutOfMemoryError, PlanError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.serve import CacheFormat, ServeLayout, WeightQuant
from meshplan.pure.verify import CompileOutcome

__all__ = ["ServeJob", "compile_serve_job"]

_TOP_BUFFERS = 5


@dataclasses.dataclass(frozen=True, slots=True)
class ServeJob:
    """One serving step to compile for one replica.

    Attributes:
      spec: the model (a copy with fewer layers compiles faster).
      cluster: the replica's devices (:func:`replica_cluster`).
      layout: the serving layout.
      sequences, context: the running sequences and their cache length.
      quant, kv_dtype, cache: the weights', the cache's storage and the cache's format.
      target: ``"auto"`` (the cluster's compiler) or ``"cpu"``.
      kind: ``"decode"`` or ``"prefill"`` (a chunk of ``chunk`` tokens).
      chunk: the prefill chunk's tokens.
    """

    spec: ModelSpec
    cluster: Cluster
    layout: ServeLayout
    sequences: int
    context: int
    quant: WeightQuant
    kv_dtype: str
    cache: CacheFormat
    target: str = "auto"
    kind: str = "decode"
    chunk: int = 512

    @property
    def mesh_text(self) -> str:
        """The layout's text."""
        return self.layout.text


def _step(job: ServeJob, mesh: Any) -> Any:
    from meshplan.facade.verify._decode_step import decode_step, prefill_step

    if job.kind == "prefill":
        return prefill_step(job.spec, mesh, job.layout, chunk=min(job.chunk, job.context), sequences=job.sequences,
                            context=job.context, quant=job.quant, kv_dtype=job.kv_dtype, cache=job.cache)
    return decode_step(job.spec, mesh, job.layout, sequences=job.sequences, context=job.context, quant=job.quant,
                       kv_dtype=job.kv_dtype, cache=job.cache)


def compile_serve_job(job: ServeJob) -> CompileOutcome:
    """Build and compile ``job``'s step in this process; XLA refusing a step too big is an outcome.

    Example:
      >>> compile_serve_job("not a job")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.PlanError: job='not a job' must be a ServeJob.
    """
    from meshplan.facade.verify._compiled import compiled_memory

    if not isinstance(job, ServeJob):
        raise PlanError(f"job={job!r:.60} must be a ServeJob.")
    start = time.perf_counter()
    target = compile_target(job.cluster, ("ep", "tp"), (job.layout.ep, job.layout.tp), None, job.target)
    where = target.label
    step = _step(job, target.mesh)
    options = {"xla_backend_optimization_level": 0} if job.target == "cpu" else None
    try:
        mem = compiled_memory(step.fn, *step.args, compiler_options=options, top_buffers=_TOP_BUFFERS)
    except CompiledOutOfMemoryError as err:
        return CompileOutcome(where, None, oom=True, oom_required_bytes=err.required_bytes,
                              oom_available_bytes=err.available_bytes, error="does not fit (XLA ran out of memory)",
                              seconds=time.perf_counter() - start, deviceless=target.deviceless)
    return CompileOutcome(where, mem, seconds=time.perf_counter() - start, deviceless=target.deviceless)
