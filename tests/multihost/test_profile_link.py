"""Two real jax processes on 127.0.0.1 profile the link between them (CPU devices, gloo)."""

from __future__ import annotations


import pytest

import meshplan
from meshplan.pure.cluster import PROFILE_COLLECTIVES
from meshplan.pure.cost import profile_figures, profiled_cluster
from meshplan.pure.cluster import machine_cluster

pytestmark = [pytest.mark.multihost, pytest.mark.slow]  # two processes time their link: the second tier


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    from tests.multihost.harness import run_workers

    out = tmp_path_factory.mktemp("profiles")
    results = run_workers("tests.multihost.profile_scenarios:profile_link", 2, workdir=out / "work",
                          devices_per_process=2, params={"out_dir": str(out)}, deadline_s=240)
    return out, [r.report for r in results]


def test_both_processes_time_the_inter_host_link_and_agree_on_what_they_timed(run) -> None:
    _, reports = run
    for report in reports:
        assert report["process_count"] == 2 and report["device_count"] == 4
        assert report["links"] == [["inter", 2], ["intra", 2]]
        assert report["kinds"] == sorted(PROFILE_COLLECTIVES)


def test_process_0_alone_writes_the_profile(run) -> None:
    out, reports = run
    assert (out / "from-0.json").exists() and not (out / "from-1.json").exists()
    assert meshplan.load_profile(out / "from-0.json").id == reports[0]["id"]


def test_the_profile_of_two_hosts_prices_the_network_of_a_bigger_cluster(run) -> None:
    out, _ = run
    p = meshplan.load_profile(out / "from-0.json")
    figures = profile_figures(p)
    assert figures.inter is not None and figures.inter.bandwidth > 0 and figures.inter.rows == 10
    cluster, _, used = profiled_cluster(machine_cluster("cpu", "cpu", 64, process_count=16), p, hidden=64)
    assert cluster.device.inter_bandwidth == figures.inter.bandwidth
    assert not any(k.startswith("inter link") for k in used.kept)
