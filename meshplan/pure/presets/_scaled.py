"""A model cut to fewer layers, for a compile that is faster than the full model's (``check --layers``)."""

from __future__ import annotations

import dataclasses

from meshplan.pure._check import as_count
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._spec import ModelSpec

__all__ = ["scaled_model"]


def scaled_model(spec: ModelSpec, layers: int | None) -> ModelSpec:
    """``spec`` with ``layers`` layers, or as it is (``None``, or at least its own count).

    An MoE model keeps its dense-first layers up to one fewer than ``layers`` (an MoE layer stays); a model
    with sliding-window layers keeps their share of the layers (Gemma 3: 5 in 6), at least one if it has any.

    Raises:
      MeshplanTypeError: ``spec`` is not a ModelSpec.
      PlanError: ``layers`` is not a count >= 1.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> scaled_model(MODEL_SPECS["gpt2"], 2).name, scaled_model(MODEL_SPECS["gpt2"], 2).num_layers
      ('gpt2 (2 layers)', 2)
    """
    if not isinstance(spec, ModelSpec):
        raise MeshplanTypeError(f"spec={spec!r:.60} must be a ModelSpec.")
    if layers is None:
        return spec
    layers = as_count(layers, "layers", error=PlanError)
    if layers >= spec.num_layers:
        return spec
    dense = min(spec.num_dense_layers, max(layers - 1, 0)) if spec.is_moe else spec.num_dense_layers
    local = max(1, round(spec.sliding_window_layers * layers / spec.num_layers)) if spec.sliding_window else 0
    return dataclasses.replace(spec, name=f"{spec.name} ({layers} layers)", num_layers=layers,
                               num_dense_layers=dense, num_params=None, sliding_window_layers=local)
