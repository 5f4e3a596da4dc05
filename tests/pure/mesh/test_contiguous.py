"""Host blocks: every process's devices form one contiguous sub-block of the mesh (pure part)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh

from meshplan.errors import DeviceLayoutError, MeshplanTypeError, MeshShapeError
from meshplan.pure.mesh import (
    DeviceInfo,
    HybridMeshShape,
    arrange_host_blocks,
    granule_device_ids,
    group_granules,
    host_block_problems,
    layout_device_ids,
    place_granules,
)
from meshplan.testing import device_layouts, factorizations


@dataclasses.dataclass(frozen=True)
class Dev:
    """What jax's Mesh._local_mesh reads off a device."""

    id: int
    process_index: int


def _jax_says_contiguous(ids: np.ndarray, process_of: dict[int, int]) -> bool:
    """The oracle: jax's own per-process sub-mesh, which raises for a scattered host."""
    devices = np.vectorize(lambda i: Dev(int(i), process_of[int(i)]), otypes=[object])(ids)
    mesh = Mesh(devices, tuple(f"a{k}" for k in range(ids.ndim)))
    try:
        for p in sorted(set(process_of.values())):
            mesh._local_mesh(p)
    except ValueError:
        return False
    return True


@st.composite
def id_grids(draw):
    """A grid of ids 0..n-1 in any order and any process assignment (equal or not). Shrinks to one device."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    n = math.prod(shape)
    ids = np.array(draw(st.permutations(range(n))), dtype=np.int64).reshape(shape)
    procs = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return ids, dict(enumerate(procs))


@st.composite
def equal_hosts(draw):
    """Equal hosts of arbitrary ids and a shape that holds them all. Shrinks to one host of one device."""
    num_hosts = draw(st.integers(1, 8))
    per_host = draw(st.integers(1, 8))
    ids = draw(st.permutations(range(num_hosts * per_host)))
    hosts = [ids[h * per_host:(h + 1) * per_host] for h in range(num_hosts)]
    rank = draw(st.integers(1, 4))
    shape = draw(factorizations(num_hosts * per_host, rank))
    return hosts, shape


@st.composite
def tpu_cases(draw):
    """TPU slices over several hosts each (meshplan.testing.device_layouts) and an ICI shape per slice."""
    devices = draw(device_layouts(platform="tpu", max_devices_per_granule=32))
    granules = group_granules(devices)
    rank = draw(st.integers(1, 4))
    ici = draw(factorizations(len(granules[0]), rank))
    dcn = draw(factorizations(len(granules), rank))
    return devices, HybridMeshShape(ici, dcn)


def _process_of(devices) -> dict[int, int]:
    return {d.id: d.process_index for d in devices}


# --- properties -----------------------------------------------------------------------------------


@given(id_grids())
def test_host_block_problems_agree_with_jax_local_mesh(case):
    ids, process_of = case
    assert (host_block_problems(ids, process_of) == ()) == _jax_says_contiguous(ids, process_of)


@given(equal_hosts())
def test_arranged_hosts_are_each_one_block_holding_every_id_once(case):
    hosts, shape = case
    out = arrange_host_blocks(hosts, shape)
    assert out.shape == shape and out.dtype == np.int64
    assert sorted(out.ravel().tolist()) == sorted(i for h in hosts for i in h)
    process_of = {i: h for h, ids in enumerate(hosts) for i in ids}
    assert host_block_problems(out, process_of) == ()
    assert _jax_says_contiguous(out, process_of)


@given(st.data())
def test_place_granules_is_numpy_block_of_the_grid(data):
    rank = data.draw(st.integers(1, 3))
    inner = data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank).map(tuple))
    dcn = data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank).map(tuple))
    per, num = math.prod(inner), math.prod(dcn)
    grids = [np.arange(g * per, (g + 1) * per).reshape(inner) for g in range(num)]
    # jax's create_hybrid_device_mesh: np.block over the granule grid.
    cells = np.empty(dcn, dtype=object)
    for g, index in enumerate(np.ndindex(*dcn)):
        cells[index] = grids[g]
    np.testing.assert_array_equal(place_granules(grids, dcn), np.block(cells.tolist()))


@given(tpu_cases())
def test_every_tpu_host_is_one_contiguous_block_of_the_global_mesh(case):
    devices, shape = case
    ids = layout_device_ids(devices, shape)
    assert host_block_problems(ids, _process_of(devices)) == ()
    assert sorted(ids.ravel().tolist()) == sorted(d.id for d in devices)


@given(tpu_cases(), st.data())
def test_tpu_host_blocks_ignore_the_listing_order(case, data):
    devices, shape = case
    reordered = data.draw(st.permutations(devices))
    np.testing.assert_array_equal(layout_device_ids(devices, shape), layout_device_ids(reordered, shape))


@given(tpu_cases())
def test_each_slice_still_fills_one_ici_block_at_its_dcn_position(case):
    devices, shape = case
    ids = layout_device_ids(devices, shape)
    ici, dcn = shape.ici_mesh_shape, shape.dcn_mesh_shape
    for g, granule in enumerate(group_granules(devices)):
        pos = np.unravel_index(g, dcn)
        block = ids[tuple(slice(p * i, (p + 1) * i) for p, i in zip(pos, ici))]
        assert sorted(block.ravel().tolist()) == sorted(d.id for d in granule)


# --- examples -------------------------------------------------------------------------------------


def test_a_slice_without_slice_index_over_four_hosts_is_one_granule_of_host_blocks():
    # AXLearn's single-slice v4 4x4 test topology: host k holds the chips (k, 0..3).
    devices = [DeviceInfo(i, process_index=i // 4, platform="tpu", coords=(i // 4, i % 4, 0)) for i in range(16)]
    (granule,) = group_granules(devices)
    ids = granule_device_ids(granule, (2, 8))
    assert ids.tolist() == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]
    assert host_block_problems(ids, _process_of(devices)) == ()


def test_a_single_process_granule_is_laid_out_row_major_as_before():
    devices = [DeviceInfo(i, process_index=0) for i in range(8)]
    assert granule_device_ids(devices, (2, 4)).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_unequal_hosts_have_no_contiguous_layout_and_say_how_to_opt_out():
    with pytest.raises(DeviceLayoutError, match=r"different numbers of devices \(\[1, 3\]\).*contiguous_hosts=False"):
        arrange_host_blocks([[0], [1, 2, 3]], (4,))
    devices = [DeviceInfo(i, process_index=int(i > 0), platform="tpu", coords=(i, 0, 0)) for i in range(4)]
    with pytest.raises(DeviceLayoutError, match="contiguous_hosts=False"):
        layout_device_ids(devices, HybridMeshShape((4,), (1,)))


BAD_CALLS = [
    (lambda: host_block_problems([[0, 1]], {0: 0, 1: 0}), MeshplanTypeError, "numpy array"),
    (lambda: host_block_problems(np.array([0.5]), {}), MeshplanTypeError, "integer"),
    (lambda: host_block_problems(np.array([0, 1]), [0, 0]), MeshplanTypeError, "mapping"),
    (lambda: host_block_problems(np.array([0, 7]), {0: 0}), DeviceLayoutError, r"\[7\]"),
    (lambda: place_granules([], (1,)), DeviceLayoutError, "empty"),
    (lambda: place_granules([np.zeros(2), np.zeros(3)], (2,)), DeviceLayoutError, "different shapes"),
    (lambda: place_granules([np.zeros(2)], (2,)), DeviceLayoutError, r"dcn_shape=\(2,\)"),
    (lambda: place_granules([np.zeros(2)], (0,)), MeshShapeError, "dcn_shape"),
    (lambda: arrange_host_blocks([], (1,)), DeviceLayoutError, "empty"),
    (lambda: arrange_host_blocks([[0, 1]], (3,)), DeviceLayoutError, r"shape=\(3,\) holds 3"),
    (lambda: arrange_host_blocks([[0, "1"]], (2,)), MeshplanTypeError, r"hosts\[0\]\[1\]"),
    (lambda: arrange_host_blocks([[0, 1]], (2.0,)), MeshplanTypeError, "shape"),
    (lambda: arrange_host_blocks(None, (64, 32)), MeshplanTypeError, "hosts=None"),
    (lambda: arrange_host_blocks([0, 1], (2,)), MeshplanTypeError, r"hosts\[0\]=0"),
    (lambda: place_granules(None, (1,)), MeshplanTypeError, "grids=None"),
    (lambda: place_granules([[[0, 1], [2]]], (1, 1)), DeviceLayoutError, r"grids\[0\].*rectangular"),
    (lambda: host_block_problems(np.array([0, 1]), {0: 0, 1: "b"}), MeshplanTypeError, r"process_of\[1\]"),
]


@pytest.mark.parametrize("call, error, match", BAD_CALLS)
def test_bad_arguments_are_typed_errors_naming_the_value(call, error, match):
    with pytest.raises(error, match=match):
        call()
