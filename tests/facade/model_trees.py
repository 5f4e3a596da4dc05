"""Small real models in each tree convention, as their libraries build them (shapes only, no compute).

Every builder returns the parameter tree a user would hand to the planner:
``nnx.state(model, nnx.Param)``, linen's ``{"params": ...}`` (with
``nn.Partitioned`` boxes), or equinox's ``eqx.partition(model, eqx.is_array)[0]``.

Sizes are all distinct where it matters, so a dim's size says which feature it is:
hidden D=48, heads H=4 of HD=16 (q: 64), kv heads KV=2 (k, v: 32), MLP F=96, vocab V=256,
layers L=3, experts E=4, MLA ranks Q_RANK=40, KV_RANK=24 (+ ROPE=8).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

D, H, HD, KV, F, V, L, E = 48, 4, 16, 2, 96, 256, 3, 4
Q_RANK, KV_RANK, ROPE = 40, 24, 8
HINTS = dict(num_heads=H, num_kv_heads=KV, num_experts=E)


# ---------------------------------------------------------------- flax nnx
def _lin(i: int, o: int, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(i, o, use_bias=False, rngs=rngs)


class NnxAttention(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.q_proj, self.k_proj = _lin(D, H * HD, rngs), _lin(D, KV * HD, rngs)
        self.v_proj, self.o_proj = _lin(D, KV * HD, rngs), _lin(H * HD, D, rngs)


class NnxMla(nnx.Module):
    """DeepSeek's multi-head latent attention: low-rank q and kv, per-head up-projections."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.q_a_proj, self.q_a_layernorm = _lin(D, Q_RANK, rngs), nnx.RMSNorm(Q_RANK, rngs=rngs)
        self.q_b_proj = _lin(Q_RANK, H * HD, rngs)
        self.kv_a_proj_with_mqa = _lin(D, KV_RANK + ROPE, rngs)
        self.kv_a_layernorm = nnx.RMSNorm(KV_RANK, rngs=rngs)
        self.kv_b_proj = _lin(KV_RANK, H * 2 * HD, rngs)
        self.o_proj = _lin(H * HD, D, rngs)


class NnxMlp(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, f: int = F) -> None:
        self.gate_proj, self.up_proj, self.down_proj = _lin(D, f, rngs), _lin(D, f, rngs), _lin(f, D, rngs)


class NnxExperts(nnx.Module):
    """Stacked experts, flax layout per expert: w1/w3 (E, D, F), w2 (E, F, D)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.lecun_normal()
        self.w1 = nnx.Param(init(rngs.params(), (E, D, F)))
        self.w3 = nnx.Param(init(rngs.params(), (E, D, F)))
        self.w2 = nnx.Param(init(rngs.params(), (E, F, D)))


class NnxMoe(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, shared: bool) -> None:
        self.gate = _lin(D, E, rngs)
        self.experts = NnxExperts(rngs)
        if shared:
            self.shared_experts = NnxMlp(rngs, f=2 * F)


class NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, kind: str) -> None:
        self.input_layernorm = nnx.RMSNorm(D, rngs=rngs)
        self.self_attn = NnxMla(rngs) if kind == "deepseek" else NnxAttention(rngs)
        self.post_attention_layernorm = nnx.RMSNorm(D, rngs=rngs)
        self.mlp = NnxMlp(rngs) if kind == "llama" else NnxMoe(rngs, shared=kind == "deepseek")


class NnxModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, kind: str = "llama", scan: bool = False) -> None:
        self.embed_tokens = nnx.Embed(V, D, rngs=rngs)
        if scan:  # nnx.vmap over the layer constructor: every leaf gets a leading L axis
            @nnx.split_rngs(splits=L)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(r: nnx.Rngs) -> NnxBlock:
                return NnxBlock(r, kind)

            self.layers: Any = make(rngs)
        else:
            self.layers = nnx.List([NnxBlock(rngs, kind) for _ in range(L)])
        self.norm = nnx.RMSNorm(D, rngs=rngs)
        self.lm_head = _lin(D, V, rngs)


def nnx_params(kind: str = "llama", *, scan: bool = False) -> Any:
    """``nnx.state(model, nnx.Param)`` of an abstract (shape-only) model."""
    model = nnx.eval_shape(lambda: NnxModel(nnx.Rngs(0), kind, scan))
    return nnx.state(model, nnx.Param)


def nnx_model(kind: str = "llama") -> NnxModel:
    """A live model (for nnx.split / nnx.state in the tests)."""
    return nnx.eval_shape(lambda: NnxModel(nnx.Rngs(0), kind))


# ---------------------------------------------------------------- flax linen
def _dense(features: int, name: str, names: tuple[str, str]) -> nn.Dense:
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)
    return nn.Dense(features, use_bias=False, name=name, kernel_init=init)


class LinenBlock(nn.Module):
    moe: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None) -> tuple[jax.Array, None]:
        h = nn.RMSNorm(name="input_layernorm")(x)
        q = _dense(H * HD, "q_proj", ("embed", "heads"))(h)
        k = _dense(KV * HD, "k_proj", ("embed", "kv"))(h)
        v = _dense(KV * HD, "v_proj", ("embed", "kv"))(h)
        x = x + _dense(D, "o_proj", ("heads", "embed"))(q + jnp.tile(k + v, 2))
        h = nn.RMSNorm(name="post_attention_layernorm")(x)
        if self.moe:
            scope = LinenExperts(name="experts")
            _dense(E, "gate", ("embed", "expert"))(h)
            return x + scope(h), None
        mlp = _dense(F, "gate_proj", ("embed", "mlp"))(h) * _dense(F, "up_proj", ("embed", "mlp"))(h)
        return x + _dense(D, "down_proj", ("mlp", "embed"))(mlp), None


class LinenExperts(nn.Module):
    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        init = nn.initializers.lecun_normal()
        w1 = self.param("w1", init, (E, D, F))
        w3 = self.param("w3", init, (E, D, F))
        w2 = self.param("w2", init, (E, F, D))
        y = jnp.einsum("bd,edf->bef", h, w1) * jnp.einsum("bd,edf->bef", h, w3)
        return jnp.einsum("bef,efd->bd", y, w2)


class LinenModel(nn.Module):
    scan: bool = False
    moe: bool = False

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(V, D, name="embed_tokens")(tokens)
        if self.scan:
            stack = nn.scan(LinenBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=L,
                            metadata_params={nn.PARTITION_NAME: "layers"})
            x, _ = stack(moe=self.moe, name="layers")(x, None)
        else:
            for i in range(L):
                x, _ = LinenBlock(moe=self.moe, name=f"layers_{i}")(x)
        x = nn.RMSNorm(name="norm")(x)
        return _dense(V, "lm_head", ("embed", "vocab"))(x)


def linen_params(*, scan: bool = False, moe: bool = False) -> Any:
    """``model.init(...)`` shapes: ``{"params": ...}`` with ``nn.Partitioned`` kernels."""
    model = LinenModel(scan=scan, moe=moe)
    return jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((2,), jnp.int32))


class MaxTextBlock(nn.Module):
    """MaxText's decoder layer names and DenseGeneral shapes."""

    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None) -> tuple[jax.Array, None]:
        h = nn.RMSNorm(name="pre_self_attention_layer_norm")(x)
        attn = SelfAttention(name="self_attention")(h)
        x = x + attn
        h = nn.RMSNorm(name="post_self_attention_layer_norm")(x)
        mlp = Mlp(name="mlp")(h)
        return x + mlp, None


class SelfAttention(nn.Module):
    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        q = nn.DenseGeneral((H, HD), use_bias=False, name="query")(h)
        k = nn.DenseGeneral((KV, HD), use_bias=False, name="key")(h)
        v = nn.DenseGeneral((KV, HD), use_bias=False, name="value")(h)
        return nn.DenseGeneral(D, axis=(-2, -1), use_bias=False, name="out")(q + jnp.tile(k + v, (2, 1)))


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        a = nn.DenseGeneral(F, use_bias=False, name="wi_0")(h) * nn.DenseGeneral(F, use_bias=False, name="wi_1")(h)
        return nn.DenseGeneral(D, use_bias=False, name="wo")(a)


class MaxTextModel(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(V, D, name="token_embedder")(tokens)
        decoder = Decoder(name="decoder")
        return decoder(x)


class Decoder(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        # MaxText scans its layers with param_scan_axis=1: (embed, L, heads, head_dim).
        stack = nn.scan(MaxTextBlock, variable_axes={"params": 1}, split_rngs={"params": True}, length=L)
        x, _ = stack(name="layers")(x, None)
        x = nn.RMSNorm(name="decoder_norm")(x)
        return nn.DenseGeneral(V, use_bias=False, name="logits_dense")(x)


def maxtext_params() -> Any:
    return jax.eval_shape(MaxTextModel().init, jax.random.key(0), jnp.zeros((2,), jnp.int32))


# ---------------------------------------------------------------- equinox
class EqxAttention(eqx.Module):
    q_proj: eqx.nn.Linear
    k_proj: eqx.nn.Linear
    v_proj: eqx.nn.Linear
    o_proj: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k = jax.random.split(key, 4)
        self.q_proj = eqx.nn.Linear(D, H * HD, use_bias=False, key=k[0])
        self.k_proj = eqx.nn.Linear(D, KV * HD, use_bias=False, key=k[1])
        self.v_proj = eqx.nn.Linear(D, KV * HD, use_bias=False, key=k[2])
        self.o_proj = eqx.nn.Linear(H * HD, D, use_bias=False, key=k[3])


class EqxExperts(eqx.Module):
    """Stacked experts the equinox way: a filter_vmap'd Linear, weight (E, out, in)."""

    w1: eqx.nn.Linear
    w3: eqx.nn.Linear
    w2: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k = jax.random.split(key, 3)

        def stack(i: int, o: int, key: jax.Array) -> eqx.nn.Linear:
            return eqx.filter_vmap(lambda kk: eqx.nn.Linear(i, o, use_bias=False, key=kk))(
                jax.random.split(key, E))

        self.w1, self.w3, self.w2 = stack(D, F, k[0]), stack(D, F, k[1]), stack(F, D, k[2])


class EqxMlp(eqx.Module):
    gate_proj: eqx.nn.Linear
    up_proj: eqx.nn.Linear
    down_proj: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k = jax.random.split(key, 3)
        self.gate_proj = eqx.nn.Linear(D, F, use_bias=False, key=k[0])
        self.up_proj = eqx.nn.Linear(D, F, use_bias=False, key=k[1])
        self.down_proj = eqx.nn.Linear(F, D, use_bias=False, key=k[2])


class EqxMoe(eqx.Module):
    gate: eqx.nn.Linear
    experts: EqxExperts

    def __init__(self, key: jax.Array) -> None:
        k = jax.random.split(key, 2)
        self.gate = eqx.nn.Linear(D, E, use_bias=False, key=k[0])
        self.experts = EqxExperts(k[1])


class EqxBlock(eqx.Module):
    input_layernorm: eqx.nn.RMSNorm
    self_attn: EqxAttention
    post_attention_layernorm: eqx.nn.RMSNorm
    mlp: Any

    def __init__(self, key: jax.Array, moe: bool) -> None:
        k = jax.random.split(key, 2)
        self.input_layernorm = eqx.nn.RMSNorm(D)
        self.self_attn = EqxAttention(k[0])
        self.post_attention_layernorm = eqx.nn.RMSNorm(D)
        self.mlp = EqxMoe(k[1]) if moe else EqxMlp(k[1])


class EqxModel(eqx.Module):
    embed_tokens: eqx.nn.Embedding
    layers: list[EqxBlock]
    norm: eqx.nn.RMSNorm
    lm_head: eqx.nn.Linear

    def __init__(self, key: jax.Array, moe: bool = False) -> None:
        k = jax.random.split(key, L + 2)
        self.embed_tokens = eqx.nn.Embedding(V, D, key=k[0])
        self.layers = [EqxBlock(k[2 + i], moe) for i in range(L)]
        self.norm = eqx.nn.RMSNorm(D)
        self.lm_head = eqx.nn.Linear(D, V, use_bias=False, key=k[1])


def eqx_params(*, moe: bool = False) -> Any:
    """``eqx.partition(model, eqx.is_array)[0]``, traced abstractly (ShapeDtypeStruct leaves)."""
    return jax.eval_shape(lambda key: eqx.partition(EqxModel(key, moe), eqx.is_array)[0], jax.random.key(0))
