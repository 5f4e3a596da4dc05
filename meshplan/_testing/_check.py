"""Argument checks run when a strategy is built, never during a draw.

Each raises hypothesis's ``InvalidArgument`` naming the argument and the
value, as ``hypothesis.extra.numpy`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

__all__ = ["check_axis_sizes", "check_bool", "check_int", "check_names", "check_order",
           "check_strategy", "InvalidArgument"]


def check_int(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``, else InvalidArgument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an int, not {type(value).__name__}.")
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise InvalidArgument(f"{name}={value} must be >= {minimum}{upper}.")
    return value


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be True or False.")
    return value


def check_order(low: int, high: int, low_name: str, high_name: str) -> None:
    """``low <= high``, phrased like hypothesis's ``order_check``."""
    if low > high:
        raise InvalidArgument(f"{low_name}={low} is larger than {high_name}={high}.")


def check_strategy(value: Any, name: str) -> SearchStrategy:
    if not isinstance(value, SearchStrategy):
        raise InvalidArgument(f"{name}={value!r} must be a hypothesis strategy, "
                              f"not {type(value).__name__}.")
    return value


def check_names(value: Any, name: str, *, min_size: int = 0) -> tuple[str, ...]:
    """A tuple of unique, non-empty strings."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidArgument(f"{name}={value!r} must be a list or tuple of strings.")
    items = tuple(value)
    bad = [f"{name}[{i}]={n!r}" for i, n in enumerate(items) if not isinstance(n, str) or not n.strip()]
    if bad:
        raise InvalidArgument(f"{', '.join(bad)}: every name must be a non-empty string.")
    repeated = sorted({n for n in items if items.count(n) > 1})
    if repeated:
        raise InvalidArgument(f"{name}={items!r} repeats {repeated}; names must be unique.")
    if len(items) < min_size:
        raise InvalidArgument(f"{name}={items!r} needs at least {min_size} name(s).")
    return items


def check_axis_sizes(value: Any, name: str = "axis_sizes") -> dict[str, int]:
    """An ordered mapping axis name -> size >= 1 (a MeshShape, Mesh or AbstractMesh also works)."""
    if hasattr(value, "as_dict"):  # MeshShape
        value = value.as_dict()
    elif hasattr(value, "axis_names") and hasattr(value, "shape"):  # Mesh / AbstractMesh
        value = dict(value.shape)
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{name}={value!r} must map axis names to sizes, e.g. {{'dp': 2, 'tp': 4}}.")
    names = check_names(list(value), name, min_size=0)
    out = {}
    for n in names:
        out[n] = check_int(value[n], f"{name}[{n!r}]", minimum=1)
    return out
