"""The reference serving steps, in plain jax: a decode step (one new token per sequence, the KV cache donated)
and a prefill chunk (a prompt's tokens written into the cache), over the exact weights and cache of a serving
plan (:func:`meshplan.pure.serve.serving_params`, :func:`meshplan.pure.serve.kv_cache_tree`).

The cache is the plan's: ``"contiguous"`` (a slot of ``context`` tokens per sequence in every layer, as MaxText /
JetStream hold it) or ``"paged"`` (``ep x pages`` pages of ``page_size`` tokens, a block table per sequence, as
vLLM and vLLM-TPU hold it). Every layer is cached at the full context (a sliding-window layer masks, it does not
free). The step is what a JAX engine compiles, not an engine's kernels: attention reads the whole cache slot or
its gathered pages and masks what is past each sequence's position; a quantized weight is dequantized where it
is used (to bfloat16, times its scale); a quantized cache is written quantized with its scales (per layer, or
per token for a ``"token"`` format) and read back dequantized. An MoE layer computes every expert for every token
and combines the chosen ones (the memory of the weights is what a plan prices; the step's FLOPs are not an
engine's). Layers are scanned, the cache carried through the scan and updated in place.

Compiled with its arguments' shardings (``compiled_memory(step.fn, *step.args)``), XLA's argument bytes per
device are the weights, the KV cache and the step's inputs exactly (``step.expected_argument_bytes``, from the
pure planner); its peak is what the step needs on top.

Example:
  >>> import dataclasses, jax
  >>> from meshplan.pure.presets import MODEL_SPECS
  >>> from meshplan.pure.serve import CacheFormat, ServeLayout
  >>> tiny = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=2, hidden_size=64,
  ...     num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=256, num_params=None)
  >>> mesh = replica_mesh(jax.devices()[:4], ServeLayout(2, 4))
  >>> step = decode_step(tiny, mesh, ServeLayout(2, 4), sequences=4, context=32, cache=CacheFormat("paged", 8))
  >>> step.fn.lower(*step.args).compile().memory_analysis().argument_size_in_bytes == step.expected_argument_bytes
  True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from meshplan.facade.verify import _reference as ref
from meshplan.facade.verify import _reference_model as rm
from meshplan.pure._types import make_spec, make_struct
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.serve import (
    CacheFormat,
    ServeLayout,
    WeightQuant,
    decode_input_bytes,
    decode_inputs_tree,
    kv_cache_tree,
    kv_geometry,
    serving_params,
    weight_bytes,
    weight_quant,
)

__all__ = ["ServeStep", "decode_step", "prefill_step", "replica_mesh"]

_NEG = float(-3.4028234663852886e38)
_BF16 = jnp.bfloat16


@dataclasses.dataclass(frozen=True)
class ServeStep:
    """A jitted serving step and its abstract, sharded arguments.

    Attributes:
      fn: the jitted step (``donate_argnums=1``: the cache).
      args: ``(params, cache, inputs)`` as ``ShapeDtypeStruct`` trees with shardings.
      kind: ``"decode"`` or ``"prefill"``.
      expected_argument_bytes: per device, the weights + KV cache + inputs the pure planner counts.
      weight_bytes, cache_bytes, input_bytes: its parts.
    """

    fn: Any
    args: tuple[Any, ...]
    kind: str
    expected_argument_bytes: int
    weight_bytes: int
    cache_bytes: int
    input_bytes: int


def replica_mesh(devices: Sequence[Any], layout: ServeLayout) -> Mesh:
    """One replica's mesh ``{"ep": ep, "tp": tp}`` over the first ``ep x tp`` of ``devices`` (Auto axes).

    Raises:
      PlanError: fewer devices than a replica has.
    """
    n = layout.devices_per_replica
    if len(devices) < n:
        raise PlanError(f"a replica of {layout.text} needs {n} devices; {len(devices)} given.")
    grid = np.array(list(devices)[:n], dtype=object).reshape(layout.ep, layout.tp)
    return Mesh(grid, ("ep", "tp"), axis_types=(AxisType.Auto,) * 2)


# --- pieces ---------------------------------------------------------------------------------------------------

def _w(p: dict[str, Any], dtype: Any = _BF16) -> jax.Array:
    """A linear weight ``(..., out, in)`` in ``dtype``: dequantized with its scales where it has them."""
    w: jax.Array = p["weight"].astype(dtype)
    scale = p.get("weight_scale")
    if scale is None:
        return w
    out: jax.Array = w * (scale[..., None] if scale.ndim == w.ndim - 1 else scale[..., None, None]).astype(dtype)
    return out


def _lin(x: jax.Array, p: dict[str, Any]) -> jax.Array:
    out = jnp.einsum("...d,fd->...f", x, _w(p))
    return out + p["bias"].astype(x.dtype) if "bias" in p else out


def _rope(x: jax.Array, positions: jax.Array, theta: float = 500_000.0) -> jax.Array:
    """Rotary embedding of ``x`` ``(s, t, heads, dim)`` at ``positions`` ``(s, t)`` (half-split, as HF)."""
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = positions.astype(jnp.float32)[..., None, None] * inv
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    xf = x.astype(jnp.float32)
    a, b = xf[..., : dim // 2], xf[..., dim // 2:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(x.dtype)


def _quantize(x: jax.Array, dtype: Any, scales: str, stored_scale: jax.Array | None) -> tuple[jax.Array, Any]:
    """``x`` in the cache dtype: per-token scales (over its last two dims), or the layer's stored scale."""
    if dtype == jnp.dtype(_BF16):
        return x.astype(dtype), None
    top = 127.0 if dtype == jnp.dtype(jnp.int8) else 448.0
    if scales == "token":
        scale = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=tuple(range(2, x.ndim)), keepdims=True) / top + 1e-8
        q = x.astype(jnp.float32) / scale
        return (jnp.round(q) if top == 127.0 else q).astype(dtype), scale.reshape(*x.shape[:2], 1).astype(_BF16)
    assert stored_scale is not None
    q = x.astype(jnp.float32) / stored_scale
    return (jnp.round(q) if top == 127.0 else q).astype(dtype), None


class _Cache:
    """Reads and writes of one layer's cache entry ``name`` (the layer's slice of the carried arrays)."""

    def __init__(self, fmt: CacheFormat, block_table: jax.Array | None, slots: jax.Array) -> None:
        self.fmt, self.table, self.slots = fmt, block_table, slots

    def write(self, arr: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
        """``arr`` (one layer) with ``new`` ``(s, t, ...)`` stored at each row's ``positions``."""
        if self.fmt.layout == "contiguous":
            return arr.at[self.slots[:, None], positions].set(new)
        assert self.table is not None
        page = jnp.take_along_axis(self.table[self.slots], positions // self.fmt.page_size, axis=1)
        return arr.at[page, positions % self.fmt.page_size].set(new)

    def read(self, arr: jax.Array) -> jax.Array:
        """Every cached token of the rows' sequences: ``(s, tokens, ...)``."""
        if self.fmt.layout == "contiguous":
            return arr[self.slots]
        assert self.table is not None
        pages = arr[self.table[self.slots]]  # (s, pages, page_size, ...)
        return pages.reshape(pages.shape[0], pages.shape[1] * pages.shape[2], *pages.shape[3:])


def _entry(cache: dict[str, jax.Array], l: jax.Array, name: str, new: jax.Array, positions: jax.Array,
           io: _Cache) -> tuple[dict[str, jax.Array], jax.Array]:
    """Store ``new`` into layer ``l`` of cache entry ``name`` and read the entry back, dequantized."""
    cache = dict(cache)
    arr = jax.lax.dynamic_index_in_dim(cache[name], l, keepdims=False)
    scale_key = f"{name}_scale"
    stored = None
    token = scale_key in cache and cache[scale_key].ndim > 1
    if scale_key in cache and not token:
        stored = jax.lax.dynamic_index_in_dim(cache[scale_key], l, keepdims=False)
    q, tok_scale = _quantize(new, arr.dtype, "token" if token else "tensor", stored)
    arr = io.write(arr, q, positions)
    cache[name] = jax.lax.dynamic_update_index_in_dim(cache[name], arr, l, 0)
    full = io.read(arr).astype(_BF16)
    if token:
        sarr = io.write(jax.lax.dynamic_index_in_dim(cache[scale_key], l, keepdims=False), tok_scale, positions)
        cache[scale_key] = jax.lax.dynamic_update_index_in_dim(cache[scale_key], sarr, l, 0)
        scale = io.read(sarr)
        full = full * scale.reshape(*scale.shape, *([1] * (full.ndim - scale.ndim)))
    elif stored is not None:
        full = full * stored.astype(_BF16)
    return cache, full


def _masked_softmax(scores: jax.Array, positions: jax.Array) -> jax.Array:
    """Softmax over the last dim (cached tokens), keys past each query's position masked; ``scores``'s first
    dims are ``(s, ...)`` and its second-to-last is the query's ``t``."""
    keys = jnp.arange(scores.shape[-1])
    valid = keys[None, None, :] <= positions[:, :, None]  # (s, t, tokens)
    shape = (positions.shape[0],) + (1,) * (scores.ndim - 3) + valid.shape[1:]
    return jax.nn.softmax(jnp.where(valid.reshape(shape), scores, _NEG), axis=-1)


def _attention(h: jax.Array, p: dict[str, Any], spec: ModelSpec, positions: jax.Array, cache: dict[str, jax.Array],
               l: jax.Array, io: _Cache) -> tuple[jax.Array, dict[str, jax.Array]]:
    s, t, _ = h.shape
    if spec.mla is not None:
        return _mla(h, p, spec, positions, cache, l, io)
    n, hd = spec.num_heads, spec.head_dim
    kvs = p["k_proj"]["weight"].shape[0] // hd
    q = _lin(h, p["q_proj"]).reshape(s, t, n, hd)
    k = _lin(h, p["k_proj"]).reshape(s, t, kvs, hd)
    v = _lin(h, p["v_proj"]).reshape(s, t, kvs, hd)
    if "q_norm" in p:
        q, k = rm.rms_norm(q, p["q_norm"]["weight"]), rm.rms_norm(k, p["k_norm"]["weight"])
    q, k = _rope(q, positions), _rope(k, positions)
    cache, keys = _entry(cache, l, "k", k, positions, io)
    cache, vals = _entry(cache, l, "v", v, positions, io)
    qg = q.reshape(s, t, kvs, n // kvs, hd)
    scores = jnp.einsum("stkgh,sTkh->skgtT", qg, keys, preferred_element_type=jnp.float32) / math.sqrt(hd)
    probs = _masked_softmax(scores, positions).astype(_BF16)
    out = jnp.einsum("skgtT,sTkh->stkgh", probs, vals).reshape(s, t, n * hd)
    return _lin(out, p["o_proj"]), cache


def _mla(h: jax.Array, p: dict[str, Any], spec: ModelSpec, positions: jax.Array, cache: dict[str, jax.Array],
         l: jax.Array, io: _Cache) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DeepSeek's attention: the latent cached and attended in its absorbed form, or (MaxText's heads form)
    the up-projected keys and values cached."""
    s, t, _ = h.shape
    m, n = spec.mla, spec.num_heads
    assert m is not None
    if "q_proj" in p:
        q = _lin(h, p["q_proj"])
    else:
        q = _lin(rm.rms_norm(_lin(h, p["q_a_proj"]), p["q_a_layernorm"]["weight"]), p["q_b_proj"])
    q = q.reshape(s, t, n, m.qk_head_dim)
    q_nope, q_rope = q[..., : m.qk_nope_head_dim], _rope(q[..., m.qk_nope_head_dim:], positions)
    kv_a = _lin(h, p["kv_a_proj_with_mqa"])
    latent = rm.rms_norm(kv_a[..., : m.kv_lora_rank], p["kv_a_layernorm"]["weight"])
    k_rope = _rope(kv_a[..., m.kv_lora_rank:][:, :, None, :], positions)[:, :, 0, :]
    w_kv = _w(p["kv_b_proj"]).reshape(n, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
    if "latent" in cache:
        cache, cached = _entry(cache, l, "latent", jnp.concatenate([latent, k_rope], axis=-1), positions, io)
        lat, rope_c = cached[..., : m.kv_lora_rank], cached[..., m.kv_lora_rank:]
        q_lat = jnp.einsum("stnd,ndl->stnl", q_nope, w_kv[:, : m.qk_nope_head_dim])
        scores = (jnp.einsum("stnl,sTl->sntT", q_lat, lat, preferred_element_type=jnp.float32)
                  + jnp.einsum("stnr,sTr->sntT", q_rope, rope_c, preferred_element_type=jnp.float32))
        probs = _masked_softmax(scores / math.sqrt(m.qk_head_dim), positions).astype(_BF16)
        out_lat = jnp.einsum("sntT,sTl->stnl", probs, lat)
        out = jnp.einsum("stnl,nvl->stnv", out_lat, w_kv[:, m.qk_nope_head_dim:])
    else:
        kv = jnp.einsum("stl,nfl->stnf", latent, w_kv)
        k = jnp.concatenate([kv[..., : m.qk_nope_head_dim],
                             jnp.broadcast_to(k_rope[:, :, None, :], (s, t, n, m.qk_rope_head_dim))], axis=-1)
        cache, keys = _entry(cache, l, "k", k, positions, io)
        cache, vals = _entry(cache, l, "v", kv[..., m.qk_nope_head_dim:], positions, io)
        qf = jnp.concatenate([q_nope, q_rope], axis=-1)
        scores = jnp.einsum("stnh,sTnh->sntT", qf, keys, preferred_element_type=jnp.float32)
        probs = _masked_softmax(scores / math.sqrt(m.qk_head_dim), positions).astype(_BF16)
        out = jnp.einsum("sntT,sTnv->stnv", probs, vals)
    return _lin(out.reshape(s, t, n * m.v_head_dim), p["o_proj"]), cache


def _moe(h: jax.Array, p: dict[str, Any], spec: ModelSpec) -> jax.Array:
    """Every expert on every token, the chosen ones combined (see the module docstring)."""
    mixtral = spec.family == "mixtral"
    m = p["block_sparse_moe"] if mixtral else p["mlp"]
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    logits = jnp.einsum("std,ed->ste", h, m["gate"]["weight"].astype(_BF16), preferred_element_type=jnp.float32)
    if "e_score_correction_bias" in m["gate"]:  # DeepSeek-V3: sigmoid scores, the bias steers the choice only
        scores = jax.nn.sigmoid(logits)
        _, idx = jax.lax.top_k(scores + m["gate"]["e_score_correction_bias"].astype(jnp.float32),
                               spec.num_experts_per_tok)
    else:
        scores = jax.nn.softmax(logits, axis=-1)
        _, idx = jax.lax.top_k(scores, spec.num_experts_per_tok)
    chosen = jnp.take_along_axis(scores, idx, axis=-1)
    weights = chosen / jnp.sum(chosen, axis=-1, keepdims=True)
    combine = jnp.sum(jax.nn.one_hot(idx, spec.num_experts, dtype=jnp.float32) * weights[..., None], axis=-2)
    ex = m["experts"]
    act = jax.nn.silu(jnp.einsum("std,efd->stef", h, _w(ex[gate]))) * jnp.einsum("std,efd->stef", h, _w(ex[up]))
    out = jnp.einsum("ste,stef,edf->std", combine.astype(_BF16), act, _w(ex[down]))
    if "shared_experts" in m:
        sh = m["shared_experts"]
        out = out + _lin(jax.nn.silu(_lin(h, sh["gate_proj"])) * _lin(h, sh["up_proj"]), sh["down_proj"])
    return out


def _layer(spec: ModelSpec, moe_layer: bool, io: _Cache, positions: jax.Array
           ) -> Callable[[tuple[jax.Array, dict[str, jax.Array]], tuple[jax.Array, Any]], tuple[Any, None]]:
    def body(carry: tuple[jax.Array, dict[str, jax.Array]], xs: tuple[jax.Array, Any]) -> tuple[Any, None]:
        x, cache = carry
        l, p = xs
        a, cache = _attention(rm.rms_norm(x, p["input_layernorm"]["weight"]), p["self_attn"], spec, positions,
                              cache, l, io)
        gemma = spec.family == "gemma"
        x = x + (rm.rms_norm(a, p["post_attention_layernorm"]["weight"]) if gemma else a)
        norm = p["pre_feedforward_layernorm" if gemma else "post_attention_layernorm"]["weight"]
        h = rm.rms_norm(x, norm)
        if moe_layer:
            y = _moe(h, p, spec)
        else:
            mlp = p["mlp"]
            act = (lambda z: jax.nn.gelu(z, approximate=True)) if gemma else jax.nn.silu
            y = _lin(act(_lin(h, mlp["gate_proj"])) * _lin(h, mlp["up_proj"]), mlp["down_proj"])
        x = x + (rm.rms_norm(y, p["post_feedforward_layernorm"]["weight"]) if gemma else y)
        return (x, cache), None

    return body


def _forward(spec: ModelSpec, fmt: CacheFormat, params: dict[str, Any], cache: dict[str, jax.Array],
             tokens: jax.Array, positions: jax.Array, slots: jax.Array,
             block_table: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
    io = _Cache(fmt, block_table, slots)
    model = params["model"]
    x = jnp.take(model["embed_tokens"]["weight"], tokens, axis=0).astype(_BF16)
    for name, first, stop in ref._layer_groups(spec):
        body = _layer(spec, name == "moe", io, positions)
        (x, cache), _ = jax.lax.scan(body, (x, cache), (jnp.arange(first, stop), model["layers"][name]))
    h = rm.rms_norm(x[:, -1], model["norm"]["weight"])
    head = params["lm_head"]["weight"] if "lm_head" in params else model["embed_tokens"]["weight"]
    logits = jnp.einsum("sd,vd->sv", h, head.astype(_BF16), preferred_element_type=jnp.float32)
    return jnp.argmax(logits[:, : spec.vocab_size], axis=-1).astype(jnp.int32), cache


def _shardings(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda p: NamedSharding(mesh, p), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda s, sh: make_struct(s.shape, s.dtype, sharding=sh), tree, shardings)


def _check(spec: Any, mesh: Any, layout: Any, cache: Any) -> None:
    if not isinstance(spec, ModelSpec):
        raise MeshplanTypeError(f"spec={spec!r:.60} must be a ModelSpec.")
    if not isinstance(mesh, Mesh):
        raise MeshplanTypeError(f"mesh={mesh!r:.60} must be a jax.sharding.Mesh (replica_mesh(devices, layout)).")
    if not isinstance(layout, ServeLayout):
        raise MeshplanTypeError(f"layout={layout!r:.60} must be a ServeLayout.")
    if not isinstance(cache, CacheFormat):
        raise MeshplanTypeError(f"cache={cache!r:.60} must be a CacheFormat.")
    if dict(mesh.shape) != {"ep": layout.ep, "tp": layout.tp}:
        raise PlanError(f"mesh {dict(mesh.shape)} is not one replica of {layout.text}: it needs axes "
                        f"{{'ep': {layout.ep}, 'tp': {layout.tp}}} (replica_mesh builds it).")


def _parts(spec: ModelSpec, mesh: Mesh, layout: ServeLayout, quant: WeightQuant, kv_dtype: str,
           cache: CacheFormat, sequences: int, context: int) -> tuple[Any, ...]:
    fmt = dataclasses.replace(cache, window_capped=False)
    geometry = kv_geometry(spec, layout, kv_dtype, fmt)
    tree, specs = serving_params(spec, layout, quant)
    params, param_specs = ref._stack(tree, specs, spec)
    kv_tree, kv_specs = kv_cache_tree(spec, layout, geometry, sequences=sequences, context=context)
    p_sh, c_sh = _shardings(mesh, param_specs), _shardings(mesh, kv_specs)
    return fmt, geometry, _abstract(params, p_sh), p_sh, _abstract(kv_tree, c_sh), c_sh


def decode_step(spec: ModelSpec, mesh: Mesh, layout: ServeLayout, *, sequences: int, context: int,
                quant: WeightQuant | str = "bfloat16", kv_dtype: str = "bfloat16",
                cache: CacheFormat | None = None) -> ServeStep:
    """One decode step of a replica: ``sequences`` sequences (split over ``ep``), a cache of ``context`` tokens
    each, one new token each; the cache is donated and comes back updated.

    Args:
      spec: the model (a family of :data:`~meshplan.pure.serve.SERVED_FAMILIES`).
      mesh: one replica's mesh (:func:`replica_mesh`): local devices, a TPU topology's or a GPU cluster's.
      layout: the serving layout (its ``ep`` and ``tp``).
      sequences, context: the running sequences and their cache length.
      quant, kv_dtype: the weights' and the cache's storage.
      cache: the cache's format (default: paged, 16-token pages); windows are never capped here.

    Returns:
      A :class:`ServeStep`; ``compiled_memory(step.fn, *step.args)`` compiles it.

    Raises:
      PlanError: a layout that cannot split the model, a mesh that is not one replica of it, bad counts.
      MeshplanTypeError: arguments of the wrong type.
    """
    cache = CacheFormat() if cache is None else cache
    _check(spec, mesh, layout, cache)
    quant = weight_quant(quant)
    fmt, geometry, params, p_sh, kv, c_sh = _parts(spec, mesh, layout, quant, kv_dtype, cache, sequences, context)
    inputs_tree, input_specs = decode_inputs_tree(layout, geometry, sequences=sequences, context=context)
    i_sh = _shardings(mesh, input_specs)
    inputs = _abstract(inputs_tree, i_sh)

    def step(params: Any, cache_arrays: Any, inputs: Any) -> tuple[jax.Array, Any]:
        rows = inputs["tokens"].shape[0]
        return _forward(spec, fmt, params, cache_arrays, inputs["tokens"][:, None], inputs["positions"][:, None],
                        jnp.arange(rows), inputs.get("block_table"))

    fn = jax.jit(step, in_shardings=(p_sh, c_sh, i_sh), out_shardings=(i_sh["tokens"], c_sh), donate_argnums=(1,),
                 keep_unused=True)
    wb = weight_bytes(spec, layout, quant).total
    cb = geometry.cache_bytes(sequences, context)
    ib = decode_input_bytes(layout, geometry, sequences=sequences, context=context)
    return ServeStep(fn, (params, kv, inputs), "decode", wb + cb + ib, wb, cb, ib)


def prefill_step(spec: ModelSpec, mesh: Mesh, layout: ServeLayout, *, chunk: int, sequences: int, context: int,
                 quant: WeightQuant | str = "bfloat16", kv_dtype: str = "bfloat16",
                 cache: CacheFormat | None = None) -> ServeStep:
    """One prefill chunk: ``chunk`` prompt tokens of one sequence written into a replica's cache of
    ``sequences`` sequences x ``context`` tokens (donated), the chunk attending causally to what is cached.

    Inputs: ``tokens`` and ``positions`` ``(1, chunk)``, ``slots`` ``(1,)`` (the sequence), and the block table
    of a paged cache, all replicated.

    Raises:
      PlanError: a chunk longer than the context, as :func:`decode_step` otherwise.
      MeshplanTypeError: arguments of the wrong type.
    """
    cache = CacheFormat() if cache is None else cache
    _check(spec, mesh, layout, cache)
    if not isinstance(chunk, int) or isinstance(chunk, bool) or not 1 <= chunk <= context:
        raise PlanError(f"chunk={chunk!r:.40} must be an int in [1, context={context}].")
    quant = weight_quant(quant)
    fmt, geometry, params, p_sh, kv, c_sh = _parts(spec, mesh, layout, quant, kv_dtype, cache, sequences, context)
    i32 = np.dtype(np.int32)
    tree: dict[str, Any] = {"tokens": make_struct((1, chunk), i32), "positions": make_struct((1, chunk), i32),
                            "slots": make_struct((1,), i32)}
    rows = layout.ep * -(-sequences // layout.ep)
    if fmt.layout == "paged":
        tree["block_table"] = make_struct((rows, -(-context // fmt.page_size)), i32)
    i_sh = jax.tree.map(lambda _: NamedSharding(mesh, make_spec()), tree)
    inputs = _abstract(tree, i_sh)

    def step(params: Any, cache_arrays: Any, inputs: Any) -> tuple[jax.Array, Any]:
        return _forward(spec, fmt, params, cache_arrays, inputs["tokens"], inputs["positions"], inputs["slots"],
                        inputs.get("block_table"))

    fn = jax.jit(step, in_shardings=(p_sh, c_sh, i_sh), out_shardings=(NamedSharding(mesh, make_spec()), c_sh),
                 donate_argnums=(1,), keep_unused=True)
    wb = weight_bytes(spec, layout, quant).total
    cb = geometry.cache_bytes(sequences, context)
    ib = 4 * (2 * chunk + 1) + (4 * rows * (-(-context // fmt.page_size)) if fmt.layout == "paged" else 0)
    return ServeStep(fn, (params, kv, inputs), "prefill", wb + cb + ib, wb, cb, ib)
