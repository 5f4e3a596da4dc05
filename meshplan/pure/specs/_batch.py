"""Which slice of a global batch each host feeds.

In multi-process jax every process builds its part of a global input batch
from host-local data (``jax.make_array_from_process_local_data``). The part a
process must load follows from three facts: the batch's PartitionSpec, the
mesh axis names and sizes, and which process owns each mesh position. This
module answers from exactly those facts, as plain data: the process owning
each position is a grid of ints shaped like the mesh (the facade reads it off
``mesh.devices``), so the planner never sees a device.

How it works. Under a spec, each mesh position holds one *shard* of the
batch: along a dim split over axes ``(a, b)``, the shard index is the
position's mixed-radix number in those axes, ``a`` major (jax's order for a
tuple entry). A process feeds the union of the shards at its positions. That
union is one slice only if it is a box: along every dim the process's shard
indices form one run ``lo..hi``, and it holds every combination of them.
Hosts must also feed equally sized boxes, since
``make_array_from_process_local_data`` takes one local shape. Both checks
run over every process, so every process computes, and agrees on, the same
answer or the same error. Several processes may feed the same box: that is
replication over hosts, e.g. a batch split over an axis that lies inside
each host.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from meshplan.pure.mesh._axes import validate_axis_names
from meshplan.pure._check import as_int, as_int_tuple
from meshplan.pure.specs._geometry import UNCONSTRAINED, canonical_entries, shard_geometry
from meshplan.pure._types import Shape, make_spec
from meshplan.pure.errors import DeviceLayoutError, MeshplanTypeError, SpecError

__all__ = ["HostBatchSlice", "batch_partition_spec", "host_batch_slices"]


@dataclasses.dataclass(frozen=True, slots=True)
class HostBatchSlice:
    """The box of a global batch that one process feeds.

    Attributes:
      process_index: the process this slice belongs to.
      start: first index along each batch dim.
      stop: one past the last index along each batch dim.

    Example:
      >>> s = HostBatchSlice(process_index=1, start=(4, 0), stop=(8, 3))
      >>> s.shape
      (4, 3)
      >>> s.slices
      (slice(4, 8, None), slice(0, 3, None))
    """

    process_index: int
    start: Shape
    stop: Shape

    def __post_init__(self) -> None:
        start = as_int_tuple(self.start, "start")
        stop = as_int_tuple(self.stop, "stop")
        index = as_int(self.process_index, "process_index")
        if len(start) != len(stop):
            raise SpecError(f"start={start} and stop={stop} must have the same length.")
        bad = [
            f"dim {d}: start={a}, stop={b}"
            for d, (a, b) in enumerate(zip(start, stop))
            if not 0 <= a <= b
        ]
        if bad:
            raise SpecError(f"a slice needs 0 <= start <= stop on every dim; {'; '.join(bad)}.")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "process_index", index)

    @property
    def shape(self) -> Shape:
        """The shape of this host's part of the batch."""
        return tuple(b - a for a, b in zip(self.start, self.stop))

    @property
    def slices(self) -> tuple[slice, ...]:
        """One ``slice`` per batch dim: ``global_batch[s.slices]`` is this host's part."""
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop))


def batch_partition_spec(batch_axis_names: Any) -> PartitionSpec:
    """The PartitionSpec a batch gets from MeshConfig-style ``batch_axis_names``.

    A name or a sequence of names splits the leading (batch) dim over those
    axes, outer axis first, as loadax's ``MeshConfig.batch_axis_names`` does;
    a PartitionSpec is taken as given, for batches split on more dims (such as
    a plan's ``MeshCandidate.batch_spec``, which also splits the sequence over ``sp``).

    Args:
      batch_axis_names: an axis name, a sequence of axis names, or a
        ``PartitionSpec``.

    Returns:
      The batch PartitionSpec.

    Raises:
      MeshplanTypeError: anything else (a name that is not a string, a set).

    Example:
      >>> batch_partition_spec("data")
      P('data',)
      >>> batch_partition_spec(("data", "fsdp"))
      P(('data', 'fsdp'),)
    """
    if isinstance(batch_axis_names, PartitionSpec):
        return batch_axis_names
    if isinstance(batch_axis_names, str):
        return make_spec(batch_axis_names)
    if isinstance(batch_axis_names, Sequence) and all(isinstance(a, str) for a in batch_axis_names):
        names = tuple(batch_axis_names)
        return make_spec(names) if names else make_spec()
    raise MeshplanTypeError(
        f"batch_axis_names={batch_axis_names!r} must be an axis name, a tuple of axis names, "
        "or a PartitionSpec."
    )


def _process_grid(process_grid: Any, rank: int) -> np.ndarray:
    """``process_grid`` as an int array with one dim per mesh axis."""
    try:
        grid = np.asarray(process_grid)
    except (ValueError, TypeError, OverflowError):  # ragged nesting: refused below
        grid = np.asarray(None)
    if grid.dtype == bool or not np.issubdtype(grid.dtype, np.integer):
        raise MeshplanTypeError(
            f"process_grid must hold int process indices, got dtype {grid.dtype} "
            f"({process_grid!r})."
        )
    if grid.ndim != rank:
        raise DeviceLayoutError(
            f"process_grid has {grid.ndim} dims (shape {grid.shape}) but the mesh has {rank} "
            "axes; pass one process index per mesh position, shaped like the mesh."
        )
    if grid.size == 0:
        raise DeviceLayoutError(f"process_grid has no positions (shape {grid.shape}).")
    return grid


def _shard_indices(
    entries: tuple[tuple[str, ...], ...], names: tuple[str, ...], shape: Shape
) -> np.ndarray:
    """For every mesh position, the shard index along every batch dim.

    Returns an int array of shape ``(prod(mesh), len(entries))``, rows in
    C order of mesh positions.
    """
    positions = np.indices(shape).reshape(len(shape), -1)
    columns = []
    for entry in entries:
        index = np.zeros(positions.shape[1], dtype=np.int64)
        for axis in entry:  # mixed radix, first axis major (jax's order)
            a = names.index(axis)
            index = index * shape[a] + positions[a]
        columns.append(index)
    return np.stack(columns, axis=1) if columns else np.zeros((positions.shape[1], 0), np.int64)


def _box_of(rows: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(lo, hi) shard-index corners if ``rows`` fill a box exactly, else None."""
    unique = np.unique(rows, axis=0)
    lo, hi = unique.min(axis=0), unique.max(axis=0)
    if len(unique) != math.prod(int(h - l + 1) for l, h in zip(lo, hi)):
        return None
    return tuple(int(x) for x in lo), tuple(int(x) for x in hi)


def _describe(rows: np.ndarray, limit: int = 6) -> str:
    """A short list of the shard-index tuples in ``rows`` for error messages."""
    unique = [tuple(r) for r in np.unique(rows, axis=0).tolist()]
    shown = ", ".join(map(str, unique[:limit]))
    return f"[{shown}{', ...' if len(unique) > limit else ''}] ({len(unique)} shards)"


def host_batch_slices(
    global_batch_shape: Sequence[int],
    mesh_axis_names: Sequence[str],
    process_grid: Any,
    batch_axis_names: Any = "data",
) -> tuple[HostBatchSlice, ...]:
    """The slice of a global batch that every process feeds.

    Args:
      global_batch_shape: shape of the global batch (leading dim = batch).
      mesh_axis_names: the mesh's axis names, in mesh order.
      process_grid: the process index owning each mesh position, an int
        array-like shaped like the mesh (its shape gives the axis sizes).
      batch_axis_names: the batch's sharding, as in MeshConfig: an axis name,
        a tuple of axis names (both split the leading dim), or a
        PartitionSpec.

    Returns:
      One :class:`HostBatchSlice` per process, sorted by process index.

    Raises:
      MeshplanTypeError: a shape entry, name or grid entry of the wrong type.
      SpecError: the spec names an unknown axis or one twice, is longer than
        the batch rank, is ``UNCONSTRAINED``, or splits a dim unevenly.
      DeviceLayoutError: a process's shards are not one contiguous box, or
        processes would feed parts of different shapes.

    Example:
      Two hosts of 4 devices, mesh ``("data", "model") = (2, 4)``, each host
      one row; a batch of 8 split over ``data`` gives each host 4 rows:

      >>> slices = host_batch_slices((8, 16), ("data", "model"), [[0, 0, 0, 0], [1, 1, 1, 1]])
      >>> [(s.process_index, s.slices) for s in slices]
      [(0, (slice(0, 4, None), slice(0, 16, None))), (1, (slice(4, 8, None), slice(0, 16, None)))]
    """
    shape = as_int_tuple(global_batch_shape, "global_batch_shape")
    negative = [f"global_batch_shape[{i}]={d}" for i, d in enumerate(shape) if d < 0]
    if negative:
        raise SpecError(f"global_batch_shape={shape} has negative sizes: {', '.join(negative)}.")
    names = validate_axis_names(mesh_axis_names)
    grid = _process_grid(process_grid, len(names))
    spec = batch_partition_spec(batch_axis_names)
    del global_batch_shape, mesh_axis_names, process_grid, batch_axis_names

    axis_sizes = dict(zip(names, grid.shape))
    entries = canonical_entries(spec, len(shape), where="batch")
    if any(e is UNCONSTRAINED for e in entries):
        raise SpecError(
            f"batch spec {spec} contains UNCONSTRAINED; a fed batch needs a concrete layout, "
            "so name the axes (or None) for every dim."
        )
    geometry = shard_geometry(shape, spec, axis_sizes, where="batch")
    if geometry.padded:
        uneven = [
            f"dim {d} (size {size}) over {entries[d]} ({n} ways)"
            for d, (size, n) in enumerate(zip(shape, geometry.splits))
            if size % n
        ]
        raise SpecError(
            f"global batch shape {shape} does not split evenly under {spec}: {'; '.join(uneven)}. "
            "Each host feeds whole shards, so make every split dim a multiple of its split."
        )

    indices = _shard_indices(entries, names, grid.shape)
    owners = grid.reshape(-1)
    boxes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    problems: list[str] = []
    for process in sorted(int(p) for p in np.unique(owners)):
        rows = indices[owners == process]
        box = _box_of(rows)
        if box is None:
            problems.append(f"process {process} holds shards {_describe(rows)}")
        else:
            boxes[process] = box
    if problems:
        raise DeviceLayoutError(
            f"under batch spec {spec} some processes' shards are not one contiguous slice: "
            f"{'; '.join(problems)}. Lay the mesh out so each host's devices form one block "
            "(meshplan's create_mesh does), or split the batch over the axes that cross hosts."
        )

    shard = geometry.shard_shape
    slices = tuple(
        HostBatchSlice(
            process_index=p,
            start=tuple(l * s for l, s in zip(lo, shard)),
            stop=tuple((h + 1) * s for h, s in zip(hi, shard)),
        )
        for p, (lo, hi) in boxes.items()
    )
    shapes = sorted({s.shape for s in slices})
    if len(shapes) > 1:
        per_process = ", ".join(f"process {s.process_index}: {s.shape}" for s in slices)
        raise DeviceLayoutError(
            f"under batch spec {spec} processes would feed parts of different shapes "
            f"({per_process}); every host must feed the same local shape. Give every host the "
            "same number of devices along the batch axes."
        )
    return slices
