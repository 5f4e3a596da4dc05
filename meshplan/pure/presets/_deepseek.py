"""DeepSeek-V2 / V3 parameter shapes in the Hugging Face layout (no MTP layer)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from meshplan.pure._types import PyTree
from meshplan.pure.errors import PlanError
from meshplan.pure.presets._spec import ModelSpec, ShapeTree, _Leaves, as_model_spec, decoder_tree

__all__ = ["deepseek_v3_params"]


def deepseek_v3_params(spec: ModelSpec, *, dtype: Any = jnp.bfloat16,
                       unstack_experts: bool = False) -> PyTree:
    """Shape tree of a DeepSeek-V2/V3-style model: MLA attention, dense then MoE layers.

    Names follow HF ``DeepseekV3ForCausalLM``: ``model.embed_tokens.weight``;
    per layer ``input_layernorm``, ``post_attention_layernorm`` and
    ``self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj, o_proj}.weight``; the first
    ``spec.num_dense_layers`` layers have ``mlp.{gate,up,down}_proj.weight``,
    the rest ``mlp.gate.weight`` (router, ``(E, hidden)``),
    ``mlp.gate.e_score_correction_bias`` (``(E,)``), the routed experts
    ``mlp.experts.{gate,up,down}_proj.weight`` stacked as ``(E, out, in)``
    (``unstack_experts=True``: HF's ``mlp.experts.{e}.{gate,up,down}_proj.weight``)
    and ``mlp.shared_experts.{gate,up,down}_proj.weight`` with hidden size
    ``moe_intermediate_size * num_shared_experts``; then ``model.norm.weight``
    and ``lm_head.weight``. The checkpoint's multi-token-prediction layer
    (``model.layers.61``) is not part of the model and is left out.

    DeepSeek-V2 (family ``deepseek_v2``) differs in two places: its router has
    no ``e_score_correction_bias``, and with ``mla.q_lora_rank == 0``
    (V2-Lite) the queries come from one ``self_attn.q_proj.weight``
    ``(heads * qk_head_dim, hidden)`` instead of ``q_a_proj`` / ``q_a_layernorm`` /
    ``q_b_proj``.

    Args:
      spec: sizes, with ``spec.mla`` set.
      dtype: dtype of every leaf (the official checkpoint keeps the router's
        correction bias in fp32; here every leaf has ``dtype``).
      unstack_experts: one leaf per expert instead of a stacked leaf.

    Returns:
      Nested dicts of ``jax.ShapeDtypeStruct`` (layout: see ``presets._spec``).

    Raises:
      PlanError: ``spec.mla`` is missing.
      MeshplanTypeError: a bad dtype.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> tree = deepseek_v3_params(MODEL_SPECS["deepseek-v3"])
      >>> tree["model"]["layers"]["3"]["mlp"]["experts"]["gate_proj"]["weight"].shape
      (256, 2048, 7168)
      >>> tree["model"]["layers"]["0"]["self_attn"]["kv_a_proj_with_mqa"]["weight"].shape
      (576, 7168)
    """
    spec = as_model_spec(spec)
    mla = spec.mla
    if mla is None:
        raise PlanError(f"ModelSpec {spec.name!r}: DeepSeek-V3 attention needs spec.mla (MLADims).")
    d, h = spec.hidden_size, spec.num_heads
    leaf = _Leaves(dtype)

    def linear(n_out: int, n_in: int) -> ShapeTree:
        return {"weight": leaf(n_out, n_in)}

    def mlp(f: int) -> ShapeTree:
        return {"gate_proj": linear(f, d), "up_proj": linear(f, d), "down_proj": linear(d, f)}

    def queries() -> ShapeTree:
        if not mla.q_lora_rank:
            return {"q_proj": linear(h * mla.qk_head_dim, d)}
        return {
            "q_a_proj": linear(mla.q_lora_rank, d),
            "q_a_layernorm": {"weight": leaf(mla.q_lora_rank)},
            "q_b_proj": linear(h * mla.qk_head_dim, mla.q_lora_rank),
        }

    def attention() -> ShapeTree:
        return {
            **queries(),
            "kv_a_proj_with_mqa": linear(mla.kv_lora_rank + mla.qk_rope_head_dim, d),
            "kv_a_layernorm": {"weight": leaf(mla.kv_lora_rank)},
            "kv_b_proj": linear(h * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
            "o_proj": linear(d, h * mla.v_head_dim),
        }

    def moe() -> ShapeTree:
        e, f = spec.num_experts, spec.moe_intermediate_size
        experts: ShapeTree
        if unstack_experts:
            # 14,848 expert dicts in DeepSeek-V3: build them inline (no helper calls) to stay fast.
            up, down = leaf(f, d), leaf(d, f)
            experts = {str(i): {"gate_proj": {"weight": up}, "up_proj": {"weight": up},
                                "down_proj": {"weight": down}} for i in range(e)}
        else:
            experts = {"gate_proj": {"weight": leaf(e, f, d)}, "up_proj": {"weight": leaf(e, f, d)},
                       "down_proj": {"weight": leaf(e, d, f)}}
        router: ShapeTree = {"weight": leaf(e, d)}
        if spec.family != "deepseek_v2":  # V3's aux-loss-free balancing bias
            router["e_score_correction_bias"] = leaf(e)
        out: ShapeTree = {"gate": router, "experts": experts}
        if spec.num_shared_experts:
            out["shared_experts"] = mlp(f * spec.num_shared_experts)
        return out

    def layer(i: int) -> ShapeTree:
        return {
            "input_layernorm": {"weight": leaf(d)},
            "self_attn": attention(),
            "post_attention_layernorm": {"weight": leaf(d)},
            "mlp": moe() if spec.is_moe_layer(i) else mlp(spec.intermediate_size),
        }

    return decoder_tree(spec, leaf, layer)
