"""The one split algorithm: a global mesh shape over granules (hosts, slices).

A *granule* is a unit of the slow outer network: a process (host) or a TPU
slice. Splitting a global mesh shape over ``n`` granules means choosing a DCN
shape ``dcn`` with ``prod(dcn) == n`` and ``dcn[i]`` dividing ``global[i]``;
the inner (ICI / per-host) shape is then ``global[i] // dcn[i]``. Both the
per-host shape (:func:`per_host_mesh_shape`) and the default ICI/DCN
split (:func:`meshplan.pure.split_mesh_shape`) use :func:`split_over_granules`,
so the two can never disagree.

Preference order, from most to least specific:

(a) **One axis takes every granule** -- the first non-singleton axis that
    ``n`` divides. This is loadax's rule: on 2 nodes, ``(1, 2, 8)`` becomes
    dcn ``(1, 2, 1)`` / ici ``(1, 1, 8)`` (2-way data parallelism over DCN),
    and ``(2, 1, 8)`` becomes dcn ``(2, 1, 1)``. Keeping the slow network on
    one axis keeps every other axis's collectives on the fast network.
(b) **Spread over several axes**, outermost first: of all valid ``dcn``
    tuples choose the lexicographically largest. Outer axes carry the least
    traffic by convention (``[replica, data, model]``), so they should absorb
    the slow links. Worked example, ``(2, 3, 4)`` over 12 granules: no axis
    is divisible by 12, so (a) does not apply; the outermost axis takes
    ``gcd(2, 12) = 2`` (12 left -> 6), the next ``gcd(3, 6) = 3`` (-> 2), the
    last ``gcd(4, 2) = 2`` (-> 1): dcn ``(2, 3, 2)``, ici ``(1, 1, 2)``.
(c) **No split exists**: a prime factor of ``n`` occurs more often in ``n``
    than in all axis sizes together (e.g. 3 granules for ``(4, 4)``).
    :class:`DeviceLayoutError` says which prime is short. Since exponents
    add up over a product, this happens exactly when ``n`` does not divide
    ``prod(global)``; so when the device counts match (``prod(global) ==
    devices_per_granule * n``) a split always exists.

Why the greedy ``gcd`` walk in (b) is exact. Divisibility works prime by
prime: a valid ``dcn`` exists iff for every prime ``p`` the exponent of
``p`` in ``n`` is at most the sum of its exponents over the axis sizes. At
axis ``i`` with ``r`` granules still to place, ``dcn[i]`` must divide both
``global[i]`` and ``r``, so ``gcd(global[i], r)`` bounds it; taking exactly
that bound only lowers what the later axes must absorb, so whenever ``r`` is
placeable on axes ``i..`` it stays placeable on axes ``i+1..``. Hence the
walk maximises each coordinate in turn (lexicographic maximum) and finishes
with ``r == 1`` iff any split exists. It costs one ``gcd`` per axis, so
large counts (10^6 granules) are instant.

Contrast with the reference (eformer): its greedy walk can fail on shapes
that do have a split, e.g. a host share spread over two axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshplan.pure.mesh._axes import infer_axis_dims
from meshplan.pure._check import as_count, as_int_tuple, as_positive_shape
from meshplan.pure.errors import DeviceLayoutError

__all__ = ["per_host_mesh_shape", "prime_factors", "split_over_granules"]


def prime_factors(n: int) -> dict[int, int]:
    """Prime -> exponent for ``n >= 1``, primes ascending (trial division).

    Example:
      >>> prime_factors(360)
      {2: 3, 3: 2, 5: 1}
    """
    out: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def _valuation(x: int, p: int) -> int:
    """Exponent of prime ``p`` in ``x >= 1``."""
    k = 0
    while x % p == 0:
        x //= p
        k += 1
    return k


def _first_axis_taking_all(shape: tuple[int, ...], n: int) -> int | None:
    """Index of the first non-singleton axis that ``n`` divides (rule (a)), else None."""
    for i, size in enumerate(shape):
        if size > 1 and size % n == 0:
            return i
    return None


def _shortage_message(shape: tuple[int, ...], n: int, leftover: int) -> str:
    """Why ``n`` granules cannot split ``shape``: the primes the axes lack.

    ``leftover`` is what the greedy walk could not place; its primes are
    exactly the short ones.
    """
    parts = []
    for p in sorted(prime_factors(leftover)):
        need = _valuation(n, p)
        have = sum(_valuation(size, p) for size in shape)
        if have == 0:
            parts.append(f"the prime factor {p} of {n} divides no axis size")
        else:
            parts.append(
                f"{p}^{need} divides {n} but the axis sizes together hold only {p}^{have}"
            )
    return "; ".join(parts)


def split_over_granules(
    global_shape: Sequence[int], num_granules: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Splits a global mesh shape into inner (ICI/host) and outer (DCN) shapes.

    See the module docstring for the preference order and why it is exact.

    Args:
      global_shape: the global mesh shape, every size >= 1 (no ``-1``).
      num_granules: the number of granules (processes or slices), >= 1.

    Returns:
      ``(ici, dcn)`` with ``ici[i] * dcn[i] == global_shape[i]`` and
      ``prod(dcn) == num_granules``.

    Raises:
      MeshplanTypeError: a size or the count is not an int.
      MeshShapeError: a size or the count is < 1.
      DeviceLayoutError: no split exists (names the short prime factors).

    Example:
      >>> split_over_granules((1, 2, 8), 2)
      ((1, 1, 8), (1, 2, 1))
      >>> split_over_granules((2, 3, 4), 12)
      ((1, 1, 2), (2, 3, 2))
    """
    shape = as_positive_shape(global_shape, "global_shape")
    n = as_count(num_granules, "num_granules")
    del global_shape, num_granules

    dcn = [1] * len(shape)
    axis = _first_axis_taking_all(shape, n) if n > 1 else None
    if axis is not None:
        dcn[axis] = n
    else:
        remaining = n
        for i, size in enumerate(shape):
            dcn[i] = math.gcd(size, remaining)
            remaining //= dcn[i]
        if remaining != 1:
            raise DeviceLayoutError(
                f"cannot split global_shape={shape} ({math.prod(shape)} devices) over "
                f"num_granules={n}: {_shortage_message(shape, n, remaining)}. The granule "
                "count must divide the number of devices in the mesh; change the mesh shape "
                f"(e.g. make an axis a multiple of {n}) or the number of granules."
            )
    ici = tuple(size // d for size, d in zip(shape, dcn))
    return ici, tuple(dcn)


def per_host_mesh_shape(
    global_mesh_shape: Sequence[int], total_devices: int, num_processes: int
) -> tuple[int, ...]:
    """The per-host mesh shape for a global mesh over ``num_processes`` hosts.

    Pure twin of eformer's ``calculate_host_mesh_shape``: both counts are
    required here (the facade fills them from jax).

    Args:
      global_mesh_shape: the global mesh shape; at most one ``-1``, inferred
        against ``total_devices * num_processes``.
      total_devices: devices on each host (the facade passes ``local_device_count()``).
      num_processes: number of hosts (the facade passes ``process_count()``).

    Returns:
      The host shape ``h`` with ``h[i] * dcn[i] == global[i]``,
      ``prod(h) == total_devices`` and ``prod(dcn) == num_processes``, the
      process split placed as :func:`split_over_granules` prefers.

    Raises:
      MeshplanTypeError: a size or count is not an int.
      MeshShapeError: the global shape does not hold
        ``total_devices * num_processes`` devices. (Once it does, a host
        split always exists; see the module docstring.)

    Example:
      >>> per_host_mesh_shape((2, 4), total_devices=4, num_processes=2)
      (1, 4)
    """
    dims = as_int_tuple(global_mesh_shape, "global_mesh_shape")
    per_host = as_count(total_devices, "total_devices")
    hosts = as_count(num_processes, "num_processes")
    del global_mesh_shape, total_devices, num_processes
    shape = infer_axis_dims(
        dims,
        per_host * hosts,
        dims_name="global_mesh_shape",
        total_name=f"total_devices*num_processes={per_host}*{hosts}",
    )
    ici, _ = split_over_granules(shape, hosts)
    return ici
