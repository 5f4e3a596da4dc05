"""Compiles on a real Dask cluster: a scheduler and two worker processes started here on 127.0.0.1, each
compile still in a bounded subprocess of its worker, the outcomes back in this process (and cached here).

Bounded: every wait has a timeout, and the processes are shut down by the fixture whatever the test did.
Skips, saying why, where Dask ``distributed`` is not installed (``pip install 'meshplan[dask]'``; the ``test``
extra installs it)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="needs Dask distributed: pip install 'meshplan[dask]'")
# A local Dask cluster and its compiles: the second tier (pytest -m slow).
pytestmark = pytest.mark.slow

import meshplan  # noqa: E402
from meshplan.facade.verify._executor import dask_executor, resolve_executor  # noqa: E402
from meshplan.facade.verify._reference import ReferenceConfig  # noqa: E402
from meshplan.facade.verify._jobs import CompileJob  # noqa: E402
from meshplan.facade.verify._worker import run_jobs  # noqa: E402
from meshplan.pure import get_preset, parse_cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = dataclasses.replace(get_preset("gpt2").spec, name="gpt2-1layer", num_layers=1, num_params=None)


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", ""))
                                                       if p),
           "JAX_PLATFORMS": "cpu", "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    out = open(log, "w")  # noqa: SIM115 -- closed with the process in the fixture
    return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                            cwd=str(ROOT), start_new_session=True)


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """A scheduler and two single-thread worker processes on 127.0.0.1; yields the scheduler's address."""
    from distributed import Client

    tmp = tmp_path_factory.mktemp("dask")
    sched_file = tmp / "scheduler.json"
    procs = [_start(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(sched_file), "--idle-timeout", "900"], tmp / "scheduler.log")]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sched_file.exists(), (tmp / "scheduler.log").read_text()[-2000:]
        time.sleep(0.3)  # the file is written whole before the scheduler listens; give it a beat
        address = json.loads(sched_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:"), address
        for i in range(2):
            procs.append(_start(["distributed.cli.dask_worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
                                 "--nworkers", "1", "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}",
                                 "--memory-limit", "0", "--death-timeout", "60"], tmp / f"worker{i}.log"))
        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)


def _job(sizes: tuple[int, ...] = (8,)) -> CompileJob:
    return CompileJob(TINY, parse_cluster("1x8xH100"), ("dp",), sizes, None, None, batch=8, seq=64,
                      config=ReferenceConfig(), target="cpu")


def test_a_comparison_compiles_on_the_dask_workers_to_the_byte_of_a_local_run(dask_cluster, tmp_path, monkeypatch):
    from distributed import Client, get_task_stream

    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "cache"))
    kw = dict(seq=64, verify=True, top=1, target="cpu", prices="H100=2.0")
    with Client(dask_cluster, timeout=30) as watcher, get_task_stream(watcher) as tasks:
        remote = meshplan.compare_clusters(TINY, "1x8xH100,2x4xH100,1x4xH100", executor=dask_cluster, cache=True,
                                           stream=io.StringIO(), **kw)
    ran = [t for t in tasks.data if "run_remote" in t["key"]]
    assert len(ran) == 3, tasks.data  # one compile per cluster, each a task on the cluster
    assert len({t["worker"] for t in ran}) == 2  # both workers took jobs
    assert [o.status for o in remote.options] == ["exact"] * 3
    assert any("compiles ran on Dask at tcp://127.0.0.1:" in n for n in remote.notes)
    # The same comparison on local workers with no cache: XLA's figures are the same to the byte.
    local = meshplan.compare_clusters(TINY, "1x8xH100,2x4xH100,1x4xH100", cache=False, stream=io.StringIO(), **kw)
    assert [(o.cluster, o.mesh, o.memory_bytes) for o in remote.options] == [
        (o.cluster, o.mesh, o.memory_bytes) for o in local.options]
    # The remote outcomes were cached here: a re-run reads them and compiles nothing.
    again = io.StringIO()
    meshplan.compare_clusters(TINY, "1x8xH100,2x4xH100,1x4xH100", cache=True, stream=again, **kw)
    assert again.getvalue().count("(cached)") == 3 and "compiling" not in again.getvalue()


def test_a_job_that_fails_on_a_worker_marks_only_its_own_row(dask_cluster):
    executor = dask_executor(dask_cluster)
    bad = _job((4,))  # 4 devices for an 8-device cluster: the worker's compile raises
    outcomes = run_jobs([_job(), bad, _job()], executor=executor, timeout_s=300)
    assert [o.ok for o in outcomes] == [True, False, True]
    assert outcomes[1].error and "4" in outcomes[1].error
    assert outcomes[0].memory.peak_bytes == outcomes[2].memory.peak_bytes


def test_an_unreachable_executor_fails_fast_with_the_address_or_falls_back_when_asked():
    start = time.monotonic()
    with pytest.raises(meshplan.ExecutorError, match=r"tcp://127\.0\.0\.1:9.*within 2 s") as info:
        dask_executor("tcp://127.0.0.1:9", timeout_s=2)
    assert time.monotonic() - start < 30 and isinstance(info.value, RuntimeError)
    choice = resolve_executor("tcp://127.0.0.1:9", fallback=True, timeout_s=2)
    assert choice.executor is None and choice.note.startswith("fell back to local workers: cannot reach")
    with pytest.raises(meshplan.MeshplanTypeError):
        resolve_executor(42)


def test_plan_compiles_its_verified_meshes_on_the_cluster_too(dask_cluster, tmp_path, monkeypatch, capsys):
    from meshplan import cli

    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--seq", "64", "--verify", "1", "--target", "cpu",
            "--no-pipeline"]
    assert cli.main([*argv, "--executor", dask_cluster]) == 0
    assert "exact" in capsys.readouterr().out
    assert cli.main([*argv, "--executor", "tcp://127.0.0.1:9"]) == 1
    assert "cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'" in capsys.readouterr().err
