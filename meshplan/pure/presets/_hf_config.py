"""A :class:`ModelSpec` from a Hugging Face ``config.json`` (already parsed: a mapping in, a spec out).

The architecture is read from ``model_type`` (and checked against
``architectures`` when both are there). Supported, with the keys each reads:

================  ==========================================================
``model_type``    what it adds to the common decoder keys
================  ==========================================================
``gpt2``          ``n_embd``, ``n_layer``, ``n_head``, ``n_inner``, ``n_positions``
``llama``         Llama 1-3.x; ``head_dim`` when given; ``rope_scaling`` ignored
``mistral``       ``sliding_window`` (v0.1: 4096 on every layer; null later)
``mixtral``       ``num_local_experts``, ``num_experts_per_tok``
``qwen2``         q/k/v biases; ``use_sliding_window`` / ``max_window_layers``
``qwen3``         q/k norms, explicit ``head_dim``
``qwen3_moe``     + ``num_experts``, ``moe_intermediate_size``, ``mlp_only_layers``
``gemma2``        four norms a layer, tied head, every other layer local
``gemma3``        ``text_config`` (or ``gemma3_text``): + q/k norms, five local in six
``deepseek_v2``   MLA ranks (``q_lora_rank`` null: one ``q_proj``), shared and
``deepseek_v3``   routed experts, ``first_k_dense_replace``; V3's MTP layer left out
================  ==========================================================

The common keys are ``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads`` (default: the head count),
``intermediate_size`` and ``tie_word_embeddings``. A key a real config leaves
out takes the default ``transformers`` gives it (:data:`HF_DEFAULTS`; Gemma 3's
``text_config`` omits ``vocab_size``, for one). Keys that do not change a
weight's shape (rope settings, dropout, token ids, ``torch_dtype``) are not read.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any

from meshplan.pure.errors import ModelConfigError
from meshplan.pure.presets._show import show_int as _show_int
from meshplan.pure.presets._show import show_value as _show_value
from meshplan.pure.presets._spec import MLADims, ModelSpec

__all__ = ["HF_DEFAULTS", "HF_MODEL_TYPES", "model_spec_from_hf_config"]

HF_MODEL_TYPES: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    "gpt2": ("GPT2LMHeadModel", "GPT2Model"),
    "llama": ("LlamaForCausalLM", "LlamaModel"),
    "mistral": ("MistralForCausalLM", "MistralModel"),
    "mixtral": ("MixtralForCausalLM", "MixtralModel"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Model"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Model"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeModel"),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Model"),
    "gemma3": ("Gemma3ForConditionalGeneration",),
    "gemma3_text": ("Gemma3ForCausalLM", "Gemma3TextModel"),
    "deepseek_v2": ("DeepseekV2ForCausalLM", "DeepseekV2Model"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Model"),
})
"""``model_type`` -> the ``architectures`` entries that go with it."""

HF_DEFAULTS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    # transformers' configuration_*.py defaults for keys real config files leave out.
    "gpt2": {"n_inner": None, "tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True, "sliding_window": 4096},
    "gemma3_text": {"vocab_size": 262_208, "tie_word_embeddings": True, "sliding_window": 4096,
                    "sliding_window_pattern": 6, "head_dim": 256},
    "mistral": {"sliding_window": 4096},
    "qwen2": {"use_sliding_window": False},
    "qwen3_moe": {"decoder_sparse_step": 1, "mlp_only_layers": []},
    "deepseek_v2": {"first_k_dense_replace": 0, "moe_layer_freq": 1, "n_shared_experts": None},
    "deepseek_v3": {"first_k_dense_replace": 3, "moe_layer_freq": 1},
})
"""Per ``model_type``: defaults for keys a real ``config.json`` may leave out (as ``transformers`` sets them)."""

_MISSING = object()
# Sizes past these describe no model; refusing them keeps a typo (or a fuzzer) from building a tree of a
# billion layers. Layers and experts become dict entries of the tree; widths are only shape numbers.
_MAX_SIZE = 10**12
_MAX_ENTRIES = {"num_hidden_layers": 10_000, "n_layer": 10_000, "num_local_experts": 100_000,
                "num_experts": 100_000, "n_routed_experts": 100_000}


class _Config:
    """Reads checked values out of one config mapping, naming the file and key in every error."""

    __slots__ = ("defaults", "mapping", "model_type", "source")

    def __init__(self, mapping: Mapping[str, Any], source: str, model_type: str) -> None:
        self.mapping, self.source, self.model_type = mapping, source, model_type
        self.defaults = HF_DEFAULTS.get(model_type, {})

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        value = self.mapping.get(key, self.defaults.get(key, default))
        if value is _MISSING:
            raise ModelConfigError(f"{self.source}: key {key!r} is missing; a {self.model_type!r} config needs it "
                                   f"(a positive int).")
        return value

    def count(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelConfigError(f"{self.source}: key {key!r}={_show_value(value)} must be an int >= {minimum}.")
        if value < minimum:
            raise ModelConfigError(f"{self.source}: key {key!r}={_show_int(value)} must be >= {minimum}.")
        maximum = _MAX_ENTRIES.get(key, _MAX_SIZE)
        if value > maximum:
            raise ModelConfigError(f"{self.source}: key {key!r}={_show_int(value)} is past any model; it must be <= "
                                   f"{maximum:,}.")
        return value

    def optional_count(self, key: str, *, minimum: int = 1) -> int | None:
        """An int, or ``None`` when the key is absent or null."""
        if self.raw(key, None) is None:
            return None
        return self.count(key, minimum=minimum)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelConfigError(f"{self.source}: key {key!r}={_show_value(value)} must be true or false.")
        return value

    def fail(self, key: str, message: str) -> ModelConfigError:
        return ModelConfigError(f"{self.source}: key {key!r}={_show_value(self.mapping.get(key))} {message}")


def _model_type(config: Mapping[str, Any], source: str) -> str:
    """The config's ``model_type``, from the key or from ``architectures``, checked to agree."""
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise ModelConfigError(f"{source}: key 'architectures'={_show_value(archs)} must be a list of class names.")
    by_arch = {a: t for t, names in HF_MODEL_TYPES.items() for a in names}
    from_arch = next((by_arch[a] for a in archs or [] if a in by_arch), None)
    model_type = config.get("model_type") or from_arch  # absent or null: the architectures say
    known = sorted(HF_MODEL_TYPES)
    if not isinstance(model_type, str) or model_type not in HF_MODEL_TYPES:
        shown = model_type if model_type is not None else archs
        raise ModelConfigError(f"{source}: unknown architecture {_show_value(shown)} (key 'model_type'); meshplan reads "
                               f"model_type {known} (architectures "
                               f"{sorted(by_arch)}). For another model, build a ModelSpec yourself.")
    if archs and from_arch is not None and from_arch != model_type and \
            {from_arch, model_type} != {"gemma3", "gemma3_text"}:
        raise ModelConfigError(f"{source}: key 'model_type'={model_type!r} disagrees with 'architectures'="
                               f"{archs!r} (which is model_type {from_arch!r}); fix one of them.")
    return model_type


def _name(config: Mapping[str, Any], name: str | None, model_type: str) -> str:
    if name is not None:
        return name
    given = config.get("_name_or_path")
    if isinstance(given, str) and given.strip("/"):
        return given.strip("/").rsplit("/", 1)[-1]
    return model_type


def _heads(c: _Config, hidden: int) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim), with the dividing checks a real model satisfies."""
    heads = c.count("num_attention_heads")
    kv_heads = c.optional_count("num_key_value_heads") or heads  # absent (Llama 1) or null: no GQA
    if heads % kv_heads:
        raise c.fail("num_key_value_heads", f"must divide num_attention_heads={heads} (grouped-query attention).")
    explicit = c.optional_count("head_dim")
    if explicit is None:
        if hidden % heads:
            raise c.fail("num_attention_heads", f"must divide hidden_size={hidden}, or give head_dim.")
        return heads, kv_heads, hidden // heads
    return heads, kv_heads, explicit


def _local_layers(c: _Config, layers: int) -> tuple[int, int]:
    """(sliding window, layers using it): from ``layer_types`` when given, else the family's pattern."""
    if c.model_type == "qwen2" and not c.flag("use_sliding_window", False):
        return 0, 0
    window = c.optional_count("sliding_window") if c.model_type in ("mistral", "qwen2", "gemma2",
                                                                      "gemma3_text") else None
    if not window:
        return 0, 0
    kinds = c.raw("layer_types", None)
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers or not all(isinstance(k, str) for k in kinds):
            raise c.fail("layer_types", f"must list one attention kind per layer ({layers}).")
        local = sum(k == "sliding_attention" for k in kinds)
        return (window, local) if local else (0, 0)
    if c.model_type == "qwen2":  # layers from max_window_layers on use the window
        local = max(0, layers - c.count("max_window_layers", minimum=0))
        return (window, local) if local else (0, 0)
    if c.model_type == "gemma2":
        return window, math.ceil(layers / 2)  # layers 0, 2, 4, ... are local
    if c.model_type == "gemma3_text":
        pattern = c.count("sliding_window_pattern")
        return window, layers - layers // pattern  # every pattern-th layer is global
    return window, layers  # Mistral: every layer


def _dense(c: _Config, name: str, family: str) -> ModelSpec:
    """Llama, Mistral, Qwen2, Qwen3 and Gemma 2/3: dense decoders."""
    hidden, layers = c.count("hidden_size"), c.count("num_hidden_layers")
    heads, kv_heads, head_dim = _heads(c, hidden)
    for key in ("attention_bias", "mlp_bias"):
        if c.model_type in ("llama", "mistral", "qwen3") and c.flag(key, False):
            raise c.fail(key, "is not supported (an o_proj / MLP bias); meshplan models q/k/v biases only "
                              "(Qwen2's).")
    sliding, local = _local_layers(c, layers)
    return _spec(c, name, family, hidden, layers, heads, kv_heads, head_dim, sliding_window=sliding,
                 sliding_window_layers=local)


def _spec(c: _Config, name: str, family: str, hidden: int, layers: int, heads: int, kv_heads: int,
          head_dim: int, **extra: Any) -> ModelSpec:
    tied = c.flag("tie_word_embeddings", False)
    return ModelSpec(name, family, vocab_size=c.count("vocab_size"), hidden_size=hidden, num_layers=layers,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     intermediate_size=c.count("intermediate_size"), tied_embeddings=tied,
                     qkv_bias=c.model_type == "qwen2", qk_norm=c.model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
                     **extra)


def _experts(c: _Config, experts_key: str, top_k_key: str) -> tuple[int, int]:
    experts = c.count(experts_key)
    top_k = c.raw(top_k_key, None)
    if top_k is None:
        raise ModelConfigError(f"{c.source}: key {experts_key!r}={experts} names experts but {top_k_key!r} "
                               f"(experts per token, 1..{experts}) is missing.")
    top_k = c.count(top_k_key)
    if top_k > experts:
        raise c.fail(top_k_key, f"exceeds {experts_key}={experts}; each token picks at most every expert.")
    return experts, top_k


def _mixtral(c: _Config, name: str) -> ModelSpec:
    hidden, layers = c.count("hidden_size"), c.count("num_hidden_layers")
    heads, kv_heads, head_dim = _heads(c, hidden)
    experts, top_k = _experts(c, "num_local_experts", "num_experts_per_tok")
    window = c.optional_count("sliding_window")
    return _spec(c, name, "mixtral", hidden, layers, heads, kv_heads, head_dim, num_experts=experts,
                 num_experts_per_tok=top_k, moe_intermediate_size=c.count("intermediate_size"),
                 sliding_window=window or 0, sliding_window_layers=layers if window else 0)


def _qwen3_moe(c: _Config, name: str) -> ModelSpec:
    hidden, layers = c.count("hidden_size"), c.count("num_hidden_layers")
    heads, kv_heads, head_dim = _heads(c, hidden)
    experts, top_k = _experts(c, "num_experts", "num_experts_per_tok")
    step = c.count("decoder_sparse_step")
    dense_only = c.raw("mlp_only_layers")
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                   for i in dense_only):
        raise c.fail("mlp_only_layers", "must be a list of layer indices.")
    # ModelSpec keeps dense layers first: a prefix of mlp_only_layers and a sparse step of 1 fit it.
    if step != 1 or sorted(dense_only) != list(range(len(dense_only))):
        raise ModelConfigError(f"{c.source}: decoder_sparse_step={step} with mlp_only_layers={_show_value(dense_only)}: "
                               f"meshplan models MoE layers after a run of leading dense layers only "
                               f"(decoder_sparse_step 1, mlp_only_layers [0, 1, ..., k-1]).")
    return _spec(c, name, "qwen3_moe", hidden, layers, heads, kv_heads, head_dim, num_experts=experts,
                 num_experts_per_tok=top_k, moe_intermediate_size=c.count("moe_intermediate_size"),
                 num_dense_layers=len(dense_only))


def _deepseek(c: _Config, name: str) -> ModelSpec:
    hidden, layers = c.count("hidden_size"), c.count("num_hidden_layers")
    heads = c.count("num_attention_heads")
    experts, top_k = _experts(c, "n_routed_experts", "num_experts_per_tok")
    if c.count("moe_layer_freq") != 1:
        raise c.fail("moe_layer_freq", "must be 1: meshplan models MoE on every layer after the first "
                                        "first_k_dense_replace.")
    dense = c.count("first_k_dense_replace", minimum=0)
    if dense > layers:
        raise c.fail("first_k_dense_replace", f"exceeds num_hidden_layers={layers}.")
    mla = MLADims(q_lora_rank=c.optional_count("q_lora_rank") or 0, kv_lora_rank=c.count("kv_lora_rank"),
                  qk_nope_head_dim=c.count("qk_nope_head_dim"), qk_rope_head_dim=c.count("qk_rope_head_dim"),
                  v_head_dim=c.count("v_head_dim"))
    shared = c.optional_count("n_shared_experts", minimum=0) or 0
    return ModelSpec(name, c.model_type, vocab_size=c.count("vocab_size"), hidden_size=hidden, num_layers=layers,
                     num_heads=heads, num_kv_heads=heads, head_dim=mla.v_head_dim,
                     intermediate_size=c.count("intermediate_size"), num_experts=experts, num_experts_per_tok=top_k,
                     moe_intermediate_size=c.count("moe_intermediate_size"), num_shared_experts=shared,
                     num_dense_layers=dense, tied_embeddings=c.flag("tie_word_embeddings", False), mla=mla)


def _gpt2(c: _Config, name: str) -> ModelSpec:
    hidden, layers, heads = c.count("n_embd"), c.count("n_layer"), c.count("n_head")
    if hidden % heads:
        raise c.fail("n_head", f"must divide n_embd={hidden}.")
    inner = c.optional_count("n_inner") or 4 * hidden
    return ModelSpec(name, "gpt2", vocab_size=c.count("vocab_size"), hidden_size=hidden, num_layers=layers,
                     num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads, intermediate_size=inner,
                     tied_embeddings=c.flag("tie_word_embeddings", True),
                     max_position_embeddings=c.count("n_positions"))


_FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "gemma2": "gemma",
           "gemma3_text": "gemma"}


def model_spec_from_hf_config(config: Mapping[str, Any], *, name: str | None = None,
                              source: str = "config.json") -> ModelSpec:
    """The :class:`ModelSpec` a Hugging Face ``config.json`` describes (the module docstring lists the models).

    Args:
      config: the parsed ``config.json`` (a mapping of its keys).
      name: the spec's name (default: the last part of ``_name_or_path``, else the ``model_type``).
      source: what to call the config in error messages (the file's path).

    Returns:
      A :class:`ModelSpec` whose :func:`~meshplan.pure.presets.build_params` tree has the
      checkpoint's tensors (Gemma 3's language model without its vision tower; DeepSeek-V3
      without its multi-token-prediction layer). ``num_params`` is left ``None``.

    Raises:
      ModelConfigError: an unknown architecture, a missing key, a value of the wrong type or
        sign, heads that do not divide, experts with no top-k (each message names ``source``
        and the key).

    Example:
      >>> spec = model_spec_from_hf_config({"model_type": "qwen2", "vocab_size": 151936,
      ...     "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
      ...     "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True},
      ...     name="Qwen2.5-0.5B")
      >>> spec.family, spec.head_dim, spec.qkv_bias, spec.tied_embeddings
      ('llama', 64, True, True)
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{source}: a config.json holds a JSON object (a mapping of keys), not "
                               f"{type(config).__name__}.")
    if name is not None and (not isinstance(name, str) or not name):
        raise ModelConfigError(f"name={_show_value(name)} must be a non-empty str or None.")
    model_type = _model_type(config, source)
    if model_type == "gemma3":  # the multimodal checkpoint: its language model is under text_config
        text = config.get("text_config")
        if not isinstance(text, Mapping):
            raise ModelConfigError(f"{source}: key 'text_config'={_show_value(text)} must be the language model's config "
                                   f"(a JSON object) in a gemma3 config.")
        return model_spec_from_hf_config({"model_type": "gemma3_text", **text}, name=_name(config, name, model_type),
                                         source=f"{source} text_config")
    c = _Config(config, source, model_type)
    name = _name(config, name, model_type)
    if model_type == "gpt2":
        return _gpt2(c, name)
    if model_type == "mixtral":
        return _mixtral(c, name)
    if model_type == "qwen3_moe":
        return _qwen3_moe(c, name)
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(c, name)
    return _dense(c, name, _FAMILY[model_type])
