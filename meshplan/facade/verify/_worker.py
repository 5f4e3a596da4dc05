"""Compile reference steps in worker subprocesses: the user's process is never disturbed, a crash is one row.

Compiling for a GPU with no GPU needs jax to run with ``JAX_PLATFORMS=cpu`` and
the CUDA plugin loaded; compiling for a TPU loads libtpu; a full-size compile
takes gigabytes and may take minutes. None of that belongs in the caller's
process (their jax may already run on their own devices), so each
:class:`CompileJob` runs in a fresh ``python -m meshplan.facade.verify._worker``
with ``JAX_PLATFORMS=cpu``, an address-space limit and a wall-clock timeout;
several run side by side, one per core. A worker that crashes, runs out of
its memory or time, or raises, gives a :class:`CompileOutcome` with the reason
and no figures: the caller marks that row "not verified" and goes on.

The job and its outcome cross the process boundary as pickles through files
in a private temporary directory (written and read only by this library).
"""

from __future__ import annotations

import concurrent.futures
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from meshplan.facade.verify._jobs import CompileJob
from meshplan.facade.verify._subprocess import default_memory_limit, default_parallel, run_one
from meshplan.facade.verify._targets import compile_target, hybrid_device_order
from meshplan.pure.verify import CompiledStep, CompileOutcome, compiled_step_of

__all__ = ["compile_job", "default_memory_limit", "default_parallel", "run_jobs", "simulated_step"]

_TOP_BUFFERS = 5  # buffers live at the peak kept per compiled mesh


def _pipelined(job: CompileJob, mesh: Any) -> tuple[Any, tuple[Any, ...]]:
    """The pipelined step of ``job`` on ``mesh``: its jitted function and abstract arguments."""
    from meshplan.facade.verify._pipeline_step import pipeline_step

    assert job.pipeline is not None
    m, v = job.pipeline
    if job.target != "cpu" and job.cluster.device.ici_scope != "slice":
        # gpu_topology_mesh orders the devices hosts outermost whatever the dcn shape; TPU topologies and
        # XLA:CPU take it as built (tpu_topology_mesh lays out the dcn shape itself).
        from jax.sharding import Mesh

        mesh = Mesh(hybrid_device_order(mesh.devices, job.dcn_shape, job.cluster.num_nodes), mesh.axis_names,
                    axis_types=mesh.axis_types)
    step = pipeline_step(job.spec, mesh, batch=job.batch, seq=job.seq, micro_batches=m, repeats=v, plan=job.plan,
                         config=job.config)
    return step.fn, tuple(step.args)


def compile_job(job: CompileJob) -> CompileOutcome:
    """Build and compile ``job``'s reference step in this process; XLA's refusal of a too-big step is an
    outcome, any other failure raises.

    Example:
      >>> import dataclasses
      >>> from meshplan.pure import get_preset, parse_cluster
      >>> from meshplan.facade.verify._reference import ReferenceConfig
      >>> one_layer = dataclasses.replace(get_preset("gpt2").spec, num_layers=1, num_params=None)
      >>> job = CompileJob(one_layer, parse_cluster("1x8xH100"), ("dp",), (8,), None, None,
      ...                  batch=8, seq=32, config=ReferenceConfig(), target="cpu")
      >>> compile_job(job).memory.num_devices
      8
    """
    from meshplan.facade.verify._compiled import compile_with_memory
    from meshplan.facade.verify._reference import reference_step
    from meshplan.pure._format import fmt_bytes
    from meshplan.pure.errors import CompiledOutOfMemoryError

    if not isinstance(job, CompileJob):  # a serving step's job (meshplan.facade.verify._serve_job) builds its own step
        from meshplan.facade.verify._serve_job import compile_serve_job

        return compile_serve_job(job)
    start = time.perf_counter()
    where = compile_target(job.cluster, job.axis_names, job.axis_sizes, job.dcn_shape, job.target)
    mesh = where.mesh
    if job.pipeline is not None:
        fn, args = _pipelined(job, mesh)
    else:
        ref = reference_step(job.spec, mesh, batch=job.batch, seq=job.seq, plan=job.plan, config=job.config)
        fn, args = ref.fn, tuple(ref.args)
    # XLA:CPU: less LLVM effort halves the compile; buffer assignment (the figures) comes before it.
    options = {"xla_backend_optimization_level": 0} if job.target == "cpu" else None
    try:
        compiled, mem = compile_with_memory(fn, *args, compiler_options=options, top_buffers=_TOP_BUFFERS)
    except CompiledOutOfMemoryError as err:
        need = (f"XLA needs {fmt_bytes(err.required_bytes)} of {fmt_bytes(err.available_bytes)}"
                if err.required_bytes and err.available_bytes else "XLA ran out of memory")
        return CompileOutcome(where.label, None, oom=True, oom_required_bytes=err.required_bytes,
                              oom_available_bytes=err.available_bytes, error=f"does not fit: {need}",
                              seconds=time.perf_counter() - start, deviceless=where.deviceless)
    step, note = simulated_step(compiled, job)
    return CompileOutcome(where.label, mem, seconds=time.perf_counter() - start, deviceless=where.deviceless,
                          step=step, step_note=note)


def simulated_step(compiled: Any, job: CompileJob) -> tuple[CompiledStep | None, str]:
    """The compiled program's step simulated from its schedule on ``job``'s cluster, and what to say of it.

    A program the reader or the simulator cannot price keeps its memory figures; its step is ``None`` and the
    note says why. XLA:CPU's program (``target="cpu"``) is XLA:CPU's lowering priced on the cluster's devices:
    the note says its step is not the cluster's program's.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from meshplan.pure import get_preset, parse_cluster
      >>> from meshplan.facade.verify._reference import ReferenceConfig
      >>> job = CompileJob(get_preset("gpt2").spec, parse_cluster("1x1xH100"), (), (), None, None, batch=1, seq=8,
      ...                  config=ReferenceConfig())
      >>> step, note = simulated_step(jax.jit(lambda a: a @ a).lower(jnp.zeros((256, 256))).compile(), job)
      >>> step.step_s > 0, note
      (True, '')
    """
    from meshplan.facade.verify._compiled_schedule import compiled_step_time
    from meshplan.pure.errors import MeshplanError

    try:
        timed = compiled_step_time(compiled, cluster=job.cluster)
    except MeshplanError as err:
        return None, f"no compiled step time: {str(err).splitlines()[0][:200]}"
    note = ("XLA:CPU's program priced on the cluster's devices: a check of the schedule, not the cluster's own "
            "program" if job.target == "cpu" else "")
    return compiled_step_of(timed.schedule, xla_floor_s=timed.xla_optimal_seconds), note


def run_jobs(jobs: Sequence[CompileJob], *, parallel: int | None = None, timeout_s: float = 600.0,
             memory_limit: int | None = None,
             on_done: Callable[[int, CompileOutcome], None] | None = None,
             executor: concurrent.futures.Executor | None = None) -> list[CompileOutcome]:
    """Compile each job in its own worker subprocess, ``parallel`` at a time; outcomes in the jobs' order.

    Args:
      jobs: what to compile.
      parallel: workers side by side (default: one per core).
      timeout_s: the most one compile may take, worker start included.
      memory_limit: address space per worker in bytes (default: the machine's memory shared, >= 8 GiB).
      on_done: called with (job index, outcome) as each finishes (progress).
      executor: run the jobs there instead (a Dask cluster's executor: :mod:`meshplan.facade.verify._executor`),
        each still in a subprocess of the machine that runs it, under the memory limit and timeout.

    Returns:
      One :class:`CompileOutcome` per job; a crash, a timeout or an error is an outcome with ``error`` set.

    Example:
      >>> run_jobs([])
      []
    """
    if not jobs:
        return []
    if executor is not None:
        from meshplan.facade.verify._executor import run_on

        return run_on(executor, jobs, timeout_s=timeout_s, memory_limit=memory_limit, on_done=on_done)
    workers = max(1, min(parallel or default_parallel(), len(jobs)))
    limit = memory_limit or default_memory_limit(workers)
    results: list[CompileOutcome | None] = [None] * len(jobs)
    with tempfile.TemporaryDirectory(prefix="meshplan-worker-") as workdir, \
            concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_one, job, timeout_s=timeout_s, memory_limit=limit, workdir=workdir,
                               index=i): i for i, job in enumerate(jobs)}
        for fut in concurrent.futures.as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            if on_done is not None:
                on_done(i, results[i])  # type: ignore[arg-type]
    return [r for r in results if r is not None]


def _main(argv: Sequence[str]) -> int:
    """The worker: bound its memory, read a pickled job, compile it, write the outcome (or a one-line reason)."""
    import resource

    job_path, out_path, limit = argv
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    try:
        result: CompileOutcome | str = compile_job(job)
    except Exception as err:  # noqa: BLE001 -- any failure of this one compile is its row's reason, never the plan's end
        result = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    # The job and the outcome are classes of other modules (_jobs, meshplan.pure.verify), so running as
    # __main__ pickles and unpickles them against the same classes the caller uses.
    sys.exit(_main(sys.argv[1:]))
