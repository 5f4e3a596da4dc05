"""Type aliases shared by the pure planners.

Everything in :mod:`meshplan.pure` speaks in these plain types: no devices,
no meshes, no arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeAlias

import jax
from jax.sharding import PartitionSpec

from meshplan.pure.errors import MeshplanTypeError

Shape: TypeAlias = tuple[int, ...]
"""An array shape or a mesh shape, e.g. ``(8, 4096)``."""

AxisName: TypeAlias = str
"""A mesh axis name such as ``"fsdp"``."""

AxisSizes: TypeAlias = Mapping[str, int]
"""Ordered mapping mesh axis name -> size, in mesh order (``{"dp": 2, "tp": 4}``)."""

SpecEntry: TypeAlias = tuple[str, ...]
"""One canonical PartitionSpec entry: the mesh axes a dim is split over
(``()`` for replicated, ``("fsdp", "tp")`` for a split over both)."""

PyTree: TypeAlias = Any
"""Any jax pytree."""

# jax's ``PartitionSpec`` and ``ShapeDtypeStruct`` constructors carry no
# annotations, so ``mypy --strict`` refuses every call to them. These handles
# are the very same classes, seen through a typed signature.
make_spec: Callable[..., PartitionSpec] = PartitionSpec
"""``PartitionSpec(*entries)``, typed: ``make_spec("dp", None) == P("dp", None)``."""

make_struct: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
"""``jax.ShapeDtypeStruct(shape, dtype)``, typed."""


class FrozenAxisSizes(dict[str, int]):
    """A checked, read-only ``{axis name: size}`` in mesh order.

    A ``dict`` subclass so lookups stay as fast as a dict's (rules read sizes
    in their inner loops) and so it compares equal to plain dicts; every
    mutating method raises. Only :func:`meshplan.pure._check.canonical_axis_sizes` makes them,
    which lets the planner pass one to each leaf context without checking
    it again.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise MeshplanTypeError("axis sizes are read-only; build a new mapping instead.")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))
