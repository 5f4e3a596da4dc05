"""Multi-host helpers: ``barrier_sync`` and what each host feeds.

These run under jax's own distributed runtime (``jax.distributed``); with one
process they are no-ops or return the whole picture, so the same training
script runs on one machine and on many.

``barrier_sync`` waits on the distributed runtime's coordination service,
not on a device collective: jax's public ``multihost_utils.sync_global_devices``
has no timeout (it blocked for over 75 s with a peer absent), whereas the
coordination service's barrier takes one and names the processes that did
not arrive. That barrier is only reachable through a private client object;
:func:`_wait_at_barrier` is the single place that touches it.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from meshplan.facade._context import require_mesh
from meshplan.facade._mesh import calculate_host_mesh_shape
from meshplan.pure._check import as_real
from meshplan.pure.errors import (
    BarrierTimeoutError,
    DistributedArgumentError,
    DistributedError,
)
from meshplan.pure.specs._batch import HostBatchSlice, host_batch_slices

__all__ = ["barrier_sync", "host_batch_slice", "host_mesh_shape"]

_BARRIER_PREFIX = "meshplan_barrier"

# Barrier names must match across processes, so they come from a counter that
# every process advances in the same order (one tick per barrier_sync call).
# The lock makes a tick atomic when several threads of one process sync.
_barrier_counter = itertools.count()
_barrier_lock = threading.Lock()


def _next_barrier_id() -> str:
    with _barrier_lock:
        return f"{_BARRIER_PREFIX}_{next(_barrier_counter)}"


def _wait_at_barrier(barrier_id: str, timeout_ms: int) -> None:
    """Waits at a coordination-service barrier through jax's distributed client.

    The client is private to jax (:func:`meshplan.facade._jax_internals.distributed_client` says why it
    is used and reads it), so a jax release that moves it breaks here, loudly.

    Raises:
      DistributedError: the client is gone from jax, or not connected.
      jax.errors.JaxRuntimeError: whatever the barrier itself reports.
    """
    from meshplan.facade._jax_internals import distributed_client

    try:
        client = distributed_client()
        if client is None:  # jax.distributed.initialize() has not run (or shut down)
            raise AttributeError("jax._src.distributed.global_state.client is None")
        wait = client.wait_at_barrier
    except (ImportError, AttributeError) as err:
        raise DistributedError(
            f"barrier_sync needs jax's distributed client (jax._src.distributed.global_state"
            f".client.wait_at_barrier), which jax {jax.__version__} does not provide ({err}). "
            "Use jax.experimental.multihost_utils.sync_global_devices (no timeout) or pin a "
            "jax version meshplan supports."
        ) from err
    wait(barrier_id, timeout_ms)


def _parse_missing(message: str) -> tuple[int, ...] | None:
    """Process indices JAX lists as not having arrived, or None if it lists none.

    jax 0.10 writes ``Some timed out task names:`` then one task per line,
    either a bare index or a task name ending in ``task:<index>``.
    """
    head, sep, tail = message.partition("timed out task names:")
    if not sep:
        return None
    found: list[int] = []
    for line in tail.strip().splitlines():
        match = re.fullmatch(r"\s*(?:.*task:)?(\d+)\s*", line)
        if match is None:
            break
        found.append(int(match.group(1)))
    return tuple(sorted(set(found))) or None


def _timeout_error(barrier_id: str, timeout: float, err: Exception) -> BarrierTimeoutError:
    message = str(err)
    missing = _parse_missing(message)
    arrived = re.search(r"reached the barrier:\s*(\d+)\s*/\s*(\d+)", message)
    who = (
        f"processes that did not arrive: {list(missing)}"
        if missing is not None
        else "jax did not say which processes did not arrive"
    )
    count = f"{arrived.group(1)} of {arrived.group(2)} processes arrived; " if arrived else ""
    return BarrierTimeoutError(
        f"barrier {barrier_id!r} timed out after timeout={timeout:g} s: {count}{who}. Every "
        "process must call barrier_sync() the same number of times, in the same order; if a "
        "process is just slow (compiling, loading a checkpoint), pass a larger timeout. "
        f"jax said: {message.strip()}"
    )


def barrier_sync(timeout: float = 200) -> None:
    """Waits until every process reaches this barrier, or raises after ``timeout``.

    Each call takes the next name from a per-process counter, so all
    processes must call ``barrier_sync`` the same number of times, in the same
    order (never under an ``if jax.process_index() == 0``). A process that
    arrives after the others have timed out gets the timeout error too, and
    the next barrier works again for everyone.

    If a peer *dies* rather than stalls, jax's distributed runtime aborts the
    surviving processes (SIGABRT once the heartbeat timeout passes) instead of
    raising here; no Python code can catch that.

    Args:
      timeout: seconds to wait for every process, > 0. Default 200.

    Returns:
      None.

    Raises:
      MeshplanTypeError: ``timeout`` is not a number.
      DistributedArgumentError: ``timeout`` <= 0 or not finite (a
        ``DistributedError`` and a ``ValueError``).
      DistributedError: several processes but
        ``jax.distributed`` is not initialised; or the barrier failed for a
        reason other than time (the message quotes jax).
      BarrierTimeoutError: not every process arrived in time (also a
        ``TimeoutError``); names the barrier, the timeout and the processes
        that did not arrive.

    Example:
      With one process it returns at once:

      >>> barrier_sync()
      >>> barrier_sync(timeout=5)
    """
    timeout = as_real(timeout, "timeout", error=DistributedArgumentError)
    if jax.process_count() == 1:
        return
    if not jax.distributed.is_initialized():
        raise DistributedError(
            f"barrier_sync: jax reports {jax.process_count()} processes but jax.distributed is "
            "not initialised, so there is no coordination service to meet at. Call "
            "jax.distributed.initialize(...) at start-up, before any other jax call."
        )
    barrier_id = _next_barrier_id()
    # jax takes a 32-bit millisecond count: longer waits (> 24 days) are clamped rather than overflowing.
    timeout_ms = min(max(1, math.ceil(timeout * 1000)), 2**31 - 1)
    try:
        _wait_at_barrier(barrier_id, timeout_ms)
    except jax.errors.JaxRuntimeError as err:
        message = str(err)
        if "DEADLINE_EXCEEDED" in message or "timed out" in message:
            raise _timeout_error(barrier_id, timeout, err) from err
        raise DistributedError(f"barrier {barrier_id!r} failed: {message.strip()}") from err


def _live_mesh(mesh: Mesh | None) -> Mesh:
    found = require_mesh(mesh, "host_batch_slice", concrete=True)
    assert isinstance(found, Mesh)  # concrete=True guarantees it
    return found


def host_batch_slice(
    global_batch_shape: Sequence[int],
    mesh: Mesh | None = None,
    batch_axis_names: Any = "data",
) -> HostBatchSlice:
    """The slice of a global batch that this process feeds.

    Load ``global_batch[s.slices]`` (or just ``s.shape`` rows of your data
    stream starting at ``s.start``) on each host and hand it to
    ``jax.make_array_from_process_local_data``. Checks every process's part,
    so all processes agree on the answer or fail with the same error.

    Args:
      global_batch_shape: shape of the global batch (leading dim = batch).
      mesh: the device mesh; ``None`` uses the mesh set with ``jax.set_mesh``.
      batch_axis_names: an axis name or tuple of names (splitting the leading
        dim, as ``MeshConfig.batch_axis_names``), or a PartitionSpec.

    Returns:
      A :class:`~meshplan.HostBatchSlice` for ``jax.process_index()``.

    Raises:
      MeshShapeError: ``mesh`` is None and no mesh is set.
      MeshplanTypeError: ``mesh`` is not a ``jax.sharding.Mesh``.
      SpecError, DeviceLayoutError: as :func:`meshplan.pure.host_batch_slices`.

    Example:
      >>> import jax
      >>> mesh = jax.make_mesh((4, 2), ("data", "model"))
      >>> host_batch_slice((16, 3), mesh).slices  # one process feeds everything
      (slice(0, 16, None), slice(0, 3, None))
    """
    mesh = _live_mesh(mesh)
    process_grid = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(mesh.devices)
    slices = host_batch_slices(global_batch_shape, mesh.axis_names, process_grid, batch_axis_names)
    me = jax.process_index()
    for s in slices:
        if s.process_index == me:
            return s
    raise DistributedError(
        f"process {me} owns no device of the mesh (mesh processes: "
        f"{[s.process_index for s in slices]}); it has nothing to feed. Build the mesh over "
        "every process's devices."
    )


def host_mesh_shape(global_mesh_shape: Sequence[int]) -> tuple[int, ...]:
    """This host's share of a global mesh shape, from the live process layout.

    :func:`meshplan.pure.per_host_mesh_shape` with
    ``total_devices=jax.local_device_count()`` and
    ``num_processes=jax.process_count()``.

    Args:
      global_mesh_shape: the global mesh shape (at most one ``-1``).

    Returns:
      The per-host mesh shape.

    Raises:
      MeshplanTypeError, MeshShapeError: as ``calculate_host_mesh_shape``.

    Example:
      >>> import jax
      >>> host_mesh_shape((2, -1)) == (2, jax.local_device_count() // 2)
      True
    """
    return calculate_host_mesh_shape(global_mesh_shape)
