"""One compile job in a fresh worker subprocess: its memory bound, its timeout, and why it gave no outcome.

What the local pool (:func:`~meshplan.facade.verify._worker.run_jobs`) and a Dask worker
(:func:`~meshplan.facade.verify._executor.run_remote`) both do with a job: pickle it to a private temporary
directory, run ``python -m meshplan.facade.verify._worker`` on it with ``JAX_PLATFORMS=cpu``, an address-space
limit and a wall-clock timeout, and read the pickled outcome back (or say in a few words why there is none).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from meshplan.pure.verify import CompileOutcome

__all__ = ["default_memory_limit", "default_parallel", "run_one"]


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


def run_one(job: Any, *, timeout_s: float, memory_limit: int, workdir: str, index: int) -> CompileOutcome:
    start = time.perf_counter()
    job_path, out_path = os.path.join(workdir, f"job{index}.pkl"), os.path.join(workdir, f"out{index}.pkl")
    with open(job_path, "wb") as f:
        pickle.dump(job, f)
    # The worker imports this very meshplan (an editable checkout or a source tree on sys.path included).
    root = str(Path(__file__).resolve().parents[3])  # the directory holding the meshplan package
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": path}
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several workers may load libtpu at once
    where = f"{job.cluster.num_devices} x {'XLA:CPU' if job.target == 'cpu' else job.cluster.device.name}"
    try:
        # The worker bounds its own address space first thing (no preexec_fn: forking a process that runs
        # jax's threads is unsafe, and without one subprocess spawns rather than forks).
        proc = subprocess.run([sys.executable, "-m", "meshplan.facade.verify._worker", job_path, out_path,
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
