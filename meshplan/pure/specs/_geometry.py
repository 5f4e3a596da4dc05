"""PartitionSpecs as plain data: canonical entries and per-device shard geometry.

A PartitionSpec entry may be ``None``, one axis name, a tuple of axis names,
or ``P.UNCONSTRAINED``; specs may be shorter than the array's rank. Every
planner in meshplan first turns a spec into *canonical entries*: one tuple of
axis names per array dimension (``()`` = replicated), so no other module has
to handle the spellings again.

Shard geometry follows XLA: a dim of size ``d`` split ``n`` ways holds
``ceil(d / n)`` elements per shard. jax refuses to *store* such uneven arrays
(``device_put`` raises), but inside ``jit`` XLA pads them; the result says
whether padding happened so callers can decide.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_count, as_sequence, as_shape, canonical_axis_sizes
from meshplan.pure._types import AxisSizes, Shape, SpecEntry, make_spec
from meshplan.pure.errors import MeshplanTypeError, SpecError

__all__ = [
    "UNCONSTRAINED",
    "ShardGeometry",
    "canonical_entries",
    "geometry_of_entries",
    "spec_from_entries",
    "spec_axes",
    "shard_geometry",
    "shard_shape",
]

UNCONSTRAINED = PartitionSpec.UNCONSTRAINED
"""The spec entry meaning "let the compiler choose"; kept as-is by canonical_entries."""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardGeometry:
    """How one array splits over a mesh under one spec.

    Attributes:
      shard_shape: per-device shard shape (ceil division on uneven dims).
      splits: how many ways each dim is split (1 = not split).
      padded: True when some dim is not a multiple of its split, so XLA pads
        it inside ``jit`` and ``device_put`` would refuse it.
    """

    shard_shape: Shape
    splits: Shape
    padded: bool

    @property
    def num_elements(self) -> int:
        """Elements in one (padded) shard."""
        return math.prod(self.shard_shape)


def _entry(raw: Any, where: str) -> SpecEntry | Any:
    """One raw spec entry -> a tuple of axis names (or UNCONSTRAINED)."""
    if raw is None:
        return ()
    if raw is UNCONSTRAINED:
        return UNCONSTRAINED
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, tuple | list) and all(isinstance(a, str) for a in raw):
        return tuple(raw)
    raise MeshplanTypeError(
        f"{where}: spec entry {raw!r} is not None, an axis name, a tuple of axis names "
        "or PartitionSpec.UNCONSTRAINED."
    )


_MAX_RANK = 2**16


def canonical_entries(spec: Any, rank: int | None = None, *, where: str = "spec") -> tuple[Any, ...]:
    """Canonical entries of a PartitionSpec, padded with ``()`` to ``rank``.

    Args:
      spec: a ``PartitionSpec`` (``None`` is read as ``P()``, fully replicated).
      rank: the array rank to pad to; ``None`` keeps the spec's own length.
      where: a leaf path or label used in error messages.

    Returns:
      A tuple with one entry per dim: a tuple of axis names (``()`` when the
      dim is replicated) or ``UNCONSTRAINED``.

    Raises:
      SpecError: the spec is longer than ``rank``.
      MeshplanTypeError: ``spec`` is not a PartitionSpec, or an entry is malformed.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> canonical_entries(P(("fsdp", "tp"), None), 3)
      (('fsdp', 'tp'), (), ())
    """
    if spec is None:
        spec = make_spec()
    if not isinstance(spec, PartitionSpec):
        raise MeshplanTypeError(f"{where}: expected a PartitionSpec, got {spec!r} ({type(spec).__name__}).")
    entries = tuple(_entry(raw, where) for raw in spec)
    if rank is None:
        return entries
    # numpy arrays have at most 64 dims; the bound only keeps an absurd rank (2**31) from padding a tuple
    # of gigabytes.
    rank = as_count(rank, "rank", minimum=0, maximum=_MAX_RANK, error=SpecError)
    if len(entries) > rank:
        raise SpecError(
            f"{where}: spec {spec} has {len(entries)} entries but the array has rank {rank}; "
            f"drop the extra entries (a spec may be shorter than the rank, never longer)."
        )
    return entries + ((),) * (rank - len(entries))


def spec_from_entries(entries: Sequence[Any]) -> PartitionSpec:
    """The shortest PartitionSpec with these canonical entries.

    Single axes are written bare and trailing replicated dims are dropped, so
    equal layouts give equal (and equally hashed) specs.

    Example:
      >>> spec_from_entries([("fsdp",), (), ("dp", "tp"), ()])
      P('fsdp', None, ('dp', 'tp'))
    """
    raw: list[Any] = []
    for i, entry in enumerate(as_sequence(entries, "entries")):
        if entry is UNCONSTRAINED:
            raw.append(UNCONSTRAINED)
            continue
        if not isinstance(entry, tuple | list) or not all(isinstance(a, str) for a in entry):
            raise MeshplanTypeError(f"entries[{i}]={entry!r:.80} is not a tuple of axis names or UNCONSTRAINED "
                                    "(canonical_entries gives such entries).")
        names = tuple(entry)
        raw.append(None if not names else names[0] if len(names) == 1 else names)
    while raw and raw[-1] is None:
        raw.pop()
    return make_spec(*raw)


def spec_axes(spec: Any) -> tuple[str, ...]:
    """Every mesh axis a spec uses, in order of appearance (repeats kept).

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> spec_axes(P("dp", None, ("fsdp", "tp")))
      ('dp', 'fsdp', 'tp')
    """
    return tuple(a for e in canonical_entries(spec) if e is not UNCONSTRAINED for a in e)


def _check_axes(entries: tuple[Any, ...], axis_sizes: AxisSizes, where: str) -> None:
    """Unknown or repeated axes -> one SpecError listing every problem."""
    problems: list[str] = []
    seen: set[str] = set()
    for dim, entry in enumerate(entries):
        if entry is UNCONSTRAINED:
            continue
        for axis in entry:
            if axis not in axis_sizes:
                problems.append(
                    f"dim {dim} uses unknown mesh axis {axis!r} (mesh axes: {list(axis_sizes)})"
                )
            elif axis in seen:
                problems.append(f"mesh axis {axis!r} is used more than once (again at dim {dim})")
            seen.add(axis)
    if problems:
        raise SpecError(f"{where}: " + "; ".join(problems) + ".")


def shard_geometry(
    shape: Sequence[int], spec: Any, axis_sizes: AxisSizes, *, where: str = "array"
) -> ShardGeometry:
    """Per-device shard shape of an array of ``shape`` under ``spec``.

    Tuple entries split by the product of their axes; ``UNCONSTRAINED`` is
    counted as replicated (the compiler may do better, never worse).

    Args:
      shape: the global array shape.
      spec: its PartitionSpec (``None`` = replicated).
      axis_sizes: ordered mapping mesh axis name -> size.
      where: a leaf path or label used in error messages.

    Returns:
      A :class:`ShardGeometry`.

    Raises:
      SpecError: unknown axis, an axis used twice, or a spec longer than the rank.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> shard_geometry((8, 6), P(("dp", "tp")), {"dp": 2, "tp": 2})
      ShardGeometry(shard_shape=(2, 6), splits=(4, 1), padded=False)
      >>> shard_geometry((5, 6), P("dp"), {"dp": 2}).padded
      True
    """
    axis_sizes = canonical_axis_sizes(axis_sizes)
    shape = as_shape(shape, "shape")
    entries = canonical_entries(spec, len(shape), where=where)
    _check_axes(entries, axis_sizes, where)
    return geometry_of_entries(shape, entries, axis_sizes)


def geometry_of_entries(shape: Shape, entries: tuple[Any, ...], axis_sizes: Mapping[str, int]) -> ShardGeometry:
    """:func:`shard_geometry`'s arithmetic without its checks: ``entries`` are what
    :func:`canonical_entries` gave for this rank and every axis in them has a size in
    ``axis_sizes`` (a planner that checked a spec once reuses its entries on many meshes).

    Example:
      >>> geometry_of_entries((8, 6), (("dp", "tp"), ()), {"dp": 2, "tp": 2})
      ShardGeometry(shard_shape=(2, 6), splits=(4, 1), padded=False)
    """
    splits = tuple(
        1 if e is UNCONSTRAINED else math.prod(axis_sizes[a] for a in e) for e in entries
    )
    shard = tuple(-(-d // n) for d, n in zip(shape, splits, strict=True))
    padded = any(d % n for d, n in zip(shape, splits, strict=True))
    return ShardGeometry(shard_shape=shard, splits=splits, padded=padded)


def shard_shape(shape: Sequence[int], spec: Any, axis_sizes: AxisSizes) -> Shape:
    """Per-device shard shape (ceil on uneven dims); see :func:`shard_geometry`.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> shard_shape((8, 6), P("data"), {"data": 4})
      (2, 6)
    """
    return shard_geometry(shape, spec, axis_sizes).shard_shape
