"""Exact per-device memory of a pytree under its PartitionSpecs.

Device positions are the mesh's index grid in row-major order (the order of
``mesh.devices.flat``): position ``k`` is the device at
``np.unravel_index(k, mesh_shape)``. Along a dim split over axes
``(a1, a2)`` the device at coordinates ``c`` holds shard
``c[a1] * size[a2] + c[a2]`` (the first axis is major, as in jax).

Bytes follow :func:`meshplan.pure.array_bytes`: by default what
``jax.Array.nbytes`` reports (one byte per sub-byte element), or packed with
``packed_subbyte=True``. For specs jax can store (every split divides its
dim) all shards of an array are equal and the figures equal the sum of
``addressable_shards[i].data.nbytes`` per device, byte for byte.

Uneven splits exist only inside ``jit``, where XLA pads every shard up to
``ceil(d / n)``. ``padding="padded"`` (the default) counts those padded
buffers, which is what XLA allocates; ``padding="actual"`` counts only the
real elements, so the last shards are smaller (possibly empty).
``P.UNCONSTRAINED`` dims are counted as replicated (an upper bound) and the
result says ``exact=False``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from meshplan.pure._check import as_choice, as_count, as_flag, as_int, as_positive_shape, as_sequence
from meshplan.pure._types import AxisSizes, PyTree
from meshplan.pure.errors import MeshplanTypeError, SpecError
from meshplan.pure.specs._dtypes import array_bytes, dtype_bits, dtype_storage_bytes
from meshplan.pure.specs._geometry import (
    UNCONSTRAINED,
    ShardGeometry,
    canonical_entries,
    shard_geometry,
)
from meshplan.pure.specs._tree import LeafInfo, TreeFacts
from meshplan.pure.specs._validate import Finding, _resolve, group_leaves, raise_errors

__all__ = [
    "MemoryEstimate",
    "PlacedGroup",
    "estimate_groups",
    "estimate_leaves_memory",
    "estimate_memory",
    "leaf_groups",
    "place_groups",
    "validate_and_estimate",
]

_PADDING = ("padded", "actual")


def _byte_counts(value: Any, what: str) -> tuple[int, ...]:
    """A tuple of Python ints >= 0 (byte counts per device); checked in bulk, as there may be thousands."""
    items = as_sequence(value, what)
    if not all(type(b) is int for b in items):
        items = tuple(as_int(b, f"{what}[{i}]") for i, b in enumerate(items))
    if items and min(items) < 0:
        raise SpecError(f"{what} has negative byte counts (min {min(items)}); bytes are >= 0.")
    return items


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes every device of a mesh holds for one pytree.

    Attributes:
      axis_names: mesh axis names, in mesh order.
      mesh_shape: mesh axis sizes, in mesh order.
      per_device: bytes per device position, row-major over ``mesh_shape``.
      total_unsharded_bytes: bytes of the whole tree on one device.
      replicated_bytes: unsharded bytes of the leaves no spec splits
        (every device holds them whole).
      sharded_bytes: unsharded bytes of the leaves split at least once.
      num_arrays: array leaves counted.
      padded: some dim is split unevenly (only possible inside ``jit``).
      exact: False when ``P.UNCONSTRAINED`` dims were counted as replicated.
    """

    axis_names: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    per_device: tuple[int, ...]
    total_unsharded_bytes: int
    replicated_bytes: int
    sharded_bytes: int
    num_arrays: int
    padded: bool = False
    exact: bool = True

    def __post_init__(self) -> None:
        names = as_sequence(self.axis_names, "axis_names")
        bad_names = [n for n in names if not isinstance(n, str)]
        if bad_names:
            raise MeshplanTypeError(f"axis_names={names!r:.80} has non-str names {bad_names!r:.80}.")
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "mesh_shape", as_positive_shape(self.mesh_shape, "mesh_shape"))
        object.__setattr__(self, "per_device", _byte_counts(self.per_device, "per_device"))
        for field in ("total_unsharded_bytes", "replicated_bytes", "sharded_bytes", "num_arrays"):
            object.__setattr__(self, field, as_count(getattr(self, field), field, minimum=0, error=SpecError))
        for field in ("padded", "exact"):
            object.__setattr__(self, field, as_flag(getattr(self, field), field))
        if len(self.axis_names) != len(self.mesh_shape):
            raise MeshplanTypeError(f"axis_names={self.axis_names} and mesh_shape={self.mesh_shape} differ in length.")
        if len(self.per_device) != math.prod(self.mesh_shape):
            raise MeshplanTypeError(
                f"per_device has {len(self.per_device)} entries; mesh_shape={self.mesh_shape} needs "
                f"{math.prod(self.mesh_shape)}."
            )
        if self.replicated_bytes + self.sharded_bytes != self.total_unsharded_bytes:
            raise MeshplanTypeError("replicated_bytes + sharded_bytes must equal total_unsharded_bytes.")

    @property
    def num_devices(self) -> int:
        """Devices in the mesh."""
        return len(self.per_device)

    @property
    def max_per_device(self) -> int:
        """Bytes on the fullest device: what must fit."""
        return max(self.per_device)

    @property
    def min_per_device(self) -> int:
        """Bytes on the emptiest device."""
        return min(self.per_device)

    @property
    def mean_per_device(self) -> float:
        """Average bytes per device."""
        return sum(self.per_device) / len(self.per_device)

    def to_dict(self) -> dict[str, Any]:
        """The reference's keys (``total_size``, ``size_per_device`` = the max) plus the rest.

        Example:
          >>> import numpy as np
          >>> from jax.sharding import PartitionSpec as P
          >>> d = estimate_memory({"w": np.zeros((8, 4), np.float32)}, {"w": P("x")}, {"x": 4}).to_dict()
          >>> d["total_size"], d["size_per_device"], d["per_device"]
          (128, 32, [32, 32, 32, 32])
        """
        return {
            "total_size": self.total_unsharded_bytes,
            "size_per_device": self.max_per_device,
            "max_per_device": self.max_per_device,
            "min_per_device": self.min_per_device,
            "mean_per_device": self.mean_per_device,
            "per_device": list(self.per_device),
            "num_devices": self.num_devices,
            "total_unsharded_bytes": self.total_unsharded_bytes,
            "replicated_bytes": self.replicated_bytes,
            "sharded_bytes": self.sharded_bytes,
            "num_arrays": self.num_arrays,
            "padded": self.padded,
            "exact": self.exact,
        }

    def scaled(self, factor: int) -> MemoryEstimate:
        """Every byte figure times ``factor`` (e.g. 2 for two optimizer copies)."""
        factor = as_count(factor, "factor", minimum=0, error=SpecError)
        return dataclasses.replace(
            self,
            per_device=tuple(b * factor for b in self.per_device),
            total_unsharded_bytes=self.total_unsharded_bytes * factor,
            replicated_bytes=self.replicated_bytes * factor,
            sharded_bytes=self.sharded_bytes * factor,
        )

    def __add__(self, other: MemoryEstimate) -> MemoryEstimate:
        """Two trees on the same mesh, held at once."""
        if not isinstance(other, MemoryEstimate):
            return NotImplemented
        if (self.axis_names, self.mesh_shape) != (other.axis_names, other.mesh_shape):
            raise MeshplanTypeError(
                f"cannot add estimates for different meshes: {dict(zip(self.axis_names, self.mesh_shape))} "
                f"and {dict(zip(other.axis_names, other.mesh_shape))}."
            )
        return MemoryEstimate(
            self.axis_names,
            self.mesh_shape,
            tuple(a + b for a, b in zip(self.per_device, other.per_device, strict=True)),
            self.total_unsharded_bytes + other.total_unsharded_bytes,
            self.replicated_bytes + other.replicated_bytes,
            self.sharded_bytes + other.sharded_bytes,
            self.num_arrays + other.num_arrays,
            self.padded or other.padded,
            self.exact and other.exact,
        )


DtypeMap = Callable[[Any], Any]
"""``leaf dtype -> counted dtype``: the same leaves, counted as gradients or optimizer copies."""


def _same_dtype(dtype: Any) -> Any:
    return dtype


@dataclasses.dataclass(frozen=True, slots=True)
class PlacedGroup:
    """Equal leaves (same shape, dtype and spec) and how they split: the unit of memory arithmetic.

    Attributes:
      info: the leaves' shape and dtype.
      count: how many leaves share them.
      spec: their PartitionSpec.
      geometry: :func:`~meshplan.pure.specs.shard_geometry` of the shape under the spec.
    """

    info: LeafInfo
    count: int
    spec: Any
    geometry: ShardGeometry


def place_groups(
    counts: collections.Counter[tuple[int, Any]], by_id: dict[int, LeafInfo | None], axis_sizes: AxisSizes
) -> tuple[PlacedGroup, ...]:
    """One :class:`PlacedGroup` per distinct (leaf kind, spec) (see :func:`~meshplan.pure.specs._validate.group_leaves`).

    Non-array leaves are skipped; :func:`shard_geometry` runs once per group.
    """
    out: list[PlacedGroup] = []
    for (info_id, spec), count in counts.items():
        info = by_id[info_id]
        if info is not None:
            out.append(PlacedGroup(info, count, spec, shard_geometry(info.shape, spec, axis_sizes)))
    return tuple(out)


def _shard_lengths(
    d: int, entry: tuple[str, ...], chunk: int, coords: dict[str, NDArray[np.int64]], sizes: AxisSizes
) -> NDArray[np.int64]:
    """Real (unpadded) elements along one dim at every device position."""
    index = np.zeros_like(coords[entry[0]])
    for axis in entry:  # first axis major, as jax lays out tuple entries
        index = index * sizes[axis] + coords[axis]
    return np.clip(d - index * chunk, 0, chunk)


def _uneven_bytes(
    group: PlacedGroup, dtype: Any, sizes: AxisSizes, coords: dict[str, NDArray[np.int64]], packed_subbyte: bool,
) -> NDArray[np.int64]:
    """Actual bytes of one unevenly split array at every device position."""
    shape, geometry = group.info.shape, group.geometry
    entries = canonical_entries(group.spec, len(shape))
    elems = np.ones(math.prod(sizes.values()), dtype=np.int64)
    for d, entry, n, chunk in zip(shape, entries, geometry.splits, geometry.shard_shape, strict=True):
        if n == 1:
            elems = elems * d
        else:
            elems = elems * _shard_lengths(d, entry, chunk, coords, sizes)
    bits = dtype_bits(dtype)
    if packed_subbyte and bits < 8:
        return -(-elems * bits // 8)
    return elems * dtype_storage_bytes(dtype)


def estimate_leaves_memory(
    facts: TreeFacts,
    per_leaf_specs: tuple[Any, ...],
    axis_sizes: AxisSizes,
    *,
    packed_subbyte: bool = False,
    padding: str = "padded",
) -> MemoryEstimate:
    """:func:`estimate_memory` for leaves whose specs are already resolved and valid.

    Work is per distinct ``(shape, dtype, spec)``, so 50k leaves of a few
    hundred kinds cost one pass over the leaves plus a few hundred sums.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> from meshplan.pure import tree_facts
      >>> facts = tree_facts([np.zeros((5, 2), np.int8)])
      >>> estimate_leaves_memory(facts, (P("x"),), {"x": 2}, padding="actual").per_device
      (6, 4)
    """
    _check_padding(padding)
    return estimate_groups(leaf_groups(facts, per_leaf_specs, axis_sizes), axis_sizes,
                           packed_subbyte=packed_subbyte, padding=padding)


def leaf_groups(facts: TreeFacts, per_leaf_specs: tuple[Any, ...], axis_sizes: AxisSizes) -> tuple[PlacedGroup, ...]:
    """The placed groups of leaves whose specs are already resolved and valid."""
    groups = group_leaves(facts.infos, per_leaf_specs)
    if groups is None:
        raise MeshplanTypeError("per_leaf_specs holds an unhashable leaf; resolve specs with resolve_specs first.")
    return place_groups(*groups, axis_sizes)


def _check_padding(padding: str) -> None:
    as_choice(padding, "padding", _PADDING)


def estimate_groups(
    groups: tuple[PlacedGroup, ...], axis_sizes: AxisSizes, *, dtype_of: DtypeMap = _same_dtype,
    packed_subbyte: bool = False, padding: str = "padded",
) -> MemoryEstimate:
    """Bytes per device of placed leaf groups, each leaf counted in ``dtype_of(its dtype)``.

    Every byte figure of meshplan comes from here or from the same
    arithmetic: a shard holds ``geometry.shard_shape`` elements (padded) of
    ``array_bytes`` each. Training memory calls it once per kind of state
    (params, grads, optimizer copies) on the same groups.
    """
    _check_padding(padding)
    sizes = dict(axis_sizes)
    names = tuple(sizes)
    num_devices = math.prod(sizes.values())
    uniform = 0
    varying = np.zeros(num_devices, dtype=np.int64)
    total = replicated = num_arrays = 0
    padded_any, exact = False, True
    coords: dict[str, NDArray[np.int64]] | None = None
    for group in groups:
        info, count, geometry = group.info, group.count, group.geometry
        dtype = dtype_of(info.dtype)
        num_arrays += count
        exact = exact and all(e is not UNCONSTRAINED for e in group.spec or ())
        full = array_bytes(info.shape, dtype, packed_subbyte=packed_subbyte)
        total += count * full
        if all(n == 1 for n in geometry.splits):
            replicated += count * full
            uniform += count * full
            continue
        padded_any = padded_any or geometry.padded
        if geometry.padded and padding == "actual":
            if coords is None:
                grid = np.indices(tuple(sizes.values()), dtype=np.int64).reshape(len(names), num_devices)
                coords = dict(zip(names, grid, strict=True))
            varying += count * _uneven_bytes(group, dtype, sizes, coords, packed_subbyte)
        else:
            uniform += count * array_bytes(geometry.shard_shape, dtype, packed_subbyte=packed_subbyte)
    # uniform is an exact Python int (a 2**80-element leaf does not fit an int64): add in Python.
    per_device = tuple(uniform + int(v) for v in varying)
    return MemoryEstimate(
        axis_names=names,
        mesh_shape=tuple(sizes.values()),
        per_device=per_device,
        total_unsharded_bytes=total,
        replicated_bytes=replicated,
        sharded_bytes=total - replicated,
        num_arrays=num_arrays,
        padded=padded_any,
        exact=exact,
    )


def estimate_memory(
    tree: PyTree | TreeFacts,
    specs: PyTree,
    axis_sizes: AxisSizes,
    *,
    packed_subbyte: bool = False,
    padding: str = "padded",
    x64: bool = False,
) -> MemoryEstimate:
    """Exact bytes every device holds for ``tree`` placed with ``specs``.

    Args:
      tree: a pytree of arrays / ShapeDtypeStructs (see :func:`meshplan.pure.tree_facts`).
      specs: the matching pytree of PartitionSpecs (or a prefix of it).
      axis_sizes: ordered mapping mesh axis name -> size (``mesh.shape``).
      packed_subbyte: count sub-byte dtypes packed (TPU storage) instead of
        one byte per element (``jax.Array.nbytes``).
      padding: ``"padded"`` counts uneven shards at XLA's padded size,
        ``"actual"`` counts their real elements (see the module docstring).
      x64: whether Python-scalar leaves are 64-bit.

    Returns:
      A :class:`MemoryEstimate`.

    Raises:
      SpecError: a spec that no mesh/array could use (unknown or repeated
        axis, too long, not a PartitionSpec, structure mismatch), listing all.
        Uneven splits are allowed (they are padded inside ``jit``); check
        storability with :func:`meshplan.pure.validate_specs`.
      MeshplanTypeError: bad ``axis_sizes``/``padding``, or a leaf dtype jax cannot hold.

    Example:
      >>> import jax, ml_dtypes, numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> params = {"w": jax.ShapeDtypeStruct((1024, 512), ml_dtypes.bfloat16), "b": np.zeros(512, np.float32)}
      >>> est = estimate_memory(params, {"w": P("dp", "tp"), "b": P()}, {"dp": 2, "tp": 4})
      >>> est.max_per_device, est.total_unsharded_bytes, est.replicated_bytes
      (133120, 1050624, 2048)
    """
    facts, _, findings, groups = _resolve(tree, specs, axis_sizes, for_storage=False, x64=x64)
    raise_errors(findings)
    return _named_estimate(facts, groups, axis_sizes, packed_subbyte=packed_subbyte, padding=padding)


# Findings that only matter for stored arrays: memory can still be counted.
_STORAGE_ONLY = ("indivisible", "unconstrained")


def validate_and_estimate(
    tree: PyTree | TreeFacts,
    specs: PyTree,
    axis_sizes: AxisSizes,
    *,
    for_storage: bool = True,
    packed_subbyte: bool = False,
    padding: str = "padded",
    x64: bool = False,
) -> tuple[list[Finding], MemoryEstimate | None]:
    """:func:`meshplan.pure.validate_specs` and :func:`estimate_memory` in one walk of the tree.

    Returns:
      ``(findings, estimate)``; ``estimate`` is ``None`` when a finding other
      than an uneven split or ``UNCONSTRAINED`` makes the specs uncountable.

    Raises:
      MeshplanTypeError: as :func:`estimate_memory`.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> findings, est = validate_and_estimate({"w": np.zeros((6, 4), np.int8)}, {"w": P("x")}, {"x": 4})
      >>> [f.kind for f in findings], est.per_device
      (['indivisible'], (8, 8, 8, 8))
    """
    facts, _, findings, groups = _resolve(tree, specs, axis_sizes, for_storage=for_storage, x64=x64)
    if any(f.severity == "error" and f.kind not in _STORAGE_ONLY for f in findings):
        return findings, None
    return findings, _named_estimate(facts, groups, axis_sizes, packed_subbyte=packed_subbyte, padding=padding)


def _named_estimate(
    facts: TreeFacts, groups: Any, axis_sizes: AxisSizes, *, packed_subbyte: bool, padding: str
) -> MemoryEstimate:
    """estimate_groups of group_leaves' groups, naming the leaf when its dtype has no size."""
    _check_padding(padding)
    try:
        counts, by_id = groups
        return estimate_groups(place_groups(counts, by_id, axis_sizes), axis_sizes, packed_subbyte=packed_subbyte,
                               padding=padding)
    except MeshplanTypeError as err:
        bad = _first_bad_dtype_leaf(facts)
        if bad is None:
            raise
        raise MeshplanTypeError(f"leaf {facts.path(bad)!r}: {err}") from err


def _first_bad_dtype_leaf(facts: TreeFacts) -> int | None:
    """Index of the first leaf whose dtype has no size (to name it in the error)."""
    for i, info in enumerate(facts.infos):
        if info is not None:
            try:
                dtype_bits(info.dtype)
            except MeshplanTypeError:
                return i
    return None
