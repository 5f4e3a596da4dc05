"""Real multi-process jax on 127.0.0.1: computations, barriers, host helpers.

Every test asserts on what *every* process reports.
"""

from __future__ import annotations

import pytest

from tests.multihost.harness import run_workers

pytestmark = pytest.mark.multihost


@pytest.fixture(scope="module", params=[2, 4], ids=["2procs", "4procs"])
def sum_run(request, tmp_path_factory):
    """(process count, reports) of one cross-process sum followed by 3 barriers."""
    n = request.param
    results = run_workers("tests.multihost.scenarios:sum_then_barriers", n,
                          workdir=tmp_path_factory.mktemp(f"sum{n}"))
    return n, [r.report for r in results]


def test_jitted_sum_over_a_global_array_is_right_on_every_process(sum_run):
    n, reports = sum_run
    for pid, report in enumerate(reports):
        assert report["process_index"] == pid
        assert report["process_count"] == n
        assert report["device_count"] == 4 * n
        assert report["addressable_shards"] == 4
        assert report["weighted_sum"] == report["expected_weighted_sum"]
        assert report["fed_sum"] == report["expected_fed_sum"]


def test_each_process_fed_its_own_rows_via_host_batch_slice(sum_run):
    n, reports = sum_run
    k = 16 // n  # host p loads rows [p*k, (p+1)*k) of the 16
    assert [r["host_slice"] for r in reports] == [[[p * k, 0], [(p + 1) * k, 6]] for p in range(n)]


def test_barrier_sync_passes_when_every_process_arrives(sum_run):
    n, reports = sum_run
    assert [r["barrier_rounds"] for r in reports] == [3] * n


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


HOST_HELPER_CASES = [
    # process split on "data" (outermost): each host feeds half the batch.
    ({"global_mesh_shape": [2, 4], "batch_shape": [8, 5], "batch_axis_names": "data"},
     [1, 4], [[[0, 0], [4, 5]], [[4, 0], [8, 5]]]),
    # batch over "model", which lies inside each host: both feed all of it.
    ({"global_mesh_shape": [2, 4], "batch_shape": [8, 5], "batch_axis_names": "model"},
     [1, 4], [[[0, 0], [8, 5]], [[0, 0], [8, 5]]]),
    # make_mesh fills (4, 2) in process order: host 0 holds rows 0-1.
    ({"global_mesh_shape": [4, 2], "batch_shape": [8, 5], "batch_axis_names": ["data", "model"]},
     [2, 2], [[[0, 0], [4, 5]], [[4, 0], [8, 5]]]),
]


def test_host_mesh_shape_and_host_batch_slice_on_two_processes(multihost):
    params = {"cases": [case for case, _, _ in HOST_HELPER_CASES]}
    reports = [r.report["cases"] for r in multihost("host_helpers", 2, params=params)]
    for i, (case, host_shape, slices) in enumerate(HOST_HELPER_CASES):
        assert [r[i]["host_mesh_shape"] for r in reports] == [host_shape] * 2, case
        assert [r[i]["host_slice"] for r in reports] == slices, case
