"""The reference serving steps on 8 XLA:CPU devices: XLA's argument bytes are the plan's weights + KV cache +
inputs, byte for byte, for every layout tested (tp beyond the kv heads, experts over ep, MLA, quantized), and the
steps compute what they should (a decode step continues a prefill exactly, paged or contiguous)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from meshplan.facade.verify._decode_step import decode_step, prefill_step, replica_mesh
from meshplan.pure.errors import PlanError
from meshplan.pure.presets import MODEL_SPECS, MLADims
from meshplan.pure.serve import CacheFormat, ServeLayout, WeightQuant

_TINY = dict(num_layers=2, hidden_size=64, head_dim=16, intermediate_size=128, vocab_size=250, num_params=None)
LLAMA = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny-llama", num_heads=8, num_kv_heads=2, **_TINY)
QWEN = dataclasses.replace(MODEL_SPECS["qwen2.5-72b"], name="tiny-qwen", num_heads=8, num_kv_heads=2, **_TINY)
GEMMA = dataclasses.replace(MODEL_SPECS["gemma3-27b"], name="tiny-gemma", num_heads=4, num_kv_heads=2,
                            sliding_window_layers=1, **_TINY)
MIXTRAL = dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="tiny-mixtral", num_heads=8, num_kv_heads=2,
                              moe_intermediate_size=32, num_experts=8, **_TINY)
DEEPSEEK = dataclasses.replace(
    MODEL_SPECS["deepseek-v3"], name="tiny-deepseek", num_heads=8, num_kv_heads=8, num_dense_layers=1,
    moe_intermediate_size=32, num_experts=16, num_experts_per_tok=2,
    mla=MLADims(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
    **{**_TINY, "num_layers": 3})

CASES = [
    (LLAMA, ServeLayout(1, 8), CacheFormat("paged", 8), "bfloat16", "bfloat16"),  # tp 8 > 2 kv heads: copies
    (LLAMA, ServeLayout(2, 4), CacheFormat("contiguous", scales="token"), "int8", "int8"),
    (QWEN, ServeLayout(1, 2), CacheFormat("paged", 4), WeightQuant("float8", "tensor"), "float8"),
    (GEMMA, ServeLayout(1, 4), CacheFormat("paged", 8), "bfloat16", "bfloat16"),
    (MIXTRAL, ServeLayout(1, 4, ep=2), CacheFormat("paged", 8), "int8", "bfloat16"),
    (MIXTRAL, ServeLayout(1, 8), CacheFormat("paged", 8), "bfloat16", "float8"),
    (DEEPSEEK, ServeLayout(1, 4, ep=2), CacheFormat("paged", 8), "float8", "float8"),
    (DEEPSEEK, ServeLayout(1, 8), CacheFormat("contiguous", mla="heads", scales="token"), "int8", "int8"),
]


def _ids(case: tuple) -> str:  # type: ignore[type-arg]
    spec, layout, fmt, quant, kv = case
    return f"{spec.name}-{layout.text}-{fmt.layout}-{getattr(quant, 'text', quant)}-{kv}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_compiled_arguments_are_the_planned_weights_kv_cache_and_inputs(case: tuple) -> None:  # type: ignore[type-arg]
    spec, layout, fmt, quant, kv = case
    mesh = replica_mesh(jax.devices(), layout)
    step = decode_step(spec, mesh, layout, sequences=5, context=24, quant=quant, kv_dtype=kv, cache=fmt)
    ma = step.fn.lower(*step.args).compile().memory_analysis()
    assert ma.argument_size_in_bytes == step.expected_argument_bytes
    assert ma.alias_size_in_bytes == step.cache_bytes  # the donated cache comes back in place
    assert step.expected_argument_bytes == step.weight_bytes + step.cache_bytes + step.input_bytes


def test_a_prefill_chunk_compiles_with_the_same_weights_and_cache() -> None:
    layout = ServeLayout(1, 4, ep=2)
    mesh = replica_mesh(jax.devices(), layout)
    step = prefill_step(MIXTRAL, mesh, layout, chunk=12, sequences=4, context=24, cache=CacheFormat("paged", 8))
    ma = step.fn.lower(*step.args).compile().memory_analysis()
    assert ma.argument_size_in_bytes == step.expected_argument_bytes
    decode = decode_step(MIXTRAL, mesh, layout, sequences=4, context=24, cache=CacheFormat("paged", 8))
    assert step.weight_bytes == decode.weight_bytes and step.cache_bytes == decode.cache_bytes


def _concrete(step: object, seed: int) -> tuple:  # type: ignore[type-arg]
    rng = np.random.default_rng(seed)

    def fill(s: jax.ShapeDtypeStruct) -> jax.Array:
        if np.issubdtype(s.dtype, np.integer):
            value = np.zeros(s.shape, s.dtype)
        else:
            value = (rng.standard_normal(s.shape) * 0.2).astype(s.dtype)
        return jax.device_put(value, s.sharding)

    params, cache, _ = step.args  # type: ignore[attr-defined]
    return jax.tree.map(fill, params), jax.tree.map(lambda s: jax.device_put(np.zeros(s.shape, s.dtype), s.sharding),
                                                     cache)


@pytest.mark.parametrize("fmt", [CacheFormat("paged", 4), CacheFormat("contiguous")])
def test_a_decode_step_continues_a_prefill_exactly(fmt: CacheFormat) -> None:
    layout = ServeLayout(1, 2)
    mesh = replica_mesh(jax.devices(), layout)
    seqs, context, n = 2, 16, 9
    pre_all = prefill_step(LLAMA, mesh, layout, chunk=n, sequences=seqs, context=context, cache=fmt)
    pre_part = prefill_step(LLAMA, mesh, layout, chunk=n - 1, sequences=seqs, context=context, cache=fmt)
    dec = decode_step(LLAMA, mesh, layout, sequences=seqs, context=context, cache=fmt)
    params, cache = _concrete(pre_all, 0)
    tokens = np.arange(3, 3 + n, dtype=np.int32)[None]
    table = np.arange(seqs * context // fmt.page_size, dtype=np.int32).reshape(seqs, -1) if fmt.layout == "paged" else None
    def inputs(t: np.ndarray, start: int, **extra: np.ndarray) -> dict:  # type: ignore[type-arg]
        out = {"tokens": t, "positions": (start + np.arange(t.shape[1], dtype=np.int32))[None],
               "slots": np.array([1], np.int32), **extra}
        return {**out, "block_table": table} if table is not None else out
    whole, _ = pre_all.fn(params, cache, inputs(tokens, 0))
    _, cache2 = _concrete(pre_all, 0)
    _, cache2 = pre_part.fn(params, cache2, inputs(tokens[:, :-1], 0))
    step_in = {"tokens": np.array([0, tokens[0, -1]], np.int32), "positions": np.array([0, n - 1], np.int32)}
    if table is not None:
        step_in["block_table"] = table
    nxt, cache3 = dec.fn(params, cache2, step_in)
    assert int(nxt[1]) == int(whole[0])
    assert np.any(np.asarray(jax.device_get(cache3["k"]), dtype=np.float32) != 0)


def test_a_mesh_that_is_not_one_replica_is_refused() -> None:
    mesh = replica_mesh(jax.devices(), ServeLayout(1, 8))
    with pytest.raises(PlanError, match="not one replica"):
        decode_step(LLAMA, mesh, ServeLayout(2, 4), sequences=2, context=8)
