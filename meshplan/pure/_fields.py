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
from collections.abc import Callable
from typing import Any, TypeVar, cast

from meshplan.pure._check import as_count, as_flag, as_real, as_record, as_sequence, as_str, collect
from meshplan.pure.errors import MeshplanError, MeshplanTypeError, PlanError

__all__ = ["FieldCheck", "as_bool", "as_nonneg", "as_rank", "as_seconds", "as_text", "as_texts", "check_fields",
           "fields_of", "instance_of", "nested", "optional", "record", "records", "tuple_of", "unchecked"]

T = TypeVar("T")
FieldCheck = Callable[[Any, str], Any]


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


def as_seconds(value: Any, what: str) -> float:
    """A finite float >= 0."""
    return as_real(value, what, allow_zero=True, error=PlanError)


def as_bool(value: Any, what: str) -> bool:
    """A bool field."""
    return as_flag(value, what)


def instance_of(cls: type[T]) -> Callable[[Any, str], T]:
    """A check that the value is a ``cls``."""
    def check(value: Any, what: str) -> T:
        if not isinstance(value, cls):
            raise MeshplanTypeError(f"{what}={value!r:.80} must be a {cls.__name__}, not {type(value).__name__}.")
        return value
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

