"""One process of a multi-process test: ``python -m tests.multihost.worker CONFIG PID``.

Order matters here:

1. ``JAX_PLATFORMS=cpu`` and the device count are set before jax touches a
   backend, and ``jax.distributed.initialize`` is the first jax call, on
   127.0.0.1 only, with short timeouts so a broken run fails in seconds.
2. The scenario runs and its report is written to a JSON file.
3. The worker ends with a collective over every device that it waits on
   shard by shard, then ``jax.distributed.shutdown()``, then ``os._exit``:
   without the collective and the hard exit, about 5% of runs hang at
   interpreter exit in the CPU client's destructor.

An uncaught exception is written to the report as ``error`` and the process
exits with rc=1 at once (no final collective: peers fail on their own).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any


def _write_report(report_dir: Path, pid: int, report: dict[str, Any]) -> None:
    path = report_dir / f"report-{pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True))
    os.replace(tmp, path)  # the harness never sees a half-written report


def _die_with_report(report_dir: Path, pid: int, exc_type, exc, tb) -> None:
    """sys.excepthook: record the traceback, print it, and exit rc=1 now."""
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write(text)
    sys.stderr.flush()
    _write_report(report_dir, pid, {"error": text, "error_type": exc_type.__name__})
    os._exit(1)


def _final_collective() -> None:
    """A jitted sum over every device of every process, waited on per shard."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("all",))
    n = mesh.size
    ones = jax.make_array_from_callback(
        (n,), NamedSharding(mesh, PartitionSpec("all")), lambda idx: np.ones(n, np.int32)[idx]
    )
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(ones)
    for shard in total.addressable_shards:
        shard.data.block_until_ready()
    if int(total.addressable_data(0)) != n:
        raise RuntimeError(f"final collective summed to {int(total.addressable_data(0))}, not {n}")


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this worker if the test process dies first.

    The harness kills its workers on every normal path; this covers the test
    process itself being killed (Ctrl-C twice, a CI timeout), so no worker
    outlives it. Elsewhere than Linux it is skipped.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def main(config_path: str, pid: int) -> None:
    config = json.loads(Path(config_path).read_text())
    _die_with_parent(config["parent_pid"])
    report_dir = Path(config["report_dir"])
    sys.excepthook = lambda *exc: _die_with_report(report_dir, pid, *exc)

    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_num_cpu_devices", config["devices_per_process"])
    address = f"127.0.0.1:{config['port']}"
    jax.distributed.initialize(
        coordinator_address=address,
        coordinator_bind_address=address,
        num_processes=config["num_processes"],
        process_id=pid,
        cluster_detection_method="deactivate",
        initialization_timeout=30,
        heartbeat_timeout_seconds=config["heartbeat_timeout_s"],
        shutdown_timeout_seconds=30,
    )

    module_name, _, function_name = config["scenario"].partition(":")
    scenario = getattr(importlib.import_module(module_name), function_name)
    report = scenario(**config["params"])
    _write_report(report_dir, pid, {"process_index": jax.process_index(), **report})

    _final_collective()
    jax.distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
