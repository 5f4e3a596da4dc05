"""Alpha-beta cost model of the collectives a sharded training step runs.

Each collective over ``n`` participants on one :class:`Link` costs a latency
term (``alpha`` = ``Link.latency`` seconds per ring step) plus a bandwidth
term (bytes each device must send, divided by ``Link.bandwidth``, the
per-device one-direction bandwidth). ``B`` is always the FULL logical buffer
in bytes: the gathered result of an all-gather, the input of a
reduce-scatter or an all-reduce, each device's whole send buffer of an
all-to-all.

Ring formulas (Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005; the same factors as the
"bus bandwidth" of NVIDIA's nccl-tests, doc/PERFORMANCE.md):

- all-gather, reduce-scatter: ``(n-1)*alpha + (n-1)/n * B / bw``; each device
  sends ``n-1`` chunks of ``B/n`` bytes, one chunk per ring step.
- all-reduce = reduce-scatter + all-gather:
  ``2(n-1)*alpha + 2(n-1)/n * B / bw``.
- all-to-all: ``(n-1)*alpha + (n-1)/n * B / bw``. Assumption: each device
  keeps ``B/n`` of its ``B`` bytes and sends the rest in ``n-1`` pairwise
  exchanges, each paying ``alpha``, limited only by its own injection
  bandwidth. That holds on switched fabrics (NVSwitch, a fat-tree network).
  On a TPU torus axis an all-to-all is bisection-limited and costs roughly
  ``n/4`` times more for ``n > 4``: the model is optimistic there.

Every term has the factor ``n - 1``, so all formulas give exactly 0 for
``n == 1`` without a special case.

The functions take Python numbers or numpy arrays (broadcast together), so a
planner can price many candidates in one call; they return a ``float`` for
scalar inputs and a float64 array otherwise. Times are in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

import numpy as np

from meshplan.pure.cluster._link import Link, check_link
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveKind",
    "all_gather_time",
    "all_reduce_time",
    "all_to_all_time",
    "collective_time",
    "reduce_scatter_time",
]

CollectiveKind: TypeAlias = Literal["all-gather", "reduce-scatter", "all-reduce", "all-to-all"]
"""The collectives the cost model prices."""

COLLECTIVE_KINDS: tuple[str, ...] = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")
"""Valid ``kind`` values of :func:`collective_time`, in a fixed order."""

_Real: TypeAlias = int | float | np.integer | np.floating
_ArrayLike: TypeAlias = _Real | np.ndarray | Sequence[_Real]


def _is_scalar(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _as_array(name: str, value: object) -> np.ndarray:
    """Numeric scalar/sequence/array -> ndarray; MeshplanTypeError otherwise."""
    if isinstance(value, bool) or isinstance(value, (str, bytes)):
        raise MeshplanTypeError(f"{name}={value!r} must be a number or an array of numbers.")
    if not (_is_scalar(value) or isinstance(value, (np.ndarray, list, tuple))):
        raise MeshplanTypeError(
            f"{name}={value!r} must be a number or a numpy array, not {type(value).__name__}."
        )
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError):  # ragged or mixed nesting
        raise MeshplanTypeError(f"{name}={value!r:.80} is not a number or a regular array of numbers.") from None
    if arr.dtype.kind not in "iuf":
        raise MeshplanTypeError(f"{name} must hold ints or floats, got dtype {arr.dtype} ({value!r}).")
    return arr


def _check_bytes(nbytes: object) -> np.ndarray:
    arr = _as_array("nbytes", nbytes).astype(np.float64)
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        raise PlanError(
            f"nbytes={nbytes!r} must be finite and >= 0 (bytes of the full buffer); "
            f"bad value(s): {arr[bad][:5].tolist()}."
        )
    return arr


def _check_count(n: object) -> np.ndarray:
    arr = _as_array("n", n)
    if arr.dtype.kind == "f":
        raise MeshplanTypeError(f"n={n!r} must be an integer participant count, not a float.")
    bad = arr < 1
    if bad.any():
        raise PlanError(f"n={n!r} must be >= 1 (participants in the collective); bad value(s): "
                        f"{arr[bad][:5].tolist()}.")
    return arr.astype(np.float64)


def _finish(result: np.ndarray, *inputs: object) -> float | np.ndarray:
    """float for all-scalar inputs, else the array."""
    if all(_is_scalar(x) for x in inputs):
        return float(result)
    return result


def _ring_one_pass(nbytes: _ArrayLike, n: _ArrayLike, link: Link) -> float | np.ndarray:
    """``(n-1)*alpha + (n-1)/n * B / bw``: one pass around the ring."""
    link = check_link(link)
    b = _check_bytes(nbytes)
    k = _check_count(n)
    try:
        np.broadcast_shapes(b.shape, k.shape)
    except ValueError:
        raise PlanError(f"nbytes={nbytes!r:.60} (shape {b.shape}) and n={n!r:.60} (shape {k.shape}) do not "
                        "broadcast together; pass arrays of one shape, or a scalar for either.") from None
    steps = k - 1.0
    result = steps * link.latency + (steps / k) * b / link.bandwidth
    return _finish(result, nbytes, n)


def all_gather_time(nbytes: _ArrayLike, n: _ArrayLike, link: Link) -> float | np.ndarray:
    """Seconds for a ring all-gather whose gathered result is ``nbytes``.

    Args:
      nbytes: the full gathered buffer in bytes (each device starts with
        ``nbytes / n``), >= 0. A number or a numpy array.
      n: participants (>= 1), an int or an integer array.
      link: the interconnect the ring runs on.

    Returns:
      ``(n-1)*link.latency + (n-1)/n * nbytes / link.bandwidth``; 0 for n == 1.

    Raises:
      PlanError: negative or non-finite bytes, or n < 1.
      MeshplanTypeError: non-numeric inputs, float n, or a non-Link link.

    Example:
      >>> all_gather_time(8e9, 8, Link(bandwidth=1e9, latency=0.0))
      7.0
      >>> all_gather_time(8e9, 1, Link(bandwidth=1e9, latency=1e-3))
      0.0
    """
    return _ring_one_pass(nbytes, n, link)


def reduce_scatter_time(nbytes: _ArrayLike, n: _ArrayLike, link: Link) -> float | np.ndarray:
    """Seconds for a ring reduce-scatter of an ``nbytes`` input per device.

    Same cost as the all-gather of the same full buffer: each device sends
    ``n-1`` partial sums of ``nbytes / n`` bytes.

    Args:
      nbytes: the full (unscattered) buffer in bytes, >= 0.
      n: participants (>= 1).
      link: the interconnect the ring runs on.

    Returns:
      ``(n-1)*link.latency + (n-1)/n * nbytes / link.bandwidth``.

    Raises:
      PlanError: negative or non-finite bytes, or n < 1.
      MeshplanTypeError: non-numeric inputs, float n, or a non-Link link.

    Example:
      >>> reduce_scatter_time(4e9, 4, Link(bandwidth=1e9, latency=1e-3))
      3.003
    """
    return _ring_one_pass(nbytes, n, link)


def all_reduce_time(nbytes: _ArrayLike, n: _ArrayLike, link: Link) -> float | np.ndarray:
    """Seconds for a ring all-reduce of ``nbytes``: reduce-scatter + all-gather.

    Args:
      nbytes: the buffer every device holds and receives reduced, >= 0.
      n: participants (>= 1).
      link: the interconnect the ring runs on.

    Returns:
      ``2(n-1)*link.latency + 2(n-1)/n * nbytes / link.bandwidth``.

    Raises:
      PlanError: negative or non-finite bytes, or n < 1.
      MeshplanTypeError: non-numeric inputs, float n, or a non-Link link.

    Example:
      >>> all_reduce_time(4e9, 4, Link(bandwidth=1e9, latency=1e-3))
      6.006
    """
    return reduce_scatter_time(nbytes, n, link) + all_gather_time(nbytes, n, link)


def all_to_all_time(nbytes: _ArrayLike, n: _ArrayLike, link: Link) -> float | np.ndarray:
    """Seconds for an all-to-all where every device sends from ``nbytes``.

    Assumes ``n-1`` pairwise exchanges of ``nbytes / n`` bytes, limited by the
    device's own injection bandwidth (true on switched fabrics; optimistic by
    about ``n/4`` on a TPU torus axis, see the module docstring).

    Args:
      nbytes: each device's whole send buffer in bytes (it keeps ``1/n``), >= 0.
      n: participants (>= 1).
      link: the interconnect the exchange runs on.

    Returns:
      ``(n-1)*link.latency + (n-1)/n * nbytes / link.bandwidth``.

    Raises:
      PlanError: negative or non-finite bytes, or n < 1.
      MeshplanTypeError: non-numeric inputs, float n, or a non-Link link.

    Example:
      >>> all_to_all_time(2e9, 2, Link(bandwidth=1e9, latency=0.0))
      1.0
    """
    return _ring_one_pass(nbytes, n, link)


_BY_KIND = {
    "all-gather": all_gather_time,
    "reduce-scatter": reduce_scatter_time,
    "all-reduce": all_reduce_time,
    "all-to-all": all_to_all_time,
}


def collective_time(
    kind: CollectiveKind, nbytes: _ArrayLike, n: _ArrayLike, link: Link
) -> float | np.ndarray:
    """Seconds for the collective named ``kind`` (see :data:`COLLECTIVE_KINDS`).

    Args:
      kind: ``"all-gather"``, ``"reduce-scatter"``, ``"all-reduce"`` or
        ``"all-to-all"``; ``_`` is accepted for ``-`` and case is ignored.
      nbytes: the full buffer in bytes, as each specific function defines it.
      n: participants (>= 1).
      link: the interconnect.

    Returns:
      The same value as the specific function.

    Raises:
      PlanError: an unknown kind (the message lists the valid ones), or bad
        bytes / n as in the specific functions.
      MeshplanTypeError: ``kind`` is not a string.

    Example:
      >>> collective_time("all_reduce", 1e9, 2, Link(bandwidth=1e9, latency=0.0))
      1.0
    """
    if not isinstance(kind, str):
        raise MeshplanTypeError(f"kind={kind!r} must be a string, one of {list(COLLECTIVE_KINDS)}.")
    fn = _BY_KIND.get(kind.strip().lower().replace("_", "-"))
    if fn is None:
        raise PlanError(f"kind={kind!r} is not a collective the cost model knows; use one of "
                        f"{list(COLLECTIVE_KINDS)}.")
    return fn(nbytes, n, link)


