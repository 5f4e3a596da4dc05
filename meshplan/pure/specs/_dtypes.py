"""Element sizes and array bytes, exactly as jax counts them.

jax's ``Array.nbytes`` (and each ``addressable_shards[i].data.nbytes``) is
``size * dtype.itemsize`` on every backend, and numpy/ml_dtypes give every
sub-byte type (``int4``, ``uint2``, ``float4_e2m1fn`` ...) an itemsize of one
byte. On CPU and GPU that is also what the device holds
(``on_device_size_in_bytes`` agrees). TPUs pack sub-byte types; for that
physical view pass ``packed_subbyte=True``, which counts ``ceil(n * bits / 8)``
bytes per array (or per shard). The default is the ``nbytes`` view, so
meshplan's figures equal what live ``jax.Array`` objects report, byte for byte.

Supported dtypes: numpy's bool/int/uint/float/complex, every ml_dtypes type
(``bfloat16``, fp8, fp6, fp4, int4/int2/int1 ...), jax's ``float0`` (0 bytes)
and jax's extended PRNG-key dtypes (``key<fry>`` counts its ``itemsize``).
Strings and objects are not array dtypes jax can hold and raise.
"""

from __future__ import annotations

import functools

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from meshplan.pure._check import as_flag, as_shape
from meshplan.pure.errors import MeshplanTypeError

__all__ = ["array_bytes", "canonical_dtype", "dtype_bits", "dtype_storage_bytes"]

# ml_dtypes' iinfo/finfo classes carry no annotations, so mypy --strict refuses
# calls to them; these are the same classes behind a typed signature.
_iinfo: Callable[[Any], Any] = ml_dtypes.iinfo
_finfo: Callable[[Any], Any] = ml_dtypes.finfo


def _is_extended(dtype: Any) -> bool:
    """jax's extended dtypes (PRNG keys) are not numpy dtypes but have an itemsize."""
    try:
        return bool(jnp.issubdtype(dtype, jax.dtypes.extended))
    except (TypeError, ValueError, KeyError, SyntaxError, OverflowError):
        return False  # not a dtype at all: canonical_dtype says so


def canonical_dtype(dtype: Any, *, what: str = "dtype") -> Any:
    """``dtype`` as a ``numpy.dtype`` (or a jax extended dtype, kept as is).

    Args:
      dtype: anything numpy accepts (``np.float32``, ``"bfloat16"``,
        ``jnp.int4``, ``np.dtype(...)``) or a jax PRNG-key dtype.
      what: the argument's name as the caller wrote it (``grad_dtype``), for the message.

    Returns:
      The canonical dtype object.

    Raises:
      MeshplanTypeError: ``dtype`` is not a dtype.

    Example:
      >>> canonical_dtype("bfloat16")
      dtype(bfloat16)
    """
    if isinstance(dtype, np.dtype):
        return dtype
    if type(dtype) is str:
        try:
            return _named_dtype(dtype)
        except MeshplanTypeError:
            pass  # not a dtype name: the checks below say so, naming ``what``
    # numpy reads dicts, lists and tuples as *structured* dtype specs (and
    # raises ValueError/KeyError/... on junk ones); no array leaf jax can hold
    # has one, so they are refused before numpy sees them. None would be
    # float64 to numpy, which is never what a caller meant.
    if dtype is None or isinstance(dtype, (Mapping, list, tuple, bytes, bytearray, np.ndarray)):
        raise MeshplanTypeError(_not_a_dtype(dtype, what))
    if _is_extended(dtype):
        return dtype
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError, KeyError, SyntaxError, OverflowError) as err:
        raise MeshplanTypeError(_not_a_dtype(dtype, what)) from err


@functools.lru_cache(maxsize=256)
def _named_dtype(name: str) -> Any:
    # Cached: records store dtypes by name (a TrainingRecipe's "bfloat16"), and the search reads
    # them thousands of times; jax's issubdtype test cost more than the arithmetic around it.
    # The set of names met in practice is small; the bound keeps junk names from growing it.
    if _is_extended(name):
        return name
    try:
        return np.dtype(name)
    except (TypeError, ValueError, KeyError, SyntaxError, OverflowError):
        raise MeshplanTypeError(_not_a_dtype(name, "dtype")) from None


def _not_a_dtype(dtype: Any, what: str) -> str:
    text = repr(dtype)
    text = text if len(text) <= 80 else text[:77] + "..."
    return (f"{what}={text} is not a dtype; pass a numpy/ml_dtypes/jax dtype such as "
            "np.float32, jnp.bfloat16 or 'float32'.")


def dtype_bits(dtype: Any) -> int:
    """Logical bits per element (``int4`` -> 4, ``bfloat16`` -> 16, ``bool`` -> 8).

    ``bool`` is 8 because that is its storage size in jax (as in
    ``jax.dtypes.itemsize_bits``); ``float0`` is 0.

    Args:
      dtype: any dtype accepted by :func:`canonical_dtype`.

    Returns:
      The number of bits one element occupies when packed.

    Raises:
      MeshplanTypeError: not a dtype, or one jax arrays cannot hold (strings, objects).

    Example:
      >>> import ml_dtypes, numpy as np
      >>> dtype_bits(ml_dtypes.int4), dtype_bits(ml_dtypes.float8_e4m3fn), dtype_bits(np.complex64)
      (4, 8, 64)
    """
    dt = canonical_dtype(dtype)
    if not isinstance(dt, np.dtype):  # extended (PRNG key) dtype
        return int(dt.itemsize) * 8
    return _numpy_dtype_bits(dt)


@functools.lru_cache(maxsize=256)
def _numpy_dtype_bits(dt: np.dtype) -> int:
    # Cached: the search asks for the same few dtypes thousands of times, and
    # ml_dtypes' iinfo/finfo construct a new object per call. The set of numpy
    # dtypes met in practice is small; the bound keeps odd structured dtypes from growing it.
    if dt == np.dtype(bool):
        return 8
    if dt == jax.dtypes.float0:
        return 0
    if dt.kind == "c":
        return dt.itemsize * 8
    # ml_dtypes' iinfo/finfo cover numpy's own types and the sub-byte ones
    # (whose numpy itemsize, 1, hides their real width).
    try:
        return int(_iinfo(dt).bits)
    except ValueError:
        pass
    try:
        return int(_finfo(dt).bits)
    except ValueError:
        pass
    raise MeshplanTypeError(
        f"dtype={dt} is not an array dtype jax can hold; use a bool, integer, float or complex dtype."
    )


def dtype_storage_bytes(dtype: Any) -> int:
    """Bytes one element takes unpacked: what ``jax.Array.itemsize`` reports.

    Example:
      >>> import ml_dtypes
      >>> dtype_storage_bytes(ml_dtypes.int4), dtype_storage_bytes(ml_dtypes.bfloat16)
      (1, 2)
    """
    return -(-dtype_bits(dtype) // 8)


def _num_elements(shape: Sequence[int]) -> int:
    # A bare int is read as a 1-d shape, as numpy does.
    dims = as_shape((shape,) if isinstance(shape, int | np.integer) else shape, "shape")
    return math.prod(dims)


def array_bytes(shape: Sequence[int], dtype: Any, *, packed_subbyte: bool = False) -> int:
    """Exact bytes of an array of ``shape`` and ``dtype`` (or of one shard of that shape).

    Args:
      shape: the array (or shard) shape.
      dtype: its dtype.
      packed_subbyte: count sub-byte types packed, ``ceil(n * bits / 8)``, as
        TPUs store them. The default counts one byte per sub-byte element,
        which is ``jax.Array.nbytes`` on every backend and the CPU/GPU storage.

    Returns:
      The byte count.

    Raises:
      MeshplanTypeError: a bad shape or dtype.

    Example:
      >>> import ml_dtypes
      >>> array_bytes((3, 5), ml_dtypes.int4), array_bytes((3, 5), ml_dtypes.int4, packed_subbyte=True)
      (15, 8)
      >>> array_bytes((4, 8), "bfloat16")
      64
    """
    n = _num_elements(shape)
    bits = dtype_bits(dtype)
    if as_flag(packed_subbyte, "packed_subbyte") and bits < 8:
        return -(-n * bits // 8)
    return n * (-(-bits // 8))
