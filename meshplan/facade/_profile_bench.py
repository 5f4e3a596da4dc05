"""The micro-benchmarks of a machine profile, run on live devices: matmuls, an HBM copy, collectives.

Each benchmark is one jitted program that runs its operation ``inner`` times in a ``lax.fori_loop``, each
iteration depending on the one before (so XLA can neither hoist nor merge them), timed ``repeats`` times with
``block_until_ready``; the figure is the median run divided by ``inner``, so one dispatch is spread over
``inner`` operations. How each figure was measured is written into the profile (``methods``):

- **matmul** ``(m, k) @ (k, n)`` on one local device: each iteration multiplies the activation plus the loop
  index (an elementwise pass over ``m x k``, so the product cannot be hoisted) and adds the product into an
  accumulator (one over ``m x n``); bf16 operands and output, and FP8 (``float8_e4m3fn``, bf16 output) where
  the catalogue gives the device an FP8 peak;
- **HBM**: ``x = x * a + b`` over an ``nbytes`` float32 array, in place: ``nbytes`` read and written per pass;
- **collectives** under ``jax.shard_map`` over a ``(inter, intra)`` mesh of every device
  (:func:`~meshplan.pure.cluster._machine.link_grid`): one axis at a time, every group of that axis at once (as a
  training step runs them), each call's output fed to the next (an all-gather's first block, a
  reduce-scatter's result written back into its input in place), zeros so nothing overflows.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshplan.pure.cluster._profile import CollectiveTiming, MatmulTiming, MemoryTiming

__all__ = ["METHODS", "time_collectives", "time_matmuls", "time_memory"]

METHODS = {
    "matmul": "one device; median of R runs of a jitted fori_loop of I chained matmuls (activation + loop "
              "index, product accumulated), / I",
    "hbm": "one device; median of R runs of a jitted fori_loop of I in-place x = x * a + b passes over a float32 "
           "array, / I; bandwidth = 2 x bytes / seconds (read + write)",
    "collectives": "jax.shard_map over an (inter, intra) mesh of every device, one axis at a time, every group "
                   "at once; median of R runs of a jitted fori_loop of I chained calls on zeros, / I; bytes as "
                   "the cost model counts them (the gathered result, the reduced input, the send buffer)",
}
"""How each kind of figure is measured (written into the profile)."""


def _median_seconds(run: Callable[[], Any], repeats: int, inner: int) -> float:
    jax.block_until_ready(run())  # type: ignore[no-untyped-call]  # compile and warm up; unannotated in jax
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run())  # type: ignore[no-untyped-call]
        times.append(time.perf_counter() - start)
    return max(statistics.median(times) / inner, 1e-12)


def time_matmuls(shapes: Sequence[tuple[int, int, str, int, int, int]], *, device: Any, dtypes: Sequence[str],
                 repeats: int, inner: int) -> tuple[MatmulTiming, ...]:
    """Time each ``(hidden, tp, label, m, k, n)`` in each dtype on ``device``."""
    out = []
    key = jax.random.key(0)
    for hidden, tp, label, m, k, n in shapes:
        a = jax.device_put(jax.random.normal(key, (m, k), jnp.bfloat16), device)
        b = jax.device_put(jax.random.normal(key, (k, n), jnp.bfloat16) * (1.0 / k**0.5), device)
        for dtype in dtypes:
            seconds = _median_seconds(functools.partial(_matmul_loop(dtype, inner), a, b), repeats, inner)
            out.append(MatmulTiming(label, hidden, tp, m, k, n, dtype, seconds))
        del a, b
    return tuple(out)


def _matmul_loop(dtype: str, inner: int) -> Any:
    def run(a: jax.Array, b: jax.Array) -> jax.Array:
        bb = b.astype(dtype)

        def body(i: Any, acc: jax.Array) -> jax.Array:
            x = (a + i.astype(a.dtype)).astype(dtype)
            return acc + jnp.matmul(x, bb, preferred_element_type=jnp.bfloat16)

        zero = jnp.zeros((a.shape[0], b.shape[1]), jnp.bfloat16)
        out: jax.Array = jax.lax.fori_loop(0, inner, body, zero)
        return out

    return jax.jit(run)


def time_memory(sizes: Sequence[int], *, device: Any, repeats: int, inner: int) -> tuple[MemoryTiming, ...]:
    """Time an in-place read + write pass over float32 arrays of each size (bytes) on ``device``."""
    out = []

    def passes(x: jax.Array) -> jax.Array:
        out: jax.Array = jax.lax.fori_loop(0, inner, lambda i, y: y * 0.999 + 1.0, x)
        return out

    fn = jax.jit(passes, donate_argnums=0)
    for nbytes in sizes:
        n = max(int(nbytes) // 4, 1)
        state = [jax.device_put(jnp.zeros((n,), jnp.float32), device)]

        def run(state: list[jax.Array] = state) -> jax.Array:
            state[0] = fn(state[0])
            return state[0]

        out.append(MemoryTiming(4 * n, _median_seconds(run, repeats, inner)))
        del state
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class _Axis:
    link: str
    name: str
    size: int


def _collective(kind: str, axis: str, n: int, inner: int) -> Callable[[jax.Array], jax.Array]:
    """The per-device loop body of one kind over ``axis`` (the local buffer in, the same shape out)."""
    lax: Any = jax.lax  # the collectives are unannotated in jax

    def one(x: jax.Array) -> jax.Array:
        out: jax.Array
        if kind == "all-reduce":
            out = lax.psum(x, axis)
        elif kind == "all-gather":
            out = lax.all_gather(x, axis, tiled=True)[: x.shape[0]]
        elif kind == "reduce-scatter":
            out = lax.dynamic_update_slice(x, lax.psum_scatter(x, axis, tiled=True), (0,))
        elif kind == "all-to-all":
            out = lax.all_to_all(x, axis, 0, 0, tiled=True)
        else:
            out = lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])
        return out

    def loop(x: jax.Array) -> jax.Array:
        out: jax.Array = lax.fori_loop(0, inner, lambda i, y: one(y), x)
        return out

    return loop


def _local_elements(kind: str, nbytes: int, n: int) -> int:
    """Float32 elements of each device's input for a ``kind`` moving ``nbytes`` as the cost model counts them."""
    whole = max(nbytes // 4 // (n * n), 1) * n * n  # divisible by n twice: the all-to-all splits its shard
    return whole // n if kind == "all-gather" else whole


def time_collectives(grid: Sequence[Sequence[Any]], *, kinds: Sequence[str], sizes: Sequence[int],
                     repeats: int, inner: int) -> tuple[CollectiveTiming, ...]:
    """Time each collective kind at each size over each axis of ``grid`` (devices as ``(domains, per domain)``)
    that has more than one device: ``"inter"`` across the domains, ``"intra"`` inside each."""
    devices = np.array([list(row) for row in grid], dtype=object)
    mesh = Mesh(devices, ("inter", "intra"))
    spec = PartitionSpec(("inter", "intra"))  # type: ignore[no-untyped-call]
    sharding = NamedSharding(mesh, spec)
    axes = [_Axis(link, link, int(devices.shape[i])) for i, link in enumerate(("inter", "intra"))
            if devices.shape[i] > 1]
    out = []
    for axis in axes:
        for kind in kinds:
            body = _collective(kind, axis.name, axis.size, inner)
            fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
            for nbytes in sizes:
                local = _local_elements(kind, nbytes, axis.size)
                x = jax.device_put(jnp.zeros((local * devices.size,), jnp.float32), sharding)
                seconds = _median_seconds(functools.partial(fn, x), repeats, inner)
                moved = 4 * local * (axis.size if kind == "all-gather" else 1)
                out.append(CollectiveTiming(axis.link, kind, axis.size, moved, seconds))
                del x
    return tuple(out)
