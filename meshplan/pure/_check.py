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

import math
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy as np

from jax.sharding import PartitionSpec

from meshplan.pure._types import FrozenAxisSizes, make_spec
from meshplan.pure.errors import MeshplanError, MeshplanTypeError, MeshShapeError, SpecError

P = ParamSpec("P")
T = TypeVar("T")

__all__ = [
    "as_choice",
    "as_count",
    "as_flag",
    "as_instance",
    "as_int",
    "as_int_tuple",
    "as_json_spec",
    "as_names",
    "as_positive_shape",
    "as_real",
    "as_record",
    "as_shape",
    "as_sequence",
    "as_str",
    "as_typed_mapping",
    "canonical_axis_sizes",
    "collect",
    "unresolved_shape_problems",
]


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
            f"{what}={_short(value)} has type {type(value).__name__}; expected an int."
        ) from None


def as_sequence(value: Any, what: str) -> tuple[Any, ...]:
    """``value`` as a tuple, refusing strings, sets and other unordered or scalar values.

    Example:
      >>> as_sequence(["dp", "tp"], "axis_names")
      ('dp', 'tp')
    """
    # Fast paths first: planners check thousands of shapes, and isinstance against
    # the Sequence ABC costs several times a type() test.
    if type(value) is tuple:
        return value
    if type(value) is list:
        return tuple(value)
    if isinstance(value, (str, bytes)):
        raise MeshplanTypeError(
            f"{what}={value!r} is a string; expected a sequence such as a tuple or list."
        )
    if not isinstance(value, Sequence):
        # Sets and dicts are refused on purpose: their order is not the
        # caller's order, and axis order decides device placement.
        raise MeshplanTypeError(
            f"{what}={_short(value)} has type {type(value).__name__}; expected an ordered sequence "
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
    if all(type(v) is int for v in items):  # the common case, checked in one pass
        return items
    try:
        return tuple(as_int(v, f"{what}[{i}]") for i, v in enumerate(items))
    except MeshplanTypeError as err:  # name the whole value too: "shape=(2.0,): shape[0]=2.0 ..."
        raise MeshplanTypeError(f"{what}={_short(items)}: {err}") from None


def as_count(
    value: Any,
    what: str,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    error: type[MeshplanError] = MeshShapeError,
    hint: str = "",
) -> int:
    """``value`` as an int ``>= minimum`` (a count of devices, hosts, layers, ...).

    Args:
      value: the caller's value.
      what: the argument's name as the caller wrote it.
      minimum: the smallest valid count.
      maximum: the largest valid count (None: no bound). Bounds keep absurd
        inputs (a 10**20-node cluster) from turning into hours of arithmetic.
      error: the ValueError subclass raised for a count out of range.
      hint: words appended to the range message (e.g. "or None when unknown").

    Example:
      >>> as_count(0, "host", minimum=0)
      0
    """
    out = as_int(value, what)
    if out < minimum:
        more = f" ({hint})" if hint else ""
        raise error(f"{what}={_short(out)} must be >= {minimum}{more}.")
    if maximum is not None and out > maximum:
        more = f" ({hint})" if hint else ""
        raise error(f"{what}={_short(out)} must be <= {maximum}{more}.")
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


def as_shape(value: Any, what: str) -> tuple[int, ...]:
    """``value`` as an array shape: a tuple of Python ints >= 0 (numpy ints accepted).

    The one reader of array shapes (a mesh shape is :func:`as_positive_shape`).

    Example:
      >>> as_shape([8, 0], "shape")
      (8, 0)
      >>> as_shape((4, -1), "shape")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: shape=(4, -1) has negative dims (shape[1]=-1); array dims are ints >= 0.
    """
    shape = as_int_tuple(value, what)
    bad = [f"{what}[{i}]={d}" for i, d in enumerate(shape) if d < 0]
    if bad:
        raise MeshplanTypeError(f"{what}={shape} has negative dims ({', '.join(bad)}); array dims are ints >= 0.")
    return shape


def unresolved_shape_problems(shape: tuple[int, ...], what: str) -> list[str]:
    """What keeps ``shape`` from being a mesh shape that may still hold one ``-1``.

    Every size must be >= 1, or ``-1`` ("the devices the other axes leave
    over") at most once. Returns the problems instead of raising, so callers
    can report them together with their own (a rank mismatch, a bad regex).

    Example:
      >>> unresolved_shape_problems((2, -1), "mesh_shape")
      []
      >>> unresolved_shape_problems((0, -1, -1), "mesh_shape")
      ['mesh_shape[0]=0', 'mesh_shape has 2 entries of -1 (at most one)']
    """
    problems = [f"{what}[{i}]={d}" for i, d in enumerate(shape) if d == 0 or d < -1]
    if shape.count(-1) > 1:
        problems.append(f"{what} has {shape.count(-1)} entries of -1 (at most one)")
    return problems


def as_real(value: Any, what: str, *, allow_zero: bool = False, error: type[MeshplanError]) -> float:
    """``value`` as a finite Python float > 0 (>= 0 with ``allow_zero``).

    Ints, floats and numpy scalars are accepted; bools and strings are type
    errors. Used for bandwidths, latencies and FLOP rates.

    Args:
      value: the caller's value.
      what: the argument's name as the caller wrote it.
      allow_zero: whether 0 is valid (a latency may be 0, a bandwidth not).
      error: the ValueError subclass raised for a value out of range.

    Example:
      >>> import numpy as np
      >>> as_real(np.float32(0.5), "latency", allow_zero=True, error=MeshShapeError)
      0.5
      >>> as_real(float("inf"), "bandwidth", error=MeshShapeError)
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshShapeError: bandwidth=inf must be a finite number > 0.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise MeshplanTypeError(f"{what}={_short(value)} must be a real number, not {type(value).__name__}.")
    try:
        out = float(value)
    except OverflowError:  # an int beyond float range (10**400) is as out of range as inf
        out = math.inf
    if not math.isfinite(out) or out < 0 or (out == 0 and not allow_zero):
        raise error(f"{what}={_short(value)} must be a finite number {'>= 0' if allow_zero else '> 0'}.")
    return out


def as_flag(value: Any, what: str) -> bool:
    """``value`` as a Python bool; only ``True``/``False`` (and numpy bools) are flags.

    Ints, strings (``"yes"``) and arrays are refused: ``bool(np.array([1, 2]))``
    raises numpy's own "truth value is ambiguous" error, and ``bool("no")`` is
    True, so guessing would hide the caller's bug.

    Example:
      >>> import numpy as np
      >>> as_flag(np.bool_(True), "master_weights")
      True
      >>> as_flag("yes", "master_weights")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: master_weights='yes' must be True or False, not str.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise MeshplanTypeError(f"{what}={_short(value)} must be True or False, not {type(value).__name__}.")


def as_instance(value: Any, what: str, cls: type[T], *, example: str = "") -> T:
    """``value`` checked to be a ``cls`` (a record a function reads fields of: a ``StepFlops``, a ``VerifyRow``).

    The one check of "one of meshplan's records goes here": without it a caller's dict or ``None`` fails
    later as a raw ``AttributeError`` on the first field read.

    Args:
      value: the caller's value.
      what: the argument's name as the caller wrote it.
      cls: the class the value must be an instance of (a subclass counts).
      example: how to get one, quoted in the message (``"step_flops(model, sizes, ...)"``).

    Raises:
      MeshplanTypeError: ``value`` is not a ``cls``.

    Example:
      >>> as_instance(3, "n", int)
      3
      >>> as_instance({"model": 1.0}, "flops", float, example="step_flops(...)")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: flops={'model': 1.0} must be a float (e.g. step_flops(...)), not dict.
    """
    if isinstance(value, cls):
        return value
    how = f" (e.g. {example})" if example else ""
    raise MeshplanTypeError(f"{what}={_short(value)} must be a {cls.__name__}{how}, not {type(value).__name__}.")


def as_choice(
    value: Any, what: str, choices: Sequence[str], *, error: type[MeshplanError] = SpecError
) -> str:
    """``value`` as one of the strings ``choices`` (``padding="padded"``, ``severity="error"``).

    Compared as strings only: ``value in choices`` with a numpy array would
    compare element-wise and raise numpy's own error. A value that is not a
    str is a :class:`~meshplan.errors.MeshplanTypeError`; a str that is not one
    of ``choices`` is a wrong value, so ``error`` (a ValueError) names it.

    Example:
      >>> as_choice("actual", "padding", ("padded", "actual"))
      'actual'
    """
    if not isinstance(value, str):
        raise MeshplanTypeError(f"{what}={_short(value)} must be one of {tuple(choices)}, not {type(value).__name__}.")
    if value not in choices:
        raise error(f"{what}={value!r} must be one of {tuple(choices)}.")
    return value


def as_str(value: Any, what: str, *, nonempty: bool = False, error: type[MeshplanError] = MeshShapeError) -> str:
    """``value`` as a str (a name, a label, a pattern); ``nonempty`` refuses ``""`` with ``error``.

    Example:
      >>> as_str("gpt2", "model")
      'gpt2'
    """
    if not isinstance(value, str):
        raise MeshplanTypeError(f"{what}={_short(value)} must be a str, not {type(value).__name__}.")
    if nonempty and not value.strip():
        raise error(f"{what}={value!r} must not be empty.")
    return value


def as_names(value: Any, what: str, *, error: type[MeshplanError] = MeshShapeError) -> tuple[str, ...]:
    """``value`` as mesh axis names: one name, or a sequence of at least one name.

    Args:
      value: a name (``"data"``) or an ordered sequence of names (``("data", "fsdp")``).
      what: the argument's name as the caller wrote it.
      error: the ValueError subclass for an empty sequence or an empty name.

    Raises:
      MeshplanTypeError: not a str or an ordered sequence of str (``None``, a set, ``3``).
      error: no name at all (``[]``), or a blank name.

    Example:
      >>> as_names("data", "batch_axis_names"), as_names(["dp", "fsdp"], "batch_axis_names")
      (('data',), ('dp', 'fsdp'))
      >>> as_names([], "batch_axis_names")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshShapeError: batch_axis_names=[] names no axis; give at least one mesh axis name (e.g. 'data' or ['data', 'fsdp']).
    """
    items = (value,) if isinstance(value, str) else as_sequence(value, what)
    bad = [f"{what}[{i}]={_short(n)}" for i, n in enumerate(items) if not isinstance(n, str)]
    if bad:
        raise MeshplanTypeError(f"{what}={_short(value)} holds non-strings: {', '.join(bad)}; give axis names.")
    if not items:
        raise error(f"{what}={_short(value)} names no axis; give at least one mesh axis name "
                    "(e.g. 'data' or ['data', 'fsdp']).")
    blank = [f"{what}[{i}]={n!r}" for i, n in enumerate(items) if not n.strip()]
    if blank:
        raise error(f"{what}={_short(value)} has blank names ({', '.join(blank)}); give mesh axis names.")
    return items


def as_json_spec(data: Any, what: str) -> PartitionSpec:
    """A PartitionSpec written as JSON data: one entry per dim, each null, a name or a list of names.

    The one reader of specs in saved plans and rule files; a bare string is a one-entry spec
    and ``None`` the replicated spec.

    Raises:
      MeshplanTypeError: not a list, or an entry that is not null, a name or a list of names
        (a mapping, a number), named by its index.

    Example:
      >>> as_json_spec([["fsdp", "tp"], None, "ep"], "spec")
      P(('fsdp', 'tp'), None, 'ep')
      >>> as_json_spec([["dp", {"T": None}]], "spec")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: spec[0]=['dp', {'T': None}] must be null, an axis name or a list of axis names.
    """
    if data is None:
        return make_spec()
    if isinstance(data, str):
        data = [data]
    if not isinstance(data, list | tuple):
        raise MeshplanTypeError(f"{what}={_short(data)} must be a list of entries (null, \"axis\" or "
                                "[\"a\", \"b\"]).")
    out: list[Any] = []
    for i, entry in enumerate(data):
        if entry is None or isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, list | tuple) and all(isinstance(a, str) for a in entry):
            out.append(tuple(entry))
        else:
            raise MeshplanTypeError(f"{what}[{i}]={_short(entry)} must be null, an axis name or a list of axis "
                                    "names.")
    return make_spec(*out)


def as_typed_mapping(value: Any, what: str, *, values: type | tuple[type, ...], expected: str) -> Mapping[str, Any]:
    """``value`` checked to map str names to values of type ``values``, every bad entry named with its value.

    Args:
      value: the caller's mapping.
      what: the argument's name as the caller wrote it.
      values: the type (or types) each value must have.
      expected: what a value should be, in words (``"a DeviceSpec"``).

    Raises:
      MeshplanTypeError: not a mapping, or entries with a non-str key or a value of another type.

    Example:
      >>> as_typed_mapping({"foo": 3}, "devices", values=str, expected="a name")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: devices={'foo': 3}: devices['foo']=3 is int, not a name; map each str name to a name.
    """
    if not isinstance(value, Mapping):
        raise MeshplanTypeError(f"{what}={_short(value)} must map str names to {expected}, not "
                                f"{type(value).__name__}.")
    bad = [f"{what}[{_short(k, 40)}]={_short(v, 40)} is {type(v).__name__}, not {expected}"
           if isinstance(k, str) else f"key {_short(k, 40)} is {type(k).__name__}, not a str"
           for k, v in value.items() if not isinstance(k, str) or not isinstance(v, values)]
    if bad:
        raise MeshplanTypeError(f"{what}={_short(value)}: {'; '.join(bad)}; map each str name to {expected}.")
    return value


def as_record(
    data: Any,
    what: str,
    *,
    fields: Sequence[str],
    required: Sequence[str],
    ignore: Sequence[str] = (),
    error: type[MeshplanError],
) -> dict[str, Any]:
    """A JSON object (a mapping of field name -> value) checked against its field list.

    The one reader of ``from_dict`` input: it refuses a non-mapping (a
    :class:`~meshplan.errors.MeshplanTypeError`) and non-string, unknown or
    missing keys (``error``), naming ``what`` (the field path, e.g.
    ``"candidates[0].memory"``). Values are checked by the record's own
    ``__post_init__``.

    Args:
      data: the decoded JSON value.
      what: where it sits in the document.
      fields: every field the record has.
      required: the fields without a default.
      ignore: keys written for readers and dropped here (e.g. a derived ``total``).
      error: the ValueError subclass for key problems.

    Example:
      >>> as_record({"a": 1}, "x", fields=("a", "b"), required=("a",), error=MeshShapeError)
      {'a': 1}
    """
    if not isinstance(data, Mapping):
        raise MeshplanTypeError(f"{what}={_short(data)} must be a JSON object (a mapping), not "
                                f"{type(data).__name__}.")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise MeshplanTypeError(f"{what} has non-string keys {[_short(k) for k in bad_keys]}; keys are field "
                                f"names {list(fields)}.")
    out = {k: v for k, v in data.items() if k not in ignore}
    unknown = sorted(set(out) - set(fields))
    missing = [n for n in required if n not in out]
    if unknown or missing:
        raise error(f"{what}: unknown keys {unknown}, missing keys {missing}; expected {list(fields)}.")
    return out


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about arbitrary junk."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def collect(
    type_errors: list[str],
    value_errors: list[str],
    check: Callable[P, T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T | None:
    """Run ``check(*args, **kwargs)`` and file its error instead of raising it (for collect-then-raise-once).

    A :class:`~meshplan.errors.MeshplanTypeError` goes to ``type_errors``,
    any other :class:`~meshplan.errors.MeshplanError` to ``value_errors``;
    the message loses its final full stop so the lists join with ``"; "``.

    Returns:
      The validator's result, or None when it failed.

    Example:
      >>> types, values = [], []
      >>> collect(types, values, as_count, 0, "num_nodes"), values
      (None, ['num_nodes=0 must be >= 1'])
    """
    try:
        return check(*args, **kwargs)
    except MeshplanTypeError as err:
        type_errors.append(str(err).removesuffix("."))
    except MeshplanError as err:
        value_errors.append(str(err).removesuffix("."))
    return None


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
