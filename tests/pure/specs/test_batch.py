"""host_batch_slices: which slice of a global batch each host feeds.

The oracle is jax itself: ``NamedSharding.devices_indices_map`` says which
index box every device holds; grouping the devices by a (fake) process
assignment gives the part each process must feed. Processes are plain ints
on mesh positions here, so one real 8-device process can check layouts of
any number of hosts.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.errors import DeviceLayoutError, MeshplanTypeError, MeshShapeError, SpecError
from meshplan.pure.specs._batch import HostBatchSlice, batch_partition_spec, host_batch_slices
from meshplan.testing import array_shapes_for, mesh_shapes, partition_specs

DIVISORS_OF_8 = (1, 2, 4, 8)


# --- strategies --------------------------------------------------------------------------------------


@st.composite
def process_grids(draw, shape: tuple[int, ...]) -> np.ndarray:
    """Which process owns each position of an 8-device mesh of ``shape``.

    Each process gets an equal share of positions, either as blocks of the
    mesh in some axis order (a real host layout) or scattered.
    """
    hosts = draw(st.sampled_from(DIVISORS_OF_8))
    if draw(st.booleans()):
        axes = draw(st.permutations(list(range(len(shape)))))
        positions = np.arange(8).reshape(tuple(shape[i] for i in axes))
        grid_in_axes_order = positions // (8 // hosts)
        return np.transpose(grid_in_axes_order, np.argsort(axes))
    perm = np.array(draw(st.permutations(list(range(8)))))
    return (perm // (8 // hosts)).reshape(shape)


def cases():
    """(mesh sizes, axis names, batch shape, batch spec, process grid) on 8 devices.

    The batch is 1-2 dims of multiples of 8 and the spec any valid one for it.
    Shrinks to a one-axis mesh, a replicated batch of 8 and one process.
    """
    def for_mesh(mesh):
        sizes = mesh.as_dict()
        batches = array_shapes_for(sizes, min_dims=1, max_dims=2, max_multiple=3)
        return st.tuples(st.just(mesh), batches.flatmap(lambda b: st.tuples(st.just(b), partition_specs(b, sizes))),
                         process_grids(mesh.sizes))
    return mesh_shapes(num_devices=8).flatmap(for_mesh).map(
        lambda t: (t[0].sizes, t[0].names, t[1][0], t[1][1], t[2]))


def jax_host_boxes(shape, names, batch, spec, grid):
    """Per process: (start, stop) if its devices' shards form one box, else None."""
    mesh = jax.make_mesh(shape, names, devices=jax.devices()[:8])
    index_map = NamedSharding(mesh, spec).devices_indices_map(batch)
    process_of = {d: int(grid[pos]) for pos, d in np.ndenumerate(mesh.devices)}
    shards: dict[int, set] = {}
    for device, index in index_map.items():
        box = tuple((s.indices(n)[0], s.indices(n)[1]) for s, n in zip(index, batch))
        shards.setdefault(process_of[device], set()).add(box)
    out = {}
    for process, boxes in sorted(shards.items()):
        start = tuple(min(b[d][0] for b in boxes) for d in range(len(batch)))
        stop = tuple(max(b[d][1] for b in boxes) for d in range(len(batch)))
        volume = sum(math.prod(hi - lo for lo, hi in b) for b in boxes)
        full = volume == math.prod(hi - lo for lo, hi in zip(start, stop))
        out[process] = (start, stop) if full else None
    return out


# --- properties --------------------------------------------------------------------------------------


@given(cases())
def test_host_slices_agree_with_jax_devices_indices_map(case):
    expected = jax_host_boxes(*case)
    shapes = {tuple(b - a for a, b in zip(*box)) for box in expected.values() if box is not None}
    if any(box is None for box in expected.values()) or len(shapes) > 1:
        with pytest.raises(DeviceLayoutError):
            host_batch_slices(case[2], case[1], case[4], case[3])
        return
    got = host_batch_slices(case[2], case[1], case[4], case[3])
    assert {s.process_index: (s.start, s.stop) for s in got} == expected


@given(mesh_shapes(num_devices=8), st.sampled_from(DIVISORS_OF_8), st.integers(1, 3))
def test_hosts_owning_runs_of_positions_feed_equal_consecutive_parts(mesh, hosts, mult):
    # jax.make_mesh's order off TPU: host h owns positions h*k .. (h+1)*k-1 in
    # C order; a batch split over every axis in mesh order then gives host h
    # the h-th part, and the parts tile the batch.
    shape, names = mesh.sizes, mesh.names
    grid = np.arange(8).reshape(shape) // (8 // hosts)
    batch = (8 * mult, 2)
    slices = host_batch_slices(batch, names, grid, names)
    part = batch[0] // hosts
    assert [(s.process_index, s.start, s.stop) for s in slices] == [
        (h, (h * part, 0), ((h + 1) * part, 2)) for h in range(hosts)
    ]


@given(cases(), st.randoms(use_true_random=False))
def test_relabelling_processes_relabels_the_answer(case, rnd):
    shape, names, batch, spec, grid = case
    labels = sorted(set(int(x) for x in grid.flat))
    new = dict(zip(labels, rnd.sample(range(100), len(labels))))
    regrid = np.vectorize(new.__getitem__)(grid)
    try:
        before = {new[s.process_index]: (s.start, s.stop) for s in host_batch_slices(batch, names, grid, spec)}
    except DeviceLayoutError:
        with pytest.raises(DeviceLayoutError):
            host_batch_slices(batch, names, regrid, spec)
        return
    after = host_batch_slices(batch, names, regrid, spec)
    assert [s.process_index for s in after] == sorted(before)
    assert {s.process_index: (s.start, s.stop) for s in after} == before


@given(mesh_shapes(num_devices=8), st.integers(1, 4))
def test_one_process_feeds_the_whole_batch(mesh, mult):
    shape, names = mesh.sizes, mesh.names
    batch = (shape[0] * mult, 3)
    (only,) = host_batch_slices(batch, names, np.zeros(shape, dtype=int), names[0])
    assert (only.process_index, only.start, only.stop) == (0, (0, 0), batch)


# --- examples ------------------------------------------------------------------------------------------

THREE_HOSTS_2x2 = [[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2]]  # 3 hosts x 4 devices as (2, 6)


def test_three_hosts_split_on_the_second_axis_each_feed_a_third():
    slices = host_batch_slices((12, 5), ("a", "b"), THREE_HOSTS_2x2, "b")
    assert [(s.start, s.stop) for s in slices] == [((0, 0), (4, 5)), ((4, 0), (8, 5)), ((8, 0), (12, 5))]


def test_batch_over_an_axis_inside_each_host_is_fed_whole_by_every_host():
    slices = host_batch_slices((12,), ("a", "b"), THREE_HOSTS_2x2, "a")
    assert [(s.start, s.stop) for s in slices] == [((0,), (12,))] * 3


def test_axis_order_inside_a_tuple_decides_contiguity():
    # ("b", "a"): shard = 2*b + a, so host 0 holds shards 0..3: contiguous.
    ok = host_batch_slices((24,), ("a", "b"), THREE_HOSTS_2x2, ("b", "a"))
    assert [(s.start, s.stop) for s in ok] == [((0,), (8,)), ((8,), (16,)), ((16,), (24,))]
    # ("a", "b"): shard = 6*a + b, so host 0 holds shards {0, 1, 6, 7}: not one slice.
    with pytest.raises(DeviceLayoutError, match=r"process 0 holds shards \[\(0,\), \(1,\), \(6,\), \(7,\)\]"):
        host_batch_slices((24,), ("a", "b"), THREE_HOSTS_2x2, ("a", "b"))


def test_interleaved_hosts_are_refused_with_the_shards_they_hold():
    with pytest.raises(DeviceLayoutError, match=r"process 1 holds shards \[\(1,\), \(3,\)\]"):
        host_batch_slices((8,), ("data",), [0, 1, 0, 1], "data")


def test_hosts_with_different_shares_are_refused_naming_each_shape():
    with pytest.raises(DeviceLayoutError, match=r"process 0: \(6, 2\), process 1: \(2, 2\)"):
        host_batch_slices((8, 2), ("data",), [0, 0, 0, 1], "data")


def test_a_partition_spec_can_split_several_batch_dims():
    grid = [[0, 0], [1, 1]]  # mesh (a=2, b=2), host = row
    slices = host_batch_slices((4, 6), ("a", "b"), grid, P("b", "a"))
    assert [(s.start, s.stop) for s in slices] == [((0, 0), (4, 3)), ((0, 3), (4, 6))]


@pytest.mark.parametrize(
    "batch, names, grid, spec, error, match",
    [
        ((8,), ("data",), [0, 1], "model", SpecError, r"unknown mesh axis 'model'.*\['data'\]"),
        ((8, 2), ("a", "b"), [[0, 0], [1, 1]], P("a", "a"), SpecError, "more than once"),
        ((8,), ("a",), [0, 1], P("a", None), SpecError, "has 2 entries but the array has rank 1"),
        ((6,), ("a",), [0, 0, 1, 1], "a", SpecError, r"dim 0 \(size 6\) over \('a',\) \(4 ways\)"),
        ((8,), ("a",), [0, 1], P(P.UNCONSTRAINED), SpecError, "UNCONSTRAINED"),
        ((8,), ("a",), [0.0, 1.0], "a", MeshplanTypeError, "int process indices"),
        ((8,), ("a",), [True, False], "a", MeshplanTypeError, "int process indices"),
        ((8,), ("a", "b"), [0, 1], "a", DeviceLayoutError, "1 dims .* mesh has 2 axes"),
        ((8,), ("a",), np.zeros((0,), int), "a", DeviceLayoutError, "no positions"),
        ((True,), ("a",), [0, 1], "a", MeshplanTypeError, "bool"),
        ((-2,), ("a",), [0, 1], "a", SpecError, "negative"),
        ((8,), ("a",), [0, 1], {"a"}, MeshplanTypeError, "batch_axis_names"),
        ((8,), ("a",), [0, 1], ("a", 3), MeshplanTypeError, "batch_axis_names"),
        ((8,), ("a", "a"), [[0, 1]], "a", MeshShapeError, "repeats"),
    ],
)
def test_bad_requests_raise_typed_errors_naming_the_value(batch, names, grid, spec, error, match):
    with pytest.raises(error, match=match):
        host_batch_slices(batch, names, grid, spec)


def test_batch_partition_spec_reads_names_as_the_leading_dim():
    assert batch_partition_spec("data") == P("data")
    assert batch_partition_spec(["data", "fsdp"]) == P(("data", "fsdp"))
    assert batch_partition_spec(()) == P()
    assert batch_partition_spec(P(None, "tp")) == P(None, "tp")


def test_host_batch_slice_value_checks_its_fields():
    assert HostBatchSlice(0, [1, 2], [3, 4]).start == (1, 2)
    with pytest.raises(SpecError, match="same length"):
        HostBatchSlice(0, (0,), (1, 2))
    with pytest.raises(SpecError, match="start=3, stop=1"):
        HostBatchSlice(0, (3,), (1,))
    with pytest.raises(MeshplanTypeError):
        HostBatchSlice("0", (0,), (1,))
