"""Host blocks: every process's devices as one contiguous sub-block of a mesh.

Feeding a sharded array from host-local data (``host_batch_slice``,
``jax.make_array_from_process_local_data``) needs each process's devices to
form one axis-aligned box of the device mesh: jax's ``Mesh._local_mesh``
takes, per axis, the smallest index range holding the process's devices and
fails if that box holds another process's device. This module checks that
property and builds layouts that have it, on plain ids.

* :func:`host_block_problems` names every process whose devices are not one box.
* :func:`place_granules` puts equal blocks (granules, or hosts inside a
  granule) on a grid, block ``g`` at grid position ``unravel(g)``: along each
  axis, global index = ``block_index * block_size + inner_index``, the layout
  of jax's ``create_hybrid_device_mesh`` (``np.block``).
* :func:`arrange_host_blocks` lays out one granule (e.g. a multi-host TPU
  slice) so each host is one block: the shape is split over the hosts with
  :func:`~meshplan.pure.mesh.split_over_granules`, the split that also puts
  granules on DCN, so the inner shape is each host's block. Such a split
  exists whenever the hosts hold equal device counts (see that module), so a
  contiguous layout always exists for equal hosts. Unequal hosts get no
  block layout (an error that names the opt-out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshplan.pure._check import as_int, as_positive_shape, as_sequence
from meshplan.pure.errors import DeviceLayoutError, MeshplanTypeError
from meshplan.pure.mesh._split import split_over_granules

__all__ = ["arrange_host_blocks", "host_block_problems", "place_granules"]


def host_block_problems(ids: np.ndarray, process_of: Mapping[int, int]) -> tuple[str, ...]:
    """Every process whose devices in ``ids`` do not form one contiguous sub-block.

    Args:
      ids: the mesh as an array of device ids (any rank).
      process_of: device id -> process index, for every id in ``ids``.

    Returns:
      One message per offending process (ascending process index); empty when
      every process's devices form one axis-aligned box, as jax's
      ``Mesh._local_mesh`` requires.

    Raises:
      MeshplanTypeError: ``ids`` is not an integer array or ``process_of`` not a mapping.
      DeviceLayoutError: an id has no process in ``process_of``.

    Example:
      >>> ids = np.array([[0, 1], [2, 3]])
      >>> host_block_problems(ids, {0: 0, 1: 0, 2: 1, 3: 1})
      ()
      >>> host_block_problems(ids, {0: 0, 1: 1, 2: 1, 3: 0})[0][:50]
      'process 0: its 2 devices span the box axis 0: 0..1'
    """
    if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu":
        raise MeshplanTypeError(f"ids={ids!r} must be a numpy array of integer device ids.")
    if not isinstance(process_of, Mapping):
        raise MeshplanTypeError(f"process_of={process_of!r} must be a mapping of device id -> process index.")
    flat = [int(i) for i in ids.flat]
    missing = sorted({i for i in flat if i not in process_of})
    if missing:
        raise DeviceLayoutError(f"process_of has no process for device ids {missing[:8]}; give every id in ids.")
    if not flat:
        return ()
    # One pass over the mesh: per process, the count and the per-axis index
    # range; the devices form one box exactly when the box's size is the count
    # (positions are distinct, so a box holding only them is full).
    owners = [as_int(process_of[i], f"process_of[{i}]") for i in flat]
    procs, owner = np.unique(np.array(owners, dtype=np.int64), return_inverse=True)
    positions = np.indices(ids.shape).reshape(ids.ndim, -1)
    lo = np.full((ids.ndim, len(procs)), np.iinfo(np.int64).max)
    hi = np.full((ids.ndim, len(procs)), -1)
    for axis in range(ids.ndim):
        np.minimum.at(lo[axis], owner, positions[axis])
        np.maximum.at(hi[axis], owner, positions[axis])
    counts = np.bincount(owner, minlength=len(procs))
    boxes = np.prod(hi - lo + 1, axis=0)
    problems = []
    for k in np.flatnonzero(boxes != counts):
        spans = ", ".join(f"axis {a}: {int(lo[a, k])}..{int(hi[a, k])}" for a in range(ids.ndim))
        problems.append(f"process {int(procs[k])}: its {int(counts[k])} devices span the box {spans} "
                        f"({int(boxes[k])} positions), which holds other processes' devices")
    return tuple(problems)


def _block(grid: Any, k: int) -> np.ndarray:
    """``grids[k]`` as an array; ragged nesting is not a block."""
    try:
        return np.asarray(grid)
    except ValueError as err:  # numpy refuses ragged nested sequences
        raise DeviceLayoutError(f"grids[{k}]={grid!r} is not a rectangular block ({err}).") from None


def place_granules(grids: Sequence[np.ndarray], dcn_shape: Sequence[int]) -> np.ndarray:
    """Equal blocks on a grid: block ``g`` at position ``unravel(g, dcn_shape)``.

    Args:
      grids: equal-shape arrays, one per block, in placement order.
      dcn_shape: the grid of blocks, same rank as each block; its product is ``len(grids)``.

    Returns:
      The array of shape ``block * dcn`` per axis (``np.block``'s layout).

    Raises:
      MeshplanTypeError: ``dcn_shape`` holds a non-int.
      MeshShapeError: ``dcn_shape`` holds a size < 1.
      DeviceLayoutError: no blocks, blocks of different shapes, or a rank or
        count that does not match ``dcn_shape``.

    Example:
      >>> place_granules([np.array([[0, 1]]), np.array([[2, 3]])], (1, 2)).tolist()
      [[0, 1, 2, 3]]
      >>> place_granules([np.array([[0, 1]]), np.array([[2, 3]])], (2, 1)).tolist()
      [[0, 1], [2, 3]]
    """
    dcn = as_positive_shape(dcn_shape, "dcn_shape")
    blocks = [_block(g, k) for k, g in enumerate(as_sequence(grids, "grids"))]
    if not blocks:
        raise DeviceLayoutError("grids is empty; give one block per granule.")
    shapes = sorted({b.shape for b in blocks})
    if len(shapes) > 1:
        raise DeviceLayoutError(f"the blocks have different shapes {shapes}; every block must have one shape.")
    inner = shapes[0]
    if len(inner) != len(dcn) or len(blocks) != math.prod(dcn):
        raise DeviceLayoutError(
            f"{len(blocks)} block(s) of shape {inner} do not fit dcn_shape={dcn}: give one dcn size per "
            f"block axis and {math.prod(dcn)} block(s)."
        )
    rank = len(dcn)
    stacked = np.stack(blocks).reshape(dcn + inner)
    # (*dcn, *inner) -> (d0, i0, d1, i1, ...): merging each pair gives d_k * inner_k + i_k.
    order = [axis for k in range(rank) for axis in (k, rank + k)]
    return stacked.transpose(order).reshape(tuple(d * i for d, i in zip(dcn, inner)))


def arrange_host_blocks(hosts: Sequence[Sequence[int]], shape: Sequence[int]) -> np.ndarray:
    """One granule's device ids in ``shape``, each host's ids one contiguous block.

    Hosts are placed in the given order on the host grid, and each host's ids
    fill its block row-major in the given order, so callers decide both
    orders (meshplan's layout orders hosts and devices physically).

    Args:
      hosts: one sequence of device ids per host, all of one length.
      shape: the granule's mesh shape; its product is the number of ids.

    Returns:
      An int64 array of ``shape``; :func:`host_block_problems` finds nothing in it.

    Raises:
      MeshplanTypeError: an id or size is not an int.
      DeviceLayoutError: no hosts, hosts of different sizes (for which no
        block layout is attempted), or a shape whose product is not the number of ids.

    Example:
      >>> arrange_host_blocks([[0, 1], [2, 3], [4, 5], [6, 7]], (2, 4)).tolist()
      [[0, 2, 4, 6], [1, 3, 5, 7]]
      >>> arrange_host_blocks([[0, 1, 2, 3], [4, 5, 6, 7]], (4, 2)).tolist()
      [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    dims = as_positive_shape(shape, "shape")
    rows = [[as_int(i, f"hosts[{h}][{k}]") for k, i in enumerate(as_sequence(host, f"hosts[{h}]"))]
            for h, host in enumerate(as_sequence(hosts, "hosts"))]
    del hosts, shape
    if not rows:
        raise DeviceLayoutError("hosts is empty; give the device ids of at least one host.")
    sizes = sorted({len(r) for r in rows})
    if len(sizes) > 1:
        raise DeviceLayoutError(
            f"the hosts hold different numbers of devices ({sizes}); meshplan gives each host one "
            "contiguous block only for equal hosts (and no jax layout kept these contiguous). Use "
            "equal hosts, or opt out of contiguous host blocks with contiguous_hosts=False."
        )
    total = len(rows) * sizes[0]
    if math.prod(dims) != total:
        raise DeviceLayoutError(
            f"shape={dims} holds {math.prod(dims)} devices but the {len(rows)} host(s) hold {total}."
        )
    per_host, grid = split_over_granules(dims, len(rows))
    return place_granules([np.array(r, dtype=np.int64).reshape(per_host) for r in rows], grid)
