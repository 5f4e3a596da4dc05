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
import concurrent.futures
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Literal

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from meshplan.facade._devices import describe_devices, resolve_devices
from meshplan.pure._check import as_flag
from meshplan.pure.mesh._axes import MeshShape, validate_axis_names
from meshplan.pure.mesh._axis_types import canonicalize_axis_types
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.errors import DeviceLayoutError
from meshplan.pure.mesh._hosts import host_block_problems, place_granules
from meshplan.pure.mesh._layout import DeviceInfo, granule_device_ids, group_granules
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
    """A small thread-safe LRU of built meshes that builds each key once.

    Keys hold the resolved request *and* the device ids and platform, so a
    different device set or backend never gets another's mesh. Concurrent
    callers asking for the same missing key wait for the first caller's
    build (a per-key future) instead of each building their own.
    """

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._data: collections.OrderedDict[Hashable, Mesh] = collections.OrderedDict()
        self._pending: dict[Hashable, concurrent.futures.Future[Mesh]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.builds = 0

    def get(self, key: Hashable) -> Mesh | None:
        with self._lock:
            mesh = self._data.get(key)
            if mesh is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return mesh

    def _store(self, key: Hashable, mesh: Mesh) -> None:
        # Caller holds the lock.
        self._data[key] = mesh
        self._data.move_to_end(key)
        while len(self._data) > self._maxsize:
            self._data.popitem(last=False)

    def put(self, key: Hashable, mesh: Mesh) -> None:
        with self._lock:
            self._store(key, mesh)

    def get_or_build(self, key: Hashable, build: Callable[[], Mesh]) -> Mesh:
        """The cached mesh for ``key``, else ``build()`` run once however many threads ask."""
        with self._lock:
            mesh = self._data.get(key)
            if mesh is not None:
                self._data.move_to_end(key)
                self.hits += 1
                return mesh
            self.misses += 1
            future = self._pending.get(key)
            owner = future is None
            if future is None:
                future = self._pending[key] = concurrent.futures.Future()
        if not owner:
            return future.result()  # the builder's mesh, or its exception re-raised
        try:
            mesh = build()
        except BaseException as err:
            with self._lock:
                del self._pending[key]
            future.set_exception(err)
            raise
        with self._lock:
            self.builds += 1
            self._store(key, mesh)
            del self._pending[key]
        future.set_result(mesh)
        return mesh

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = self.builds = 0

    def info(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "builds": self.builds,
                    "size": len(self._data), "maxsize": self._maxsize}


_cache = _MeshCache(_CACHE_SIZE)


def clear_mesh_cache() -> None:
    """Forget every cached mesh (and reset the hit/miss counters)."""
    _cache.clear()


def mesh_cache_info() -> dict[str, int]:
    """Hits, misses, meshes built, current size and capacity of the mesh cache."""
    return _cache.info()


def _ids_of(grid: np.ndarray) -> np.ndarray:
    return np.array([d.id for d in grid.flat], dtype=np.int64).reshape(grid.shape)


def _jax_grid(
    ici: tuple[int, ...], members: Sequence[jax.Device], *, contiguous: bool, allow_split: bool
) -> np.ndarray:
    """jax's torus-aware layout of one slice (a TPU granule)."""
    grid: np.ndarray = mesh_utils.create_device_mesh(
        ici, members, contiguous_submeshes=contiguous, allow_split_physical_axes=allow_split
    )
    return _ids_of(grid)


def _tpu_granule_ids(
    granule: Sequence[DeviceInfo],
    ici: tuple[int, ...],
    by_id: Mapping[int, jax.Device],
    *,
    allow_split_physical_axes: bool,
    contiguous_hosts: bool,
) -> np.ndarray:
    """One TPU slice in its ICI shape; over several hosts, each host one contiguous block.

    Which chips are torus neighbours is topology knowledge that jax's
    ``mesh_utils`` has, so jax lays out the slice where it can: with
    ``contiguous_submeshes=True`` first (its per-host layout for the
    topologies it knows), then its default layout if that happens to keep
    every host contiguous. Failing both, meshplan's own host-block layout
    (:func:`meshplan.pure.mesh.granule_device_ids`, which ignores the torus)
    is used if physical axes may be split, else it is an error. A slice on
    one host, or ``contiguous_hosts=False``, takes jax's default layout as is.
    """
    # In the caller's order: jax's handlers expect jax.devices() order (process-
    # tiled) and some of them (v2/v3) read it. create_mesh passes jax.devices(),
    # which every process lists the same way.
    wanted = {d.id for d in granule}
    members = [d for d in by_id.values() if d.id in wanted]
    process_of = {d.id: d.process_index for d in granule}
    if len(set(process_of.values())) == 1 or not contiguous_hosts:
        try:
            return _jax_grid(ici, members, contiguous=False, allow_split=allow_split_physical_axes)
        except (ValueError, AssertionError) as err:  # jax's own checks of the slice and shape
            raise DeviceLayoutError(
                f"jax cannot lay out this TPU slice ({len(members)} devices) as {ici}: {err}"
            ) from err
    for contiguous in (True, False):
        try:
            ids = _jax_grid(ici, members, contiguous=contiguous, allow_split=allow_split_physical_axes)
        except (ValueError, AssertionError):
            continue  # this jax layout does not apply here; try the next one
        if not host_block_problems(ids, process_of):
            return ids
    if not allow_split_physical_axes:
        # meshplan's own layout ignores the torus, so it would split physical axes.
        raise DeviceLayoutError(
            f"jax has no layout of this TPU slice ({len(members)} devices over {len(set(process_of.values()))} "
            f"hosts) as {ici} that keeps each host contiguous without splitting physical axes; pass "
            "allow_split_physical_axes=True (meshplan then plans the host blocks) or contiguous_hosts=False."
        )
    return granule_device_ids(granule, ici)


def _device_grid(
    devices: Sequence[jax.Device],
    granules: Sequence[Sequence[DeviceInfo]],
    request: MeshRequest,
    *,
    allow_split_physical_axes: bool,
    contiguous_hosts: bool,
) -> np.ndarray:
    """Devices arranged in the request's global shape: each granule one ICI block on the DCN grid."""
    ici, dcn = request.hybrid.ici_mesh_shape, request.hybrid.dcn_mesh_shape
    by_id = {d.id: d for d in devices}
    on_tpu = devices[0].platform == "tpu" and getattr(devices[0], "coords", None) is not None
    grids = [
        _tpu_granule_ids(g, ici, by_id, allow_split_physical_axes=allow_split_physical_axes,
                         contiguous_hosts=contiguous_hosts)
        if on_tpu else granule_device_ids(g, ici)
        for g in granules
    ]
    ids = place_granules(grids, dcn)
    out = np.empty(ids.shape, dtype=object)
    for index, device_id in np.ndenumerate(ids):
        out[index] = by_id[int(device_id)]
    return out


def _devices_key(devices: Sequence[jax.Device]) -> Hashable:
    """The device set, as a cache key: the devices themselves, in order.

    Ids alone are not enough once device descriptions are accepted (two
    topologies described with ids 0..n-1). Unhashable descriptions are keyed
    by identity; the cached Mesh holds them, so their ids stay unique.
    """
    key = tuple(devices)
    try:
        hash(key)
    except TypeError:
        return tuple((type(d).__name__, id(d)) for d in devices)
    return key


def _canonical_shape(mesh_shape: object, name: str) -> tuple[int, ...] | HybridMeshShape | MeshShape:
    if isinstance(mesh_shape, HybridMeshShape | MeshShape):  # checked, frozen and hashable
        return mesh_shape
    return canonical_dims(mesh_shape, name)


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
    contiguous_hosts: bool = True,
    shape_name: str = "axis_dims",
) -> Mesh:
    """Lay ``devices`` out as requested (cached); the engine behind create_mesh and MeshConfig.

    ``shape_name`` is what the caller called ``mesh_shape`` (``axis_dims`` for
    create_mesh, ``mesh_shape`` for MeshConfig), so messages use the caller's word.
    """
    # Canonicalize before the cache lookup: (np.int64(2), 4) == (2, 4) as a dict key.
    mesh_shape = _canonical_shape(mesh_shape, shape_name)
    axis_names = validate_axis_names(axis_names)
    types = canonicalize_axis_types(axis_types, len(mesh_shape))
    flags = (as_flag(should_sort_granules_by_key, "should_sort_granules_by_key"),
             as_flag(allow_split_physical_axes, "allow_split_physical_axes"), as_flag(use_jax, "use_jax"),
             granule_by, as_flag(contiguous_hosts, "contiguous_hosts"), _devices_key(devices))
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
    granules = group_granules(infos, by=granule_by, sort_by_key=should_sort_granules_by_key)
    request = resolve_mesh_request(
        mesh_shape, axis_names, num_devices=len(devices), num_granules=len(granules),
        dcn_mesh_dims=dcn_mesh_dims, shape_name=shape_name,
    )
    if types is None:
        # One default for both paths (see module docstring).
        types = (AxisType.Auto,) * len(request.axis_names)
    resolved_types = types
    one_process = len({d.process_index for d in infos}) == 1

    def build() -> Mesh:
        # jax.make_mesh knows nothing of granules or hosts: it only builds
        # single-granule meshes on one process (or when host blocks are waived).
        if use_jax and len(granules) == 1 and (one_process or not contiguous_hosts):
            return jax.make_mesh(request.shape, request.axis_names, axis_types=resolved_types, devices=devices)
        grid = _device_grid(devices, granules, request, allow_split_physical_axes=allow_split_physical_axes,
                            contiguous_hosts=contiguous_hosts)
        return Mesh(grid, request.axis_names, axis_types=resolved_types)

    mesh = _cache.get_or_build((request, types, *flags), build)
    _cache.put(raw_key, mesh)
    return mesh


def create_mesh(
    axis_dims: Sequence[int] = (1, -1, 1, 1, 1),
    axis_names: Sequence[str] = ("dp", "fsdp", "ep", "tp", "sp"),
    dcn_mesh_dims: Sequence[int] | None = None,
    should_sort_granules_by_key: bool = True,
    allow_split_physical_axes: bool = True,
    backend: str | None = None,
    use_jax: bool = False,
    axis_types: Sequence[AxisTypeLike] | AxisTypeLike | None = None,
    *,
    contiguous_hosts: bool = True,
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
      contiguous_hosts: on a TPU slice spread over several hosts, give every
        host one contiguous block of the mesh (jax's ``contiguous_submeshes``
        layout where jax has one, else meshplan's). ``False`` takes jax's
        default layout even where a host's devices are scattered.

    Returns:
      The mesh; the same object for a repeated request on the same devices.

    Raises:
      MeshShapeError: bad dims or names (the message says what would fit).
      DeviceLayoutError: the devices cannot be laid out as asked (e.g. the
        hosts of a slice hold different device counts, so no layout gives
        each one block; ``contiguous_hosts=False`` waives that).

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
        contiguous_hosts=contiguous_hosts,
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
