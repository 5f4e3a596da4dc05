"""Real multi-process jax on 127.0.0.1: computations, barriers, host helpers.

Every test asserts on what *every* process reports.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multihost


@pytest.mark.parametrize("num_processes", [2, 4])
def test_jitted_sum_over_a_global_array_is_right_on_every_process(multihost, num_processes):
    reports = [r.report for r in multihost("cross_process_sum", num_processes)]
    for pid, report in enumerate(reports):
        assert report["process_index"] == pid
        assert report["process_count"] == num_processes
        assert report["device_count"] == 4 * num_processes
        assert report["addressable_shards"] == 4
        assert report["weighted_sum"] == report["expected_weighted_sum"]
        assert report["fed_sum"] == report["expected_fed_sum"]
    # Fed via host_batch_slice: host p loads rows [p*k, (p+1)*k) of 16.
    k = 16 // num_processes
    assert [r["host_slice"] for r in reports] == [[[p * k, 0], [(p + 1) * k, 6]] for p in range(num_processes)]


@pytest.mark.parametrize("num_processes", [2, 4])
def test_barrier_sync_passes_when_every_process_arrives(multihost, num_processes):
    reports = [r.report for r in multihost("barrier_all_arrive", num_processes)]
    assert [r["rounds"] for r in reports] == [3] * num_processes


def test_barrier_with_a_process_absent_times_out_naming_it_and_later_barriers_work(multihost):
    reports = [r.report for r in multihost("barrier_absent_peer", 2, params={"absent": 1, "timeout": 3})]
    present, absent = reports[0]["first"], reports[1]["first"]
    assert present["is_barrier_timeout"] and present["is_timeout"] and present["is_distributed_error"]
    assert "'meshplan_barrier_0'" in present["message"]
    assert "timeout=3 s" in present["message"]
    assert "processes that did not arrive: [1]" in present["message"]
    # It waited for the timeout it was given, not the 200 s default.
    assert 2.5 <= present["seconds"] < 60
    # The late process finds the barrier already failed: the same error, at once.
    assert absent["is_barrier_timeout"]
    assert [r["later"] for r in reports] == [["ok", "ok"]] * 2


@pytest.mark.parametrize(
    "mesh_shape, batch_axis_names, host_mesh_shape, slices",
    [
        # process split on "data" (outermost): each host feeds half the batch.
        ((2, 4), "data", [1, 4], [[[0, 0], [4, 5]], [[4, 0], [8, 5]]]),
        # batch over "model", which lies inside each host: both feed all of it.
        ((2, 4), "model", [1, 4], [[[0, 0], [8, 5]], [[0, 0], [8, 5]]]),
        # make_mesh fills (4, 2) in process order: host 0 holds rows 0-1.
        ((4, 2), ["data", "model"], [2, 2], [[[0, 0], [4, 5]], [[4, 0], [8, 5]]]),
    ],
)
def test_host_helpers_on_two_processes(multihost, mesh_shape, batch_axis_names, host_mesh_shape, slices):
    params = {"global_mesh_shape": mesh_shape, "batch_shape": [8, 5], "batch_axis_names": batch_axis_names}
    reports = [r.report for r in multihost("host_helpers", 2, params=params)]
    assert [r["host_mesh_shape"] for r in reports] == [host_mesh_shape] * 2
    assert [r["host_slice"] for r in reports] == slices
