"""Llama-layout decoders in the Hugging Face layout: Llama, Mistral, Qwen2/3, Mixtral, Qwen3-MoE, Gemma 2/3."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from meshplan.pure._types import PyTree
from meshplan.pure.presets._spec import ModelSpec, ShapeTree, _Leaves, as_model_spec, decoder_tree

__all__ = ["llama_params"]

# Where each family keeps its routed experts: (MLP module, expert projection names up / gate / down).
_MOE_NAMES = {"mixtral": ("block_sparse_moe", ("w3", "w1", "w2")),
              "qwen3_moe": ("mlp", ("up_proj", "gate_proj", "down_proj"))}


def llama_params(spec: ModelSpec, *, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """Shape tree of a Llama-layout decoder (families ``llama``, ``mixtral``, ``qwen3_moe``, ``gemma``).

    Names follow HF ``LlamaForCausalLM`` (also ``MistralForCausalLM``,
    ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``): ``model.embed_tokens.weight``,
    ``model.layers.N.input_layernorm.weight``,
    ``model.layers.N.self_attn.{q,k,v,o}_proj.weight``,
    ``model.layers.N.post_attention_layernorm.weight``,
    ``model.layers.N.mlp.{gate,up,down}_proj.weight``, ``model.norm.weight`` and
    ``lm_head.weight`` (left out when tied). What the spec adds:

    - ``qkv_bias``: ``self_attn.{q,k,v}_proj.bias`` (Qwen2/2.5);
    - ``qk_norm``: ``self_attn.{q,k}_norm.weight`` of ``head_dim`` (Qwen3, Gemma 3);
    - family ``gemma``: ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm``
      besides the two norms above (Gemma 2/3's ``Gemma3ForCausalLM`` text model);
    - MoE layers (from ``spec.num_dense_layers`` on): ``mixtral`` has
      ``block_sparse_moe.gate.weight`` (router, ``(E, hidden)``) and
      ``block_sparse_moe.experts.{w1,w2,w3}.weight``; ``qwen3_moe`` has
      ``mlp.gate.weight`` and ``mlp.experts.{gate,up,down}_proj.weight``. Experts are
      stacked as ``(E, out, in)``; ``unstack_experts=True`` gives HF's per-expert
      ``experts.{e}.<name>.weight``.

    Args:
      spec: sizes; layers from ``spec.num_dense_layers`` on are MoE layers.
      dtype: dtype of every leaf.
      unstack_experts: one leaf per expert instead of a stacked leaf.

    Returns:
      Nested dicts of ``jax.ShapeDtypeStruct`` (layout: see ``presets._spec``).

    Raises:
      MeshplanTypeError: a bad dtype or a spec that is not a ModelSpec.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> tree = llama_params(MODEL_SPECS["mixtral-8x7b"])
      >>> tree["model"]["layers"]["0"]["block_sparse_moe"]["experts"]["w1"]["weight"].shape
      (8, 14336, 4096)
      >>> sorted(llama_params(MODEL_SPECS["qwen2.5-72b"])["model"]["layers"]["0"]["self_attn"]["q_proj"])
      ['bias', 'weight']
    """
    spec = as_model_spec(spec)
    d = spec.hidden_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    leaf = _Leaves(dtype)
    module, (up_name, gate_name, down_name) = _MOE_NAMES.get(spec.family, _MOE_NAMES["mixtral"])

    def linear(n_out: int, n_in: int, bias: bool = False) -> ShapeTree:
        return {"weight": leaf(n_out, n_in), "bias": leaf(n_out)} if bias else {"weight": leaf(n_out, n_in)}

    def mlp() -> ShapeTree:
        f = spec.intermediate_size
        return {"gate_proj": linear(f, d), "up_proj": linear(f, d), "down_proj": linear(d, f)}

    def moe() -> ShapeTree:
        e, f = spec.num_experts, spec.moe_intermediate_size
        experts: ShapeTree
        if unstack_experts:
            up, down = leaf(f, d), leaf(d, f)
            experts = {str(i): {gate_name: {"weight": up}, down_name: {"weight": down}, up_name: {"weight": up}}
                       for i in range(e)}
        else:
            experts = {gate_name: {"weight": leaf(e, f, d)}, down_name: {"weight": leaf(e, d, f)},
                       up_name: {"weight": leaf(e, f, d)}}
        return {"gate": linear(e, d), "experts": experts}

    def attention() -> ShapeTree:
        bias = spec.qkv_bias
        out: ShapeTree = {"q_proj": linear(q, d, bias), "k_proj": linear(kv, d, bias),
                          "v_proj": linear(kv, d, bias), "o_proj": linear(d, q)}
        if spec.qk_norm:
            out["q_norm"] = {"weight": leaf(spec.head_dim)}
            out["k_norm"] = {"weight": leaf(spec.head_dim)}
        return out

    def layer(i: int) -> ShapeTree:
        out: ShapeTree = {
            "input_layernorm": {"weight": leaf(d)},
            "self_attn": attention(),
            "post_attention_layernorm": {"weight": leaf(d)},
        }
        if spec.family == "gemma":
            out["pre_feedforward_layernorm"] = {"weight": leaf(d)}
            out["post_feedforward_layernorm"] = {"weight": leaf(d)}
        if spec.is_moe_layer(i):
            out[module] = moe()
        else:
            out["mlp"] = mlp()
        return out

    return decoder_tree(spec, leaf, layer)
