"""The forward pass and loss of the reference train steps, in plain jax.

One function per piece a transformer is made of (norms, rotary embedding,
attention kinds, dense MLP, capacity-dispatched MoE, multi-head latent
attention, the fp32 loss), over the Hugging Face weight layout of the presets
(``torch.nn.Linear`` weights are ``(out, in)``; GPT-2's ``Conv1D`` weights are
``(in, out)``) with the layers *stacked*: every per-layer leaf gets a leading
layer dimension, so one ``lax.scan`` runs them. :mod:`meshplan.facade.verify._reference`
builds the step around these; nothing here knows about meshes except the
activation-sharding callbacks (``constrain`` for the residual stream, ``inner``
for the heads, MLP widths and dispatched experts; the facade builds them from
:func:`meshplan.pure.specs.layer_activation_specs`).

The computation follows what production trainers compile (MaxText, GShard), so
that the compiler's buffers are the ones a user's step would have: weights cast
to the compute dtype at use, fp32 attention scores and softmax, fp32 logits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["ModelFns", "Inner", "layer_fn", "loss_from_hidden", "embed", "same"]

Tree = dict[str, Any]
Constrain = Callable[[jax.Array], jax.Array]
ModelFns = Callable[..., jax.Array]
Inner = Mapping[str, Constrain]
"""Constraints on a layer's inner activations by name (``heads``, ``kv_heads``, ``mlp``, ``experts``,
``expert_mlp``; see :func:`meshplan.pure.specs.layer_activation_specs`); a missing name is left to XLA."""

_EPS = 1e-6
_NEG = float(-3.4028234663852886e38)  # the most negative float32: masked scores


def _w(tree: Tree, *path: str) -> jax.Array:
    for key in path:
        tree = tree[key]
    return tree  # type: ignore[return-value]  # a leaf at the end of the path


def _linear(x: jax.Array, weight: jax.Array, dtype: Any) -> jax.Array:
    """``x @ weight.T`` for a ``torch.nn.Linear`` weight ``(out, in)``, in ``dtype``."""
    return jnp.einsum("...d,fd->...f", x, weight.astype(dtype))


def _conv1d(x: jax.Array, p: Tree, dtype: Any) -> jax.Array:
    """GPT-2's ``Conv1D``: ``x @ weight + bias`` with ``weight`` ``(in, out)``."""
    return jnp.einsum("...d,df->...f", x, p["weight"].astype(dtype)) + jnp.asarray(p["bias"], dtype)


def rms_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    """RMSNorm with the statistics in fp32 (as Llama/Mixtral/DeepSeek do)."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + _EPS)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm with the statistics in fp32 (GPT-2)."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + 1e-5)
    return (y * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, theta: float = 500_000.0) -> jax.Array:
    """Rotary embedding over the last dim of ``x`` ``(b, s, heads, dim)`` (half-split form, as HF)."""
    s, dim = x.shape[1], x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = jnp.arange(s, dtype=jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    xf = x.astype(jnp.float32)
    a, b = xf[..., : dim // 2], xf[..., dim // 2:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(x.dtype)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, kind: str) -> jax.Array:
    """Causal attention; ``q`` ``(b, s, n, h)``, ``k``/``v`` ``(b, s, kv, h)`` with ``kv`` dividing ``n``.

    ``"plain"``: the textbook form, fp32 ``b x n x s x s`` scores and softmax
    (what the backward pass keeps). ``"dot_product"``: ``jax.nn.dot_product_attention``
    (XLA's fused form where the backend has one). ``"flash"``: the Pallas TPU
    kernel, built by the caller under ``shard_map`` (see ``_reference``).
    """
    b, s, n, h = q.shape
    kv = k.shape[2]
    if kind == "dot_product":
        if v.shape[-1] != h:  # MLA: value heads narrower than query/key heads
            pad = h - v.shape[-1]
            out = jax.nn.dot_product_attention(q, k, jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, pad))),
                                               is_causal=True)
            return out[..., : v.shape[-1]]
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)
    g = n // kv
    qg = q.reshape(b, s, kv, g, h)
    scores = jnp.einsum("bskgh,btkh->bkgst", qg, k, preferred_element_type=jnp.float32) / math.sqrt(h)
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgst,btkh->bskgh", probs, v)
    return out.reshape(b, s, n, v.shape[-1])


def same(x: jax.Array) -> jax.Array:
    """No constraint: XLA places ``x``."""
    return x


def _pin(inner: Inner, name: str) -> Constrain:
    return inner.get(name, same)


def _gated_mlp(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array, dtype: Any,
               pin: Constrain = same, *, gelu: bool = False) -> jax.Array:
    act = (lambda t: jax.nn.gelu(t, approximate=True)) if gelu else jax.nn.silu  # Gemma: GeGLU (tanh GELU)
    return _linear(pin(act(pin(_linear(x, gate, dtype))) * pin(_linear(x, up, dtype))), down, dtype)


def _dispatch(select: jax.Array, scores: jax.Array, normalise: Callable[[jax.Array], jax.Array], top_k: int,
              capacity: int) -> tuple[jax.Array, jax.Array]:
    """GShard's capacity-based dispatch and combine tensors, one group per sequence.

    Args:
      select: router scores ``(b, s, e)`` in fp32 that pick the experts.
      scores: the scores the combine weights come from (same shape).
      normalise: maps the chosen ``scores`` ``(b, s, k)`` to combine weights.
      top_k: experts per token.
      capacity: slots per expert per group; tokens past it are dropped.

    Returns:
      ``dispatch`` (0/1) and ``combine`` (weights), both ``(b, s, e, capacity)``.
    """
    b, s, e = select.shape
    _, idx = jax.lax.top_k(select, top_k)                        # (b, s, k)
    weights = normalise(jnp.take_along_axis(scores, idx, axis=-1))
    mask = jax.nn.one_hot(idx, e, dtype=jnp.int32)               # (b, s, k, e)
    # Slot of each (token, choice) in its expert's buffer: first choices first, then by position.
    flat = mask.transpose(0, 2, 1, 3).reshape(b, top_k * s, e)
    pos = (jnp.cumsum(flat, axis=1) - 1) * flat
    pos = pos.reshape(b, top_k, s, e).transpose(0, 2, 1, 3)      # (b, s, k, e)
    keep = (mask > 0) & (pos < capacity)
    slot = jax.nn.one_hot(jnp.where(keep, pos, capacity), capacity, dtype=select.dtype)  # (b, s, k, e, c)
    dispatch = jnp.sum(slot, axis=2)
    combine = jnp.sum(slot * weights[..., None, None], axis=2)
    return dispatch, combine


def moe(x: jax.Array, p: Tree, spec: Any, dtype: Any, *, names: tuple[str, str, str], router: str,
        capacity_factor: float, constrain_experts: Constrain, pin_hidden: Constrain = same,
        local: Constrain = same) -> jax.Array:
    """Routed experts with capacity-based dispatch (GShard / MaxText's dropping path).

    ``router="softmax"``: Mixtral (softmax over all experts, top-k, renormalised).
    ``router="softmax"`` also serves Qwen3-MoE and DeepSeek-V2 (the same shapes; V2-Lite does not
    renormalise, which changes no buffer).
    ``router="sigmoid"``: DeepSeek-V3 (sigmoid scores; the correction bias
    steers the choice only; the chosen scores normalised and scaled by 2.5).
    """
    s = x.shape[1]
    e, k = spec.num_experts, spec.num_experts_per_tok
    capacity = max(1, math.ceil(k * s * capacity_factor / e))
    logits = jnp.einsum("bsd,ed->bse", x, p["gate"]["weight"].astype(dtype), preferred_element_type=jnp.float32)
    if router == "softmax":
        probs = jax.nn.softmax(logits, axis=-1)
        dispatch, combine = _dispatch(probs, probs, lambda c: c / jnp.sum(c, axis=-1, keepdims=True), k,
                                      capacity)
    else:
        scores = jax.nn.sigmoid(logits)
        select = scores + p["gate"]["e_score_correction_bias"].astype(jnp.float32)
        dispatch, combine = _dispatch(select, scores, lambda c: 2.5 * c / jnp.sum(c, axis=-1, keepdims=True), k,
                                      capacity)
    up, gate_name, down = names
    ex = p["experts"]
    # GShard's order: dispatch each group's tokens where they are (``local``: the batch split as the
    # tokens are), then move them to their experts' devices (``constrain_experts``: a reshard from the
    # batch dim to the experts dim, which XLA emits as an all-to-all), and back the same way to combine.
    xin = constrain_experts(local(jnp.einsum("bsec,bsd->ebcd", dispatch.astype(dtype), x)))
    h = jax.nn.silu(pin_hidden(jnp.einsum("ebcd,efd->ebcf", xin, ex[gate_name]["weight"].astype(dtype))))
    h = pin_hidden(h * pin_hidden(jnp.einsum("ebcd,efd->ebcf", xin, ex[up]["weight"].astype(dtype))))
    out = local(constrain_experts(jnp.einsum("ebcf,edf->ebcd", h, ex[down]["weight"].astype(dtype))))
    return jnp.einsum("bsec,ebcd->bsd", combine.astype(dtype), out)


def _projection(h: jax.Array, p: Tree, dtype: Any) -> jax.Array:
    """A q/k/v projection: ``x @ W.T``, plus its bias where the model has one (Qwen2's q/k/v)."""
    out = _linear(h, p["weight"], dtype)
    return out + jnp.asarray(p["bias"], dtype) if "bias" in p else out


def _llama_attention(h: jax.Array, p: Tree, spec: Any, dtype: Any, kind: str, inner: Inner,
                     attend: Callable[..., jax.Array]) -> jax.Array:
    b, s, _ = h.shape
    n, kv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    heads, kvs = _pin(inner, "heads"), _pin(inner, "kv_heads")
    q = _projection(h, p["q_proj"], dtype).reshape(b, s, n, hd)
    k = _projection(h, p["k_proj"], dtype).reshape(b, s, kv, hd)
    if "q_norm" in p:  # Qwen3 / Gemma 3: RMSNorm over each head before the rotary embedding
        q, k = rms_norm(q, p["q_norm"]["weight"]), rms_norm(k, p["k_norm"]["weight"])
    q, k = heads(rope(heads(q))), kvs(rope(kvs(k)))
    v = kvs(_projection(h, p["v_proj"], dtype).reshape(b, s, kv, hd))
    return _linear(heads(attend(q, k, v, kind)).reshape(b, s, n * hd), p["o_proj"]["weight"], dtype)


def _mla_attention(h: jax.Array, p: Tree, spec: Any, dtype: Any, kind: str, inner: Inner,
                   attend: Callable[..., jax.Array]) -> jax.Array:
    b, s, _ = h.shape
    m, n = spec.mla, spec.num_heads
    if "q_proj" in p:  # DeepSeek-V2-Lite: no query compression
        q = _linear(h, p["q_proj"]["weight"], dtype).reshape(b, s, n, m.qk_head_dim)
    else:
        q = _linear(rms_norm(_linear(h, p["q_a_proj"]["weight"], dtype), p["q_a_layernorm"]["weight"]),
                    p["q_b_proj"]["weight"], dtype).reshape(b, s, n, m.qk_head_dim)
    q = jnp.concatenate([q[..., : m.qk_nope_head_dim], rope(q[..., m.qk_nope_head_dim:])], axis=-1)
    kv_a = _linear(h, p["kv_a_proj_with_mqa"]["weight"], dtype)
    latent = rms_norm(kv_a[..., : m.kv_lora_rank], p["kv_a_layernorm"]["weight"])
    k_rope = rope(kv_a[..., m.kv_lora_rank:].reshape(b, s, 1, m.qk_rope_head_dim))
    kv = _linear(latent, p["kv_b_proj"]["weight"], dtype).reshape(b, s, n, m.qk_nope_head_dim + m.v_head_dim)
    k = jnp.concatenate([kv[..., : m.qk_nope_head_dim],
                         jnp.broadcast_to(k_rope, (b, s, n, m.qk_rope_head_dim))], axis=-1)
    v = kv[..., m.qk_nope_head_dim:]
    heads = _pin(inner, "heads")  # MLA: keys and values have as many heads as queries
    q, k, v = heads(q), heads(k), heads(v)
    return _linear(heads(attend(q, k, v, kind)).reshape(b, s, n * m.v_head_dim), p["o_proj"]["weight"], dtype)


def _gpt2_attention(h: jax.Array, p: Tree, spec: Any, dtype: Any, kind: str, inner: Inner,
                    attend: Callable[..., jax.Array]) -> jax.Array:
    b, s, d = h.shape
    n, hd = spec.num_heads, spec.head_dim
    qkv = _conv1d(h, p["c_attn"], dtype)
    heads = _pin(inner, "heads")
    q, k, v = (heads(t.reshape(b, s, n, hd)) for t in jnp.split(qkv, 3, axis=-1))
    out = heads(attend(q, k, v, kind)).reshape(b, s, d)
    return _conv1d(out, p["c_proj"], dtype)


def layer_fn(spec: Any, *, moe_layer: bool, dtype: Any, attention_kind: str, capacity_factor: float,
             constrain: Constrain, constrain_experts: Constrain,
             attend: Callable[..., jax.Array] = attention,
             inner: Inner | None = None) -> Callable[[jax.Array, Tree], jax.Array]:
    """One decoder layer ``(x, layer_params) -> x`` of ``spec.family``, residual stream in ``dtype``.

    ``inner`` pins the heads, MLP widths and expert hidden activations (see :data:`Inner`); the
    dispatched experts take ``constrain_experts``.
    """
    family = spec.family
    inner = {} if inner is None else inner
    mlp_pin = _pin(inner, "mlp")

    def gpt2(x: jax.Array, p: Tree) -> jax.Array:
        x = constrain(x)
        x = x + _gpt2_attention(layer_norm(x, p["ln_1"]["weight"], p["ln_1"]["bias"]), p["attn"], spec, dtype,
                                attention_kind, inner, attend)
        h = layer_norm(x, p["ln_2"]["weight"], p["ln_2"]["bias"])
        m = p["mlp"]
        return x + _conv1d(mlp_pin(jax.nn.gelu(mlp_pin(_conv1d(h, m["c_fc"], dtype)))), m["c_proj"], dtype)

    def mlp(h: jax.Array, p: Tree) -> jax.Array:
        if not moe_layer:
            m = p["mlp"]
            return _gated_mlp(h, m["gate_proj"]["weight"], m["up_proj"]["weight"], m["down_proj"]["weight"],
                              dtype, mlp_pin, gelu=family == "gemma")
        route = functools.partial(moe, capacity_factor=capacity_factor, constrain_experts=constrain_experts,
                                  pin_hidden=_pin(inner, "expert_mlp"), local=_pin(inner, "dispatch"))
        if family == "mixtral":
            return route(h, p["block_sparse_moe"], spec, dtype, names=("w3", "w1", "w2"), router="softmax")
        m = p["mlp"]
        # DeepSeek-V3 routes by sigmoid scores and a correction bias; Qwen3-MoE and DeepSeek-V2 by softmax.
        router = "sigmoid" if "e_score_correction_bias" in m["gate"] else "softmax"
        out = route(h, m, spec, dtype, names=("up_proj", "gate_proj", "down_proj"), router=router)
        if "shared_experts" in m:
            sh = m["shared_experts"]
            out = out + _gated_mlp(h, sh["gate_proj"]["weight"], sh["up_proj"]["weight"],
                                   sh["down_proj"]["weight"], dtype)
        return out

    def decoder(x: jax.Array, p: Tree) -> jax.Array:
        x = constrain(x)
        attn = _mla_attention if spec.mla is not None else _llama_attention
        a = attn(rms_norm(x, p["input_layernorm"]["weight"]), p["self_attn"], spec, dtype, attention_kind, inner,
                 attend)
        if family == "gemma":  # Gemma 2/3 norm each block's output too ("sandwich" norms)
            x = x + rms_norm(a, p["post_attention_layernorm"]["weight"])
            m = mlp(rms_norm(x, p["pre_feedforward_layernorm"]["weight"]), p)
            return x + rms_norm(m, p["post_feedforward_layernorm"]["weight"])
        x = x + a
        return x + mlp(rms_norm(x, p["post_attention_layernorm"]["weight"]), p)

    return gpt2 if family == "gpt2" else decoder


def embed(params: Tree, tokens: jax.Array, spec: Any, dtype: Any) -> jax.Array:
    """Token (and, for GPT-2, position) embeddings ``(b, s, d)`` in ``dtype``."""
    if spec.family == "gpt2":
        t = params["transformer"]
        x: jax.Array = jnp.take(t["wte"]["weight"], tokens, axis=0).astype(dtype)
        return x + jnp.asarray(t["wpe"]["weight"][: tokens.shape[1]], dtype)[None]
    return jnp.take(params["model"]["embed_tokens"]["weight"], tokens, axis=0).astype(dtype)


def final_norm(params: Tree, x: jax.Array, spec: Any) -> jax.Array:
    """The norm before the output head."""
    if spec.family == "gpt2":
        ln = params["transformer"]["ln_f"]
        return layer_norm(x, ln["weight"], ln["bias"])
    return rms_norm(x, params["model"]["norm"]["weight"])


def head_weight(params: Tree, spec: Any) -> jax.Array:
    """The output projection ``(vocab, d)``: ``lm_head``, or the input embedding when tied."""
    if "lm_head" in params:
        return params["lm_head"]["weight"]  # type: ignore[no-any-return]
    if spec.family == "gpt2":
        return params["transformer"]["wte"]["weight"]  # type: ignore[no-any-return]
    return params["model"]["embed_tokens"]["weight"]  # type: ignore[no-any-return]


def loss_from_hidden(x: jax.Array, targets: jax.Array, head: jax.Array, dtype: Any, *, vocab_tiles: int,
                     constrain_chunk: Constrain) -> jax.Array:
    """Summed token cross-entropy with fp32 logits (``logsumexp - logit[target]``).

    ``vocab_tiles > 1`` splits the sequence into that many chunks and computes
    each chunk's logits inside a rematerialised scan step, so only one chunk's
    logits are ever live (MaxText's "vocab tiling").
    """
    w = head.astype(dtype)

    def chunk_loss(xc: jax.Array, tc: jax.Array) -> jax.Array:
        logits = jnp.einsum("bsd,vd->bsv", xc, w, preferred_element_type=jnp.float32)
        gold = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        return jnp.sum(jax.nn.logsumexp(logits, axis=-1) - gold)

    if vocab_tiles <= 1:
        return chunk_loss(x, targets)
    b, s, d = x.shape
    xs = constrain_chunk(x.reshape(b, vocab_tiles, s // vocab_tiles, d).swapaxes(0, 1))
    ts = targets.reshape(b, vocab_tiles, s // vocab_tiles).swapaxes(0, 1)
    body = jax.checkpoint(chunk_loss)

    def step(total: jax.Array, chunk: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        return total + body(*chunk), None

    total, _ = jax.lax.scan(step, jnp.zeros((), jnp.float32), (xs, ts))
    return total
