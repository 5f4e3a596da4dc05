"""The field checks of a machine profile's records (shared by :mod:`._profile` and :mod:`._measured`).

Every check raises :class:`~meshplan.pure.errors.ProfileError` for a value out of range and
:class:`~meshplan.pure.errors.MeshplanTypeError` for one of the wrong type; :func:`checked` lists every bad field
of a record at once.

Example:
  >>> positive(2, "seconds"), optional(positive)(None, "seconds")
  (2.0, None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from meshplan.pure._check import as_count, as_real, as_record, as_sequence, as_str, collect
from meshplan.pure.errors import MeshplanTypeError, ProfileError

__all__ = ["MAX_BYTES", "MAX_DIM", "byte_count", "checked", "count", "name", "optional", "pairs", "positive",
           "record_fields", "records", "seconds", "text"]

T = TypeVar("T")

MAX_BYTES = 2**50  # a PiB: beyond any buffer a benchmark moves
MAX_DIM = 2**40


def _fail(what: str, type_errors: list[str], value_errors: list[str]) -> None:
    if type_errors:
        raise MeshplanTypeError(f"{what}: " + "; ".join(type_errors + value_errors) + ".")
    if value_errors:
        raise ProfileError(f"{what}: " + "; ".join(value_errors) + ".")


def checked(obj: Any, checks: Mapping[str, Callable[[Any, str], Any]]) -> None:
    """Check and canonicalize ``obj``'s fields, every problem listed at once."""
    types: list[str] = []
    values: list[str] = []
    out = {}
    for field, check in checks.items():
        before = len(types) + len(values)
        value = collect(types, values, check, getattr(obj, field), field)
        if len(types) + len(values) == before:
            out[field] = value
    _fail(type(obj).__name__, types, values)
    for field, value in out.items():
        object.__setattr__(obj, field, value)


def text(value: Any, what: str) -> str:
    return as_str(value, what, error=ProfileError)


def name(value: Any, what: str) -> str:
    return as_str(value, what, nonempty=True, error=ProfileError)


def count(value: Any, what: str) -> int:
    return as_count(value, what, maximum=MAX_DIM, error=ProfileError)


def byte_count(value: Any, what: str) -> int:
    return as_count(value, what, maximum=MAX_BYTES, error=ProfileError)


def positive(value: Any, what: str) -> float:
    return as_real(value, what, error=ProfileError)


def seconds(value: Any, what: str) -> float:
    return as_real(value, what, allow_zero=True, error=ProfileError)


def optional(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    def inner(value: Any, what: str) -> T | None:
        return None if value is None else check(value, what)
    return inner


def records(cls: type[T]) -> Callable[[Any, str], tuple[T, ...]]:
    def check(value: Any, what: str) -> tuple[T, ...]:
        items = as_sequence(value, what)
        bad = [i for i, v in enumerate(items) if not isinstance(v, cls)]
        if bad:
            raise MeshplanTypeError(f"{what}[{bad[0]}]={items[bad[0]]!r:.60} must be a {cls.__name__}")
        return tuple(items)
    return check


def pairs(value: Any, what: str) -> tuple[tuple[str, str], ...]:
    """``(name, text)`` pairs, names unique, kept sorted (a mapping in JSON)."""
    if isinstance(value, Mapping):
        value = tuple(value.items())
    items = as_sequence(value, what)
    out = []
    for i, item in enumerate(items):
        pair = as_sequence(item, f"{what}[{i}]")
        if len(pair) != 2:
            raise ProfileError(f"{what}[{i}]={item!r:.60} must be a (name, text) pair")
        out.append((name(pair[0], f"{what}[{i}] name"), text(pair[1], f"{what}[{i}] text")))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ProfileError(f"{what} names {sorted(n for n in set(names) if names.count(n) > 1)} more than once")
    return tuple(sorted(out))


def record_fields(cls: type, data: Any, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    return as_record(data, cls.__name__, fields=[f.name for f in fields], required=required, ignore=ignore,
                     error=ProfileError)


