"""How long a context each model takes: the positions of its Hugging Face config, and the serving names that
differ from a preset only there.

``max_position_embeddings`` of each preset's ``config.json`` (copies in ``tests/data/models/`` where shipped;
Meta-Llama-3-8B / -70B: 8192, Llama-3.1-8B / -70B: 131072, from their Hub configs). Llama 3.1 8B and 70B have
the shapes of Llama 3 8B and 70B (the same ``ModelSpec``) and 16 times the positions, so a serving plan knows
them as ``llama3.1-8b`` / ``llama3.1-70b``. A context past the positions is refused unless asked for: the
engine then needs rope scaling (vLLM: ``--hf-overrides`` with a ``rope_scaling``, or
``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``), and quality past the trained length is not the plan's to promise.

Example:
  >>> model_positions("llama3-70b"), serve_model("llama3.1-70b")[1]
  (8192, 131072)
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from meshplan.pure._check import as_count, as_flag
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._registry import MODEL_SPECS, resolve_preset_name
from meshplan.pure.presets._spec import ModelSpec, as_model_spec

__all__ = ["HF_REPOS", "MAXTEXT_NAMES", "MODEL_POSITIONS", "SERVE_ALIASES", "check_context", "model_positions",
           "serve_model"]

MODEL_POSITIONS: Mapping[str, int] = types.MappingProxyType({
    "gpt2": 1024, "llama3-8b": 8192, "llama3-70b": 8192, "mixtral-8x7b": 32768, "deepseek-v3": 163840,
    "mistral-7b": 32768, "deepseek-v2-lite": 163840, "gemma3-27b": 131072, "qwen2.5-72b": 32768,
    "qwen3-235b-a22b": 40960, "llama3.1-405b": 131072,
})
"""Preset name -> ``max_position_embeddings`` of its Hugging Face config."""

SERVE_ALIASES: Mapping[str, tuple[str, int]] = types.MappingProxyType({
    "llama3.1-8b": ("llama3-8b", 131072), "llama3.1-70b": ("llama3-70b", 131072),
})
"""Serving names -> (the preset with the same shapes, their positions)."""


HF_REPOS: Mapping[str, str] = types.MappingProxyType({
    "gpt2": "openai-community/gpt2", "llama3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama3-70b": "meta-llama/Meta-Llama-3-70B", "llama3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama3.1-70b": "meta-llama/Llama-3.1-70B", "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3", "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite", "gemma3-27b": "google/gemma-3-27b-it",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "llama3.1-405b": "meta-llama/Llama-3.1-405B",
})
"""The Hugging Face repository each serving name's weights come from (what the engines' commands load)."""

MAXTEXT_NAMES: Mapping[str, str] = types.MappingProxyType({
    "llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b", "llama3.1-8b": "llama3.1-8b",
    "llama3.1-70b": "llama3.1-70b", "llama3.1-405b": "llama3.1-405b", "mixtral-8x7b": "mixtral-8x7b",
    "deepseek-v3": "deepseek3-671b", "mistral-7b": "mistral-7b", "deepseek-v2-lite": "deepseek2-16b",
    "gemma3-27b": "gemma3-27b", "qwen3-235b-a22b": "qwen3-235b-a22b",
})
"""MaxText's ``model_name`` for each serving name it ships a model config for."""


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def serve_model(name: str) -> tuple[ModelSpec, int | None]:
    """The spec and positions a serving plan uses for ``name`` (a preset or a :data:`SERVE_ALIASES` name).

    Raises:
      PlanError: an unknown name (the message lists the presets and the serving names).
      MeshplanTypeError: ``name`` is not a str.

    Example:
      >>> spec, positions = serve_model("Llama-3.1-8B")
      >>> spec.name, spec.hidden_size, positions
      ('llama3.1-8b', 4096, 131072)
    """
    if not isinstance(name, str):
        raise MeshplanTypeError(f"model name={name!r:.60} must be a str.")
    for alias, (base, positions) in SERVE_ALIASES.items():
        if _key(alias) == _key(name):
            return dataclasses.replace(MODEL_SPECS[base], name=alias), positions
    try:
        preset = resolve_preset_name(name)
    except PlanError as err:
        raise PlanError(f"{err} Serving plans also know {sorted(SERVE_ALIASES)}.") from None
    return MODEL_SPECS[preset], MODEL_POSITIONS.get(preset)


def model_positions(model: Any) -> int | None:
    """The positions of a preset or serving name (or of a spec named like one); ``None`` when unknown.

    Example:
      >>> model_positions("mixtral-8x7b"), model_positions("my-model")
      (32768, None)
    """
    name = model.name if isinstance(model, ModelSpec) else model
    if not isinstance(name, str):
        raise MeshplanTypeError(f"model={model!r:.60} must be a ModelSpec or a name.")
    for alias, (_, positions) in SERVE_ALIASES.items():
        if _key(alias) == _key(name):
            return positions
    by_key = {_key(n): p for n, p in MODEL_POSITIONS.items()}
    return by_key.get(_key(name))


def check_context(spec: ModelSpec, context: int, positions: int | None, *, allow_long: bool = False) -> int:
    """``context`` if ``spec`` takes it: at most its ``positions`` unless ``allow_long``.

    Raises:
      PlanError: a context past the positions (the message says how to allow it and which model has more).
      MeshplanTypeError: a context that is not an int.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> check_context(MODEL_SPECS["llama3-70b"], 32768, 8192)
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.PlanError: context=32768 is longer than llama3-70b's 8192 positions ... or plan
      llama3.1-70b, which has the same shapes and 131072 positions.
    """
    spec = as_model_spec(spec)
    context = as_count(context, "context", maximum=10**12, error=PlanError)
    allow_long = as_flag(allow_long, "allow_long")
    if positions is None or allow_long or context <= positions:
        return context
    positions = as_count(positions, "positions", error=PlanError)
    longer = [alias for alias, (base, p) in SERVE_ALIASES.items() if base == spec.name and p >= context]
    hint = (f", or plan {longer[0]}, which has the same shapes and {SERVE_ALIASES[longer[0]][1]} positions"
            if longer else "")
    raise PlanError(f"context={context} is longer than {spec.name}'s {positions} positions (max_position_embeddings "
                    "of its config); pass allow_long=True (--allow-long-context) to plan it anyway (the engine then "
                    "needs rope scaling, e.g. vLLM's --hf-overrides rope_scaling or VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
                    f"{hint}.")
