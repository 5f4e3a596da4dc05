"""An FP8 training step against the same step in bf16 on one GPU: the FP8 price held out at step level.

``matmul_dtype="float8"`` prices the weight matmuls of a step at the FP8 peak (the attention core, the
head and the elementwise work stay bf16). This script measures what that buys a real step: the reference
train step (:func:`meshplan.facade.verify._reference.reference_step`) runs twice on the local GPU, once as it is
and once with every ``torch.nn.Linear``-style projection swapped for an FP8 linear, as torchao's
``convert_to_float8_training`` swaps ``nn.Linear`` (and as torchtitan does, the output head is left in
bf16): per-tensor dynamic scaling, e4m3 operands forward, e5m2 gradients backward, both weight and input
gradients as FP8 GEMMs, fp32 accumulation. The swap patches ``_reference_model._linear`` for the FP8 run
only; the script counts the FP8 GEMMs in the compiled HLO so a silent fallback to bf16 shows.

Run on a GPU with FP8 tensor cores (H100, H200)::

    python benchmarks/bench_fp8_step.py --jsonl FILE        # measure (records bf16 and fp8 seconds)
    python benchmarks/bench_fp8_step.py --predict FILE      # on any machine: meshplan's ratio for those rows

Measured: the mean of 5 steps after a warm-up (``bench_step_time_gpu.measure``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2

# (model, layers, batch, seq): remat full, cuDNN-free dot_product attention, as bench_step_time_gpu's rows.
CASES: tuple[tuple[str, int, int, int], ...] = (
    ("llama3-8b", 8, 8, 2048),
    ("llama3-8b", 16, 2, 4096),
    ("llama3-70b", 2, 2, 4096),
)


def _quantize(x: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``x`` scaled so its largest magnitude is ``dtype``'s largest, cast; and the scale (per tensor)."""
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    scale = float(jnp.finfo(dtype).max) / jnp.maximum(amax, 1e-12)
    return (x.astype(jnp.float32) * scale).astype(dtype), scale


@jax.custom_vjp
def fp8_linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w.T`` (``w`` is ``(out, in)``) with FP8 GEMMs forward and backward."""
    return _fp8_forward(x, w)[0]


def _fp8_forward(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    x8, sx = _quantize(x, E4M3)
    w8, sw = _quantize(w, E4M3)
    y = jnp.einsum("...d,fd->...f", x8, w8, preferred_element_type=jnp.float32) / (sx * sw)
    return y.astype(x.dtype), (x8, sx, w8, sw)  # the FP8 input is what the weight gradient keeps


def _fp8_backward(res: tuple[jax.Array, ...], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x8, sx, w8, sw = res
    g8, sg = _quantize(g, E5M2)
    dx = jnp.einsum("...f,fd->...d", g8, w8, preferred_element_type=jnp.float32) / (sg * sw)
    dw = jnp.einsum("...f,...d->fd", g8, x8, preferred_element_type=jnp.float32) / (sg * sx)
    return dx.astype(g.dtype), dw.astype(g.dtype)


fp8_linear.defvjp(_fp8_forward, _fp8_backward)


@contextlib.contextmanager
def fp8_linears() -> Iterator[None]:
    """Within: the reference model's linears are FP8 linears (the module swap; the head is not a linear)."""
    from meshplan.facade.verify import _reference_model as rm

    plain = rm._linear
    rm._linear = lambda x, weight, dtype: fp8_linear(x.astype(dtype), weight.astype(dtype))
    try:
        yield
    finally:
        rm._linear = plain


def _build(name: str, layers: int, batch: int, seq: int) -> tuple[Any, Any]:
    from bench_compiled import scaled

    from meshplan.facade.verify._reference import ReferenceConfig, reference_step
    from meshplan.pure import search_meshes
    from meshplan.pure.cost._recipe import TrainingRecipe

    spec = scaled(name, layers)
    recipe = TrainingRecipe(remat="full", attention="dot_product", backend="gpu", residual_split=False)
    cand = search_meshes(spec, "1x1xH100", axes=("fsdp",), fixed={"fsdp": 1}, batch=batch, seq=seq,
                         recipe=recipe, headroom=0.0, top_k=1, micro_batches=1).best
    mesh = jax.make_mesh((1,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    return spec, reference_step(spec, mesh, batch=batch, seq=seq, plan=cand,
                                config=ReferenceConfig(remat="full", attention="dot_product"))


def measure_case(name: str, layers: int, batch: int, seq: int) -> dict[str, Any]:
    from bench_step_time_gpu import measure

    _, ref = _build(name, layers, batch, seq)
    bf16_s = measure(ref)
    with fp8_linears():
        _, ref8 = _build(name, layers, batch, seq)
        hlo = ref8.fn.lower(*ref8.args).compile().as_text() or ""
        fp8_s = measure(ref8)
    fp8_gemms = hlo.count('custom_call_target="__cublas$lt$matmul$f8"')  # cuBLASLt's FP8 GEMMs
    return {"model": name, "layers": layers, "batch": batch, "seq": seq, "bf16_s": bf16_s, "fp8_s": fp8_s,
            "measured_ratio": fp8_s / bf16_s, "fp8_gemm_calls": fp8_gemms,
            "device": jax.devices()[0].device_kind, "jax": jax.__version__}


def predict(row: dict[str, Any]) -> tuple[float, float]:
    """meshplan's (bf16, float8) step seconds for ``row`` on one H100."""
    from bench_compiled import scaled

    from meshplan.pure import search_meshes
    from meshplan.pure.cost._recipe import TrainingRecipe

    out = []
    for dtype in ("bfloat16", "float8"):
        recipe = TrainingRecipe(remat="full", attention="dot_product", backend="gpu", residual_split=False,
                                matmul_dtype=dtype)
        cand = search_meshes(scaled(row["model"], row["layers"]), "1x1xH100", axes=("fsdp",), fixed={"fsdp": 1},
                             batch=row["batch"], seq=row["seq"], recipe=recipe, headroom=0.0, top_k=1,
                             micro_batches=1).best
        assert cand.step is not None
        out.append(cand.step.step_s)
    return out[0], out[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jsonl", help="measure on the local GPU; append each row as JSON to this file")
    parser.add_argument("--predict", help="rows recorded by --jsonl: print meshplan's ratio beside the measured")
    parser.add_argument("--only", type=int, help="measure only this case (index into CASES)")
    args = parser.parse_args(argv)
    if args.predict:
        rows = [json.loads(line) for line in open(args.predict, encoding="utf-8") if line.strip()]
        print("| model | b x s | bf16 measured | fp8 measured | measured fp8/bf16 | predicted fp8/bf16 | "
              "pred bf16 / meas | pred fp8 / meas | FP8 GEMMs in HLO |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            p16, p8 = predict(r)
            print(f"| {r['model']}/{r['layers']}L | {r['batch']}x{r['seq']} | {r['bf16_s']:.3f} s | "
                  f"{r['fp8_s']:.3f} s | {r['measured_ratio']:.3f} | {p8 / p16:.3f} | {p16 / r['bf16_s']:.2f} | "
                  f"{p8 / r['fp8_s']:.2f} | {'-' if r['fp8_gemm_calls'] is None else r['fp8_gemm_calls']} |")
        return
    for case in CASES if args.only is None else CASES[args.only: args.only + 1]:
        row = measure_case(*case)
        print(json.dumps(row), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
