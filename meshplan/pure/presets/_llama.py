"""Llama and Mixtral parameter shapes in the Hugging Face layout."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from meshplan.pure._types import PyTree
from meshplan.pure.presets._spec import ModelSpec, ShapeTree, _Leaves, as_model_spec, decoder_tree

__all__ = ["llama_params"]


def llama_params(spec: ModelSpec, *, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """Shape tree of a Llama-style decoder (Llama, or Mixtral when it has experts).

    Names follow HF ``LlamaForCausalLM`` / ``MixtralForCausalLM``:
    ``model.embed_tokens.weight``, ``model.layers.N.input_layernorm.weight``,
    ``model.layers.N.self_attn.{q,k,v,o}_proj.weight``,
    ``model.layers.N.post_attention_layernorm.weight``, then either
    ``model.layers.N.mlp.{gate,up,down}_proj.weight`` (dense) or
    ``model.layers.N.block_sparse_moe.gate.weight`` (router, ``(E, hidden)``)
    and ``block_sparse_moe.experts.{w1,w2,w3}.weight`` stacked as
    ``(E, out, in)``; ``unstack_experts=True`` gives HF's
    ``block_sparse_moe.experts.{e}.{w1,w2,w3}.weight``. Then
    ``model.norm.weight`` and ``lm_head.weight`` (left out when tied).
    No biases; RMSNorm has a weight only.

    Args:
      spec: sizes; layers from ``spec.num_dense_layers`` on are MoE layers.
      dtype: dtype of every leaf.
      unstack_experts: one leaf per expert instead of a stacked leaf.

    Returns:
      Nested dicts of ``jax.ShapeDtypeStruct`` (layout: see ``presets._spec``).

    Raises:
      MeshplanTypeError: a bad dtype.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> tree = llama_params(MODEL_SPECS["mixtral-8x7b"])
      >>> tree["model"]["layers"]["0"]["block_sparse_moe"]["experts"]["w1"]["weight"].shape
      (8, 14336, 4096)
    """
    spec = as_model_spec(spec)
    d = spec.hidden_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    leaf = _Leaves(dtype)

    def linear(n_out: int, n_in: int) -> ShapeTree:
        return {"weight": leaf(n_out, n_in)}

    def mlp() -> ShapeTree:
        f = spec.intermediate_size
        return {"gate_proj": linear(f, d), "up_proj": linear(f, d), "down_proj": linear(d, f)}

    def moe() -> ShapeTree:
        e, f = spec.num_experts, spec.moe_intermediate_size
        experts: ShapeTree
        if unstack_experts:
            up, down = leaf(f, d), leaf(d, f)
            experts = {str(i): {"w1": {"weight": up}, "w2": {"weight": down}, "w3": {"weight": up}}
                       for i in range(e)}
        else:
            experts = {"w1": {"weight": leaf(e, f, d)}, "w2": {"weight": leaf(e, d, f)},
                       "w3": {"weight": leaf(e, f, d)}}
        return {"gate": linear(e, d), "experts": experts}

    def layer(i: int) -> ShapeTree:
        out: ShapeTree = {
            "input_layernorm": {"weight": leaf(d)},
            "self_attn": {"q_proj": linear(q, d), "k_proj": linear(kv, d), "v_proj": linear(kv, d),
                          "o_proj": linear(d, q)},
            "post_attention_layernorm": {"weight": leaf(d)},
        }
        if spec.is_moe_layer(i):
            out["block_sparse_moe"] = moe()
        else:
            out["mlp"] = mlp()
        return out

    return decoder_tree(spec, leaf, layer)
