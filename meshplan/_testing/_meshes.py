"""Strategies for mesh shapes, ICI/DCN splits and device sets (plain values; live meshes are in _live).

Sizes that must multiply to a device count are drawn as an assignment of
the count's prime factors to axes (``lists(integers(0, k - 1))``), so every
draw is valid by construction and shrinking moves factors to the first axis:
``(n, 1, ..., 1)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, overload

from hypothesis import strategies as st

from meshplan._testing._check import (
    InvalidArgument,
    check_bool,
    check_int,
    check_names,
    check_order,
)
from meshplan.pure.mesh import DeviceInfo, HybridMeshShape, MeshShape, prime_factors

__all__ = ["AXIS_NAMES", "HostSplit", "MeshDims", "axis_names", "device_counts", "device_layouts",
           "factorizations", "host_splits", "hybrid_mesh_shapes", "mesh_shapes"]

# The names people give mesh axes, the common ones first (shrinking goes to the first).
AXIS_NAMES: tuple[str, ...] = ("dp", "fsdp", "tp", "ep", "sp", "pp", "data", "model", "expert")
_PLATFORMS = ("cpu", "gpu", "tpu")


class MeshDims(NamedTuple):
    """A mesh request as users write it: dims may hold one ``-1``.

    ``resolve_mesh_shape(*dims)`` turns it into a :class:`MeshShape`.
    """

    axis_dims: tuple[int, ...]
    axis_names: tuple[str, ...]
    num_devices: int


class HostSplit(NamedTuple):
    """A global mesh shape and a granule count that it can be split over."""

    global_shape: tuple[int, ...]
    num_granules: int


def _prime_factors(n: int) -> tuple[int, ...]:
    """``n``'s prime factors with multiplicity, ascending (``12`` -> ``(2, 2, 3)``)."""
    return tuple(p for p, e in prime_factors(n).items() for _ in range(e))


def _sizes_from(primes: tuple[int, ...], num_axes: int, where: Sequence[int]) -> tuple[int, ...]:
    sizes = [1] * num_axes
    for p, axis in zip(primes, where):
        sizes[axis] *= p
    return tuple(sizes)


def factorizations(n: int, num_axes: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Tuples of ``num_axes`` sizes >= 1 whose product is ``n``; shrinks to ``(n, 1, ..., 1)``.

    Example:
      >>> from hypothesis import find
      >>> find(factorizations(12, 2), lambda s: True)
      (12, 1)
    """
    check_int(n, "n", minimum=1)
    check_int(num_axes, "num_axes", minimum=0)
    if num_axes == 0 and n != 1:
        raise InvalidArgument(f"n={n} devices cannot be spread over num_axes=0 axes.")
    return _factorizations(n, num_axes)


# cached: the mesh strategies build one per drawn device count, and building and
# validating a strategy costs more than drawing from it
@functools.lru_cache(maxsize=1024)
def _factorizations(n: int, num_axes: int) -> st.SearchStrategy[tuple[int, ...]]:
    if num_axes == 0:
        return st.just(())
    primes = _prime_factors(n)
    where = st.lists(st.integers(0, num_axes - 1), min_size=len(primes), max_size=len(primes))
    return where.map(lambda w: _sizes_from(primes, num_axes, w))


def device_counts(*, min_devices: int = 1, max_devices: int = 8) -> st.SearchStrategy[int]:
    """Device counts in ``[min_devices, max_devices]``; shrinks to ``min_devices``.

    Example:
      >>> from hypothesis import find
      >>> find(device_counts(max_devices=64), lambda n: n >= 6)
      6
    """
    check_int(min_devices, "min_devices", minimum=1)
    check_int(max_devices, "max_devices", minimum=1)
    check_order(min_devices, max_devices, "min_devices", "max_devices")
    return st.integers(min_devices, max_devices)


def axis_names(*, min_size: int = 1, max_size: int | None = None,
               names: Sequence[str] = AXIS_NAMES) -> st.SearchStrategy[tuple[str, ...]]:
    """Tuples of unique mesh axis names taken from ``names``.

    ``max_size=None`` means ``max(min_size, 3)`` (capped by ``len(names)``).
    Shrinks to the first ``min_size`` names, in order: ``("dp",)``.

    Example:
      >>> from hypothesis import find
      >>> find(axis_names(), lambda t: len(t) == 2)
      ('dp', 'fsdp')
    """
    pool = check_names(names, "names", min_size=1)
    check_int(min_size, "min_size", minimum=0)
    if max_size is None:
        max_size = min(max(min_size, 3), len(pool))
    check_int(max_size, "max_size", minimum=0)
    check_order(min_size, max_size, "min_size", "max_size")
    if max_size > len(pool):
        raise InvalidArgument(f"max_size={max_size} is larger than the {len(pool)} names in names={pool!r}.")
    return st.lists(st.sampled_from(pool), min_size=min_size, max_size=max_size, unique=True).map(tuple)


def _place_infer(dims: tuple[int, ...], at: int | None) -> tuple[int, ...]:
    return dims if at is None else dims[:at] + (-1,) + dims[at + 1:]


@overload
def mesh_shapes(*, num_devices: int | None = ..., axis_names: Sequence[str] | None = ...,
                min_axes: int | None = ..., max_axes: int | None = ..., max_devices: int = ...,
                allow_infer: Literal[False] = ...) -> st.SearchStrategy[MeshShape]: ...
@overload
def mesh_shapes(*, num_devices: int | None = ..., axis_names: Sequence[str] | None = ...,
                min_axes: int | None = ..., max_axes: int | None = ..., max_devices: int = ...,
                allow_infer: Literal[True]) -> st.SearchStrategy[MeshDims]: ...
def mesh_shapes(*, num_devices: int | None = None, axis_names: Sequence[str] | None = None,
                min_axes: int | None = None, max_axes: int | None = None, max_devices: int = 8,
                allow_infer: bool = False) -> st.SearchStrategy[Any]:
    """Resolved mesh shapes, or with ``allow_infer=True`` requests that may hold one ``-1``.

    Args:
      num_devices: the product of the sizes; None draws it from ``[1, max_devices]``.
      axis_names: fixed names (then the number of axes is ``len(axis_names)``);
        None draws names from :data:`AXIS_NAMES`.
      min_axes, max_axes: the number of axes when names are drawn (default 1 and 3).
      max_devices: the largest drawn device count when ``num_devices`` is None.
      allow_infer: return :class:`MeshDims` whose dims may hold one ``-1``; each
        resolves with ``resolve_mesh_shape(*dims)``.

    Returns:
      A strategy of :class:`MeshShape` (or :class:`MeshDims` with ``allow_infer``).
      Shrinks to ``min_axes`` axes named ``dp, fsdp, ...``, one device
      (or ``num_devices`` on the first axis), and no ``-1``.

    Example:
      >>> from hypothesis import find
      >>> find(mesh_shapes(num_devices=8), lambda m: m.ndim == 2)
      MeshShape(dp=8, fsdp=1)
    """
    check_bool(allow_infer, "allow_infer")
    check_int(max_devices, "max_devices", minimum=1)
    if num_devices is not None:
        check_int(num_devices, "num_devices", minimum=1)
    # An axis is needed to hold more than one device, and to hold a -1.
    needs_axis = allow_infer or (num_devices is not None and num_devices > 1)
    why = "allow_infer=True" if allow_infer else f"num_devices={num_devices}"
    if axis_names is not None:
        fixed = check_names(axis_names, "axis_names")
        for arg, value in (("min_axes", min_axes), ("max_axes", max_axes)):
            if value is not None and value != len(fixed):
                raise InvalidArgument(f"{arg}={value} conflicts with the {len(fixed)} axis_names={fixed!r}; "
                                      "pass one or the other.")
        if needs_axis and not fixed:
            raise InvalidArgument(f"{why} needs at least one axis, but axis_names=().")
        names_st = st.just(fixed)
    else:
        lo = 1 if min_axes is None else check_int(min_axes, "min_axes", minimum=0)
        hi = max(lo, 3) if max_axes is None else check_int(max_axes, "max_axes", minimum=0)
        check_order(lo, hi, "min_axes", "max_axes")
        if hi > len(AXIS_NAMES):
            raise InvalidArgument(f"max_axes={hi} is larger than the {len(AXIS_NAMES)} built-in names; "
                                  "pass axis_names=... for more axes.")
        if needs_axis:
            if hi == 0:
                raise InvalidArgument(f"{why} needs at least one axis, but max_axes=0.")
            lo = max(lo, 1)
        names_st = st.lists(st.sampled_from(AXIS_NAMES), min_size=lo, max_size=hi, unique=True).map(tuple)
    counts = st.just(num_devices) if num_devices is not None else st.integers(1, max_devices)

    def for_names(names: tuple[str, ...]) -> st.SearchStrategy[Any]:
        def for_count(n: int) -> st.SearchStrategy[Any]:
            dims = factorizations(n, len(names))
            if not allow_infer:
                return dims.map(lambda d: MeshShape(names, d))
            at = st.none() | st.integers(0, len(names) - 1)
            return st.tuples(dims, at).map(lambda da: MeshDims(_place_infer(da[0], da[1]), names, n))

        # no axes: only the one-device mesh (MeshShape((), ()))
        return (counts if names else st.just(1)).flatmap(for_count)

    return names_st.flatmap(for_names)


def hybrid_mesh_shapes(*, num_granules: int | None = None, max_granules: int = 4,
                       devices_per_granule: int | None = None, max_devices_per_granule: int = 8,
                       min_axes: int = 1, max_axes: int = 3,
                       allow_infer: bool = False) -> st.SearchStrategy[HybridMeshShape]:
    """ICI/DCN mesh shapes whose DCN part multiplies to the granule count.

    Args:
      num_granules: product of the DCN part; None draws it from ``[1, max_granules]``.
      devices_per_granule: product of the ICI part; None draws it from
        ``[1, max_devices_per_granule]``.
      min_axes, max_axes: the rank.
      allow_infer: put a ``-1`` in the ICI and/or DCN part (each resolves with
        ``resolve_hybrid(shape, devices_per_granule=..., num_granules=...)``);
        needs both counts fixed, since the caller must know them to resolve.

    Returns:
      A strategy of :class:`HybridMeshShape`; shrinks to ``min_axes`` axes,
      one granule of one device: ``HybridMeshShape((1,), (1,))``.

    Example:
      >>> from hypothesis import find
      >>> find(hybrid_mesh_shapes(num_granules=2, devices_per_granule=4), lambda h: True)
      HybridMeshShape(ici_mesh_shape=(4,), dcn_mesh_shape=(2,))
    """
    check_bool(allow_infer, "allow_infer")
    check_int(max_granules, "max_granules", minimum=1)
    check_int(max_devices_per_granule, "max_devices_per_granule", minimum=1)
    check_int(min_axes, "min_axes", minimum=1)
    check_int(max_axes, "max_axes", minimum=1)
    check_order(min_axes, max_axes, "min_axes", "max_axes")
    if num_granules is not None:
        check_int(num_granules, "num_granules", minimum=1)
    if devices_per_granule is not None:
        check_int(devices_per_granule, "devices_per_granule", minimum=1)
    if allow_infer and (num_granules is None or devices_per_granule is None):
        raise InvalidArgument("allow_infer=True needs num_granules and devices_per_granule, so "
                              "that a drawn -1 can be resolved; "
                              f"got num_granules={num_granules}, devices_per_granule={devices_per_granule}.")
    granules = st.just(num_granules) if num_granules else st.integers(1, max_granules)
    per = st.just(devices_per_granule) if devices_per_granule else st.integers(1, max_devices_per_granule)
    infer = (st.none() | st.integers(0, max_axes - 1)) if allow_infer else st.none()

    def build(rank: int) -> st.SearchStrategy[HybridMeshShape]:
        ici = per.flatmap(lambda n: factorizations(n, rank))
        dcn = granules.flatmap(lambda n: factorizations(n, rank))
        at = infer.map(lambda a: None if a is None else a % rank)
        return st.tuples(ici, dcn, at, at).map(
            lambda t: HybridMeshShape(_place_infer(t[0], t[2]), _place_infer(t[1], t[3])))

    return st.integers(min_axes, max_axes).flatmap(build)


def host_splits(*, max_granules: int = 8, max_devices_per_granule: int = 8,
                min_axes: int = 1, max_axes: int = 3) -> st.SearchStrategy[HostSplit]:
    """A global mesh shape and a granule count that evenly splits it (``split_over_granules``).

    Drawn as ``ici * dcn`` per axis, so a split always exists, though the
    planner may find a different one. Shrinks to ``HostSplit((1,), 1)``.

    Example:
      >>> from hypothesis import find
      >>> find(host_splits(), lambda h: h.num_granules == 2)
      HostSplit(global_shape=(2,), num_granules=2)
    """
    shapes = hybrid_mesh_shapes(max_granules=max_granules, max_devices_per_granule=max_devices_per_granule,
                                min_axes=min_axes, max_axes=max_axes)
    return shapes.map(lambda h: HostSplit(h.global_shape, math.prod(h.dcn_mesh_shape)))


def _tpu_devices(num_slices: int, chips: tuple[int, int, int], hosts: int) -> list[DeviceInfo]:
    x, y, z = chips
    per_slice = x * y * z
    out = []
    for s in range(num_slices):
        for k in range(per_slice):
            coords = (k % x, (k // x) % y, k // (x * y))
            host = s * hosts + k * hosts // per_slice
            out.append(DeviceInfo(s * per_slice + k, process_index=host, slice_index=s, platform="tpu",
                                  coords=coords))
    return out


def _node_devices(platform: str, num_processes: int, per_process: int) -> list[DeviceInfo]:
    return [DeviceInfo(p * per_process + i, process_index=p, platform=platform)
            for p in range(num_processes) for i in range(per_process)]


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _tpu_layouts(num_slices: int | None, num_processes: int | None,
                 max_chips: int) -> st.SearchStrategy[list[DeviceInfo]]:
    """Slices of ``2**e`` chips on an (x, y, z) grid, each over a power-of-two number of hosts."""
    if num_slices is not None:
        slices = [num_slices]
    elif num_processes is not None:
        slices = [s for s in range(1, num_processes + 1) if num_processes % s == 0]
    else:
        slices = [1, 2]
    if num_processes is not None:
        slices = [s for s in slices if num_processes % s == 0 and _is_pow2(num_processes // s)]
    if not slices:
        raise InvalidArgument(f"num_processes={num_processes} cannot be spread over num_slices="
                              f"{num_slices} TPU slices with a power-of-two host count in each.")
    max_exp = max(0, max_chips.bit_length() - 1)

    def for_slices(s: int) -> st.SearchStrategy[list[DeviceInfo]]:
        hosts = st.just(num_processes // s) if num_processes is not None else st.sampled_from([1, 2, 4])
        def for_hosts(h: int) -> st.SearchStrategy[list[DeviceInfo]]:
            low = h.bit_length() - 1
            exps = st.integers(low, max(low, max_exp))
            grids = exps.flatmap(lambda e: factorizations(2 ** e, 3))
            return grids.map(lambda g: _tpu_devices(s, (g[0], g[1], g[2]), h))
        return hosts.flatmap(for_hosts)

    return st.sampled_from(slices).flatmap(for_slices)


# cached: one strategy per count, not one per draw (building and validating them dominates small draws)
@functools.lru_cache(maxsize=256)
def _unique_ints(count: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, 8 * count), min_size=count, max_size=count, unique=True)


def _renumbered(devices: list[DeviceInfo]) -> st.SearchStrategy[list[DeviceInfo]]:
    """The devices with ids and process indices drawn from wider ranges, each still unique."""
    hosts = sorted({d.process_index for d in devices})
    return st.tuples(_unique_ints(len(devices)), _unique_ints(len(hosts))).map(lambda t: [
        dataclasses.replace(d, id=t[0][k], process_index=t[1][hosts.index(d.process_index)])
        for k, d in enumerate(devices)])


def device_layouts(*, platform: str | None = None, num_slices: int | None = None,
                   num_processes: int | None = None, max_processes: int = 4,
                   max_devices_per_granule: int = 8, subset: bool = False,
                   shuffle: bool = True) -> st.SearchStrategy[tuple[DeviceInfo, ...]]:
    """Plain device sets as jax would report them, for :func:`meshplan.pure.layout_device_ids`.

    * ``"tpu"``: ``num_slices`` slices of chips with ``(x, y, z)`` coordinates
      (a power-of-two grid) and ``slice_index``, each slice spread over equal hosts;
    * ``"gpu"``: ``num_processes`` nodes of equal size;
    * ``"cpu"``: ``num_processes`` processes of equal size.

    Ids are unique and every granule (slice on TPU, else process) has the same
    size. ``max_processes`` bounds a drawn CPU/GPU process count. With
    ``subset`` the devices are part of a larger system: ids and process
    indices are unique but need not start at 0, be contiguous, or rise
    together. With ``shuffle`` the listing order is a permutation (layout must
    not depend on it). Shrinks to one CPU device with id 0.

    Example:
      >>> from hypothesis import find
      >>> find(device_layouts(platform="gpu", num_processes=2), lambda d: True)
      (DeviceInfo(id=0, process_index=0, ...), DeviceInfo(id=1, process_index=1, ...))
    """
    check_bool(shuffle, "shuffle")
    check_bool(subset, "subset")
    check_int(max_processes, "max_processes", minimum=1)
    check_int(max_devices_per_granule, "max_devices_per_granule", minimum=1)
    if platform is not None and platform not in _PLATFORMS:
        raise InvalidArgument(f"platform={platform!r} must be None or one of {_PLATFORMS}.")
    if num_slices is not None:
        check_int(num_slices, "num_slices", minimum=1)
        if platform not in (None, "tpu"):
            raise InvalidArgument(f"num_slices={num_slices} only applies to platform='tpu', "
                                  f"not platform={platform!r}.")
    if num_processes is not None:
        check_int(num_processes, "num_processes", minimum=1)
    if num_slices is not None:
        platform = "tpu"
    tpu = None
    if platform in (None, "tpu"):
        try:
            tpu = _tpu_layouts(num_slices, num_processes, max_devices_per_granule)
        except InvalidArgument:
            if platform == "tpu":
                raise
    # without a platform, TPU is left out where the process count does not fit it
    platforms = st.just(platform) if platform else st.sampled_from(
        tuple(p for p in _PLATFORMS if p != "tpu" or tpu is not None))
    counts = st.just(num_processes) if num_processes else st.integers(1, max_processes)

    def build(plat: str) -> st.SearchStrategy[list[DeviceInfo]]:
        if plat == "tpu":
            assert tpu is not None  # only sampled when a TPU layout exists
            return tpu
        return st.tuples(counts, st.integers(1, max_devices_per_granule)).map(
            lambda t: _node_devices(plat, *t))

    devices = platforms.flatmap(build)
    if subset:
        devices = devices.flatmap(_renumbered)
    if shuffle:
        devices = devices.flatmap(st.permutations)
    return devices.map(tuple)
