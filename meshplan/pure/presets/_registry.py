"""The shipped model presets: their specs, builders and the name registry.

Sizes come from each model's Hugging Face ``config.json`` (openai-community/gpt2,
meta-llama/Meta-Llama-3-8B, meta-llama/Meta-Llama-3-70B,
mistralai/Mixtral-8x7B-v0.1, deepseek-ai/DeepSeek-V3, mistralai/Mistral-7B-v0.1,
deepseek-ai/DeepSeek-V2-Lite, google/gemma-3-27b-it, Qwen/Qwen2.5-72B,
Qwen/Qwen3-235B-A22B, meta-llama/Llama-3.1-405B; copies in tests/data/models/).
``num_params`` is the checkpoint's exact total and the tests check every tree
sums to it exactly.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp

from meshplan.pure._types import PyTree
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._deepseek import deepseek_v3_params
from meshplan.pure.presets._gpt2 import gpt2_params
from meshplan.pure.presets._llama import llama_params
from meshplan.pure.presets._spec import FAMILIES, MLADims, ModelSpec

__all__ = [
    "MODEL_PRESETS",
    "MODEL_SPECS",
    "Preset",
    "build_params",
    "deepseek_v3",
    "get_preset",
    "gpt2_small",
    "llama3_8b",
    "llama3_70b",
    "mixtral_8x7b",
    "preset_names",
    "resolve_preset_name",
]

MODEL_SPECS: Mapping[str, ModelSpec] = types.MappingProxyType({
    "gpt2": ModelSpec(
        "gpt2", "gpt2", vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
        num_kv_heads=12, head_dim=64, intermediate_size=3072, tied_embeddings=True,
        max_position_embeddings=1024, num_params=124_439_808),
    "llama3-8b": ModelSpec(
        "llama3-8b", "llama", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, num_params=8_030_261_248),
    "llama3-70b": ModelSpec(
        "llama3-70b", "llama", vocab_size=128256, hidden_size=8192, num_layers=80, num_heads=64,
        num_kv_heads=8, head_dim=128, intermediate_size=28672, num_params=70_553_706_496),
    "mixtral-8x7b": ModelSpec(
        "mixtral-8x7b", "mixtral", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=14336, num_params=46_702_792_704),
    # 61 decoder layers (the checkpoint's 62nd is the multi-token-prediction module, left out).
    # head_dim is the value head size; query/key heads are qk_nope + qk_rope = 192 wide.
    "deepseek-v3": ModelSpec(
        "deepseek-v3", "deepseek_v3", vocab_size=129280, hidden_size=7168, num_layers=61,
        num_heads=128, num_kv_heads=128, head_dim=128, intermediate_size=18432, num_experts=256,
        num_experts_per_tok=8, moe_intermediate_size=2048, num_shared_experts=1, num_dense_layers=3,
        mla=MLADims(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                    v_head_dim=128),
        num_params=671_026_419_200),
    # The shipped configs of the models people ask about most (tests/data/models/*.json, read by
    # model_spec_from_hf_config); each num_params is the checkpoint's exact count (the tests cite the source).
    "mistral-7b": ModelSpec(
        "mistral-7b", "llama", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, sliding_window=4096, sliding_window_layers=32,
        num_params=7_241_732_096),
    "deepseek-v2-lite": ModelSpec(
        "deepseek-v2-lite", "deepseek_v2", vocab_size=102400, hidden_size=2048, num_layers=27, num_heads=16,
        num_kv_heads=16, head_dim=128, intermediate_size=10944, num_experts=64, num_experts_per_tok=6,
        moe_intermediate_size=1408, num_shared_experts=2, num_dense_layers=1,
        mla=MLADims(q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
        num_params=15_706_484_224),
    # The language model of google/gemma-3-27b-it (its SigLIP vision tower is not planned).
    "gemma3-27b": ModelSpec(
        "gemma3-27b", "gemma", vocab_size=262208, hidden_size=5376, num_layers=62, num_heads=32,
        num_kv_heads=16, head_dim=128, intermediate_size=21504, tied_embeddings=True, qk_norm=True,
        sliding_window=1024, sliding_window_layers=52, num_params=27_009_346_304),
    "qwen2.5-72b": ModelSpec(
        "qwen2.5-72b", "llama", vocab_size=152064, hidden_size=8192, num_layers=80, num_heads=64,
        num_kv_heads=8, head_dim=128, intermediate_size=29568, qkv_bias=True, num_params=72_706_203_648),
    "qwen3-235b-a22b": ModelSpec(
        "qwen3-235b-a22b", "qwen3_moe", vocab_size=151936, hidden_size=4096, num_layers=94, num_heads=64,
        num_kv_heads=4, head_dim=128, intermediate_size=12288, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=1536, qk_norm=True, num_params=235_093_634_560),
    "llama3.1-405b": ModelSpec(
        "llama3.1-405b", "llama", vocab_size=128256, hidden_size=16384, num_layers=126, num_heads=128,
        num_kv_heads=8, head_dim=128, intermediate_size=53248, num_params=405_853_388_800),
})


def build_params(spec: ModelSpec, *, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """The shape tree of any :class:`ModelSpec`, by its ``family``.

    Args:
      spec: the model (a shipped one from :data:`MODEL_SPECS` or your own).
      dtype: dtype of every leaf.
      unstack_experts: per-expert leaves instead of stacked ones (no effect on
        dense models).

    Returns:
      Nested dicts of ``jax.ShapeDtypeStruct`` in the Hugging Face layout.

    Raises:
      PlanError: an unknown family (the message lists the known ones).
      MeshplanTypeError: ``spec`` is not a ModelSpec, or a bad dtype.

    Example:
      >>> import dataclasses
      >>> tiny = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=1,
      ...                            num_params=None)
      >>> sorted(build_params(tiny)["model"]["layers"]["0"])
      ['input_layernorm', 'mlp', 'post_attention_layernorm', 'self_attn']
    """
    if not isinstance(spec, ModelSpec):
        raise MeshplanTypeError(f"spec={spec!r} must be a ModelSpec.")
    if not isinstance(unstack_experts, bool):
        raise MeshplanTypeError(f"unstack_experts={unstack_experts!r} must be a bool.")
    if spec.family == "gpt2":
        return gpt2_params(spec, dtype=dtype)
    if spec.family in ("llama", "mixtral", "qwen3_moe", "gemma"):
        return llama_params(spec, dtype=dtype, unstack_experts=unstack_experts)
    if spec.family in ("deepseek_v2", "deepseek_v3"):
        return deepseek_v3_params(spec, dtype=dtype, unstack_experts=unstack_experts)
    raise PlanError(f"ModelSpec {spec.name!r}: unknown family={spec.family!r}; known families: {list(FAMILIES)}.")


def gpt2_small(*, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """GPT-2 small (124,439,808 parameters, tied head).

    ``unstack_experts`` is accepted so every preset builder has one signature;
    GPT-2 has no experts.

    Example:
      >>> gpt2_small()["transformer"]["wte"]["weight"]
      ShapeDtypeStruct(shape=(50257, 768), dtype=bfloat16)
    """
    return build_params(MODEL_SPECS["gpt2"], dtype=dtype, unstack_experts=unstack_experts)


def llama3_8b(*, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """Llama-3-8B (8,030,261,248 parameters, untied head; no experts).

    Example:
      >>> llama3_8b()["model"]["layers"]["31"]["self_attn"]["k_proj"]["weight"].shape
      (1024, 4096)
    """
    return build_params(MODEL_SPECS["llama3-8b"], dtype=dtype, unstack_experts=unstack_experts)


def llama3_70b(*, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """Llama-3-70B (70,553,706,496 parameters, untied head; no experts).

    Example:
      >>> llama3_70b()["model"]["layers"]["79"]["mlp"]["down_proj"]["weight"].shape
      (8192, 28672)
    """
    return build_params(MODEL_SPECS["llama3-70b"], dtype=dtype, unstack_experts=unstack_experts)


def mixtral_8x7b(*, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """Mixtral-8x7B (46,702,792,704 parameters), experts stacked unless asked.

    Example:
      >>> mixtral_8x7b(unstack_experts=True)["model"]["layers"]["0"]["block_sparse_moe"][
      ...     "experts"]["7"]["w2"]["weight"].shape
      (4096, 14336)
    """
    return build_params(MODEL_SPECS["mixtral-8x7b"], dtype=dtype, unstack_experts=unstack_experts)


def deepseek_v3(*, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
    """DeepSeek-V3 without the MTP layer (671,026,419,200 parameters).

    Example:
      >>> deepseek_v3()["model"]["layers"]["60"]["mlp"]["gate"]["e_score_correction_bias"].shape
      (256,)
    """
    return build_params(MODEL_SPECS["deepseek-v3"], dtype=dtype, unstack_experts=unstack_experts)


def _builder(name: str) -> Callable[..., PyTree]:
    """The ``(*, dtype, unstack_experts) -> tree`` builder of a preset that has no function of its own."""

    def build(*, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> PyTree:
        return build_params(MODEL_SPECS[name], dtype=dtype, unstack_experts=unstack_experts)

    build.__name__ = build.__qualname__ = name.replace("-", "_").replace(".", "_")
    build.__doc__ = f"The {name} preset's shape tree ({MODEL_SPECS[name].num_params:,} parameters)."
    return build


MODEL_PRESETS: Mapping[str, Callable[..., PyTree]] = types.MappingProxyType({
    "gpt2": gpt2_small,
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "mixtral-8x7b": mixtral_8x7b,
    "deepseek-v3": deepseek_v3,
    **{name: _builder(name) for name in MODEL_SPECS if name not in
       ("gpt2", "llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3")},
})
"""Preset name -> builder ``(*, dtype=bfloat16, unstack_experts=False) -> tree``."""


class Preset(NamedTuple):
    """A preset's metadata and its shape tree."""

    spec: ModelSpec
    params: PyTree


def _key(name: str) -> str:
    # "Llama-3-8B", "llama3_8b" and "llama3-8b" name the same preset.
    return "".join(ch for ch in name.lower() if ch.isalnum())


_BY_KEY: Mapping[str, str] = types.MappingProxyType(
    {**{_key(name): name for name in MODEL_PRESETS}, _key("gpt2-small"): "gpt2"})


def preset_names() -> tuple[str, ...]:
    """The registry's names: the first five presets, then the rest smallest model first.

    Example:
      >>> preset_names()[:5]
      ('gpt2', 'llama3-8b', 'llama3-70b', 'mixtral-8x7b', 'deepseek-v3')
      >>> len(preset_names())
      11
    """
    return tuple(MODEL_PRESETS)


def resolve_preset_name(name: str) -> str:
    """The registry name ``name`` refers to (case, ``-``, ``_`` and ``.`` ignored).

    Raises:
      PlanError: an unknown name; the message lists the known ones.
      MeshplanTypeError: ``name`` is not a str.

    Example:
      >>> resolve_preset_name("Llama-3-70B")
      'llama3-70b'
    """
    if not isinstance(name, str):
        raise MeshplanTypeError(f"preset name={name!r} must be a str, one of {list(preset_names())}.")
    found = _BY_KEY.get(_key(name))
    if found is None:
        close = difflib.get_close_matches(_key(name), sorted(_BY_KEY), n=1)
        hint = f" Did you mean {_BY_KEY[close[0]]!r}?" if close else ""
        if name.lower().endswith((".json", ".yml", ".yaml")) or "/" in name:
            # The pure core opens no files: a config path goes through meshplan.load_model first.
            hint = (" That looks like a model config file: read it with meshplan.load_model(path) and pass the "
                    "ModelSpec (the CLI's --model reads it for you).")
        raise PlanError(f"unknown model preset {name!r}; known presets: {list(preset_names())}.{hint} "
                            f"For another model, build a ModelSpec and call build_params(spec).")
    return found


def get_preset(name: str, *, dtype: Any = jnp.bfloat16, unstack_experts: bool = False) -> Preset:
    """A preset's spec and shape tree by name.

    Args:
      name: a name from :func:`preset_names` (case, ``-``, ``_`` and ``.`` are
        ignored, so ``"Llama-3-8B"`` works).
      dtype: dtype of every leaf (default bfloat16).
      unstack_experts: per-expert leaves for MoE presets (no effect on dense).

    Returns:
      ``Preset(spec, params)``.

    Raises:
      PlanError: an unknown name (the message lists the known ones).
      MeshplanTypeError: a non-str name or a bad dtype.

    Example:
      >>> p = get_preset("mixtral-8x7b")
      >>> p.spec.num_experts, p.params["lm_head"]["weight"].shape
      (8, (32000, 4096))
    """
    resolved = resolve_preset_name(name)
    return Preset(MODEL_SPECS[resolved],
                  MODEL_PRESETS[resolved](dtype=dtype, unstack_experts=unstack_experts))
