"""Field checks of the JSON-ready records of the cost model and the search, and the field path of a bad value in a saved plan.

Every record of a :class:`~meshplan.pure.SearchResult` (``ParamGroup``,
``MemoryBreakdown``, ``CommTerm``, ``MeshCandidate``, ``Rejection``,
``SearchRequest``) checks its fields in ``__post_init__`` with
:func:`check_fields`, so a hand-built or hand-edited record fails when it is
made, not later inside ``.fits`` or ``.specs_for``. :func:`record` reads a
``from_dict`` input; :func:`nested` prefixes a nested record's failure with its
place in the document, so ``SearchResult.from_json`` says
``candidates[0].memory: MemoryBreakdown.params='x' must be an int`` instead
of raising a raw ``TypeError``.

Example:
  >>> from meshplan.pure.errors import PlanError
  >>> try:
  ...     nested("candidates[0]", lambda: nested("memory", lambda: as_nonneg("x", "params")))
  ... except PlanError as err:
  ...     print(err)
  plan field candidates[0].memory: params='x' has type str; expected an int.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from meshplan.pure._check import (
    _short,
    as_count,
    as_flag,
    as_instance,
    as_real,
    as_record,
    as_sequence,
    as_str,
    collect,
)
from meshplan.pure.errors import MeshplanError, MeshplanTypeError, PlanError

__all__ = ["MAX_BYTES", "MAX_COUNT", "FieldCheck", "as_bool", "as_byte_count", "as_efficiency", "as_nonneg",
           "as_rank", "as_seconds", "as_size", "as_sizes", "as_text", "as_texts", "check_fields", "fields_of",
           "instance_of", "nested", "optional", "record", "records", "tuple_of", "unchecked"]

T = TypeVar("T")
FieldCheck = Callable[[Any, str], Any]

MAX_COUNT = 10**12
"""The largest batch, sequence length, mesh axis size or device count a planner takes: far beyond any real
step, small enough that every product the cost model forms stays an exact float (no ``OverflowError``)."""

MAX_BYTES = 10**18
"""The largest byte count a planner takes (an exabyte: beyond any device's memory)."""


def as_text(value: Any, what: str) -> str:
    """A str field (a name, a pattern, a reason)."""
    return as_str(value, what)


def as_nonneg(value: Any, what: str) -> int:
    """An int field >= 0 (bytes, counts)."""
    return as_count(value, what, minimum=0, error=PlanError)


def as_rank(value: Any, what: str) -> int:
    """A 1-based rank."""
    return as_count(value, what, minimum=1, error=PlanError)


def as_texts(value: Any, what: str) -> tuple[str, ...]:
    """A tuple of str (axis names)."""
    return tuple(as_str(v, f"{what}[{i}]") for i, v in enumerate(as_sequence(value, what)))


def as_size(value: Any, what: str) -> int:
    """An int in ``[1, MAX_COUNT]``: a batch, a sequence length, a mesh axis size, a layer or device count.

    Example:
      >>> as_size(10**13, "batch")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.PlanError: batch=10000000000000 must be <= 1000000000000.
    """
    return as_count(value, what, maximum=MAX_COUNT, error=PlanError)


def as_byte_count(value: Any, what: str) -> int:
    """An int in ``[0, MAX_BYTES]``: a buffer's, a peak's or a budget's bytes."""
    return as_count(value, what, minimum=0, maximum=MAX_BYTES, error=PlanError)


def as_sizes(value: Any, what: str) -> dict[str, int]:
    """Mesh axis sizes, name -> :func:`as_size`, in the caller's order, multiplying to at most ``MAX_COUNT``.

    Raises:
      MeshplanTypeError: not a mapping, a name that is not a str, a size that is not an int.
      PlanError: a size below 1, or sizes whose product (the mesh's devices) exceeds ``MAX_COUNT``.

    Example:
      >>> as_sizes({"fsdp": 8, "tp": 4}, "sizes")
      {'fsdp': 8, 'tp': 4}
      >>> as_sizes(["fsdp"], "sizes")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: sizes=['fsdp'] must map mesh axis names to sizes (e.g. {'fsdp': 8, 'tp': 4}), not list.
    """
    if not isinstance(value, Mapping):
        raise MeshplanTypeError(f"{what}={_short(value)} must map mesh axis names to sizes (e.g. {{'fsdp': 8, "
                                f"'tp': 4}}), not {type(value).__name__}.")
    out: dict[str, int] = {}
    devices = 1
    for name, size in value.items():
        if not isinstance(name, str):
            raise MeshplanTypeError(f"{what} has a non-string axis name {_short(name)}; names are str.")
        out[name] = as_size(size, f"{what}[{name!r}]")
        devices *= out[name]
        if devices > MAX_COUNT:
            raise PlanError(f"{what}={_short(value)} multiplies to more than {MAX_COUNT} devices.")
    return out


def as_efficiency(value: Any, what: str) -> float:
    """A fraction of a device's peak FLOP/s, in ``(0, 1]``."""
    out = as_real(value, what, error=PlanError)
    if out > 1:
        raise PlanError(f"{what}={value!r} must be a fraction of peak FLOP/s in (0, 1].")
    return out


def as_seconds(value: Any, what: str) -> float:
    """A finite float >= 0."""
    return as_real(value, what, allow_zero=True, error=PlanError)


def as_bool(value: Any, what: str) -> bool:
    """A bool field."""
    return as_flag(value, what)


def instance_of(cls: type[T]) -> Callable[[Any, str], T]:
    """A check that the value is a ``cls``."""
    def check(value: Any, what: str) -> T:
        return as_instance(value, what, cls)
    return check


def tuple_of(item: Callable[[Any, str], T]) -> Callable[[Any, str], tuple[T, ...]]:
    """A check of a sequence field, item by item."""
    def check(value: Any, what: str) -> tuple[T, ...]:
        return tuple(item(v, f"{what}[{i}]") for i, v in enumerate(as_sequence(value, what)))
    return check


def optional(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    """``None`` or what ``check`` accepts."""
    def inner(value: Any, what: str) -> T | None:
        return None if value is None else check(value, what)
    return inner


def check_fields(obj: Any, checks: dict[str, FieldCheck]) -> None:
    """Check and canonicalize the fields of a frozen dataclass, listing every bad one at once.

    Raises:
      MeshplanTypeError: a field of the wrong type (with every other problem).
      PlanError: a field of the right type out of range.
    """
    name = type(obj).__name__
    try:  # the common case, all valid: one pass, no bookkeeping (the search builds thousands of records)
        out = {field: check(getattr(obj, field), f"{name}.{field}") for field, check in checks.items()}
    except MeshplanError:
        pass
    else:
        for field, value in out.items():
            object.__setattr__(obj, field, value)
        return
    types: list[str] = []
    values: list[str] = []
    out = {}
    for field, check in checks.items():
        before = len(types) + len(values)
        result = collect(types, values, check, getattr(obj, field), f"{name}.{field}")
        if len(types) + len(values) == before:
            out[field] = result
    if types:
        raise MeshplanTypeError("; ".join(types + values) + ".")
    if values:
        raise PlanError("; ".join(values) + ".")
    for field, value in out.items():
        object.__setattr__(obj, field, value)


def record(cls: type, data: Any, *, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``cls`` in a ``from_dict`` input (see :func:`~meshplan.pure._check.as_record`)."""
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return as_record(data, f"{cls.__name__}.from_dict input", fields=[f.name for f in fields], required=required,
                     ignore=ignore, error=PlanError)


def _field_error(path: str, reason: str) -> PlanError:
    err = PlanError(f"plan field {path}: {reason}")
    # Kept on the error so an enclosing nested() can prefix its own place.
    err.field_path, err.field_reason = path, reason  # type: ignore[attr-defined]
    return err


def nested(where: str, make: Callable[[], T]) -> T:
    """``make()``, with any meshplan error re-raised as a :class:`PlanError` naming the field path ``where``."""
    try:
        return make()
    except MeshplanError as err:
        inner = getattr(err, "field_path", None)
        if inner is not None:
            raise _field_error(f"{where}.{inner}", err.field_reason) from None  # type: ignore[attr-defined]
        raise _field_error(where, str(err)) from None


def records(where: str, from_dict: Callable[[Any], T], items: Any) -> tuple[T, ...]:
    """``from_dict`` of every item of a JSON list, failures named ``where[i]``."""
    seq = nested(where, lambda: as_sequence(items, where))
    return tuple(nested(f"{where}[{i}]", functools.partial(from_dict, item)) for i, item in enumerate(seq))


def unchecked(cls: type[T], values: tuple[Any, ...]) -> T:
    """A frozen record of ``cls`` holding ``values`` in field order, without ``__post_init__``'s checks:
    for figures the search built itself, already of the canonical types."""
    out = object.__new__(cls)
    for setter, value in zip(_slot_setters(cast(type, cls)), values, strict=True):
        setter(out, value)
    return out


# A search builds ~700 records through unchecked; setting their slots through the slot descriptors takes
# half the time of object.__setattr__ by name. A class's slots never change, so the cache (one entry per
# record class) is pure.
@functools.lru_cache(maxsize=16)
def _slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    """The ``__set__`` of each slot of a slots dataclass, in field order (its ``__slots__``)."""
    return tuple(getattr(cls, name).__set__ for name in cls.__slots__)  # type: ignore[attr-defined]


def fields_of(cls: type, data: Any, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The checked fields of a ``from_dict`` input for ``cls`` (:func:`record`), ``ignore`` left out."""
    return record(cls, data, ignore=ignore)

