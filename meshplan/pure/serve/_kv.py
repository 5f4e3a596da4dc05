"""The KV cache of a serving replica: bytes per token per device, what a budget holds, and the cache's arrays.

Per token and layer, one device stores (``b`` the cache dtype's bytes):

- GQA / MHA: ``2 x kv_heads_per_device x head_dim x b``, where ``kv_heads_per_device = max(kv, tp) / tp``: a
  ``tp`` beyond the kv heads copies them, one per device (vLLM, SGLang, MaxText all do);
- MLA, latent form (vLLM, SGLang, vLLM-TPU): ``(kv_lora_rank + qk_rope_head_dim) x b``, the compressed latent
  and the shared rope key, whole on every device of the replica (it has no heads to split);
- MLA, heads form (MaxText's ``mla_naive_kvcache: True``, its default): ``heads/tp x (qk_head_dim + v_head_dim)
  x b``, the up-projected keys and values;
- plus, for a quantized cache scaled per token (MaxText), one bfloat16 scale for K and one for V (one for the
  latent); per-layer scales (vLLM, SGLang: one float32 for K and V in each layer) are a fixed 8 bytes a layer.

A paged cache (:class:`CacheFormat` ``"paged"``) holds a sequence in ``ceil(L / page)`` pages; sliding-window
layers of an engine that frees what the window left behind (``window_capped``: vLLM's hybrid KV manager)
hold at most ``ceil(W / page) + 1`` pages. A contiguous cache (MaxText / JetStream) gives every sequence slot
``context`` tokens in every layer, full or windowed. With ``ep > 1`` each attention data-parallel rank caches
its own sequences, ``ceil(sequences / ep)`` of them per device.

Example:
  >>> from meshplan.pure.presets import MODEL_SPECS
  >>> from meshplan.pure.serve import ServeLayout
  >>> g = kv_geometry(MODEL_SPECS["llama3-70b"], ServeLayout(1, 16), "bfloat16", CacheFormat("paged", 16))
  >>> g.bytes_per_token  # 80 layers x 2 x one kv head x 128 x 2 bytes
  40960
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
from jax.sharding import PartitionSpec

from meshplan.pure._check import as_choice, as_count, as_flag, as_int
from meshplan.pure._types import make_spec, make_struct
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._spec import ModelSpec, as_model_spec
from meshplan.pure.serve._layout import ServeLayout, check_layout
from meshplan.pure.serve._quant import kv_dtype, kv_element_dtype

__all__ = ["CACHE_LAYOUTS", "CacheFormat", "KvGeometry", "decode_input_bytes", "decode_inputs_tree", "kv_cache_tree",
           "kv_geometry"]

CACHE_LAYOUTS: tuple[str, ...] = ("paged", "contiguous")
"""How a cache holds sequences: pages from a shared pool (vLLM, SGLang, vLLM-TPU) or one slot each (MaxText)."""

_MAX_TOKENS = 10**12  # the context bound every planner keeps (beyond any model's positions)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)


@dataclasses.dataclass(frozen=True, slots=True)
class CacheFormat:
    """How an engine lays its KV cache out (what :func:`kv_geometry` needs to know of the engine).

    Attributes:
      layout: one of :data:`CACHE_LAYOUTS`.
      page_size: tokens per page (1 for a contiguous cache).
      mla: ``"latent"`` (the compressed latent) or ``"heads"`` (up-projected keys and values).
      window_capped: sliding-window layers keep only the pages their window still sees.
      scales: a quantized cache's scales, ``"tensor"`` (one float32 per layer for K and V) or ``"token"``
        (one bfloat16 per token for K and V).

    Raises:
      PlanError: a value out of range.
      MeshplanTypeError: a value of the wrong type.

    Example:
      >>> CacheFormat("contiguous").page_size
      1
    """

    layout: str = "paged"
    page_size: int = 16
    mla: str = "latent"
    window_capped: bool = False
    scales: str = "tensor"

    def __post_init__(self) -> None:
        as_choice(self.layout, "layout", CACHE_LAYOUTS, error=PlanError)
        as_choice(self.mla, "mla", ("latent", "heads"), error=PlanError)
        as_choice(self.scales, "scales", ("tensor", "token"), error=PlanError)
        as_flag(self.window_capped, "window_capped")
        page = as_count(self.page_size, "page_size", maximum=2**20, error=PlanError)
        object.__setattr__(self, "page_size", 1 if self.layout == "contiguous" else page)


@dataclasses.dataclass(frozen=True, slots=True)
class KvGeometry:
    """A replica's KV cache per device, as bytes per token and what that makes of a budget.

    Attributes:
      format: the engine's :class:`CacheFormat`.
      dtype: the cache dtype (:data:`~meshplan.pure.serve.KV_DTYPES`).
      ep: attention data-parallel ranks (each caches its own sequences).
      full_layers, window_layers: layers attending to everything / within ``window`` tokens.
      window: the sliding window (0: none).
      full_token_bytes: bytes one token costs a device in all full-attention layers together.
      window_token_bytes: the same in all window layers together.
      fixed_bytes: per device whatever the tokens (per-layer tensor scales).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> from meshplan.pure.serve import ServeLayout
      >>> g = kv_geometry(MODEL_SPECS["mistral-7b"], ServeLayout(1, 1), "bfloat16",
      ...                 CacheFormat("paged", 16, window_capped=True))
      >>> g.sequence_bytes(32768) == g.bytes_per_token * (4096 + 16)
      True
    """

    format: CacheFormat
    dtype: str
    ep: int
    full_layers: int
    window_layers: int
    window: int
    full_token_bytes: int
    window_token_bytes: int
    fixed_bytes: int

    @property
    def bytes_per_token(self) -> int:
        """What one more token costs a device while its sequence is within every window (all layers)."""
        return self.full_token_bytes + self.window_token_bytes

    def _pad(self, tokens: int) -> int:
        page = self.format.page_size
        return -(-tokens // page) * page

    def stored_tokens(self, context: int) -> tuple[int, int]:
        """Tokens a sequence of ``context`` tokens keeps in each full layer and in each window layer."""
        context = as_count(context, "context", maximum=_MAX_TOKENS, error=PlanError)
        if self.format.layout == "contiguous":
            return context, context
        full = self._pad(context)
        if not (self.window_layers and self.format.window_capped):
            return full, full
        cap = (-(-self.window // self.format.page_size) + 1) * self.format.page_size
        return full, min(full, cap)

    def sequence_bytes(self, context: int) -> int:
        """Bytes one sequence of ``context`` tokens takes on the device caching it."""
        full, window = self.stored_tokens(context)
        return self.full_token_bytes * full + self.window_token_bytes * window

    def cache_bytes(self, sequences: int, context: int) -> int:
        """Bytes each device of a replica holds for ``sequences`` sequences of ``context`` tokens."""
        sequences = as_count(sequences, "sequences", minimum=0, maximum=_MAX_TOKENS, error=PlanError)
        return -(-sequences // self.ep) * self.sequence_bytes(context) + self.fixed_bytes

    def read_bytes(self, sequences: int, context: int) -> int:
        """KV bytes a decode step reads on each device: the live tokens (a window layer's last ``window``);
        a contiguous cache's whole slots (MaxText's decode attends over the slot, masked)."""
        sequences = as_count(sequences, "sequences", minimum=0, maximum=_MAX_TOKENS, error=PlanError)
        context = as_count(context, "context", maximum=_MAX_TOKENS, error=PlanError)
        if self.format.layout == "contiguous":
            return self.cache_bytes(sequences, context)
        window = min(context, self.window) if self.window_layers else context
        per = self.full_token_bytes * context + self.window_token_bytes * window
        return -(-sequences // self.ep) * per + self.fixed_bytes

    def capacity_tokens(self, budget: int) -> int:
        """Tokens a replica's caches hold in a per-device budget, counting every layer's bytes (the figure vLLM
        logs as its KV cache size for a model without window layers); whole pages."""
        usable = max(0, _budget(budget) - self.fixed_bytes)
        page = self.format.page_size
        return self.ep * (usable // (self.bytes_per_token * page)) * page

    def max_sequences(self, context: int, budget: int) -> int:
        """The most sequences of ``context`` tokens a replica caches in a per-device budget."""
        usable = max(0, _budget(budget) - self.fixed_bytes)
        return self.ep * (usable // self.sequence_bytes(context))

    def max_context(self, sequences: int, budget: int, *, limit: int = _MAX_TOKENS) -> int:
        """The longest context (at most ``limit``) at which ``sequences`` sequences fit a per-device budget;
        0 when not even one token each does."""
        sequences = as_count(sequences, "sequences", maximum=_MAX_TOKENS, error=PlanError)
        limit = as_count(limit, "limit", maximum=_MAX_TOKENS, error=PlanError)
        budget = _budget(budget)
        if self.cache_bytes(sequences, 1) > budget:
            return 0
        lo, hi = 1, limit
        while lo < hi:  # the cache grows with the context: the last length that fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.cache_bytes(sequences, mid) <= budget else (lo, mid - 1)
        return lo


def _budget(budget: Any) -> int:
    """A per-device budget in bytes: an int (negative: nothing left)."""
    value = as_int(budget, "budget")
    if abs(value) > 2**60:
        raise PlanError(f"budget={value} bytes is beyond any device (at most 2**60).")
    return value


def _check_layout_type(layout: Any) -> ServeLayout:
    if not isinstance(layout, ServeLayout):
        raise MeshplanTypeError(f"layout={layout!r:.60} must be a ServeLayout(replicas, tp, ep).")
    return layout


def _per_layer_token_bytes(spec: ModelSpec, tp: int, fmt: CacheFormat, element: int, token_scaled: bool) -> int:
    scale = 2 * _BF16.itemsize if token_scaled else 0
    if spec.mla is not None and fmt.mla == "latent":
        return (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * element + (scale // 2)
    if spec.mla is not None:
        return spec.num_heads // tp * (spec.mla.qk_head_dim + spec.mla.v_head_dim) * element + scale
    kv_per_device = max(spec.num_kv_heads, tp) // tp
    return 2 * kv_per_device * spec.head_dim * element + scale


def _check_format(fmt: Any) -> CacheFormat:
    if not isinstance(fmt, CacheFormat):
        raise MeshplanTypeError(f"format={fmt!r:.60} must be a CacheFormat (an engine's: engine_cache_format).")
    return fmt


def kv_geometry(spec: ModelSpec, layout: ServeLayout, dtype: str, fmt: CacheFormat) -> KvGeometry:
    """The KV cache geometry of ``spec`` on ``layout``, cached in ``dtype`` as ``fmt`` lays it out.

    Raises:
      PlanError: an unknown dtype, or a layout that cannot split the model.
      MeshplanTypeError: arguments of the wrong type.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> from meshplan.pure.serve import ServeLayout
      >>> kv_geometry(MODEL_SPECS["deepseek-v3"], ServeLayout(1, 8), "bfloat16", CacheFormat()).bytes_per_token
      70272
    """
    spec = as_model_spec(spec)
    fmt = _check_format(fmt)
    dtype = kv_dtype(dtype)
    check_layout(spec, layout)
    element = int(kv_element_dtype(dtype).itemsize)
    quantized = dtype != "bfloat16"
    per_layer = _per_layer_token_bytes(spec, layout.tp, fmt, element, quantized and fmt.scales == "token")
    window_layers = spec.sliding_window_layers if spec.sliding_window else 0
    full_layers = spec.num_layers - window_layers
    tensors = 1 if spec.mla is not None and fmt.mla == "latent" else 2  # the latent, or K and V
    fixed = tensors * _F32.itemsize * spec.num_layers if quantized and fmt.scales == "tensor" else 0
    return KvGeometry(fmt, dtype, layout.ep, full_layers, window_layers, spec.sliding_window,
                      per_layer * full_layers, per_layer * window_layers, fixed)


def kv_cache_tree(spec: ModelSpec, layout: ServeLayout, geometry: KvGeometry, *, sequences: int,
                  context: int) -> tuple[dict[str, Any], dict[str, PartitionSpec]]:
    """The cache arrays of one replica holding ``sequences`` sequences of ``context`` tokens, and their specs.

    Every layer is cached at the full ``context`` (window layers too: the reference decode step does not
    free what a window left behind), so the arrays' bytes per device equal
    ``geometry.cache_bytes(sequences, context)`` for a geometry whose format has ``window_capped=False``.

    Keys: ``k`` / ``v`` (GQA, or MLA's heads form) or ``latent`` (MLA's latent form), each with the layers
    stacked first; a paged cache is ``(layers, ep x pages, page_size, ...)`` with ``block_table``
    ``(sequences, pages_per_sequence)`` int32 among the step's inputs (:func:`decode_inputs_tree`); a
    contiguous one ``(layers, sequences, context, ...)``. A
    quantized cache adds ``k_scale`` / ``v_scale`` (``latent_scale``): float32 ``(layers,)`` per-layer scales,
    or bfloat16 per-token ones shaped like the cache without its last dims.

    Raises:
      PlanError: a geometry that caps windows (its bytes are not those of these arrays), bad counts.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> from meshplan.pure.serve import ServeLayout
      >>> spec, layout = MODEL_SPECS["llama3-8b"], ServeLayout(1, 2)
      >>> g = kv_geometry(spec, layout, "bfloat16", CacheFormat("contiguous"))
      >>> tree, specs = kv_cache_tree(spec, layout, g, sequences=4, context=64)
      >>> tree["k"].shape, specs["k"]
      ((32, 4, 64, 8, 128), P(None, 'ep', None, 'tp', None))
    """
    spec = as_model_spec(spec)
    _check_layout_type(layout)
    if not isinstance(geometry, KvGeometry):
        raise MeshplanTypeError(f"geometry={geometry!r:.60} must be a KvGeometry (from kv_geometry).")
    if geometry.format.window_capped and geometry.window_layers:
        raise PlanError("kv_cache_tree lays every layer out at the full context; pass the geometry of a format "
                        "with window_capped=False.")
    sequences = as_count(sequences, "sequences", maximum=2**31, error=PlanError)
    context = as_count(context, "context", maximum=2**31, error=PlanError)
    fmt, ep, layers = geometry.format, layout.ep, spec.num_layers
    per_rank = -(-sequences // ep)
    element = kv_element_dtype(geometry.dtype)
    if fmt.layout == "paged":
        pages = -(-context // fmt.page_size)
        lead, lead_spec = (ep * per_rank * pages, fmt.page_size), ("ep", None)
    else:
        lead, lead_spec = (ep * per_rank, context), ("ep", None)
    widths: dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]
    if spec.mla is not None and fmt.mla == "latent":
        widths = {"latent": ((spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim,), (None,))}
    elif spec.mla is not None:
        heads = spec.num_heads
        widths = {"k": ((heads, spec.mla.qk_head_dim), ("tp", None)), "v": ((heads, spec.mla.v_head_dim), ("tp", None))}
    else:
        kv = max(spec.num_kv_heads, layout.tp)
        widths = {name: ((kv, spec.head_dim), ("tp", None)) for name in ("k", "v")}
    tree: dict[str, Any] = {}
    specs: dict[str, PartitionSpec] = {}
    for name, (tail, tail_spec) in widths.items():
        tree[name] = make_struct((layers, *lead, *tail), element)
        specs[name] = make_spec(None, *lead_spec, *tail_spec)
        if geometry.dtype != "bfloat16" and fmt.scales == "token":
            tree[f"{name}_scale"] = make_struct((layers, *lead, 1), _BF16)
            specs[f"{name}_scale"] = make_spec(None, *lead_spec, None)
        elif geometry.dtype != "bfloat16":
            tree[f"{name}_scale"] = make_struct((layers,), _F32)
            specs[f"{name}_scale"] = make_spec(None)
    return tree, specs


def decode_inputs_tree(layout: ServeLayout, geometry: KvGeometry, *, sequences: int,
                       context: int) -> tuple[dict[str, Any], dict[str, PartitionSpec]]:
    """A decode step's other inputs: ``tokens`` and ``positions`` (int32, one per sequence) and, for a paged
    cache, ``block_table`` (int32 ``(sequences, pages_per_sequence)``); sequences split over ``ep``.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> from meshplan.pure.serve import ServeLayout
      >>> layout = ServeLayout(1, 2)
      >>> g = kv_geometry(MODEL_SPECS["llama3-8b"], layout, "bfloat16", CacheFormat("paged", 16))
      >>> decode_inputs_tree(layout, g, sequences=4, context=64)[0]["block_table"].shape
      (4, 4)
    """
    _check_layout_type(layout)
    if not isinstance(geometry, KvGeometry):
        raise MeshplanTypeError(f"geometry={geometry!r:.60} must be a KvGeometry (from kv_geometry).")
    sequences = as_count(sequences, "sequences", maximum=2**31, error=PlanError)
    context = as_count(context, "context", maximum=2**31, error=PlanError)
    rows = layout.ep * -(-sequences // layout.ep)
    i32 = np.dtype(np.int32)
    tree: dict[str, Any] = {"tokens": make_struct((rows,), i32), "positions": make_struct((rows,), i32)}
    specs: dict[str, PartitionSpec] = {"tokens": make_spec("ep"), "positions": make_spec("ep")}
    if geometry.format.layout == "paged":
        tree["block_table"] = make_struct((rows, -(-context // geometry.format.page_size)), i32)
        specs["block_table"] = make_spec("ep", None)
    return tree, specs


def decode_input_bytes(layout: ServeLayout, geometry: KvGeometry, *, sequences: int, context: int) -> int:
    """Bytes per device of :func:`decode_inputs_tree` (8 per sequence, plus the block table's rows).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> from meshplan.pure.serve import ServeLayout
      >>> layout = ServeLayout(1, 1)
      >>> g = kv_geometry(MODEL_SPECS["llama3-8b"], layout, "bfloat16", CacheFormat("paged", 16))
      >>> decode_input_bytes(layout, g, sequences=4, context=64)
      96
    """
    _check_layout_type(layout)
    if not isinstance(geometry, KvGeometry):
        raise MeshplanTypeError(f"geometry={geometry!r:.60} must be a KvGeometry (from kv_geometry).")
    context = as_count(context, "context", maximum=2**31, error=PlanError)
    per_rank = -(-as_count(sequences, "sequences", maximum=2**31, error=PlanError) // layout.ep)
    pages = -(-context // geometry.format.page_size) if geometry.format.layout == "paged" else 0
    return per_rank * 4 * (2 + pages)
