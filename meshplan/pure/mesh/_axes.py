"""Mesh axes: names, sizes, and ``-1`` inference against a device count.

Everything here is plain arithmetic on tuples; values are checked by the
validators in :mod:`meshplan.pure._check`, so every entry point rejects
``True``, ``2.0`` and ``"2"`` the same way.

:class:`MeshShape` is the one value for "named axes with sizes" (jax's
``AbstractMesh`` without the axis types). The other shape values build on
it or convert to it instead of re-checking names and sizes themselves:

* a read-only ``{name: size}`` mapping (:class:`~meshplan.pure.FrozenAxisSizes`,
  what the planners take) is :attr:`MeshShape.axis_sizes`, and
  :meth:`MeshShape.from_axis_sizes` goes back;
* a :class:`~meshplan.pure.HybridMeshShape` holds sizes only (per part);
  wherever it takes a plain shape it also takes a MeshShape (:func:`mesh_dims`);
* a :class:`~meshplan.pure.MeshRequest` is names plus a hybrid shape; its
  ``mesh_shape`` is the global MeshShape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.pure._check import as_int, as_int_tuple, as_sequence, canonical_axis_sizes
from meshplan.pure._types import FrozenAxisSizes
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError

__all__ = ["MeshShape", "infer_axis_dims", "mesh_dims", "resolve_mesh_shape", "validate_axis_names"]


# --- public API -----------------------------------------------------------------------------------


def validate_axis_names(names: Sequence[str]) -> tuple[str, ...]:
    """Checks mesh axis names and returns them as a tuple.

    Args:
      names: an ordered sequence (tuple, list) of axis names. A bare string
        is refused rather than read as one name per character.

    Returns:
      The names as a tuple, in the given order.

    Raises:
      MeshplanTypeError: ``names`` is a string, unordered, or holds a non-string.
      MeshShapeError: a name is empty/blank or appears more than once.

    Example:
      >>> validate_axis_names(["dp", "tp"])
      ('dp', 'tp')
    """
    items = as_sequence(names, "axis_names")
    not_str = [f"axis_names[{i}]={n!r}" for i, n in enumerate(items) if not isinstance(n, str)]
    if not_str:
        raise MeshplanTypeError(
            f"axis names must be strings; got {', '.join(not_str)} in axis_names={items!r}."
        )
    problems = [f"axis_names[{i}]={n!r} is empty" for i, n in enumerate(items) if not n.strip()]
    seen: dict[str, int] = {}
    for i, n in enumerate(items):
        if n in seen:
            problems.append(f"axis_names[{i}]={n!r} repeats axis_names[{seen[n]}]")
        else:
            seen[n] = i
    if problems:
        raise MeshShapeError(
            f"invalid axis_names={items!r}: {'; '.join(problems)}. "
            "Axis names must be non-empty and unique."
        )
    return items


def infer_axis_dims(
    dims: Sequence[int],
    total: int,
    *,
    dims_name: str = "axis_dims",
    total_name: str = "num_devices",
) -> tuple[int, ...]:
    """Replaces a single ``-1`` in ``dims`` so their product equals ``total``.

    Args:
      dims: axis sizes, each >= 1, except at most one ``-1`` meaning "all the
        devices the other axes leave over".
      total: the number of devices the product must equal.
      dims_name: what to call ``dims`` in error messages.
      total_name: what to call ``total`` in error messages.

    Returns:
      The sizes with the ``-1`` resolved; their product is ``total``.

    Raises:
      MeshplanTypeError: a size or ``total`` is not an int.
      MeshShapeError: more than one ``-1``; a size is 0 or below -1; the
        product does not equal ``total``; or the ``-1`` cannot be inferred
        because ``total`` is not divisible by the product of the others.

    Example:
      >>> infer_axis_dims((1, -1, 1, 4), 8)
      (1, 2, 1, 4)
    """
    shape = as_int_tuple(dims, dims_name)
    total = as_int(total, total_name)
    del dims
    where = f"{dims_name}={shape} with {total_name}={total}"
    if total < 1:
        raise MeshShapeError(f"{total_name}={total} must be >= 1 ({where}).")
    problems = [
        f"{dims_name}[{i}]={d}" for i, d in enumerate(shape) if d == 0 or d < -1
    ]
    if problems:
        raise MeshShapeError(
            f"{where}: {', '.join(problems)} invalid; each size must be >= 1, or -1 "
            "(at most once) to take the remaining devices."
        )
    free = [i for i, d in enumerate(shape) if d == -1]
    if len(free) > 1:
        raise MeshShapeError(
            f"{where}: -1 appears {len(free)} times (at indices {free}); at most one axis "
            "can be inferred. Give the other sizes explicitly."
        )
    known = math.prod(d for d in shape if d != -1)
    if not free:
        if known != total:
            # "doesn't match": the words eformer's users match on.
            raise MeshShapeError(
                f"{where}: the sizes multiply to {known}, not {total} (mesh size {known} doesn't "
                f"match {total}). Make the product equal {total}, or put -1 on one axis to infer it."
            )
        return shape
    if total % known != 0:
        raise MeshShapeError(
            f"{where}: cannot infer the -1 at index {free[0]} because {total} devices are "
            f"not divisible by the product {known} of the other sizes. Use sizes whose "
            f"product divides {total}."
        )
    out = list(shape)
    out[free[0]] = total // known
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class MeshShape:
    """A named, fully resolved mesh shape: axis names and their sizes, in mesh order.

    Args:
      names: unique, non-empty axis names.
      sizes: one int >= 1 per name (no ``-1``: see :func:`resolve_mesh_shape`).

    Raises:
      MeshplanTypeError: a name is not a string or a size is not an int.
      MeshShapeError: names repeat or are empty, counts differ, a size < 1.

    Example:
      >>> shape = MeshShape(("dp", "tp"), (2, 4))
      >>> shape, shape.size, shape.as_dict(), len(shape)
      (MeshShape(dp=2, tp=4), 8, {'dp': 2, 'tp': 4}, 2)
      >>> MeshShape.from_axis_sizes(shape.axis_sizes) == shape
      True
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        names = validate_axis_names(self.names)
        sizes = as_int_tuple(self.sizes, "sizes")
        if len(names) != len(sizes):
            raise MeshShapeError(
                f"MeshShape has {len(names)} names {names} but {len(sizes)} sizes {sizes}; "
                "give one size per axis name."
            )
        bad = [f"{n}={s}" for n, s in zip(names, sizes) if s < 1]
        if bad:
            raise MeshShapeError(
                f"MeshShape sizes must be >= 1; got {', '.join(bad)}. Resolve -1 with "
                "resolve_mesh_shape first."
            )
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "sizes", sizes)

    @property
    def size(self) -> int:
        """The number of devices: the product of the sizes (1 for no axes)."""
        return math.prod(self.sizes)

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.sizes)

    def __len__(self) -> int:
        """The number of axes, as ``len`` of a plain shape tuple gives it."""
        return len(self.sizes)

    def as_dict(self) -> dict[str, int]:
        """A new dict axis name -> size, in mesh order."""
        return dict(zip(self.names, self.sizes))

    @property
    def axis_sizes(self) -> FrozenAxisSizes:
        """The read-only ``{name: size}`` mapping the planners take, in mesh order."""
        return canonical_axis_sizes(self.as_dict())

    @classmethod
    def from_axis_sizes(cls, axis_sizes: Mapping[str, int]) -> MeshShape:
        """The MeshShape of an ordered ``{name: size}`` mapping (``dict(mesh.shape)``).

        Raises:
          MeshplanTypeError: not a mapping, or a name/size of the wrong type.
          MeshShapeError: a name is empty or a size is below 1.

        Example:
          >>> MeshShape.from_axis_sizes({"dp": 2, "tp": 4})
          MeshShape(dp=2, tp=4)
        """
        if not isinstance(axis_sizes, Mapping):
            raise MeshplanTypeError(
                f"axis_sizes={axis_sizes!r} must be a mapping of mesh axis name -> size in mesh "
                "order, e.g. {'dp': 2, 'tp': 4}."
            )
        return cls(tuple(axis_sizes), tuple(axis_sizes.values()))

    def __repr__(self) -> str:
        # Non-identifier names (``"a b"``) are quoted so the repr stays unambiguous.
        parts = ", ".join(
            f"{n if n.isidentifier() else repr(n)}={s}" for n, s in zip(self.names, self.sizes)
        )
        return f"MeshShape({parts})"


def mesh_dims(value: Any, what: str) -> tuple[int, ...]:
    """The sizes of a shape given as a sequence of ints or as a :class:`MeshShape`.

    The one place a named shape turns into plain sizes, so every function
    that takes a plain shape takes a MeshShape too. Sizes are type-checked
    only (a ``-1`` passes; range checks belong to the caller).

    Example:
      >>> mesh_dims(MeshShape(("dp", "tp"), (2, 4)), "mesh_shape"), mesh_dims([2, -1], "mesh_shape")
      ((2, 4), (2, -1))
    """
    if isinstance(value, MeshShape):
        return value.sizes
    return as_int_tuple(value, what)


def resolve_mesh_shape(
    axis_dims: Sequence[int], axis_names: Sequence[str], num_devices: int
) -> MeshShape:
    """Validates names and dims together and resolves ``-1`` against ``num_devices``.

    Args:
      axis_dims: one size per axis; at most one ``-1``.
      axis_names: unique, non-empty names, same count as ``axis_dims``.
      num_devices: the number of devices the mesh must use exactly.

    Returns:
      The resolved :class:`MeshShape`.

    Raises:
      MeshplanTypeError: wrong types (see :func:`validate_axis_names`, :func:`infer_axis_dims`).
      MeshShapeError: names/dims counts differ, or the dims do not fit ``num_devices``.

    Example:
      >>> resolve_mesh_shape((1, -1, 1, 1, 1), ("dp", "fsdp", "ep", "tp", "sp"), 8)
      MeshShape(dp=1, fsdp=8, ep=1, tp=1, sp=1)
    """
    names = validate_axis_names(axis_names)
    dims = as_int_tuple(axis_dims, "axis_dims")
    if len(names) != len(dims):
        raise MeshShapeError(
            f"axis_dims={dims} has {len(dims)} entries but axis_names={names} has "
            f"{len(names)}; give one size per axis name."
        )
    return MeshShape(names, infer_axis_dims(dims, num_devices))
