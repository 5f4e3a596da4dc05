"""The validators: one per kind of value, used by every module that takes that kind.

Each turns a caller's value into the canonical plain form (a Python int, a
tuple, a read-only axis-size mapping) or raises one typed error that names
the argument as the caller wrote it (``what``) and says what would be valid.
The error class follows the kind of mistake:

* a value of the wrong type (``2.0``, ``True``, ``"2"`` where an int goes; a
  string or a set where an ordered sequence goes) is a
  :class:`~meshplan.errors.MeshplanTypeError`;
* a value of the right type but out of range is the ``ValueError`` of the
  domain that asked (``error=``): a mesh dim below 1 is a
  :class:`~meshplan.errors.MeshShapeError`, a batch below 1 a
  :class:`~meshplan.errors.PlanError`.

Example:
  >>> import numpy as np
  >>> as_int(np.int64(4), "dp"), as_int_tuple([2, 4], "axis_dims")
  (4, (2, 4))
  >>> as_count(0, "num_devices")
  Traceback (most recent call last):
  ...
  meshplan.pure.errors.MeshShapeError: num_devices=0 must be >= 1.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.pure._types import FrozenAxisSizes
from meshplan.pure.errors import MeshplanError, MeshplanTypeError, MeshShapeError

__all__ = ["as_count", "as_int", "as_int_tuple", "as_positive_shape", "as_sequence", "canonical_axis_sizes"]


def as_int(value: Any, what: str) -> int:
    """``value`` as a Python int; bools, floats and strings are type errors.

    ``operator.index`` accepts ints and numpy integers but not floats, so a
    ``2.0`` that happens to be integral is still refused: a float in a mesh
    shape is almost always a bug upstream (a division that should be ``//``).

    Example:
      >>> as_int(3, "tp")
      3
    """
    if isinstance(value, bool):
        raise MeshplanTypeError(f"{what}={value!r} is a bool; expected an int.")
    try:
        return operator.index(value)
    except TypeError:
        raise MeshplanTypeError(
            f"{what}={value!r} has type {type(value).__name__}; expected an int."
        ) from None


def as_sequence(value: Any, what: str) -> tuple[Any, ...]:
    """``value`` as a tuple, refusing strings, sets and other unordered or scalar values.

    Example:
      >>> as_sequence(["dp", "tp"], "axis_names")
      ('dp', 'tp')
    """
    if isinstance(value, (str, bytes)):
        raise MeshplanTypeError(
            f"{what}={value!r} is a string; expected a sequence such as a tuple or list."
        )
    if not isinstance(value, Sequence):
        # Sets and dicts are refused on purpose: their order is not the
        # caller's order, and axis order decides device placement.
        raise MeshplanTypeError(
            f"{what}={value!r} has type {type(value).__name__}; expected an ordered sequence "
            "such as a tuple or list."
        )
    return tuple(value)


def as_int_tuple(value: Any, what: str) -> tuple[int, ...]:
    """``value`` as a tuple of Python ints (type checks only, no range checks).

    Example:
      >>> as_int_tuple((2, -1), "axis_dims")
      (2, -1)
    """
    items = as_sequence(value, what)
    return tuple(as_int(v, f"{what}[{i}]") for i, v in enumerate(items))


def as_count(
    value: Any,
    what: str,
    *,
    minimum: int = 1,
    error: type[MeshplanError] = MeshShapeError,
    hint: str = "",
) -> int:
    """``value`` as an int ``>= minimum`` (a count of devices, hosts, layers, ...).

    Args:
      value: the caller's value.
      what: the argument's name as the caller wrote it.
      minimum: the smallest valid count.
      error: the ValueError subclass raised for a count out of range.
      hint: words appended to the range message (e.g. "or None when unknown").

    Example:
      >>> as_count(0, "host", minimum=0)
      0
    """
    out = as_int(value, what)
    if out < minimum:
        more = f" ({hint})" if hint else ""
        raise error(f"{what}={out} must be >= {minimum}{more}.")
    return out


def as_positive_shape(value: Any, what: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints that are all >= 1 (a resolved shape, no -1).

    Example:
      >>> as_positive_shape([2, 4], "mesh_shape")
      (2, 4)
    """
    shape = as_int_tuple(value, what)
    bad = [f"{what}[{i}]={d}" for i, d in enumerate(shape) if d < 1]
    if bad:
        raise MeshShapeError(
            f"{what}={shape} has entries < 1 ({', '.join(bad)}); every size must be >= 1 "
            "(-1 is not resolved here: infer it first)."
        )
    return shape


def canonical_axis_sizes(axis_sizes: Mapping[str, int], what: str = "axis_sizes") -> FrozenAxisSizes:
    """Check an ordered mapping of mesh axis name -> size and freeze it.

    The one reader of axis-size mappings: every planner entry point passes
    its ``axis_sizes`` through here, so they all accept and refuse the same
    values with the same error.

    Args:
      axis_sizes: mesh axis sizes in mesh order (``dict(mesh.shape)``).
      what: the argument's name as the caller wrote it.

    Returns:
      A read-only mapping (a :class:`FrozenAxisSizes`) with the same order
      and Python-int sizes; one made by this function is returned as is.

    Raises:
      MeshplanTypeError: not a mapping, a non-string name, a non-int size or
        a size below 1 (the mapping as a whole is malformed).

    Example:
      >>> dict(canonical_axis_sizes({"dp": 2, "tp": 4}))
      {'dp': 2, 'tp': 4}
    """
    if type(axis_sizes) is FrozenAxisSizes:
        return axis_sizes
    if not isinstance(axis_sizes, Mapping):
        raise MeshplanTypeError(
            f"{what}={axis_sizes!r} must be a mapping of mesh axis name -> size in mesh "
            "order, e.g. {'dp': 2, 'tp': 4} (dict(mesh.shape) gives one)."
        )
    out: dict[str, int] = {}
    bad: list[str] = []
    for name, size in axis_sizes.items():
        if not isinstance(name, str):
            raise MeshplanTypeError(f"{what} has a non-string axis name {name!r}; names are str.")
        out[name] = as_int(size, f"{what}[{name!r}]")
        if out[name] < 1:
            bad.append(f"{name!r}={out[name]}")
    if bad:
        raise MeshplanTypeError(
            f"{what}={dict(axis_sizes)} has sizes below 1 ({', '.join(bad)}); names are str and sizes ints >= 1."
        )
    return FrozenAxisSizes(out)
