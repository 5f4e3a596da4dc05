"""Fixtures for tests that run real jax.distributed processes on 127.0.0.1.

``multihost(scenario, num_processes, **options)`` runs a scenario from
:mod:`tests.multihost.scenarios` (or any ``"module:function"``) in that many
processes and returns one :class:`~tests.multihost.harness.WorkerResult` per
process; the options are those of :func:`tests.multihost.harness.run_workers`
(``devices_per_process``, ``params``, ``deadline_s``, ``heartbeat_timeout_s``,
``check``). A failed process fails the test with its exit code or signal and
its stderr tail.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.harness import WorkerResult, run_workers

Runner = Callable[..., list[WorkerResult]]


@pytest.fixture
def multihost(tmp_path: Path) -> Runner:
    """Runs a scenario in N processes; each call gets its own work directory."""
    calls = itertools.count()

    def run(scenario: str, num_processes: int, **options: Any) -> list[WorkerResult]:
        if ":" not in scenario:
            scenario = f"tests.multihost.scenarios:{scenario}"
        workdir = tmp_path / f"run-{next(calls)}"
        return run_workers(scenario, num_processes, workdir=workdir, **options)

    return run
