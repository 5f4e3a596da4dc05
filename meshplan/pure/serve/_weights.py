"""The weights a serving replica holds, leaf by leaf: the Hugging Face tree of the preset, laid out for ``ep x tp``.

The layout (one replica's mesh is ``{"ep": ep, "tp": tp}``; every other replica holds the same):

- ``embed_tokens`` and ``lm_head``: the vocabulary split ``tp`` ways, padded to a multiple of ``lcm(64, tp)``
  rows (vLLM's ``VocabParallelEmbedding`` pads to 64 and splits the padded table);
- q / k / v projections and their biases: split over heads (``P("tp", None)``); where ``tp`` exceeds the kv
  heads, the k / v projections are stored ``tp`` heads wide, each kv head copied ``tp / kv`` times, so every
  device holds one (vLLM's ``QKVParallelLinear``); ``o_proj``: split over its input (``P(None, "tp")``);
- MLA: the down-projections ``q_a_proj`` / ``kv_a_proj_with_mqa`` and their norms replicated (vLLM's
  ``ReplicatedLinear``), the up-projections ``q_b_proj`` / ``kv_b_proj`` split over heads;
- dense MLP and shared experts: gate / up split over their output, down over its input;
- routed experts: each expert's width split ``tp`` ways when ``ep == 1``; split whole over all ``ep x tp``
  devices when ``ep > 1``; the router and norms replicated.

Quantized weights (:class:`~meshplan.pure.serve.WeightQuant`) replace each linear ``weight`` with its 1-byte
elements and add a float32 ``weight_scale`` beside it, split like the weight's output dim. Every split divides
its dim (:func:`~meshplan.pure.serve.check_layout` refuses the layouts where one would not), so every device of
a replica holds exactly the same bytes, and :func:`weight_bytes` is exact: the reference decode step
(``meshplan.facade``) compiles this very tree, and XLA's argument bytes equal it.

Example:
  >>> from meshplan.pure.presets import MODEL_SPECS
  >>> from meshplan.pure.serve import ServeLayout
  >>> w = weight_bytes(MODEL_SPECS["llama3-8b"], ServeLayout(1, 1))
  >>> w.total == 2 * MODEL_SPECS["llama3-8b"].num_params
  True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax.sharding import PartitionSpec

from meshplan.pure._check import as_count
from meshplan.pure._types import make_spec, make_struct
from meshplan.pure.errors import PlanError
from meshplan.pure.presets._registry import build_params
from meshplan.pure.presets._spec import ModelSpec, as_model_spec
from meshplan.pure.serve._layout import ServeLayout, check_layout
from meshplan.pure.serve._quant import WeightQuant, weight_quant
from meshplan.pure.specs._geometry import shard_shape

__all__ = ["SERVED_FAMILIES", "WeightBytes", "kv_heads_stored", "padded_vocab", "serving_params", "weight_bytes"]

SERVED_FAMILIES: tuple[str, ...] = ("deepseek_v2", "deepseek_v3", "gemma", "llama", "mixtral", "qwen3_moe")
"""The decoder families a serving plan lays out (GPT-2's learned positions and fused Conv1D are not)."""

_VOCAB_PAD = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
_COLUMN = frozenset({"q_proj", "k_proj", "v_proj", "q_b_proj", "kv_b_proj", "gate_proj", "up_proj", "w1", "w3"})
_ROW = frozenset({"o_proj", "down_proj", "w2"})
_REPLICATED_LINEAR = frozenset({"q_a_proj", "kv_a_proj_with_mqa"})


def padded_vocab(vocab: int, tp: int) -> int:
    """Rows of the embedding / head table of a ``tp``-way replica: ``vocab`` rounded up to ``lcm(64, tp)``.

    Example:
      >>> padded_vocab(50257, 1), padded_vocab(128256, 8)
      (50304, 128256)
    """
    vocab = as_count(vocab, "vocab", maximum=2**40, error=PlanError)
    tp = as_count(tp, "tp", maximum=2**22, error=PlanError)
    unit = math.lcm(_VOCAB_PAD, tp)
    return -(-vocab // unit) * unit


def kv_heads_stored(spec: ModelSpec, tp: int) -> int:
    """kv heads a replica stores in all: the model's, or ``tp`` of them where ``tp`` exceeds them (copies).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> kv_heads_stored(MODEL_SPECS["llama3-70b"], 4), kv_heads_stored(MODEL_SPECS["llama3-70b"], 16)
      (8, 16)
    """
    spec = as_model_spec(spec)
    return max(spec.num_kv_heads, as_count(tp, "tp", maximum=2**22, error=PlanError))


@dataclasses.dataclass(frozen=True, slots=True)
class WeightBytes:
    """The weight bytes one device of a replica holds (every device of it holds the same).

    Attributes:
      total: all of them.
      embedding: the input embedding table (a decode step reads only the rows of its tokens); 0 when the head
        shares it (tied embeddings: the head reads it whole).
      experts: the routed experts (a decode step reads only the experts its tokens chose).
      num_experts_per_device: routed experts whose weights sit on each device (their full number when each
        expert is split ``tp`` ways; ``E / (ep x tp)`` when split whole), summed over MoE layers' one layer.
      quant: how the linear weights are stored.

    Example:
      >>> WeightBytes(100, 10, 50, 4, WeightQuant()).dense
      40
    """

    total: int
    embedding: int
    experts: int
    num_experts_per_device: int
    quant: WeightQuant

    @property
    def dense(self) -> int:
        """Everything a decode step reads whole: all but the input embedding and the routed experts."""
        return self.total - self.embedding - self.experts


def _leaf_specs(path: tuple[str, ...], shape: tuple[int, ...], layout: ServeLayout) -> PartitionSpec:
    """The PartitionSpec of one Hugging Face leaf (``path`` its keys) in the serving layout."""
    name, parent = path[-1], path[-2] if len(path) > 1 else ""
    owner = path[-3] if len(path) > 2 else ""
    if parent in ("embed_tokens", "lm_head"):
        return make_spec("tp", None)
    if owner == "experts" or parent == "experts":  # stacked experts (E, out, in)
        if layout.ep > 1:
            return make_spec(("ep", "tp"), None, None)
        return make_spec(None, "tp", None) if parent in _COLUMN or owner in _COLUMN else make_spec(None, None, "tp")
    if parent in _COLUMN:
        return make_spec("tp", None) if name == "weight" else make_spec("tp")
    if parent in _ROW:
        return make_spec(None, "tp")
    return make_spec(*([None] * len(shape)))  # norms, the router, MLA's down-projections: replicated


def _is_linear(path: tuple[str, ...]) -> bool:
    if path[-1] != "weight" or len(path) < 2:
        return False
    parent, owner = path[-2], path[-3] if len(path) > 2 else ""
    return parent in _COLUMN | _ROW | _REPLICATED_LINEAR and owner not in ("embed_tokens", "lm_head")


def _reshape(path: tuple[str, ...], shape: tuple[int, ...], spec: ModelSpec, layout: ServeLayout) -> tuple[int, ...]:
    """The leaf's stored shape: the vocabulary padded, k / v widened to ``tp`` heads where ``tp`` exceeds them."""
    parent = path[-2] if len(path) > 1 else ""
    if parent in ("embed_tokens", "lm_head"):
        return (padded_vocab(shape[0], layout.tp), *shape[1:])
    if parent in ("k_proj", "v_proj") and spec.mla is None and layout.tp > spec.num_kv_heads:
        return (layout.tp * spec.head_dim, *shape[1:])
    return shape


def _walk(tree: Any, path: tuple[str, ...], spec: ModelSpec, layout: ServeLayout, quant: WeightQuant,
          out_tree: dict[str, Any], out_specs: dict[str, Any]) -> None:
    for key in sorted(tree):
        value, here = tree[key], (*path, key)
        if isinstance(value, Mapping):
            out_tree[key], out_specs[key] = {}, {}
            _walk(value, here, spec, layout, quant, out_tree[key], out_specs[key])
            continue
        shape = _reshape(here, tuple(value.shape), spec, layout)
        pspec = _leaf_specs(here, shape, layout)
        if quant.quantized and _is_linear(here):
            out_tree[key] = make_struct(shape, quant.element_dtype)
            out_specs[key] = pspec
            entries = tuple(pspec) + (None,) * (len(shape) - len(tuple(pspec)))
            scale = quant.scale_shape(shape)
            out_tree[f"{key}_scale"] = make_struct(scale, _F32)
            out_specs[f"{key}_scale"] = make_spec(*entries[: len(scale)])
        else:
            out_tree[key] = make_struct(shape, _BF16)
            out_specs[key] = pspec


def _check_family(spec: ModelSpec) -> None:
    if spec.family not in SERVED_FAMILIES:
        raise PlanError(f"{spec.name}: serving plans cover the {list(SERVED_FAMILIES)} families; "
                        f"{spec.family!r} is not laid out (GPT-2's learned positions and fused Conv1D weights).")


def serving_params(spec: ModelSpec, layout: ServeLayout, quant: WeightQuant | str = "bfloat16",
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One replica's weights as a tree of ``ShapeDtypeStruct`` and the matching PartitionSpecs.

    Args:
      spec: the model (a family of :data:`SERVED_FAMILIES`).
      layout: the serving layout; its ``ep`` and ``tp`` axes name the specs.
      quant: how the linear weights are stored (a dtype name or a :class:`~meshplan.pure.serve.WeightQuant`).

    Returns:
      ``(tree, specs)``: nested dicts in the Hugging Face layout of :func:`~meshplan.pure.presets.build_params`
      (experts stacked), quantized linears with a ``weight_scale`` beside each ``weight``.

    Raises:
      PlanError: a family not served, or a layout that cannot split the model (every problem listed).
      MeshplanTypeError: arguments of the wrong type.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> tree, specs = serving_params(MODEL_SPECS["llama3-70b"], ServeLayout(1, 16))
      >>> tree["model"]["layers"]["0"]["self_attn"]["k_proj"]["weight"].shape
      (2048, 8192)
    """
    spec = as_model_spec(spec)
    _check_family(spec)
    quant = weight_quant(quant)
    check_layout(spec, layout)
    tree: dict[str, Any] = {}
    specs: dict[str, Any] = {}
    _walk(build_params(spec), (), spec, layout, quant, tree, specs)
    return tree, specs


def _shard_bytes(leaf: jax.ShapeDtypeStruct, pspec: PartitionSpec, axes: Mapping[str, int]) -> int:
    return math.prod(shard_shape(leaf.shape, pspec, axes)) * int(np.dtype(leaf.dtype).itemsize)


def weight_bytes(spec: ModelSpec, layout: ServeLayout, quant: WeightQuant | str = "bfloat16") -> WeightBytes:
    """Exact weight bytes on each device of a replica (the sum over :func:`serving_params`' shards).

    Raises:
      PlanError: as :func:`serving_params`.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> w = weight_bytes(MODEL_SPECS["mixtral-8x7b"], ServeLayout(1, 2, ep=4), "int8")
      >>> w.num_experts_per_device, w.total < w.experts * 2
      (1, True)
    """
    quant = weight_quant(quant)
    tree, specs = serving_params(spec, layout, quant)
    axes = layout.replica_axes
    total = embedding = experts = 0
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for (keys, leaf), pspec in zip(leaves, flat_specs, strict=True):
        path = tuple(str(getattr(k, "key", k)) for k in keys)
        nbytes = _shard_bytes(leaf, pspec, axes)
        total += nbytes
        if "experts" in path and "shared_experts" not in path:
            experts += nbytes
        if "embed_tokens" in path and not spec.tied_embeddings:
            embedding += nbytes
    per_device = spec.num_experts // layout.devices_per_replica if layout.ep > 1 else spec.num_experts
    return WeightBytes(total, embedding, experts, per_device, quant)
