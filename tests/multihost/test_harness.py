"""The harness itself: failures come back as clear, bounded test failures.

A peer that dies takes the survivors with it: jax's distributed runtime
notices the missing heartbeats and aborts them (SIGABRT); nothing raises in
Python. These tests pin that the harness reports such runs, and crashes and
hangs, by process, with the signal or exit code and the stderr tail.
"""

from __future__ import annotations

import pytest

from tests.multihost.harness import WorkerFailure

pytestmark = pytest.mark.multihost


@pytest.mark.parametrize("victim", [0, 1])
def test_a_peer_killed_mid_run_aborts_the_survivor_and_fails_clearly(multihost, victim):
    with pytest.raises(WorkerFailure) as info:
        multihost("kill_peer", 2, params={"victim": victim}, heartbeat_timeout_s=3, deadline_s=45)
    by_pid = {r.process_id: r for r in info.value.results}
    survivor = by_pid[1 - victim]
    assert by_pid[victim].returncode == -9 and not by_pid[victim].timed_out
    assert survivor.returncode == -6 and not survivor.timed_out  # SIGABRT from jax, not our deadline
    message = str(info.value)
    assert f"process {victim}: killed by signal SIGKILL (rc=-9)" in message
    assert f"process {1 - victim}: killed by signal SIGABRT (rc=-6)" in message
    assert "Terminating process because the JAX distributed service detected fatal errors" in message


def test_a_scenario_exception_names_the_process_and_the_traceback(multihost):
    with pytest.raises(WorkerFailure) as info:
        multihost("raise_on", 2, params={"process": 1}, heartbeat_timeout_s=3, deadline_s=45)
    message = str(info.value)
    assert "process 1: exited with rc=1" in message
    assert "ValueError: scenario failed on purpose in process 1" in message
    assert info.value.results[1].report["error_type"] == "ValueError"


def test_a_hung_run_is_killed_at_the_deadline(multihost):
    with pytest.raises(WorkerFailure) as info:
        multihost("hang_on", 2, params={"process": 1}, deadline_s=6)
    assert all(r.timed_out and r.returncode == -9 for r in info.value.results)
    assert "process 1: still running at the deadline; killed" in str(info.value)


def test_check_false_returns_the_failed_results_instead_of_raising(multihost):
    results = multihost("raise_on", 2, params={"process": 0}, heartbeat_timeout_s=3, check=False)
    assert results[0].returncode == 1 and not results[0].ok


def test_a_taken_port_is_retried_on_a_new_one(multihost, monkeypatch, tmp_path):
    import socket

    from tests.multihost import harness

    with socket.socket() as squatter:  # listening, without SO_REUSEPORT: grpc cannot bind
        squatter.bind((harness.HOST, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        real_free_port = harness.free_port
        monkeypatch.setattr(harness, "free_port", lambda: next(picks, None) or real_free_port())
        results = multihost("raise_on", 2, params={"process": -1})
    assert all(r.ok for r in results)
    first_try = (tmp_path / "run-0" / "attempt-0" / "stderr-0.txt").read_text()
    assert any(s in first_try for s in harness.PORT_TAKEN), first_try


def test_process_0_failing_before_its_port_answers_is_reported_without_starting_the_rest(multihost):
    # A heartbeat timeout jax cannot take makes initialize fail in process 0
    # before its coordination service listens.
    with pytest.raises(WorkerFailure) as info:
        multihost("raise_on", 2, heartbeat_timeout_s="soon", deadline_s=30)
    message = str(info.value)
    assert "process 0: exited with rc=1" in message
    assert "process 1: never started" in message
    assert "TypeError" in message
