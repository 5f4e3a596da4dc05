"""Tests for meshplan.pure.mesh._layout: granules and the global device-id array."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.experimental import mesh_utils

from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.mesh._layout import DeviceInfo, group_granules, layout_device_ids
from meshplan.pure.errors import DeviceLayoutError, MeshplanTypeError
from meshplan.testing import device_layouts, hybrid_mesh_shapes


@dataclasses.dataclass(frozen=True)
class FakeCpuDevice:
    """What jax's create_hybrid_device_mesh reads off a CPU device (jax 0.10)."""

    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"
    slice_index: int | None = None


@dataclasses.dataclass(frozen=True)
class LayoutCase:
    ici: tuple[int, ...]
    dcn: tuple[int, ...]
    devices: tuple[DeviceInfo, ...]  # in the caller's (shuffled) order


@functools.cache
def _hybrid_shapes(num_granules, devices_per_granule):
    return hybrid_mesh_shapes(num_granules=num_granules, devices_per_granule=devices_per_granule)


def layout_cases():
    """CPU device sets (ids and process indices unique, otherwise arbitrary; listed shuffled)
    with a hybrid shape of 1-3 axes that fits their processes.

    Shrinks to one axis, one granule of one device.
    """
    def for_devices(devices):
        num = len({d.process_index for d in devices})
        shapes = _hybrid_shapes(num, len(devices) // num)
        return shapes.map(lambda h: LayoutCase(h.ici_mesh_shape, h.dcn_mesh_shape, devices))

    return device_layouts(platform="cpu", max_processes=6, max_devices_per_granule=6,
                          subset=True).flatmap(for_devices)


def _jax_ids(case: LayoutCase, *, sort: bool) -> np.ndarray:
    # jax keeps the given order inside a granule; meshplan orders by id, so hand jax the
    # devices sorted by id to compare the assembly itself.
    fakes = [FakeCpuDevice(d.id, d.process_index) for d in sorted(case.devices, key=lambda d: d.id)]
    mesh = mesh_utils.create_hybrid_device_mesh(
        case.ici, case.dcn, devices=fakes, process_is_granule=True, should_sort_granules_by_key=sort
    )
    return np.vectorize(lambda d: d.id, otypes=[np.int64])(mesh)


# --- properties -----------------------------------------------------------------------------------


@given(case=layout_cases())
def test_every_device_id_appears_exactly_once_in_the_global_shape(case):
    out = layout_device_ids(case.devices, HybridMeshShape(case.ici, case.dcn))
    assert out.dtype == np.int64
    assert out.shape == tuple(i * d for i, d in zip(case.ici, case.dcn))
    assert sorted(out.ravel().tolist()) == sorted(d.id for d in case.devices)


@given(case=layout_cases())
def test_each_granule_fills_one_ici_block_at_its_dcn_position(case):
    out = layout_device_ids(case.devices, HybridMeshShape(case.ici, case.dcn))
    for g, granule in enumerate(group_granules(case.devices)):
        pos = np.unravel_index(g, case.dcn)
        block = tuple(slice(p * i, (p + 1) * i) for p, i in zip(pos, case.ici))
        expected = np.array([d.id for d in granule]).reshape(case.ici)
        np.testing.assert_array_equal(out[block], expected)


@given(case=layout_cases(), sort=st.booleans())
def test_layout_agrees_with_jax_create_hybrid_device_mesh_on_fake_cpu_devices(case, sort):
    shape = HybridMeshShape(case.ici, case.dcn)
    by_id = sorted(case.devices, key=lambda d: d.id)
    np.testing.assert_array_equal(
        layout_device_ids(by_id, shape, sort_granules=sort), _jax_ids(case, sort=sort)
    )


@given(case=layout_cases(), data=st.data())
def test_layout_ignores_the_order_devices_are_listed_in(case, data):
    shape = HybridMeshShape(case.ici, case.dcn)
    reordered = data.draw(st.permutations(case.devices))
    np.testing.assert_array_equal(
        layout_device_ids(case.devices, shape), layout_device_ids(reordered, shape)
    )
    np.testing.assert_array_equal(
        layout_device_ids(case.devices, shape), layout_device_ids(np.array(reordered), shape)
    )


@given(case=layout_cases(), data=st.data())
def test_minus_one_in_either_part_is_resolved_against_the_granules(case, data):
    i = data.draw(st.integers(0, len(case.ici) - 1))
    j = data.draw(st.integers(0, len(case.dcn) - 1))
    partial = HybridMeshShape(
        case.ici[:i] + (-1,) + case.ici[i + 1 :], case.dcn[:j] + (-1,) + case.dcn[j + 1 :]
    )
    np.testing.assert_array_equal(
        layout_device_ids(case.devices, partial),
        layout_device_ids(case.devices, HybridMeshShape(case.ici, case.dcn)),
    )


@given(case=layout_cases())
def test_granules_are_sorted_by_key_and_by_id_inside(case):
    granules = group_granules(case.devices)
    keys = [g[0].process_index for g in granules]
    assert keys == sorted(keys)
    for g in granules:
        assert len({d.process_index for d in g}) == 1
        assert [d.id for d in g] == sorted(d.id for d in g)


# --- examples -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ici", [(8,), (2, 4), (4, 2), (1, 8, 1), (2, 2, 2)])
def test_live_cpu_devices_lay_out_like_jax_for_one_granule(ici):
    devices = jax.devices()
    assert len(devices) == 8
    dcn = (1,) * len(ici)
    expected = np.vectorize(lambda d: d.id, otypes=[np.int64])(
        mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices, process_is_granule=True)
    )
    infos = [DeviceInfo.from_device(d) for d in devices]
    np.testing.assert_array_equal(layout_device_ids(infos, HybridMeshShape(ici, dcn)), expected)


def test_tpu_devices_group_by_slice_and_order_by_coords_then_core():
    coords = [(1, 0, 0), (0, 0, 0), (0, 1, 0), (1, 1, 0)]
    devices = [
        DeviceInfo(
            10 * s + k, process_index=0, slice_index=s, platform="tpu", coords=c, core_on_chip=core
        )
        for s in (1, 0)
        for k, (c, core) in enumerate((c, core) for c in coords for core in (1, 0))
    ]
    granules = group_granules(devices)
    assert [g[0].slice_index for g in granules] == [0, 1]
    assert [(d.coords, d.core_on_chip) for d in granules[0]] == [
        ((0, 0, 0), 0), ((0, 0, 0), 1), ((0, 1, 0), 0), ((0, 1, 0), 1),
        ((1, 0, 0), 0), ((1, 0, 0), 1), ((1, 1, 0), 0), ((1, 1, 0), 1),
    ]
    assert [d.id for d in granules[1]] == [13, 12, 15, 14, 11, 10, 17, 16]
    (one,) = group_granules(devices, by="process")
    assert [d.id for d in one[:4]] == [3, 13, 2, 12]  # same coords: core, then id


def test_tpu_devices_without_slice_index_are_one_slice():
    # A TPU device without slice_index is in slice 0 (AXLearn); by="process" still splits by host.
    devices = [DeviceInfo(i, process_index=i % 2, platform="tpu") for i in range(4)]
    assert [[d.id for d in g] for g in group_granules(devices)] == [[0, 1, 2, 3]]
    assert [[d.id for d in g] for g in group_granules(devices, by="process")] == [[0, 2], [1, 3]]


def test_unsorted_granules_keep_first_appearance_order():
    devices = [DeviceInfo(i, process_index=p) for i, p in enumerate((5, 5, 2, 2))]
    shape = HybridMeshShape((2,), (2,))
    assert layout_device_ids(devices, shape, sort_granules=False).tolist() == [0, 1, 2, 3]
    assert layout_device_ids(devices, shape).tolist() == [2, 3, 0, 1]


def test_device_info_reads_live_cpu_devices():
    info = DeviceInfo.from_device(jax.devices()[3])
    assert (info.id, info.process_index, info.platform) == (jax.devices()[3].id, 0, "cpu")


# --- bad inputs -----------------------------------------------------------------------------------


def _cpu(n, per_process=None):
    per_process = per_process or n
    return [DeviceInfo(i, process_index=i // per_process) for i in range(n)]


BAD_CALLS = [
    (lambda: group_granules([]), DeviceLayoutError, "empty"),
    (lambda: group_granules([DeviceInfo(1), DeviceInfo(1)]), DeviceLayoutError, "[1]"),
    (
        lambda: group_granules([DeviceInfo(i, process_index=p) for i, p in enumerate((0, 0, 1))]),
        DeviceLayoutError,
        "process_index=0: 2, process_index=1: 1",
    ),
    (
        lambda: group_granules([DeviceInfo(0), DeviceInfo(1, platform="gpu")]),
        DeviceLayoutError,
        "['cpu', 'gpu']",
    ),
    (lambda: group_granules(_cpu(2), by="host"), DeviceLayoutError, "by='host'"),
    (lambda: group_granules(_cpu(2), by=1), MeshplanTypeError, "by=1"),
    (lambda: group_granules(_cpu(2), by="slice"), DeviceLayoutError, "slice_index=None"),
    (lambda: group_granules([0, 1]), MeshplanTypeError, "devices[0]=0"),
    (lambda: group_granules("ab"), MeshplanTypeError, "'ab'"),
    (
        lambda: layout_device_ids(_cpu(8, 4), HybridMeshShape((1, 4), (1, 1))),
        DeviceLayoutError,
        "2 granule(s) of 4 device(s)",
    ),
    (
        lambda: layout_device_ids(_cpu(8, 4), HybridMeshShape((1, 2), (2, 1))),
        DeviceLayoutError,
        "ici_mesh_shape=(1, 2)",
    ),
    (
        lambda: layout_device_ids(_cpu(8, 4), HybridMeshShape((1, 4), (4, 1))),
        DeviceLayoutError,
        "dcn_mesh_shape=(4, 1)",
    ),
    (lambda: layout_device_ids(_cpu(8), (2, 4)), MeshplanTypeError, "(2, 4)"),
    (lambda: DeviceInfo(-1), DeviceLayoutError, "id=-1"),
    (lambda: DeviceInfo(1.0), MeshplanTypeError, "id=1.0"),
    (lambda: DeviceInfo(1, slice_index=-2), DeviceLayoutError, "slice_index=-2"),
    (lambda: DeviceInfo(1, platform=""), MeshplanTypeError, "platform=''"),
    (lambda: DeviceInfo(1, coords=(0, 1.5)), MeshplanTypeError, "coords[1]=1.5"),
]


@pytest.mark.parametrize("call, exc, needle", BAD_CALLS)
def test_bad_inputs_raise_typed_errors_naming_the_value(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    assert needle in str(err.value)
