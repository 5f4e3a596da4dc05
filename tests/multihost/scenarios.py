"""Scenarios the multi-process tests run in every worker (after jax.distributed starts).

Each returns a JSON-able dict; the tests assert on what every process
reports. Keep them deterministic: every process must make the same jax
calls in the same order, or collectives and barriers will not line up.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import meshplan
from meshplan.errors import BarrierTimeoutError, DistributedError


def _error_facts(err: BaseException) -> dict[str, Any]:
    return {
        "type": type(err).__name__,
        "message": str(err),
        "is_barrier_timeout": isinstance(err, BarrierTimeoutError),
        "is_timeout": isinstance(err, TimeoutError),
        "is_distributed_error": isinstance(err, DistributedError),
    }


# --- a real cross-process computation --------------------------------------------------------------


def cross_process_sum(rows: int = 16, cols: int = 6) -> dict[str, Any]:
    """Sums a global array built from per-device callbacks, and one fed per host."""
    mesh = jax.make_mesh((jax.device_count() // 2, 2), ("data", "model"))
    global_value = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)

    # (1) every device fills its own shard from the global value.
    sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
    x = jax.make_array_from_callback(global_value.shape, sharding, lambda idx: global_value[idx])
    weighted = jax.jit(lambda a: (a * jnp.arange(cols, dtype=a.dtype)).sum(),
                       out_shardings=NamedSharding(mesh, PartitionSpec()))(x)

    # (2) every host feeds only its slice, as a data loader would.
    s = meshplan.host_batch_slice(global_value.shape, mesh, "data")
    fed = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("data")), global_value[s.slices], global_value.shape
    )
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(fed)
    jax.block_until_ready((weighted, total))
    return {
        "weighted_sum": int(weighted.addressable_data(0)),
        "expected_weighted_sum": int((global_value * np.arange(cols)).sum()),
        "fed_sum": int(total.addressable_data(0)),
        "expected_fed_sum": int(global_value.sum()),
        "host_slice": [s.start, s.stop],
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "addressable_shards": len(x.addressable_shards),
    }


def host_helpers(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """host_mesh_shape and host_batch_slice with live defaults, for several meshes."""
    out = []
    for case in cases:
        shape = tuple(case["global_mesh_shape"])
        mesh = jax.make_mesh(shape, ("data", "model"))
        s = meshplan.host_batch_slice(tuple(case["batch_shape"]), mesh, case["batch_axis_names"])
        out.append({
            "host_mesh_shape": list(meshplan.host_mesh_shape(shape)),
            "host_slice": [list(s.start), list(s.stop)],
        })
    return {"cases": out}


# --- barriers --------------------------------------------------------------------------------------


def sum_then_barriers(rounds: int = 3) -> dict[str, Any]:
    """cross_process_sum, then ``rounds`` barriers every process attends."""
    report = cross_process_sum()
    for _ in range(rounds):
        meshplan.barrier_sync(timeout=60)
    report["barrier_rounds"] = rounds
    return report


def barrier_absent_peer(absent: int = 1, timeout: float = 3, late_by: float = 1.5) -> dict[str, Any]:
    """Process ``absent`` is busy past the timeout; everyone then meets twice more."""
    if jax.process_index() == absent:
        time.sleep(timeout + late_by)
    start = time.monotonic()
    try:
        meshplan.barrier_sync(timeout=timeout)
        first: dict[str, Any] = {"type": None}
    except BarrierTimeoutError as err:
        first = _error_facts(err)
    first["seconds"] = time.monotonic() - start
    later = []
    for _ in range(2):
        meshplan.barrier_sync(timeout=60)
        later.append("ok")
    return {"first": first, "later": later}


# --- failures (harness self-tests) -----------------------------------------------------------------


def kill_peer(victim: int = 1) -> dict[str, Any]:
    """``victim`` dies (SIGKILL) mid-run while the others keep running collectives."""
    mesh = jax.make_mesh((jax.device_count(),), ("all",))
    step = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))
    x = jax.make_array_from_callback(
        (mesh.size,), NamedSharding(mesh, PartitionSpec("all")),
        lambda idx: np.ones(mesh.size, np.int32)[idx],
    )
    jax.block_until_ready(step(x))
    meshplan.barrier_sync(timeout=60)
    if jax.process_index() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # a training loop; jax aborts this process once the peer is found dead
        jax.block_until_ready(step(x))
        time.sleep(0.05)


def raise_on(process: int = 1) -> dict[str, Any]:
    if jax.process_index() == process:
        raise ValueError(f"scenario failed on purpose in process {process}")
    return {}


def hang_on(process: int = 1) -> dict[str, Any]:
    if jax.process_index() == process:
        time.sleep(3600)
    return {}


# --- meshes across processes -------------------------------------------------------------------------


def _layout(mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """What a process sees of a mesh, plus proof that a computation on it works."""
    names = mesh.axis_names
    n = mesh.size
    sharding = NamedSharding(mesh, PartitionSpec(names))
    x = jax.make_array_from_callback((2 * n,), sharding, lambda idx: np.arange(2 * n, dtype=np.int32)[idx])
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
    return {
        "axis_names": list(names),
        "shape": [int(s) for s in mesh.devices.shape],
        "device_ids": np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices).tolist(),
        "process_grid": np.vectorize(lambda d: d.process_index, otypes=[int])(mesh.devices).tolist(),
        "axis_types": [str(t) for t in mesh.axis_types],
        "sum": int(total.addressable_data(0)),
        "expected_sum": n * (2 * n - 1),
    }


def mesh_layouts(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Builds each requested mesh (create_mesh or MeshConfig) and reports its layout.

    A request is ``{"label", "kind": "create_mesh" | "mesh_config", "kwargs"}``;
    ``mesh_config`` requests may add ``"reverse_devices": true`` to pass the
    devices to ``create_device_mesh`` in reverse order.
    """
    out: dict[str, Any] = {}
    for request in requests:
        kwargs = dict(request["kwargs"])
        for key in ("axis_dims", "axis_names", "dcn_mesh_dims", "mesh_shape", "mesh_axis_names"):
            if kwargs.get(key) is not None:
                kwargs[key] = tuple(kwargs[key])
        if request["kind"] == "create_mesh":
            mesh = meshplan.create_mesh(**kwargs)
            layout = _layout(mesh)
        else:
            config = meshplan.MeshConfig(**kwargs)
            devices = list(reversed(jax.devices())) if request.get("reverse_devices") else None
            mesh = config.create_device_mesh(devices)
            layout = _layout(mesh)
            s = meshplan.host_batch_slice((4 * mesh.size, 3), mesh, config.batch_axis_names)
            layout.update(hosts=config.hosts, host_id=config.host_id,
                          host_slice=[list(s.start), list(s.stop)])
        out[request["label"]] = layout
    return out
