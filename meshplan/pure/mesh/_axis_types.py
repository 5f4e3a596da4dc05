"""Canonical mesh axis types: ``AxisType`` values or their names, one per axis.

``jax.sharding.AxisType`` is a plain enum, so importing it here keeps this
module pure. ``None`` is passed through on purpose: the default differs
between ``jax.make_mesh`` (Explicit) and ``Mesh(...)`` (Auto), and choosing it
is the facade's job so both of its paths agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from jax.sharding import AxisType

from meshplan.pure._check import as_int
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError

__all__ = ["canonicalize_axis_types"]

# Built from the enum so a new AxisType member is accepted without editing this file.
_BY_NAME: dict[str, AxisType] = {member.name.lower(): member for member in AxisType}
_VALID = ", ".join(repr(name) for name in sorted(_BY_NAME))


def _one(value: object, what: str) -> AxisType:
    """One AxisType from an AxisType or a case-insensitive name."""
    if isinstance(value, AxisType):
        return value
    if isinstance(value, str):
        member = _BY_NAME.get(value.strip().lower())
        if member is None:
            raise MeshShapeError(
                f"{what}={value!r} is not an axis type; valid names are {_VALID} "
                "(any case), or jax.sharding.AxisType members."
            )
        return member
    raise MeshplanTypeError(
        f"{what}={value!r} has type {type(value).__name__}; expected a "
        f"jax.sharding.AxisType or one of the strings {_VALID}."
    )


def canonicalize_axis_types(
    axis_types: AxisType | str | Sequence[AxisType | str] | None, num_axes: int
) -> tuple[AxisType, ...] | None:
    """Turns user ``axis_types`` into one ``AxisType`` per mesh axis.

    Args:
      axis_types: ``None``; one ``AxisType`` or name (``"auto"``,
        ``"explicit"``, ``"manual"``, any case) for every axis; or a sequence
        with one such value per axis.
      num_axes: the number of mesh axes.

    Returns:
      ``None`` if ``axis_types`` is ``None`` (the caller applies its
      default), else a tuple of ``num_axes`` AxisType members.

    Raises:
      MeshplanTypeError: an entry is neither an AxisType nor a string, or
        ``axis_types`` is an unordered collection.
      MeshShapeError: an unknown name, or a sequence of the wrong length.

    Example:
      >>> canonicalize_axis_types("explicit", 2)
      (Explicit, Explicit)
      >>> canonicalize_axis_types(["Auto", AxisType.Manual], 2)
      (Auto, Manual)
    """
    n = as_int(num_axes, "num_axes")
    if n < 0:
        raise MeshShapeError(f"num_axes={n} must be >= 0.")
    if axis_types is None:
        return None
    if isinstance(axis_types, (AxisType, str)):
        return (_one(axis_types, "axis_types"),) * n
    if not isinstance(axis_types, Sequence):
        raise MeshplanTypeError(
            f"axis_types={axis_types!r} has type {type(axis_types).__name__}; expected None, "
            f"an AxisType, one of {_VALID}, or an ordered sequence of those (one per axis)."
        )
    items = tuple(axis_types)
    if len(items) != n:
        raise MeshShapeError(
            f"axis_types={items!r} has {len(items)} entries but the mesh has {n} axes; give "
            "one per axis, or a single value to use for every axis."
        )
    return tuple(_one(v, f"axis_types[{i}]") for i, v in enumerate(items))
