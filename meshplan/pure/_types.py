"""Type aliases shared by the pure planners.

Everything in :mod:`meshplan.pure` speaks in these plain types: no devices,
no meshes, no arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

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
