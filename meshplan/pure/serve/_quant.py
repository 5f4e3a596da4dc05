"""What a served model's weights and KV cache are stored in: the dtypes a serving plan takes, and their scales.

Weights (:class:`WeightQuant`): ``bfloat16`` (2 bytes, no scales), ``int8`` or ``float8`` (1 byte per element,
``float8_e4m3fn``). A quantized weight matrix carries float32 scales: one per output channel by default
(``scales="channel"``: the layout of the published W8A8-INT8 / FP8-Dynamic checkpoints vLLM and SGLang load,
and of MaxText's AQT int8), or one per matrix (``scales="tensor"``: vLLM's online ``--quantization fp8``).
Only the linear layers of the decoder are quantized; embeddings, the output head, norms and the MoE router stay
bfloat16, as vLLM's fp8 and MaxText's int8 leave them. ``float8`` runs the matmuls at the device's FP8 peak
(W8A8) where it has one; ``int8`` is priced as weight-only (bf16 matmuls), as gpt-fast and MaxText run it.

KV cache (:data:`KV_DTYPES`): ``bfloat16``, ``float8`` (1 byte, ``float8_e4m3fn``) or ``int8`` (1 byte). How an
engine scales a quantized cache is the engine's (:mod:`meshplan.pure.serve._engines`): vLLM and SGLang keep one
float32 scale per layer for K and for V; MaxText (``quantize_kvcache``, ``kv_quant_axis: heads_and_dkv``) keeps
one bfloat16 scale per token for K and for V in each layer.

Example:
  >>> q = WeightQuant("int8")
  >>> q.element_bytes, q.quantized, weight_quant("fp8").dtype
  (1, True, 'float8')
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from meshplan.pure._check import as_choice, as_shape
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = ["KV_DTYPES", "SCALE_GRANULARITIES", "WEIGHT_DTYPES", "WeightQuant", "kv_dtype", "kv_element_dtype",
           "weight_quant"]

WEIGHT_DTYPES: tuple[str, ...] = ("bfloat16", "int8", "float8")
"""The weight dtypes a serving plan prices (``--weight-dtype``)."""

KV_DTYPES: tuple[str, ...] = ("bfloat16", "float8", "int8")
"""The KV-cache dtypes a serving plan prices (``--kv-dtype``)."""

SCALE_GRANULARITIES: tuple[str, ...] = ("channel", "tensor")
"""How a quantized weight matrix is scaled: one float32 per output channel, or one per matrix."""

# Spellings people type (vLLM's "fp8", "auto", numpy's names) -> the canonical name.
_ALIASES: Mapping[str, str] = types.MappingProxyType({
    "bf16": "bfloat16", "bfloat16": "bfloat16", "auto": "bfloat16",
    "int8": "int8", "w8a16": "int8", "w8a8_int8": "int8",
    "fp8": "float8", "float8": "float8", "float8_e4m3fn": "float8", "fp8_e4m3": "float8", "e4m3": "float8",
})

_ELEMENT: Mapping[str, Any] = types.MappingProxyType({
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "int8": np.dtype(np.int8),
    "float8": np.dtype(ml_dtypes.float8_e4m3fn),
})


def _canonical(value: Any, what: str, valid: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise MeshplanTypeError(f"{what}={value!r:.60} must be a str, one of {list(valid)}.")
    name = _ALIASES.get(value.strip().lower())
    if name is None or name not in valid:
        raise PlanError(f"{what}={value!r:.60} is not a dtype meshplan serves; valid: {list(valid)} "
                        f"(fp8 and bf16 are accepted for float8 and bfloat16).")
    return name


def kv_dtype(value: Any) -> str:
    """``value`` as one of :data:`KV_DTYPES` (``"fp8"`` -> ``"float8"``).

    Raises:
      PlanError: an unknown dtype (the message lists the valid ones).
      MeshplanTypeError: not a str.

    Example:
      >>> kv_dtype("fp8"), kv_dtype("auto")
      ('float8', 'bfloat16')
    """
    return _canonical(value, "kv_dtype", KV_DTYPES)


def kv_element_dtype(name: str) -> Any:
    """The numpy dtype one cached K or V element is stored in.

    Example:
      >>> kv_element_dtype("float8").itemsize
      1
    """
    return _ELEMENT[kv_dtype(name)]


@dataclasses.dataclass(frozen=True, slots=True)
class WeightQuant:
    """How the decoder's linear weights are stored.

    Attributes:
      dtype: one of :data:`WEIGHT_DTYPES`.
      scales: one of :data:`SCALE_GRANULARITIES` (ignored for ``bfloat16``).

    Raises:
      PlanError: an unknown dtype or granularity.
      MeshplanTypeError: a value that is not a str.

    Example:
      >>> WeightQuant("float8", scales="tensor").scale_shape((4096, 1024))
      ()
    """

    dtype: str = "bfloat16"
    scales: str = "channel"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _canonical(self.dtype, "weight_dtype", WEIGHT_DTYPES))
        as_choice(self.scales, "scales", SCALE_GRANULARITIES, error=PlanError)

    @property
    def quantized(self) -> bool:
        """Whether linear weights carry scales (int8, float8)."""
        return self.dtype != "bfloat16"

    @property
    def element_dtype(self) -> Any:
        """The numpy dtype of a linear weight's elements."""
        return _ELEMENT[self.dtype]

    @property
    def element_bytes(self) -> int:
        """Bytes per linear-weight element."""
        return int(self.element_dtype.itemsize)

    def scale_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The float32 scale array of a linear weight ``(..., out, in)``: ``(..., out)`` per channel, ``(...)``
        per tensor (a stacked expert weight keeps one scale set per expert)."""
        weight_shape = as_shape(weight_shape, "weight_shape")
        if len(weight_shape) < 2:
            raise PlanError(f"weight_shape={weight_shape} must be a linear weight's (..., out, in).")
        return weight_shape[:-1] if self.scales == "channel" else weight_shape[:-2]

    @property
    def text(self) -> str:
        """``"int8 (per-channel float32 scales)"``."""
        if not self.quantized:
            return "bfloat16"
        return f"{self.dtype} (per-{self.scales} float32 scales)"


def weight_quant(value: Any) -> WeightQuant:
    """``value`` (a :class:`WeightQuant` or a dtype name) as a :class:`WeightQuant`.

    Example:
      >>> weight_quant("bf16").dtype
      'bfloat16'
    """
    return value if isinstance(value, WeightQuant) else WeightQuant(value)
