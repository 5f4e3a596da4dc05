"""The multi-host helpers in one process (8 CPU devices): no-ops, defaults, error paths.

The real multi-process behaviour is in test_distributed.py; here are the
paths that one process can reach, including the error translation of
barrier_sync fed with the exact message jax 0.10 gives on a barrier timeout.
"""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AbstractMesh

import meshplan
from meshplan.errors import (
    BarrierTimeoutError,
    DistributedError,
    MeshplanTypeError,
    MeshShapeError,
)
from meshplan.facade import _distributed

# Verbatim from a 2-process run of jax 0.10.2 where process 1 came late.
JAX_BARRIER_TIMEOUT = (
    "DEADLINE_EXCEEDED: Barrier timed out. Id: meshplan_barrier_0::0. This usually happens "
    "because a task triggered the barrier too early or too slowly. Please look at the task logs "
    "(both timed out and first task) to debug further.\n# of tasks that reached the barrier: "
    "1/2.\nThe first task at the barrier: 0. Some timed out task names:\n1\n\n\nRPC: "
    "/xla.coordination.CoordinationService/Barrier "
    "[type.googleapis.com/tensorflow.CoordinationServiceError='']"
)


def test_barrier_sync_is_a_no_op_with_one_process():
    assert jax.process_count() == 1
    assert meshplan.barrier_sync() is None
    assert meshplan.barrier_sync(timeout=0.001) is None


@pytest.mark.parametrize("timeout, error", [
    (0, DistributedError), (-1, DistributedError), (float("inf"), DistributedError),
    (float("nan"), DistributedError), ("10", MeshplanTypeError), (True, MeshplanTypeError),
])
def test_barrier_sync_refuses_bad_timeouts(timeout, error):
    with pytest.raises(error, match="timeout="):
        meshplan.barrier_sync(timeout=timeout)


@pytest.fixture
def pretend_two_processes(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)


def test_barrier_sync_without_jax_distributed_says_to_initialize_it(pretend_two_processes):
    with pytest.raises(DistributedError, match=r"jax.distributed is not initialised.*initialize"):
        meshplan.barrier_sync()


def _wait_raising(message):
    def wait(barrier_id, timeout_ms):
        raise jax.errors.JaxRuntimeError(message.replace("meshplan_barrier_0", barrier_id))
    return wait


def test_barrier_timeout_names_barrier_timeout_and_missing_processes(pretend_two_processes, monkeypatch):
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(_distributed, "_wait_at_barrier", _wait_raising(JAX_BARRIER_TIMEOUT))
    with pytest.raises(BarrierTimeoutError) as info:
        meshplan.barrier_sync(timeout=3)
    message = str(info.value)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, DistributedError)
    assert "timeout=3 s" in message
    assert "1 of 2 processes arrived" in message
    assert "processes that did not arrive: [1]" in message
    assert "jax said: DEADLINE_EXCEEDED" in message
    assert isinstance(info.value.__cause__, jax.errors.JaxRuntimeError)


def test_barrier_names_are_unique_and_increasing(pretend_two_processes, monkeypatch):
    seen = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(_distributed, "_wait_at_barrier", lambda b, t: seen.append((b, t)))
    meshplan.barrier_sync(timeout=1.5)
    meshplan.barrier_sync()
    (first, ms1), (second, ms2) = seen
    assert first != second and first.startswith("meshplan_barrier_")
    assert int(second.rsplit("_", 1)[1]) == int(first.rsplit("_", 1)[1]) + 1
    assert (ms1, ms2) == (1500, 200_000)


def test_barrier_names_stay_unique_across_threads():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        names = list(pool.map(lambda _: _distributed._next_barrier_id(), range(400)))
    assert len(set(names)) == 400


def test_barrier_timeout_without_a_missing_list_quotes_jax(pretend_two_processes, monkeypatch):
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(_distributed, "_wait_at_barrier", _wait_raising("DEADLINE_EXCEEDED: late"))
    with pytest.raises(BarrierTimeoutError, match="did not say which .* jax said: DEADLINE_EXCEEDED: late"):
        meshplan.barrier_sync(timeout=1)


def test_other_barrier_failures_are_distributed_errors_not_timeouts(pretend_two_processes, monkeypatch):
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(_distributed, "_wait_at_barrier", _wait_raising("FAILED_PRECONDITION: x"))
    with pytest.raises(DistributedError, match="failed: FAILED_PRECONDITION: x") as info:
        meshplan.barrier_sync(timeout=1)
    assert not isinstance(info.value, TimeoutError)


def test_a_jax_without_the_private_client_gives_a_clear_error(monkeypatch):
    from jax._src import distributed as jax_distributed

    monkeypatch.setattr(jax_distributed, "global_state", object())
    with pytest.raises(DistributedError, match=r"global_state.client.wait_at_barrier.*does not provide"):
        _distributed._wait_at_barrier("meshplan_barrier_x", 1000)


def test_host_batch_slice_in_one_process_is_the_whole_batch():
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    s = meshplan.host_batch_slice((16, 3), mesh)
    assert (s.process_index, s.start, s.stop) == (0, (0, 0), (16, 3))


def test_host_batch_slice_uses_the_mesh_set_with_jax_set_mesh():
    mesh = jax.make_mesh((8,), ("batch",))
    with jax.set_mesh(mesh):
        assert meshplan.host_batch_slice((8,), batch_axis_names="batch").stop == (8,)


def test_host_batch_slice_needs_a_concrete_mesh():
    with pytest.raises(MeshShapeError, match="no mesh is set"):
        meshplan.host_batch_slice((8,))
    with pytest.raises(MeshplanTypeError, match="AbstractMesh"):
        meshplan.host_batch_slice((8,), AbstractMesh((8,), ("data",)))


def test_host_mesh_shape_fills_in_the_live_device_and_process_counts():
    assert meshplan.host_mesh_shape((2, -1)) == (2, 4)
    assert meshplan.host_mesh_shape((8, 1)) == (8, 1)
    with pytest.raises(MeshShapeError):
        meshplan.host_mesh_shape((3, 3))
