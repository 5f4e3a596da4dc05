"""Device layout: plain device descriptions in, a global array of device ids out.

This is the shape-only twin of jax's ``mesh_utils.create_hybrid_device_mesh``:
devices are grouped into granules (TPU slices or processes), each granule
is laid out in the ICI shape, and granules are placed on the DCN grid. It
works on :class:`DeviceInfo` records, never on live devices, and returns
ids; the facade maps ids back to ``jax.Device`` objects.

Where it differs from jax on purpose:

- Devices inside a granule are ordered by ``id`` (by physical coordinates
  on TPU) rather than by the order the caller happened to list them, so
  every process computes the same mesh from the same device set.
- Uneven granules, duplicate ids, mixed platforms and ICI/DCN shapes that
  do not match the granules are errors that say what was found.
- A granule spread over several processes (a multi-host TPU slice) is laid
  out so each process's devices form one contiguous block
  (:func:`~meshplan.pure.mesh.arrange_host_blocks`), which jax's layout does
  not promise.
- A TPU device without ``slice_index`` belongs to slice 0 (a single-slice
  job), as AXLearn treats it; jax's ``create_hybrid_device_mesh`` raises.
- TPU torus-aware placement inside a slice is not attempted; the facade
  may delegate it to jax's ``mesh_utils``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from collections.abc import Callable
from typing import Any

import numpy as np

from meshplan.pure._check import as_count, as_flag, as_int_tuple
from meshplan.pure.errors import DeviceLayoutError, MeshplanTypeError, MeshShapeError
from meshplan.pure.mesh._hosts import arrange_host_blocks, place_granules
from meshplan.pure.mesh._hybrid import HybridMeshShape, resolve_hybrid

__all__ = ["DeviceInfo", "granule_device_ids", "group_granules", "layout_device_ids"]

_GRANULE_KEYS = {"slice": "slice_index", "process": "process_index"}


def _non_negative(value: Any, what: str) -> int:
    return as_count(value, what, minimum=0, error=DeviceLayoutError)


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What layout needs to know about one device; plain data, no backend.

    Args:
      id: the device id, unique across the device set.
      process_index: the process (host) owning the device.
      slice_index: the TPU slice, or None where the platform has no slices.
      platform: ``"cpu"``, ``"gpu"``, ``"tpu"``...
      coords: physical coordinates (TPU), or None.
      core_on_chip: the core index within a chip (TPU), else 0.

    Raises:
      MeshplanTypeError: a field has the wrong type.
      DeviceLayoutError: a negative index or an empty platform.

    Example:
      >>> DeviceInfo(3, process_index=1)
      DeviceInfo(id=3, process_index=1, slice_index=None, platform='cpu', coords=None,
                 core_on_chip=0)
    """

    id: int
    process_index: int = 0
    slice_index: int | None = None
    platform: str = "cpu"
    coords: tuple[int, ...] | None = None
    core_on_chip: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", _non_negative(self.id, "id"))
        object.__setattr__(
            self, "process_index", _non_negative(self.process_index, "process_index")
        )
        if self.slice_index is not None:
            object.__setattr__(self, "slice_index", _non_negative(self.slice_index, "slice_index"))
        if not isinstance(self.platform, str) or not self.platform:
            raise MeshplanTypeError(
                f"platform={self.platform!r} must be a non-empty string such as 'cpu' or 'tpu'."
            )
        if self.coords is not None:
            object.__setattr__(self, "coords", as_int_tuple(self.coords, "coords"))
        object.__setattr__(self, "core_on_chip", _non_negative(self.core_on_chip, "core_on_chip"))

    @classmethod
    def from_device(cls, device: Any) -> DeviceInfo:
        """Reads the fields from any device-like object (a ``jax.Device`` or a fake).

        Only attributes are read; nothing is called on a backend. Missing
        optional attributes take the field defaults.

        Example:
          >>> from types import SimpleNamespace
          >>> DeviceInfo.from_device(SimpleNamespace(id=5, process_index=1, platform="gpu"))
          DeviceInfo(id=5, process_index=1, slice_index=None, platform='gpu', coords=None,
                     core_on_chip=0)
        """
        if not hasattr(device, "id"):
            raise MeshplanTypeError(f"device={device!r:.80} has no .id; pass a jax.Device or a device-like "
                                    "object with id (and optionally process_index, slice_index, platform, coords).")
        coords = getattr(device, "coords", None)
        if coords is not None and (isinstance(coords, (str, bytes)) or not isinstance(coords, Sequence)):
            raise MeshplanTypeError(f"device {device.id!r}: coords={coords!r:.80} must be a sequence of ints.")
        return cls(
            id=device.id,
            process_index=getattr(device, "process_index", 0),
            slice_index=getattr(device, "slice_index", None),
            platform=getattr(device, "platform", "cpu"),
            coords=None if coords is None else tuple(coords),
            core_on_chip=getattr(device, "core_on_chip", 0),
        )


def _as_device_infos(devices: Any) -> tuple[DeviceInfo, ...]:
    """A flat tuple of DeviceInfo from a sequence or an array of them."""
    if isinstance(devices, np.ndarray):
        items = tuple(devices.flat)
    elif isinstance(devices, Sequence) and not isinstance(devices, (str, bytes)):
        items = tuple(devices)
    else:
        raise MeshplanTypeError(
            f"devices={devices!r} has type {type(devices).__name__}; expected a sequence or "
            "array of DeviceInfo (see DeviceInfo.from_device)."
        )
    bad = [f"devices[{i}]={d!r}" for i, d in enumerate(items) if not isinstance(d, DeviceInfo)]
    if bad:
        raise MeshplanTypeError(
            f"expected DeviceInfo entries; got {', '.join(bad[:3])}"
            f"{' ...' if len(bad) > 3 else ''}. Convert devices with DeviceInfo.from_device."
        )
    if not items:
        raise DeviceLayoutError("devices is empty; a mesh needs at least one device.")
    return items


def _check_device_set(items: tuple[DeviceInfo, ...]) -> None:
    """Duplicate ids and mixed platforms make a layout meaningless."""
    counts = collections.Counter(d.id for d in items)
    dups = sorted(i for i, n in counts.items() if n > 1)
    if dups:
        raise DeviceLayoutError(
            f"device ids {dups} appear more than once in devices; pass each device once."
        )
    platforms = sorted({d.platform for d in items})
    if len(platforms) > 1:
        raise DeviceLayoutError(
            f"devices mix platforms {platforms}; a mesh is built from one platform's devices."
        )


def _slice_of(device: DeviceInfo) -> int | None:
    # A TPU always sits in a slice: without slice_index (a single-slice job,
    # or AXLearn's and jax's test devices) it is slice 0.
    if device.slice_index is None and device.platform == "tpu":
        return 0
    return device.slice_index


def _granule_key(by: str | None, items: tuple[DeviceInfo, ...]) -> Callable[[DeviceInfo], int | None]:
    """The function giving a device's granule key."""
    if by is None:
        # Slices on TPU only: other platforms may report a slice_index, but
        # their granule (a node) is the process.
        return _slice_of if all(d.platform == "tpu" for d in items) else _process_of
    if not isinstance(by, str):
        raise MeshplanTypeError(f"by={by!r} must be None, 'slice' or 'process'.")
    if by not in _GRANULE_KEYS:
        raise DeviceLayoutError(f"by={by!r} is not a granule kind; use None, 'slice' or 'process'.")
    if by == "slice":
        missing = sorted(d.id for d in items if _slice_of(d) is None)
        if missing:
            raise DeviceLayoutError(
                f"by='slice' but devices with ids {missing[:8]}{' ...' if len(missing) > 8 else ''}"
                " have slice_index=None; use by='process' (or None) on platforms without slices."
            )
        return _slice_of
    return _process_of


def _process_of(device: DeviceInfo) -> int:
    return device.process_index


def _in_granule_key(device: DeviceInfo) -> tuple[int, tuple[int, ...], int, int]:
    # Physical order on TPU keeps neighbours adjacent along the last ICI axis;
    # id order elsewhere is what jax uses for GPUs and is stable across hosts.
    if device.platform == "tpu" and device.coords is not None:
        return (0, device.coords, device.core_on_chip, device.id)
    return (1, (), 0, device.id)


def group_granules(
    devices: Sequence[DeviceInfo], *, by: str | None = None, sort_by_key: bool = True
) -> tuple[tuple[DeviceInfo, ...], ...]:
    """Groups devices into equal-size granules, each in a deterministic order.

    Args:
      devices: the devices (a sequence or array of :class:`DeviceInfo`).
      by: ``"slice"`` (``slice_index``), ``"process"`` (``process_index``), or
        None: slices on TPU (a TPU device without ``slice_index`` is in slice
        0), processes elsewhere.
      sort_by_key: order granules by key (default), else by first appearance
        in ``devices`` (jax's ``should_sort_granules_by_key=False``).

    Returns:
      The granules; inside each, devices are ordered by ``id``, or on TPU by
      ``(coords, core_on_chip)`` when coordinates are known.

    Raises:
      MeshplanTypeError: ``devices`` or an entry has the wrong type.
      DeviceLayoutError: no devices; duplicate ids; mixed platforms; a bad
        ``by``; or granules of different sizes (the sizes per key are listed).

    Example:
      >>> devs = [DeviceInfo(i, process_index=i // 2) for i in (3, 0, 2, 1)]
      >>> [[d.id for d in g] for g in group_granules(devs)]
      [[0, 1], [2, 3]]
    """
    items = _as_device_infos(devices)
    del devices
    _check_device_set(items)
    key_of = _granule_key(by, items)
    attr = "process_index" if key_of is _process_of else "slice_index"
    groups: dict[int, list[DeviceInfo]] = {}
    for device in items:
        key = key_of(device)
        assert key is not None  # _granule_key only picks slices when every device has one
        groups.setdefault(key, []).append(device)
    keys = sorted(groups) if as_flag(sort_by_key, "sort_by_key") else list(groups)  # dicts keep first-appearance order
    sizes = {key: len(groups[key]) for key in keys}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{attr}={k}: {n}" for k, n in sorted(sizes.items()))
        raise DeviceLayoutError(
            f"granules by {attr} have different sizes ({listed}); every granule must hold the "
            "same number of devices. Pass a device set with equal counts per granule."
        )
    return tuple(tuple(sorted(groups[key], key=_in_granule_key)) for key in keys)


def layout_device_ids(
    devices: Sequence[DeviceInfo],
    shape: HybridMeshShape,
    *,
    sort_granules: bool = True,
    granule_by: str | None = None,
) -> np.ndarray:
    """The global mesh as an array of device ids, like ``create_hybrid_device_mesh``.

    Granule ``g`` (in key order) fills the block at DCN position
    ``unravel(g, dcn)``; inside it, its devices fill the ICI shape row-major.
    Along each axis, global index = ``dcn_index * ici_size + ici_index``.

    Args:
      devices: the devices (a sequence or array of :class:`DeviceInfo`).
      shape: the hybrid shape; a ``-1`` per part is resolved against the
        granule size and the number of granules.
      sort_granules: place granules in key order (default) or first-appearance order.
      granule_by: passed to :func:`group_granules` as ``by``.

    Returns:
      An int64 array of shape ``shape.global_shape`` holding every id once.

    Raises:
      MeshplanTypeError: wrong argument types.
      DeviceLayoutError: bad granules (see :func:`group_granules`), or a
        shape whose DCN product is not the number of granules or whose ICI
        product is not the granule size.

    Example:
      >>> devs = [DeviceInfo(i, process_index=i // 4) for i in range(8)]
      >>> layout_device_ids(devs, HybridMeshShape((1, 4), (2, 1))).tolist()
      [[0, 1, 2, 3], [4, 5, 6, 7]]
      >>> layout_device_ids(devs, HybridMeshShape((2, 2), (1, 2))).tolist()
      [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    if not isinstance(shape, HybridMeshShape):
        raise MeshplanTypeError(
            f"shape={shape!r} has type {type(shape).__name__}; expected a HybridMeshShape "
            "(use split_mesh_shape for a plain mesh shape)."
        )
    granules = group_granules(devices, by=granule_by, sort_by_key=sort_granules)
    per_granule = len(granules[0])
    try:
        resolved = resolve_hybrid(
            shape, devices_per_granule=per_granule, num_granules=len(granules)
        )
    except MeshShapeError as err:
        raise DeviceLayoutError(
            f"{shape!r} does not fit the devices, which form {len(granules)} granule(s) of "
            f"{per_granule} device(s): {err}"
        ) from err
    grids = [granule_device_ids(g, resolved.ici_mesh_shape) for g in granules]
    return place_granules(grids, resolved.dcn_mesh_shape)


def granule_device_ids(granule: Sequence[DeviceInfo], shape: Sequence[int]) -> np.ndarray:
    """One granule's device ids in ``shape``, each process's devices one contiguous block.

    Devices are taken in :func:`group_granules`' order (physical on TPU, by
    id elsewhere). A granule of one process fills ``shape`` row-major; one
    spread over several processes (a multi-host TPU slice) gives each process
    one block (:func:`~meshplan.pure.mesh.arrange_host_blocks`), hosts in
    the order of their first device.

    Args:
      granule: the granule's devices (one of :func:`group_granules`' groups).
      shape: the granule's (ICI) mesh shape; its product is the device count.

    Returns:
      An int64 array of ``shape``.

    Raises:
      MeshplanTypeError: wrong argument types.
      DeviceLayoutError: the processes hold different device counts, or the
        shape does not hold the granule's devices.

    Example:
      >>> devs = [DeviceInfo(i, process_index=i // 2, slice_index=0, platform="tpu",
      ...                    coords=(i % 4, i // 4, 0)) for i in range(8)]
      >>> granule_device_ids(devs, (2, 4)).tolist()  # process p holds ids 2p, 2p+1: one column each
      [[0, 4, 2, 6], [1, 5, 3, 7]]
    """
    items = sorted(_as_device_infos(granule), key=_in_granule_key)
    del granule
    hosts: dict[int, list[int]] = {}
    for device in items:  # dicts keep first-appearance order: hosts by their first device
        hosts.setdefault(device.process_index, []).append(device.id)
    return arrange_host_blocks(list(hosts.values()), shape)
