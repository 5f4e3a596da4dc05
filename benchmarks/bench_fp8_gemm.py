"""FP8 against bf16 GEMM throughput on the GPU this runs on: what an FP8 recipe buys per matmul.

meshplan prices a ``matmul_dtype="float8"`` recipe's weight matmuls at the device's dense FP8 peak times
the bf16 efficiency times ``FP8_EFFICIENCY_RATIO``. That ratio is this script's measurement: for the
matmul shapes of real models (tokens x hidden -> hidden or MLP width), the FP8 GEMM's sustained fraction
of the FP8 peak over the bf16 GEMM's of the bf16 peak, two ways:

- ``gemm``: both operands already FP8 (e4m3), one ``jnp.dot`` to bf16, which XLA:GPU lowers to a cuBLASLt
  FP8 GEMM (the script checks the compiled HLO says so);
- ``cast+gemm``: what a training step's FP8 linear runs per call: per-tensor dynamic scaling of both bf16
  operands (amax, scale, cast to e4m3), the FP8 GEMM, the unscale (torchao's Float8Linear with dynamic
  scaling, Transformer Engine's current scaling).

Run on a GPU with FP8 tensor cores (H100, H200, H800)::

    python benchmarks/bench_fp8_gemm.py [--jsonl FILE]

It prints one row per shape: TFLOP/s of each, the fraction of the datasheet dense peaks (bf16 989, FP8 1979
TFLOP/s on H100/H200 SXM), and the ratio of fractions. Timings: 3 warm-up calls, then the median of 15,
each call ``block_until_ready``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PEAKS = {"bf16": 989e12, "fp8": 1979e12}  # dense, H100/H200 SXM datasheets (the 2x figures are with sparsity)
E4M3 = jnp.float8_e4m3fn
E4M3_MAX = float(jnp.finfo(E4M3).max)

# (name, tokens, k, n): the projections of real models at 16k tokens per device.
SHAPES = (
    ("llama3-8b q/o proj", 16384, 4096, 4096),
    ("llama3-8b mlp up", 16384, 4096, 14336),
    ("llama3-8b mlp down", 16384, 14336, 4096),
    ("dsv3 dense mlp up", 16384, 7168, 18432),
    ("dsv3 expert up (2048)", 16384, 7168, 2048),
    ("llama3-70b mlp up", 16384, 8192, 28672),
    ("llama3-70b mlp down", 16384, 28672, 8192),
    ("gpt-145b mlp up", 8192, 12288, 49152),
    ("llama3-405b mlp up", 8192, 16384, 53248),
)


def _median_seconds(fn: Callable[..., Any], *args: Any) -> float:
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@jax.jit
def bf16_gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(a, b, preferred_element_type=jnp.bfloat16)


@jax.jit
def fp8_gemm(a8: jax.Array, b8: jax.Array) -> jax.Array:
    return jnp.dot(a8, b8, preferred_element_type=jnp.bfloat16)


def _to_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    scale = E4M3_MAX / jnp.maximum(jnp.max(jnp.abs(x)).astype(jnp.float32), 1e-12)
    return (x.astype(jnp.float32) * scale).astype(E4M3), scale


@jax.jit
def cast_fp8_gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    a8, sa = _to_fp8(a)
    b8, sb = _to_fp8(b)
    out = jnp.dot(a8, b8, preferred_element_type=jnp.float32)
    return (out / (sa * sb)).astype(jnp.bfloat16)


def _lowered_to_fp8(a8: jax.Array, b8: jax.Array) -> bool:
    text = fp8_gemm.lower(a8, b8).compile().as_text() or ""
    return "f8e4m3" in text and ("cublas" in text or "triton" in text)


def main() -> None:
    dev = jax.devices()[0]
    out_path = sys.argv[sys.argv.index("--jsonl") + 1] if "--jsonl" in sys.argv else None
    print(f"{dev.device_kind}, jax {jax.__version__}")
    rows = []
    key = jax.random.key(0)
    for name, m, k, n in SHAPES:
        ka, kb = jax.random.split(jax.random.fold_in(key, m * k + n))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (k, n), jnp.bfloat16) * 0.02
        a8, b8 = _to_fp8(a)[0], _to_fp8(b)[0]
        flops = 2.0 * m * k * n
        t_bf16 = _median_seconds(bf16_gemm, a, b)
        t_fp8 = _median_seconds(fp8_gemm, a8, b8)
        t_cast = _median_seconds(cast_fp8_gemm, a, b)
        row = {"shape": name, "m": m, "k": k, "n": n, "device": dev.device_kind, "jax": jax.__version__,
               "bf16_s": t_bf16, "fp8_s": t_fp8, "cast_fp8_s": t_cast, "fp8_lowered": _lowered_to_fp8(a8, b8),
               "bf16_frac": flops / t_bf16 / PEAKS["bf16"], "fp8_frac": flops / t_fp8 / PEAKS["fp8"],
               "cast_fp8_frac": flops / t_cast / PEAKS["fp8"]}
        rows.append(row)
        del a, b, a8, b8
    cols = ("shape", "bf16 TF/s", "fp8 TF/s", "cast+fp8 TF/s", "bf16 frac", "fp8 frac", "cast frac",
            "fp8/bf16 frac", "cast/bf16 frac", "fp8 GEMM")
    print(" | ".join(cols))
    for r in rows:
        f = 2.0 * r["m"] * r["k"] * r["n"]
        print(" | ".join((r["shape"], f"{f / r['bf16_s'] / 1e12:.0f}", f"{f / r['fp8_s'] / 1e12:.0f}",
                          f"{f / r['cast_fp8_s'] / 1e12:.0f}", f"{r['bf16_frac']:.3f}", f"{r['fp8_frac']:.3f}",
                          f"{r['cast_fp8_frac']:.3f}", f"{r['fp8_frac'] / r['bf16_frac']:.3f}",
                          f"{r['cast_fp8_frac'] / r['bf16_frac']:.3f}", str(r["fp8_lowered"]))))
    ratios = [r["cast_fp8_frac"] / r["bf16_frac"] for r in rows]
    print(f"cast+gemm / bf16 fraction-of-peak ratio: median {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f}")
    if out_path:
        with open(out_path, "a") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
