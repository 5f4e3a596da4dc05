"""create_mesh and MeshConfig across real processes: the plan, as every process sees it.

Each host (process) must hold one contiguous block of the global mesh, of the
shape the pure planner gives (per_host_mesh_shape, or axis_dims /
dcn_mesh_dims when the user fixes the DCN split), with the blocks in process
order; and every process must compute the identical device order.

All meshes of one process count are built in a single multi-process run (a
module-scoped fixture), so the file pays for three runs, not one per case.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan.pure import per_host_mesh_shape
from tests.multihost.harness import run_workers

pytestmark = pytest.mark.multihost

DEVICES_PER_PROCESS = 4


def _req(label, kind="create_mesh", **kwargs):
    return {"label": label, "kind": kind, "kwargs": kwargs}


# label -> (request, expected global shape, expected per-host block, axis names)
TWO_HOSTS = {
    "outermost": (_req("outermost", axis_dims=[2, 4], axis_names=["dp", "tp"]), (2, 4), (1, 4)),
    "default": (_req("default"), (1, 8, 1, 1, 1), (1, 4, 1, 1, 1)),
    "use_jax": (_req("use_jax", axis_dims=[2, 4], axis_names=["dp", "tp"], use_jax=True), (2, 4), (1, 4)),
    "inferred": (_req("inferred", axis_dims=[-1, 2], axis_names=["dp", "tp"]), (4, 2), (2, 2)),
    "dcn_on_tp": (
        _req("dcn_on_tp", axis_dims=[2, 4], axis_names=["dp", "tp"], dcn_mesh_dims=[1, 2]), (2, 4), (2, 2)
    ),
    "config": (
        _req("config", "mesh_config", mesh_shape=[2, 4], mesh_axis_names=["data", "model"]), (2, 4), (1, 4)
    ),
    "config_reversed": (
        {**_req("config_reversed", "mesh_config", mesh_shape=[2, 4], mesh_axis_names=["data", "model"]),
         "reverse_devices": True},
        (2, 4), (1, 4),
    ),
}
FOUR_HOSTS = {
    # 4 hosts cannot split the size-2 axis: the plan puts them on "model".
    "columns": (_req("columns", axis_dims=[2, 4], axis_names=["data", "model"]), (2, 4), (2, 1)),
}
THREE_HOSTS = {
    # The uneven case from the issue: 3 hosts x 4 devices as (2, 6).
    "uneven": (_req("uneven", axis_dims=[2, 6], axis_names=["a", "b"]), (2, 6), (2, 2)),
    "uneven_config": (
        _req("uneven_config", "mesh_config", mesh_shape=[2, 6], mesh_axis_names=["a", "b"],
             batch_axis_names="b"),
        (2, 6), (2, 2),
    ),
}
RUNS = {2: TWO_HOSTS, 4: FOUR_HOSTS, 3: THREE_HOSTS}
DEVICES = {2: 4, 4: 2, 3: 4}  # devices per process in each run


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """process count -> list (by process) of {label: layout}."""
    out = {}
    for n, cases in RUNS.items():
        results = run_workers(
            "tests.multihost.scenarios:mesh_layouts", n,
            workdir=tmp_path_factory.mktemp(f"meshes{n}"),
            devices_per_process=DEVICES[n],
            params={"requests": [request for request, _, _ in cases.values()]},
        )
        out[n] = [r.report for r in results]
    return out


def _cases():
    return [pytest.param(n, label, id=f"{n}hosts-{label}") for n, cases in RUNS.items() for label in cases]


def _blocks(process_grid: np.ndarray) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """process -> (first corner, block shape) of its positions; asserts they fill the box."""
    out = {}
    for p in sorted(set(process_grid.flat)):
        where = np.argwhere(process_grid == p)
        lo, hi = where.min(axis=0), where.max(axis=0) + 1
        assert len(where) == math.prod(hi - lo), f"process {p}'s devices are not one block: {where.tolist()}"
        out[int(p)] = (tuple(int(x) for x in lo), tuple(int(x) for x in hi - lo))
    return out


@pytest.mark.parametrize("n, label", _cases())
def test_every_process_builds_the_same_mesh_with_one_block_per_host(layouts, n, label):
    _, shape, block = RUNS[n][label]
    seen = [report[label] for report in layouts[n]]
    first = seen[0]
    # Identical on every process: names, shape, and the device order itself.
    for pid, layout in enumerate(seen):
        assert layout["device_ids"] == first["device_ids"], f"process {pid} laid devices out differently"
        assert layout["process_grid"] == first["process_grid"]
        assert tuple(layout["shape"]) == shape
        assert layout["sum"] == layout["expected_sum"], f"process {pid}: wrong sum on the mesh"
    grid = np.array(first["process_grid"])
    ids = np.array(first["device_ids"])
    assert sorted(ids.flat) == sorted(set(ids.flat)), "a device appears twice"
    blocks = _blocks(grid)
    assert sorted(blocks) == list(range(n))
    assert {b for _, b in blocks.values()} == {block}
    # Blocks sit in process order along the DCN grid (granules sorted by key).
    dcn = tuple(s // b for s, b in zip(shape, block))
    corners = {p: tuple(c // b for c, b in zip(corner, block)) for p, (corner, _) in blocks.items()}
    assert [corners[p] for p in range(n)] == [tuple(int(i) for i in ix) for ix in np.ndindex(dcn)]


@pytest.mark.parametrize("n, label", [c for c in _cases() if "dcn" not in c.id])
def test_host_block_is_the_pure_plan(n, label):
    # With the test above: the live per-host block is what the planner says.
    _, shape, block = RUNS[n][label]
    assert per_host_mesh_shape(shape, DEVICES[n], n) == block


def test_dcn_mesh_dims_moves_the_process_split_to_the_axis_it_names(layouts):
    planned = layouts[2][0]["outermost"]["process_grid"]
    forced = layouts[2][0]["dcn_on_tp"]["process_grid"]
    assert planned == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert forced == [[0, 0, 1, 1], [0, 0, 1, 1]]


def test_use_jax_gives_the_same_multi_process_layout_and_axis_types(layouts):
    for report in layouts[2]:
        assert report["use_jax"]["device_ids"] == report["outermost"]["device_ids"]
        assert report["use_jax"]["axis_types"] == report["outermost"]["axis_types"]


def test_mesh_config_lays_out_a_passed_device_list_not_its_order(layouts):
    for report in layouts[2]:
        assert report["config_reversed"]["device_ids"] == report["config"]["device_ids"]


def test_mesh_config_reports_hosts_and_feeds_each_host_its_part(layouts):
    for n, label, parts in [(2, "config", 2), (3, "uneven_config", 3)]:
        reports = layouts[n]
        assert [r[label]["hosts"] for r in reports] == [n] * n
        assert [r[label]["host_id"] for r in reports] == list(range(n))
        size = 4 * math.prod(RUNS[n][label][1])
        k = size // parts
        assert [r[label]["host_slice"] for r in reports] == [[[p * k, 0], [(p + 1) * k, 3]] for p in range(n)]
