"""Compile reference steps in worker subprocesses: the user's process is never disturbed, a crash is one row.

Compiling for a GPU with no GPU needs jax to run with ``JAX_PLATFORMS=cpu`` and
the CUDA plugin loaded; compiling for a TPU loads libtpu; a full-size compile
takes gigabytes and may take minutes. None of that belongs in the caller's
process (their jax may already run on their own devices), so each
:class:`CompileJob` runs in a fresh ``python -m meshplan.facade._worker``
with ``JAX_PLATFORMS=cpu``, an address-space limit and a wall-clock timeout;
several run side by side, one per core. A worker that crashes, runs out of
its memory or time, or raises, gives a :class:`CompileOutcome` with the reason
and no figures: the caller marks that row "not verified" and goes on.

The job and its outcome cross the process boundary as pickles through files
in a private temporary directory (written and read only by this library).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from meshplan.facade._compiled import CompiledMemory
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.errors import PlanError
from meshplan.pure.presets import ModelSpec

__all__ = ["CompileJob", "CompileOutcome", "compile_job", "default_parallel", "deviceless_gpu", "run_jobs",
           "target_mesh"]

_TOP_BUFFERS = 5  # buffers live at the peak kept per compiled mesh


@dataclasses.dataclass(frozen=True, slots=True)
class CompileJob:
    """One reference step to compile: the model, the cluster, the mesh, the plan's specs and the recipe.

    Attributes:
      spec: the model's dims.
      cluster: the cluster it trains on.
      axis_names, axis_sizes, dcn_shape: the mesh (``dcn_shape`` each axis's part across hosts/slices).
      plan: the search candidate whose parameter specs and batch layout the step uses (``None``: the
        default rule's).
      batch, seq: the global batch in sequences, tokens per sequence.
      config: the :class:`~meshplan.ReferenceConfig`.
      target: ``"auto"`` (the cluster's own compiler) or ``"cpu"`` (XLA:CPU, as many devices).
      pipeline: ``(micro_batches, repeats)`` to compile the pipelined step
        (:func:`~meshplan.facade._pipeline_step.pipeline_step`, the circular schedule) on a mesh whose
        first axis is ``pp``; ``None``: the unpipelined reference step.

    Example:
      >>> from meshplan.pure import get_preset, parse_cluster
      >>> from meshplan.facade._reference import ReferenceConfig
      >>> job = CompileJob(get_preset("gpt2").spec, parse_cluster("1x8xH100"), ("fsdp",), (8,), None, None,
      ...                  batch=8, seq=64, config=ReferenceConfig())
      >>> job.mesh_text
      'fsdp=8'
    """

    spec: ModelSpec
    cluster: Cluster
    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    dcn_shape: tuple[int, ...] | None
    plan: Any
    batch: int
    seq: int
    config: Any
    target: str = "auto"
    pipeline: tuple[int, int] | None = None

    @property
    def mesh_text(self) -> str:
        """``"fsdp=4,tp=2"`` (axes of size 1 left out; ``"single device"`` when none is left)."""
        return ",".join(f"{a}={s}" for a, s in zip(self.axis_names, self.axis_sizes, strict=True)
                        if s > 1) or "single device"


@dataclasses.dataclass(frozen=True, slots=True)
class CompileOutcome:
    """What a compile gave: XLA's figures, or why there are none.

    Attributes:
      target: where it compiled (``"8 x NVIDIA H100 80GB HBM3 (no GPU: shipped description)"``).
      memory: XLA's per-device figures (``None`` when the compile failed).
      oom: the compiler refused the step as too big for the device (XLA:TPU's out-of-memory).
      oom_required_bytes, oom_available_bytes: the figures of XLA's out-of-memory message, where given.
      error: why there are no figures (``""`` when there are).
      seconds: the wall time of the job, worker start included.

    Example:
      >>> CompileOutcome("8 x XLA:CPU", None, error="timed out after 1 s").ok
      False
    """

    target: str
    memory: CompiledMemory | None
    oom: bool = False
    oom_required_bytes: int | None = None
    oom_available_bytes: int | None = None
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether XLA gave figures."""
        return self.memory is not None


def _ensure_cpu_devices(n: int) -> None:
    """Ask for ``n`` simulated CPU devices if jax has not started its backends yet (else keep what it has)."""
    import jax
    # Private: the one place that says whether backends are up (setting the device count after is ignored).
    from jax._src import xla_bridge

    current = int(getattr(jax.config, "jax_num_cpu_devices", -1))  # an untyped config attribute
    if not xla_bridge.backends_are_initialized() and current < n:
        jax.config.update("jax_num_cpu_devices", n)  # type: ignore[no-untyped-call]


def _local_mesh(devices: Any, sizes: Sequence[int], names: Sequence[str]) -> Any:
    """A mesh of local devices in the order given (Auto axes, as the reference step's constraints need)."""
    import numpy as np
    from jax.sharding import AxisType, Mesh

    return Mesh(np.array(devices, dtype=object).reshape(tuple(sizes)), tuple(names),
                axis_types=(AxisType.Auto,) * len(names))


def target_mesh(cluster: Cluster, names: Sequence[str], sizes: Sequence[int], dcn: Sequence[int] | None,
                target: str) -> tuple[Any, str]:
    """The mesh to compile on and the target's name: XLA:CPU devices, a TPU topology, or GPUs (local or not).

    Raises:
      PlanError: ``--target cpu`` in a process that started jax with fewer CPU devices.
      ClusterError: the target's compiler is missing (libtpu, the CUDA plugin) or the GPU unknown.

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> target_mesh(parse_cluster("1x8xH100"), ("dp",), (8,), None, "cpu")[1]
      '8 x XLA:CPU'
    """
    import jax

    n = cluster.num_devices
    if target == "cpu":
        _ensure_cpu_devices(n)
        cpus = jax.devices("cpu")
        if len(cpus) < n:
            raise PlanError(f"--target cpu needs {n} CPU devices for {cluster.text}, this process has "
                            f"{len(cpus)}; run with XLA_FLAGS=--xla_force_host_platform_device_count={n} (or "
                            f"verify a smaller cluster).")
        return _local_mesh(cpus[:n], sizes, names), f"{n} x XLA:CPU"
    if cluster.device.ici_scope == "slice":
        from meshplan.facade._compiled import tpu_topology_mesh
        from meshplan.pure.search import tpu_topology

        mesh = tpu_topology_mesh(cluster, names, sizes, dcn_shape=dcn)
        return mesh, f"{tpu_topology(cluster).topology_name} ({cluster.text})"
    from meshplan.facade._compiled import gpu_topology_mesh, local_gpus

    gpus = [d for d in local_gpus() if cluster.device.matches_kind(d.device_kind)]
    if len(gpus) >= n:
        return _local_mesh(gpus[:n], sizes, names), f"{n} x {gpus[0].device_kind}"
    mesh = gpu_topology_mesh(cluster, names, sizes)
    how = _AHEAD_OF_TIME if gpus else _NO_GPU
    return mesh, f"{n} x {mesh.devices.flat[0].device_kind} ({how})"


_NO_GPU = "no GPU: meshplan's shipped description"
_AHEAD_OF_TIME = "compiled ahead of time"


def deviceless_gpu(target: str) -> bool:
    """Whether a compile's ``target`` text (:func:`target_mesh`'s, or a cached outcome's) is XLA:GPU compiling
    for GPUs it did not run on: no autotuning, so a run on the GPU may peak higher
    (:func:`~meshplan.pure.xla.deviceless_gpu_run_range`).

    Example:
      >>> deviceless_gpu("8 x NVIDIA H100 80GB HBM3 (no GPU: meshplan's shipped description)")
      True
      >>> deviceless_gpu("8 x NVIDIA H100 80GB HBM3"), deviceless_gpu("8 x XLA:CPU")
      (False, False)
    """
    return target.endswith((f"({_NO_GPU})", f"({_AHEAD_OF_TIME})"))


def _hybrid(devices: Any, dcn: Sequence[int] | None, hosts: int) -> Any:
    """``devices`` (a grid, hosts outermost in its flat order, as ``gpu_topology_mesh`` lays them) rearranged
    so that axis ``i`` spans ``dcn[i]`` hosts and ``size_i / dcn[i]`` devices of each: ``pp`` placed inside
    each node (ICI) stays inside it. The grid as it is where ``dcn`` does not split the hosts.

    Example:
      >>> import numpy as np
      >>> _hybrid(np.arange(8).reshape(2, 4), (1, 2), 2).tolist()  # pp=2 in each of 2 nodes: stage 0 = 0,1,4,5
      [[0, 1, 4, 5], [2, 3, 6, 7]]
      >>> _hybrid(np.arange(8).reshape(2, 4), (2, 1), 2).tolist()  # pp=2 over the network: a node each
      [[0, 1, 2, 3], [4, 5, 6, 7]]
    """
    import numpy as np

    sizes = tuple(devices.shape)
    if (dcn is None or len(dcn) != len(sizes) or math.prod(dcn) != hosts or hosts <= 1
            or any(s % d for s, d in zip(sizes, dcn, strict=True))):
        return devices
    ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
    # Device (host h, local l): h ravels the axes' DCN parts, l their ICI parts; axis i's index is d_i * ici_i + c_i.
    grid = np.asarray(devices).reshape(*dcn, *ici)
    order = [k for i in range(len(sizes)) for k in (i, len(sizes) + i)]
    return grid.transpose(order).reshape(sizes)


def _pipelined(job: CompileJob, mesh: Any) -> tuple[Any, tuple[Any, ...]]:
    """The pipelined step of ``job`` on ``mesh``: its jitted function and abstract arguments."""
    from meshplan.facade._pipeline_step import pipeline_step

    assert job.pipeline is not None
    m, v = job.pipeline
    if job.target != "cpu" and job.cluster.device.ici_scope != "slice":
        # gpu_topology_mesh orders the devices hosts outermost whatever the dcn shape; TPU topologies and
        # XLA:CPU take it as built (tpu_topology_mesh lays out the dcn shape itself).
        from jax.sharding import Mesh

        mesh = Mesh(_hybrid(mesh.devices, job.dcn_shape, job.cluster.num_nodes), mesh.axis_names,
                    axis_types=mesh.axis_types)
    step = pipeline_step(job.spec, mesh, batch=job.batch, seq=job.seq, micro_batches=m, repeats=v, plan=job.plan,
                         config=job.config)
    return step.fn, tuple(step.args)


def compile_job(job: CompileJob) -> CompileOutcome:
    """Build and compile ``job``'s reference step in this process; XLA's refusal of a too-big step is an
    outcome, any other failure raises.

    Example:
      >>> from meshplan.pure import get_preset, parse_cluster
      >>> from meshplan.facade._reference import ReferenceConfig
      >>> one_layer = dataclasses.replace(get_preset("gpt2").spec, num_layers=1, num_params=None)
      >>> job = CompileJob(one_layer, parse_cluster("1x8xH100"), ("dp",), (8,), None, None,
      ...                  batch=8, seq=32, config=ReferenceConfig(), target="cpu")
      >>> compile_job(job).memory.num_devices
      8
    """
    from meshplan.facade._compiled import compiled_memory
    from meshplan.facade._reference import reference_step
    from meshplan.pure.errors import CompiledOutOfMemoryError

    start = time.perf_counter()
    mesh, where = target_mesh(job.cluster, job.axis_names, job.axis_sizes, job.dcn_shape, job.target)
    if job.pipeline is not None:
        fn, args = _pipelined(job, mesh)
    else:
        ref = reference_step(job.spec, mesh, batch=job.batch, seq=job.seq, plan=job.plan, config=job.config)
        fn, args = ref.fn, tuple(ref.args)
    # XLA:CPU: less LLVM effort halves the compile; buffer assignment (the figures) comes before it.
    options = {"xla_backend_optimization_level": 0} if job.target == "cpu" else None
    try:
        mem = compiled_memory(fn, *args, compiler_options=options, top_buffers=_TOP_BUFFERS)
    except CompiledOutOfMemoryError as err:
        return CompileOutcome(where, None, oom=True, oom_required_bytes=err.required_bytes,
                              oom_available_bytes=err.available_bytes, error="does not fit (XLA ran out of memory)",
                              seconds=time.perf_counter() - start)
    return CompileOutcome(where, mem, seconds=time.perf_counter() - start)


def default_parallel() -> int:
    """Workers side by side: one per core this process may use, at least one.

    Example:
      >>> default_parallel() >= 1
      True
    """
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 << 30


_MIN_WORKER_MEMORY = 8 << 30  # jax and XLA reserve this much address space just to start


def default_memory_limit(parallel: int) -> int:
    """Address space per worker: this machine's memory shared by the workers, at least 8 GiB.

    Example:
      >>> default_memory_limit(1) >= 8 << 30
      True
    """
    return max(_MIN_WORKER_MEMORY, _physical_memory() // max(parallel, 1))


_MEMORY_WORDS = ("bad_alloc", "MemoryError", "annot allocate memory", "out of memory", "RESOURCE_EXHAUSTED")


def _reason(code: int, stderr: str, limit: int) -> str:
    """Why a worker gave no outcome, in a few words and the last line it wrote."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith(("W0000", "I0000"))]
    # An abort inside XLA ends with a stack trace; its message is the fatal log line ("F1127 12:00:00 ... ] ...").
    fatal = [ln.split("] ", 1)[-1] for ln in lines if re.match(r"F\d{4} ", ln)]
    last = (fatal[-1] if fatal else lines[-1] if lines else "no message").strip()[:200]
    bound = f"{limit / 2**30:.0f} GiB memory bound"
    if any(word in stderr for word in _MEMORY_WORDS):
        return f"the compile ran out of the worker's {bound} ({last})"
    if code < 0:  # killed by a signal: an abort inside XLA is often an allocation the bound refused
        return f"the worker died (signal {-code}; its {bound} may be too small): {last}"
    return f"the worker failed (exit {code}): {last}"


def _run_one(job: CompileJob, *, timeout_s: float, memory_limit: int, workdir: str, index: int) -> CompileOutcome:
    start = time.perf_counter()
    job_path, out_path = os.path.join(workdir, f"job{index}.pkl"), os.path.join(workdir, f"out{index}.pkl")
    with open(job_path, "wb") as f:
        pickle.dump(job, f)
    # The worker imports this very meshplan (an editable checkout or a source tree on sys.path included).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": path}
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several workers may load libtpu at once
    where = f"{job.cluster.num_devices} x {'XLA:CPU' if job.target == 'cpu' else job.cluster.device.name}"
    try:
        # The worker bounds its own address space first thing (no preexec_fn: forking a process that runs
        # jax's threads is unsafe, and without one subprocess spawns rather than forks).
        proc = subprocess.run([sys.executable, "-m", "meshplan.facade._worker", job_path, out_path,
                               str(memory_limit)], env=env, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return CompileOutcome(where, None, error=f"timed out after {timeout_s:g} s",
                              seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or not os.path.exists(out_path):
        return CompileOutcome(where, None, error=_reason(proc.returncode, proc.stderr, memory_limit), seconds=seconds)
    with open(out_path, "rb") as f:
        outcome = pickle.load(f)
    if isinstance(outcome, str):  # the worker caught an exception: its one-line reason
        return CompileOutcome(where, None, error=outcome, seconds=seconds)
    assert isinstance(outcome, CompileOutcome)
    return dataclasses.replace(outcome, seconds=seconds)


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
      executor: run the jobs there instead (a Dask cluster's executor: :mod:`meshplan.facade._executor`),
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
        from meshplan.facade._executor import run_on

        return run_on(executor, jobs, timeout_s=timeout_s, memory_limit=memory_limit, on_done=on_done)
    workers = max(1, min(parallel or default_parallel(), len(jobs)))
    limit = memory_limit or default_memory_limit(workers)
    results: list[CompileOutcome | None] = [None] * len(jobs)
    with tempfile.TemporaryDirectory(prefix="meshplan-worker-") as workdir, \
            concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_one, job, timeout_s=timeout_s, memory_limit=limit, workdir=workdir,
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
    # Run as the module's own name, so the outcome pickles as meshplan.facade._worker.CompileOutcome.
    from meshplan.facade import _worker

    sys.exit(_worker._main(sys.argv[1:]))
