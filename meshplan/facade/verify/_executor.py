"""Where the compile jobs run: the local worker pool, or a Dask ``distributed`` cluster given by address.

``executor=None`` keeps today's pool (:func:`meshplan.facade.verify._worker.run_jobs`: one
subprocess per job on this machine). ``executor="tcp://scheduler:8786"`` (or a
``concurrent.futures.Executor`` you built) sends each job to a Dask worker, which runs it
exactly as the local pool does: in a fresh ``python -m meshplan.facade.verify._worker``
subprocess of *its* machine, under an address-space limit and a timeout, so a compile
that crashes, runs out of memory or hangs gives its row a reason and the worker lives
on. Outcomes come back to the caller, which caches them
(:mod:`meshplan.facade.verify._cache`), so the cache stays where the plan is read.

Dask ships a job as a pickle and the function by reference (its module and name), so
each worker's environment must hold the same meshplan and the target's compiler (jax,
libtpu or the CUDA plugin) -- install ``meshplan[tpu]`` / ``meshplan[gpu]`` there as here
(``docs/compare.md`` says why Dask rather than Ray). An address that cannot be reached
fails at once with the address and Dask's own message (:class:`~meshplan.errors.ExecutorError`);
``fallback=True`` runs the jobs locally instead, and the caller's note says so.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from meshplan.pure.errors import ExecutorError, MeshplanTypeError

__all__ = ["ExecutorChoice", "dask_executor", "resolve_executor", "run_on", "run_remote"]

CONNECT_TIMEOUT_S = 10.0
"""Seconds to reach a Dask scheduler before giving up (an unreachable address fails fast)."""

_INSTALL = "pip install 'meshplan[dask]' (Dask distributed) here and on every worker"


def dask_executor(address: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> concurrent.futures.Executor:
    """A ``concurrent.futures.Executor`` over the Dask cluster at ``address`` (``Client(address).get_executor()``).

    Args:
      address: the scheduler, e.g. ``"tcp://10.0.0.5:8786"`` or ``"127.0.0.1:8786"``.
      timeout_s: the most to wait for the scheduler.

    Returns:
      The executor; its client stays open for the process (``executor.shutdown()`` does not close it).

    Raises:
      ExecutorError: Dask is not installed, or the scheduler cannot be reached (the message names the
        address and quotes Dask's error).
      MeshplanTypeError: ``address`` is not a non-empty str.

    Example:
      >>> dask_executor("127.0.0.1:1", timeout_s=0.5)  # doctest: +SKIP
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.ExecutorError: cannot reach the Dask scheduler at '127.0.0.1:1' ...
    """
    if not isinstance(address, str) or not address.strip():
        raise MeshplanTypeError(f"executor address={address!r:.60} must be a str such as 'tcp://host:8786'.")
    try:
        from distributed import Client
    except ImportError:
        raise ExecutorError(f"--executor {address}: Dask distributed is not installed; {_INSTALL}.") from None
    try:
        client = Client(address.strip(), timeout=timeout_s, set_as_default=False)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError, ValueError) as err:  # Dask's connect errors: OSError subclasses, or ValueError
        raise ExecutorError(f"cannot reach the Dask scheduler at {address.strip()!r} within {timeout_s:g} s: "
                            f"{type(err).__name__}: {str(err).strip()[:300]}") from None
    executor: concurrent.futures.Executor = client.get_executor()  # type: ignore[no-untyped-call]
    executor._meshplan_client = client  # type: ignore[attr-defined]  # keeps the client alive with its executor
    return executor


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutorChoice:
    """Which executor a run uses, and the line that says so.

    Attributes:
      executor: ``None`` (this machine's worker pool) or the remote executor.
      where: ``"local workers"`` or ``"Dask at <address>"``.
      note: set when the address was unreachable and the run fell back to local workers.
    """

    executor: concurrent.futures.Executor | None
    where: str
    note: str = ""


def resolve_executor(executor: Any, *, fallback: bool = False,
                     timeout_s: float = CONNECT_TIMEOUT_S) -> ExecutorChoice:
    """``executor=`` as given (``None``, an address, or an Executor) turned into an :class:`ExecutorChoice`.

    Args:
      executor: ``None``, a Dask scheduler address, or a ``concurrent.futures.Executor``.
      fallback: with an unreachable address, run on local workers (and say so) instead of failing.
      timeout_s: the most to wait for the scheduler.

    Raises:
      ExecutorError: an unreachable address without ``fallback``.
      MeshplanTypeError: anything else.

    Example:
      >>> resolve_executor(None).where
      'local workers'
    """
    if executor is None:
        return ExecutorChoice(None, "local workers")
    if isinstance(executor, concurrent.futures.Executor):
        return ExecutorChoice(executor, f"{type(executor).__name__}")
    if not isinstance(executor, str):
        raise MeshplanTypeError(f"executor={executor!r:.60} must be None, a Dask scheduler address such as "
                                "'tcp://host:8786', or a concurrent.futures.Executor.")
    try:
        return ExecutorChoice(dask_executor(executor, timeout_s=timeout_s), f"Dask at {executor.strip()}")
    except ExecutorError as err:
        if not fallback:
            raise
        return ExecutorChoice(None, "local workers", f"fell back to local workers: {err}")


def run_remote(job: Any, timeout_s: float, memory_limit: int | None) -> Any:
    """Run one compile job on this (worker) machine exactly as the local pool does: a subprocess under a
    memory limit and a timeout. What a Dask worker executes; returns a
    :class:`~meshplan.pure.verify.CompileOutcome` (a crash or timeout is an outcome, never an exception).

    Example:
      >>> run_remote  # doctest: +ELLIPSIS
      <function run_remote at ...>
    """
    from meshplan.facade.verify._subprocess import default_memory_limit, default_parallel, run_one

    limit = memory_limit or default_memory_limit(default_parallel())
    with tempfile.TemporaryDirectory(prefix="meshplan-remote-") as workdir:
        return run_one(job, timeout_s=timeout_s, memory_limit=limit, workdir=workdir, index=os.getpid())


def run_on(executor: concurrent.futures.Executor, jobs: Sequence[Any], *, timeout_s: float,
           memory_limit: int | None,
           on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Compile ``jobs`` on ``executor`` (one :func:`run_remote` each); outcomes in the jobs' order.

    A job whose future fails (the worker process died, the cluster lost it) or that returns nothing within
    the time all jobs could take one after another gets an outcome with the reason; the others keep theirs.

    Example:
      >>> with concurrent.futures.ThreadPoolExecutor(1) as pool:
      ...     run_on(pool, [], timeout_s=1.0, memory_limit=None)
      []
    """
    from meshplan.pure.verify import CompileOutcome

    if not jobs:
        return []
    start = time.perf_counter()
    futures = {executor.submit(run_remote, job, timeout_s, memory_limit): i for i, job in enumerate(jobs)}
    results: list[Any] = [None] * len(jobs)
    deadline = timeout_s * len(jobs) + 60.0  # every job in turn on one worker, plus the transfers

    def where(i: int) -> str:
        job = jobs[i]
        return f"{job.cluster.num_devices} x {'XLA:CPU' if job.target == 'cpu' else job.cluster.device.name}"

    try:
        for fut in concurrent.futures.as_completed(futures, timeout=deadline):
            i = futures[fut]
            try:
                outcome = fut.result()
            except Exception as err:  # noqa: BLE001 -- a lost job is its row's reason, never the plan's end
                outcome = CompileOutcome(where(i), None, error=f"the executor lost the job: {type(err).__name__}: "
                                         f"{str(err).strip()[:200]}", seconds=time.perf_counter() - start)
            results[i] = outcome
            if on_done is not None:
                on_done(i, outcome)
    except concurrent.futures.TimeoutError:
        for fut, i in futures.items():
            if results[i] is None:
                fut.cancel()
                results[i] = CompileOutcome(where(i), None, error=f"the executor returned nothing in {deadline:.0f} s",
                                            seconds=time.perf_counter() - start)
                if on_done is not None:
                    on_done(i, results[i])
    return results
