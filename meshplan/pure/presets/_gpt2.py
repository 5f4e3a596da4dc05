"""GPT-2 parameter shapes in the Hugging Face ``GPT2LMHeadModel`` layout."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from meshplan.pure._types import PyTree
from meshplan.pure.errors import PlanError
from meshplan.pure.presets._spec import ModelSpec, ShapeTree, _Leaves, as_model_spec

__all__ = ["gpt2_params"]


def gpt2_params(spec: ModelSpec, *, dtype: Any = jnp.bfloat16) -> PyTree:
    """Shape tree of a GPT-2 model described by ``spec``.

    Names follow HF ``GPT2LMHeadModel.state_dict()``: ``transformer.wte``,
    ``transformer.wpe``, ``transformer.h.N.{ln_1, attn.c_attn, attn.c_proj,
    ln_2, mlp.c_fc, mlp.c_proj}`` with weights and biases, ``transformer.ln_f``,
    and ``lm_head.weight`` only when the head is untied. ``Conv1D`` weights
    are ``(in_features, out_features)`` as HF stores them. The causal-mask
    buffer ``attn.bias`` is not a parameter and is left out.

    Args:
      spec: sizes (``hidden_size``, ``intermediate_size``, ``num_layers``,
        ``vocab_size``, ``max_position_embeddings``, ``tied_embeddings``).
      dtype: dtype of every leaf.

    Returns:
      Nested dicts of ``jax.ShapeDtypeStruct`` (layout: see ``presets._spec``).

    Raises:
      PlanError: ``spec`` lacks ``max_position_embeddings`` or its heads
        do not tile ``hidden_size``.
      MeshplanTypeError: a bad dtype.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS, count_params
      >>> tree = gpt2_params(MODEL_SPECS["gpt2"])
      >>> tree["transformer"]["h"]["0"]["attn"]["c_attn"]["weight"].shape
      (768, 2304)
      >>> count_params(tree)
      124439808
    """
    spec = as_model_spec(spec)
    d, f, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    if spec.max_position_embeddings < 1 or spec.num_heads * spec.head_dim != d:
        raise PlanError(f"ModelSpec {spec.name!r}: GPT-2 needs max_position_embeddings >= 1 and "
                            f"num_heads * head_dim == hidden_size ({spec.num_heads} * {spec.head_dim} "
                            f"vs {d}).")
    leaf = _Leaves(dtype)

    def linear(n_in: int, n_out: int) -> ShapeTree:
        return {"weight": leaf(n_in, n_out), "bias": leaf(n_out)}

    def norm() -> ShapeTree:
        return {"weight": leaf(d), "bias": leaf(d)}

    def block() -> ShapeTree:
        return {
            "ln_1": norm(),
            "attn": {"c_attn": linear(d, 3 * d), "c_proj": linear(d, d)},
            "ln_2": norm(),
            "mlp": {"c_fc": linear(d, f), "c_proj": linear(f, d)},
        }

    tree: ShapeTree = {
        "transformer": {
            "wte": {"weight": leaf(v, d)},
            "wpe": {"weight": leaf(spec.max_position_embeddings, d)},
            "h": {str(i): block() for i in range(spec.num_layers)},
            "ln_f": norm(),
        }
    }
    if not spec.tied_embeddings:
        tree["lm_head"] = {"weight": leaf(v, d)}
    return tree
