"""Runs N real jax processes on 127.0.0.1 and collects what each reports.

A *scenario* is a function ``"module:function"`` that :mod:`worker` calls in
every process after ``jax.distributed.initialize``; it returns a JSON-able
dict, which the worker writes to a file (gloo prints to stdout without a
newline, so stdout is not a safe channel). :func:`run_workers` returns one
:class:`WorkerResult` per process, or raises :class:`WorkerFailure` naming
each process that failed, how (exit code or signal), and its stderr tail.

Nothing here can hang: every worker runs in its own session (process
group) and is killed with ``killpg`` at the deadline, and again on the way
out whatever happens.

Why the start-up dance: process 0 hosts the coordination service. Starting
the other processes only once its port answers avoids their ~1 s reconnect
back-off. The port is picked free on 127.0.0.1 just before, so another
program can take it in between; process 0 then fails to bind ("Failed to
start RPC server" / "Failed to add port") and the run is retried on a new
port.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"  # the only address workers ever bind or connect to
PORT_TAKEN = ("Failed to start RPC server", "Failed to add port")
PORT_ATTEMPTS = 3
TAIL_LINES = 25


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """What one worker process did.

    Attributes:
      process_id: its jax process index.
      returncode: exit status; negative = killed by that signal.
      report: the dict its scenario returned (None if it wrote none).
      stderr_tail: the last lines of its stderr, native stack frames dropped.
      timed_out: it was still running at the deadline and was killed.
      started: False if it was never launched (process 0 failed first).
    """

    process_id: int
    returncode: int
    report: dict[str, Any] | None
    stderr_tail: str
    timed_out: bool
    started: bool = True

    @property
    def ok(self) -> bool:
        return self.started and self.returncode == 0 and self.report is not None and not self.timed_out

    def describe(self) -> str:
        """One line: how this process ended."""
        if not self.started:
            how = "never started (process 0 failed or the deadline passed before its port answered)"
        elif self.timed_out:
            how = f"still running at the deadline; killed (rc={self.returncode})"
        elif self.returncode < 0:
            how = f"killed by signal {signal_name(-self.returncode)} (rc={self.returncode})"
        elif self.returncode != 0:
            how = f"exited with rc={self.returncode}"
        elif self.report is None:
            how = "exited with rc=0 but wrote no report"
        else:
            how = "ok"
        return f"process {self.process_id}: {how}"


class WorkerFailure(AssertionError):
    """A multi-process run failed; the message names each failed process."""

    def __init__(self, message: str, results: list[WorkerResult]) -> None:
        super().__init__(message)
        self.results = results


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


def _worker_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    # The parent's conftest forces 8 CPU devices through XLA_FLAGS; each worker
    # sets its own count, so drop the inherited flag.
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = flags.strip()
    # Proxy variables can route grpc's 127.0.0.1 connections through a proxy
    # (jax warns they make initialize hang); inherited jax.distributed
    # settings must not override the test's.
    for key in list(env):
        if "_proxy" in key.lower() or key in ("JAX_LOCAL_DEVICE_IDS", "JAX_COORDINATOR_ADDRESS",
                                              "JAX_COORDINATOR_BIND_ADDRESS"):
            del env[key]
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _tail(path: Path) -> str:
    """Last lines of a log, without glog's native stack frames (``@ 0x...``)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    lines = [ln for ln in text.splitlines() if not re.match(r"\s+@\s+0x[0-9a-f]+", ln)]
    return "\n".join(lines[-TAIL_LINES:])


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's whole process group (it leads its own session)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class _Attempt:
    """One try at a run, on one port."""

    def __init__(self, workdir: Path, config: dict[str, Any], env: dict[str, str]) -> None:
        self.workdir = workdir
        self.config = config
        self.env = env
        self.procs: list[subprocess.Popen] = []
        self.logs: list[tuple[Path, Path]] = []
        self.timed_out: set[int] = set()

    def _start(self, pid: int) -> None:
        out = self.workdir / f"stdout-{pid}.txt"
        err = self.workdir / f"stderr-{pid}.txt"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.multihost.worker", str(self.workdir / "config.json"),
                 str(pid)],
                cwd=REPO_ROOT, env=self.env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.logs.append((out, err))

    def port_taken(self) -> bool:
        """Process 0 failed because its port was taken (retry on another)."""
        if not self.procs or self.procs[0].poll() in (None, 0):
            return False
        text = self.logs[0][1].read_text(errors="replace")
        return any(s in text for s in PORT_TAKEN)

    def run(self, deadline: float) -> None:
        n = self.config["num_processes"]
        port = self.config["port"]
        (self.workdir / "config.json").write_text(json.dumps(self.config))
        self._start(0)
        answered = False
        while not answered and time.monotonic() < deadline and self.procs[0].poll() is None:
            answered = _port_answers(port)
            if not answered:
                time.sleep(0.02)
        if answered:
            for pid in range(1, n):
                self._start(pid)
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            if self.port_taken():
                break
            time.sleep(0.02)
        for pid, proc in enumerate(self.procs):
            if proc.poll() is None:
                self.timed_out.add(pid)

    def kill_all(self) -> None:
        # Process 0 last: while its coordination service lives, the others
        # do not start printing "leader died" noise into their logs.
        for proc in reversed(self.procs):
            _kill_group(proc)


def run_workers(
    scenario: str,
    num_processes: int,
    *,
    workdir: Path,
    devices_per_process: int = 4,
    params: dict[str, Any] | None = None,
    deadline_s: float = 60.0,
    heartbeat_timeout_s: int = 10,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> list[WorkerResult]:
    """Runs ``scenario`` in ``num_processes`` jax processes and collects their reports.

    Args:
      scenario: ``"module:function"``; the function gets ``**params`` and
        returns a JSON-able dict.
      num_processes: how many processes (each one jax "host").
      workdir: an empty directory for config, reports and logs.
      devices_per_process: CPU devices in each process.
      params: keyword arguments for the scenario (JSON-able).
      deadline_s: wall-clock bound for the whole run; stragglers are killed.
      heartbeat_timeout_s: jax's heartbeat timeout (how soon a dead peer is noticed).
      env: extra environment variables for the workers.
      check: raise :class:`WorkerFailure` unless every process succeeded.

    Returns:
      One :class:`WorkerResult` per process, by process index.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    worker_env = _worker_env(env)
    started = time.monotonic()
    deadline = started + deadline_s
    for attempt in range(PORT_ATTEMPTS):
        run_dir = workdir / f"attempt-{attempt}"
        run_dir.mkdir()
        config = {
            "scenario": scenario,
            "num_processes": num_processes,
            "devices_per_process": devices_per_process,
            "port": free_port(),
            "heartbeat_timeout_s": heartbeat_timeout_s,
            "params": params or {},
            "report_dir": str(run_dir),
            "parent_pid": os.getpid(),
        }
        run = _Attempt(run_dir, config, worker_env)
        try:
            run.run(deadline)
        finally:
            run.kill_all()
        if not run.port_taken():
            break
    results = []
    for pid, proc in enumerate(run.procs):
        report_path = run_dir / f"report-{pid}.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else None
        results.append(
            WorkerResult(
                process_id=pid,
                returncode=proc.returncode,
                report=report,
                stderr_tail=_tail(run.logs[pid][1]),
                timed_out=pid in run.timed_out,
            )
        )
    if len(results) < num_processes:
        results += [
            WorkerResult(pid, 0, None, "", timed_out=False, started=False)
            for pid in range(len(results), num_processes)
        ]
    if check and not all(r.ok for r in results):
        raise WorkerFailure(failure_message(scenario, results, time.monotonic() - started), results)
    return results


def failure_message(scenario: str, results: list[WorkerResult], elapsed: float) -> str:
    """Names every failed process, how it ended, and its stderr tail."""
    lines = [f"multi-process scenario {scenario!r} failed ({len(results)} processes, {elapsed:.1f} s):"]
    lines += [f"  {r.describe()}" for r in results]
    for r in results:
        if r.started and not r.ok:
            error = (r.report or {}).get("error")
            if error:
                lines.append(f"--- process {r.process_id} error ---\n{error}")
            lines.append(f"--- process {r.process_id} stderr (last {TAIL_LINES} lines) ---")
            lines.append(r.stderr_tail or "(empty)")
    return "\n".join(lines)
