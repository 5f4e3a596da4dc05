"""``create_mesh``: live devices in, ``jax.sharding.Mesh`` out.

The facade gathers three facts from jax (the devices, how they group into
granules, the backend), asks :mod:`meshplan.pure` for the ICI/DCN shapes and
the device order, and builds the Mesh. Only TPU's physical in-slice ordering
is delegated to jax's own ``mesh_utils``, which knows the torus topology.

Deliberate differences from eformer's ``create_mesh``:

* ``axis_types=None`` means ``AxisType.Auto`` on *both* paths. (jax 0.10's
  ``jax.make_mesh`` defaults to Explicit and ``Mesh`` to Auto, so the
  reference returned different meshes depending on ``use_jax``.)
* a user ``dcn_mesh_dims`` is reconciled with ``axis_dims``: the global
  shape stays what was asked for, instead of being silently multiplied.
* impossible requests raise typed meshplan errors; nothing falls back
  silently to another layout.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Hashable, Sequence
from typing import Literal

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from meshplan.facade._devices import describe_devices, resolve_devices
from meshplan.pure.mesh._axes import MeshShape, validate_axis_names
from meshplan.pure.mesh._axis_types import canonicalize_axis_types
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.mesh._layout import DeviceInfo, group_granules, layout_device_ids
from meshplan.pure.mesh._request import (
    MeshRequest,
    MeshShapeLike,
    canonical_dims,
    resolve_mesh_request,
)
from meshplan.pure.mesh._split import per_host_mesh_shape

__all__ = [
    "build_mesh",
    "calculate_host_mesh_shape",
    "clear_mesh_cache",
    "create_mesh",
    "mesh_cache_info",
]

AxisTypeLike = AxisType | str | Literal["auto", "explicit", "manual"]

_CACHE_SIZE = 128


class _MeshCache:
    """A small thread-safe LRU of built meshes.

    Keys hold the resolved request *and* the device ids and platform, so a
    different device set or backend never gets another's mesh.
    """

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._data: collections.OrderedDict[Hashable, Mesh] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Mesh | None:
        with self._lock:
            mesh = self._data.get(key)
            if mesh is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return mesh

    def put(self, key: Hashable, mesh: Mesh) -> None:
        with self._lock:
            self._data[key] = mesh
            self._data.move_to_end(key)
            while len(self._data) > self._maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def info(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "size": len(self._data),
                    "maxsize": self._maxsize}


_cache = _MeshCache(_CACHE_SIZE)


def clear_mesh_cache() -> None:
    """Forget every cached mesh (and reset the hit/miss counters)."""
    _cache.clear()


def mesh_cache_info() -> dict[str, int]:
    """Hits, misses, current size and capacity of the mesh cache."""
    return _cache.info()


def _device_grid(
    devices: Sequence[jax.Device],
    infos: Sequence[DeviceInfo],
    request: MeshRequest,
    *,
    granule_by: str | None,
    sort_granules: bool,
    allow_split_physical_axes: bool,
) -> np.ndarray:
    """Devices arranged in the request's global shape."""
    ici, dcn = request.hybrid.ici_mesh_shape, request.hybrid.dcn_mesh_shape
    if devices[0].platform == "tpu" and getattr(devices[0], "coords", None) is not None:
        # TPU: which chips are torus neighbours is topology knowledge that
        # jax's mesh_utils has and meshplan does not re-derive.
        if all(d == 1 for d in dcn):
            return mesh_utils.create_device_mesh(
                ici, devices, allow_split_physical_axes=allow_split_physical_axes
            )
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices,
            process_is_granule=granule_by == "process",
            should_sort_granules_by_key=sort_granules,
            allow_split_physical_axes=allow_split_physical_axes,
        )
    ids = layout_device_ids(
        infos, request.hybrid, sort_granules=sort_granules, granule_by=granule_by
    )
    by_id = {d.id: d for d in devices}
    return np.array([by_id[int(i)] for i in ids.flat], dtype=object).reshape(ids.shape)


def _canonical_shape(mesh_shape: object) -> tuple[int, ...] | HybridMeshShape | MeshShape:
    if isinstance(mesh_shape, HybridMeshShape | MeshShape):  # checked, frozen and hashable
        return mesh_shape
    return canonical_dims(mesh_shape)


def build_mesh(
    mesh_shape: MeshShapeLike,
    axis_names: Sequence[str],
    *,
    devices: Sequence[jax.Device],
    dcn_mesh_dims: Sequence[int] | None = None,
    axis_types: Sequence[AxisTypeLike] | AxisTypeLike | None = None,
    should_sort_granules_by_key: bool = True,
    allow_split_physical_axes: bool = True,
    use_jax: bool = False,
    granule_by: str | None = None,
) -> Mesh:
    """Lay ``devices`` out as requested (cached); the engine behind create_mesh and MeshConfig."""
    # Canonicalize before the cache lookup: (2.0, 4) == (2, 4) as a dict key.
    mesh_shape = _canonical_shape(mesh_shape)
    axis_names = validate_axis_names(axis_names)
    types = canonicalize_axis_types(axis_types, len(mesh_shape))
    flags = (bool(should_sort_granules_by_key), bool(allow_split_physical_axes), bool(use_jax),
             granule_by, devices[0].platform, tuple(d.id for d in devices))
    # Two keys: the raw arguments (a cheap hit for repeated calls) and the
    # resolved request (so (2, -1) and (2, 4) share one Mesh).
    raw_key = (
        mesh_shape, axis_names,
        None if dcn_mesh_dims is None else canonical_dims(dcn_mesh_dims, "dcn_mesh_dims"), types, *flags,
    )
    mesh = _cache.get(raw_key)
    if mesh is not None:
        return mesh
    infos = describe_devices(devices)
    granules = group_granules(infos, by=granule_by)
    request = resolve_mesh_request(
        mesh_shape, axis_names,
        num_devices=len(devices), num_granules=len(granules), dcn_mesh_dims=dcn_mesh_dims,
    )
    if types is None:
        # One default for both paths (see module docstring).
        types = (AxisType.Auto,) * len(request.axis_names)
    resolved_key = (request, types, *flags)
    mesh = _cache.get(resolved_key)
    if mesh is None:
        mesh = _new_mesh(devices, infos, request, types, use_jax=use_jax, num_granules=len(granules),
                         granule_by=granule_by, sort_granules=should_sort_granules_by_key,
                         allow_split_physical_axes=allow_split_physical_axes)
        _cache.put(resolved_key, mesh)
    _cache.put(raw_key, mesh)
    return mesh


def _new_mesh(
    devices: Sequence[jax.Device],
    infos: Sequence[DeviceInfo],
    request: MeshRequest,
    types: tuple[AxisType, ...],
    *,
    use_jax: bool,
    num_granules: int,
    granule_by: str | None,
    sort_granules: bool,
    allow_split_physical_axes: bool,
) -> Mesh:
    if use_jax and num_granules == 1:
        return jax.make_mesh(request.shape, request.axis_names, axis_types=types, devices=devices)
    # Multi-granule layouts always go through the planned ICI/DCN split, with
    # or without use_jax: jax.make_mesh knows nothing of granules.
    grid = _device_grid(
        devices, infos, request, granule_by=granule_by, sort_granules=sort_granules,
        allow_split_physical_axes=allow_split_physical_axes,
    )
    return Mesh(grid, request.axis_names, axis_types=types)


def create_mesh(
    axis_dims: Sequence[int] = (1, -1, 1, 1, 1),
    axis_names: Sequence[str] = ("dp", "fsdp", "ep", "tp", "sp"),
    dcn_mesh_dims: Sequence[int] | None = None,
    should_sort_granules_by_key: bool = True,
    allow_split_physical_axes: bool = True,
    backend: str | None = None,
    use_jax: bool = False,
    axis_types: Sequence[AxisTypeLike] | AxisTypeLike | None = None,
) -> Mesh:
    """Create a ``jax.sharding.Mesh`` over every device of ``backend``.

    Args:
      axis_dims: global size of each axis; one ``-1`` takes the remaining devices.
      axis_names: one unique name per axis.
      dcn_mesh_dims: how each axis spans granules (TPU slices, or processes
        elsewhere). ``None`` splits the granules over the outermost axes that
        can take them. The global shape stays ``axis_dims`` either way.
      should_sort_granules_by_key: order granules by slice/process index, so
        every process computes the same layout.
      allow_split_physical_axes: passed to jax's TPU topology code.
      backend: ``"cpu"``, ``"gpu"``, ``"tpu"`` or ``None`` for the default.
      use_jax: build single-granule meshes with ``jax.make_mesh``; the result
        (devices and axis types) is the same as the default path.
      axis_types: ``AxisType`` values or ``"auto"``/``"explicit"``/``"manual"``,
        one per axis or one for all. ``None`` means Auto.

    Returns:
      The mesh; the same object for a repeated request on the same devices.

    Raises:
      MeshShapeError: bad dims or names (the message says what would fit).
      DeviceLayoutError: the devices cannot be laid out as asked.

    Example:
      >>> mesh = create_mesh(axis_dims=(2, 4), axis_names=("data", "model"))
      >>> dict(mesh.shape)
      {'data': 2, 'model': 4}
      >>> create_mesh((2, -1), ("data", "model")) is mesh
      True
    """
    return build_mesh(
        axis_dims, axis_names,
        devices=resolve_devices(backend), dcn_mesh_dims=dcn_mesh_dims, axis_types=axis_types,
        should_sort_granules_by_key=should_sort_granules_by_key,
        allow_split_physical_axes=allow_split_physical_axes, use_jax=use_jax,
    )


def calculate_host_mesh_shape(
    global_mesh_shape: Sequence[int],
    total_devices: int | None = None,
    num_processes: int | None = None,
) -> tuple[int, ...]:
    """This host's share of ``global_mesh_shape`` (eformer's signature, live defaults).

    Args:
      global_mesh_shape: the global mesh shape.
      total_devices: devices on this host; ``None`` reads ``jax.local_device_count()``.
      num_processes: processes in the job; ``None`` reads ``jax.process_count()``.

    Returns:
      The host mesh shape; see :func:`meshplan.pure.per_host_mesh_shape`.

    Example:
      >>> calculate_host_mesh_shape((2, 4), total_devices=4, num_processes=2)
      (1, 4)
      >>> calculate_host_mesh_shape((2, 4))  # one process with 8 devices
      (2, 4)
    """
    return per_host_mesh_shape(
        global_mesh_shape,
        jax.local_device_count() if total_devices is None else total_devices,
        jax.process_count() if num_processes is None else num_processes,
    )
