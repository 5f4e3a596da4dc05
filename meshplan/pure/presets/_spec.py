"""Model metadata (:class:`ModelSpec`) and the shape-tree helpers presets share.

Layout of every preset tree (documented once here):

- nested ``dict``s with ``str`` keys, one level per dot in the Hugging Face
  ``state_dict`` name, so ``".".join(path)`` is the HF name
  (``model.layers.0.self_attn.q_proj.weight``) and meshplan's ``path_str``
  gives ``model/layers/0/self_attn/q_proj/weight``;
- layer indices are ``str`` keys ``"0"``, ``"1"``, ... (not a list), exactly
  as in the HF names. jax flattens dicts in sorted key order, so leaf order
  goes ``"0", "1", "10", ...``: deterministic, but not numeric;
- leaves are ``jax.ShapeDtypeStruct`` with no sharding; every leaf has the
  preset's ``dtype`` (norm weights and biases included). Leaves of equal
  shape may be the SAME (immutable) object, which keeps a 45k-leaf tree cheap
  to build: treat leaves as values, never key anything on ``id(leaf)``;
- ``torch.nn.Linear`` weights are ``(out_features, in_features)``; GPT-2's
  ``Conv1D`` weights are ``(in_features, out_features)``, as HF stores them;
- stacked experts (the default) put the expert index first:
  ``...experts.gate_proj.weight`` of shape ``(num_experts, out, in)``;
  ``unstack_experts=True`` gives HF's per-expert leaves
  ``...experts.0.gate_proj.weight`` of shape ``(out, in)``. Totals agree.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeAlias

import jax
import numpy as np

from meshplan.pure._check import as_count, collect
from meshplan.pure._types import PyTree, Shape, make_struct
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.specs._dtypes import canonical_dtype
from meshplan.pure.specs._tree import tree_facts

__all__ = ["FAMILIES", "MLADims", "ModelSpec", "ShapeTree", "count_params", "pricing_notes"]

FAMILIES: tuple[str, ...] = ("deepseek_v2", "deepseek_v3", "gemma", "gpt2", "llama", "mixtral", "qwen3_moe")
"""The weight layouts :func:`~meshplan.pure.presets.build_params` builds (``ModelSpec.family``)."""

ShapeTree: TypeAlias = dict[str, "ShapeTree | jax.ShapeDtypeStruct"]
"""A preset's parameter tree: nested ``str``-keyed dicts of ``ShapeDtypeStruct`` leaves."""


@dataclasses.dataclass(frozen=True, slots=True)
class MLADims:
    """DeepSeek's multi-head latent attention sizes (per head where noted).

    ``q_lora_rank=0`` means the queries are not compressed: one ``q_proj``
    ``(heads * qk_head_dim, hidden)`` instead of ``q_a_proj`` / ``q_b_proj``.

    Example:
      >>> MLADims(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
      ...         qk_rope_head_dim=64, v_head_dim=128).qk_head_dim
      192
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        # q_lora_rank 0: no query compression (DeepSeek-V2-Lite's q_proj), as MaxText writes it.
        _check_counts(self, ["q_lora_rank"], minimum=0)
        _check_counts(self, [f.name for f in dataclasses.fields(self) if f.name != "q_lora_rank"], minimum=1)

    @property
    def qk_head_dim(self) -> int:
        """Query/key size per head: the no-rope part plus the rope part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    """The sizes a planner needs about a transformer, without its weights.

    Attributes:
      name: registry name, e.g. ``"llama3-8b"``.
      family: the weight layout (:data:`FAMILIES`): ``"gpt2"``; ``"llama"``
        (Llama, Mistral, Qwen2/2.5, Qwen3 dense); ``"mixtral"``; ``"qwen3_moe"``;
        ``"gemma"`` (Gemma 2/3: four norms a layer); ``"deepseek_v2"``, ``"deepseek_v3"``.
      vocab_size, hidden_size, num_layers: the usual sizes.
      num_heads: attention (query) heads; tensor parallelism must divide it.
      num_kv_heads: key/value heads (``== num_heads`` without GQA).
      head_dim: size of one head (for MLA, the value head size).
      intermediate_size: the dense MLP's hidden size.
      num_experts: routed experts per MoE layer; 0 for dense models. Expert
        parallelism must divide it.
      num_experts_per_tok: experts each token is routed to (0 when dense).
      moe_intermediate_size: one expert's hidden size (0 when dense).
      num_shared_experts: always-on experts per MoE layer.
      num_dense_layers: in an MoE model, the leading layers that keep a dense
        MLP (3 for DeepSeek-V3, 0 for Mixtral); ignored when dense.
      tied_embeddings: whether the output head reuses the input embedding.
      max_position_embeddings: learned position table rows (GPT-2), else 0.
      mla: DeepSeek's latent-attention sizes, else ``None``.
      num_params: the published parameter total, if known.
      qkv_bias: q/k/v projections carry biases (Qwen2/2.5).
      qk_norm: per-head RMSNorm weights on queries and keys, ``head_dim``
        each (Qwen3, Gemma 3).
      sliding_window: tokens a local-attention layer sees (0: every layer
        attends to the whole sequence).
      sliding_window_layers: how many of the layers use that window (Mistral
        v0.1 all 32, Gemma 2 half, Gemma 3 five in six); at most ``num_layers``:
        a larger value, e.g. after ``dataclasses.replace(spec, num_layers=2)``,
        is read as every layer, and it is 0 without a window.

    Raises:
      PlanError: inconsistent sizes (every problem listed at once).
      MeshplanTypeError: a count that is not an int.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> s = MODEL_SPECS["mixtral-8x7b"]
      >>> (s.num_heads, s.num_kv_heads, s.num_experts, s.num_moe_layers)
      (32, 8, 8, 32)
    """

    name: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    tied_embeddings: bool = False
    max_position_embeddings: int = 0
    mla: MLADims | None = None
    num_params: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0
    sliding_window_layers: int = 0

    def __post_init__(self) -> None:
        for name in ("name", "family"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise MeshplanTypeError(f"ModelSpec.{name}={getattr(self, name)!r} must be a non-empty str.")
        problems = _check_counts(self, ["vocab_size", "hidden_size", "num_layers", "num_heads",
                                        "num_kv_heads", "head_dim", "intermediate_size"],
                                 minimum=1, raise_now=False)
        problems += _check_counts(self, ["num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                         "num_shared_experts", "num_dense_layers",
                                         "max_position_embeddings", "sliding_window", "sliding_window_layers"],
                                 minimum=0, raise_now=False)
        if not problems:
            problems += self._consistency_problems()
        if problems:
            raise PlanError(f"ModelSpec {self.name!r}: " + "; ".join(problems) + ".")

    def _consistency_problems(self) -> list[str]:
        problems = []
        if self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads={self.num_heads} must be a multiple of "
                            f"num_kv_heads={self.num_kv_heads}")
        if self.num_dense_layers > self.num_layers:
            problems.append(f"num_dense_layers={self.num_dense_layers} exceeds num_layers={self.num_layers}")
        moe = (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size)
        if self.num_experts and not all(moe):
            problems.append("an MoE model needs num_experts, num_experts_per_tok and "
                            "moe_intermediate_size all > 0")
        if self.num_experts_per_tok > self.num_experts:
            problems.append(f"num_experts_per_tok={self.num_experts_per_tok} exceeds "
                            f"num_experts={self.num_experts}")
        if self.num_params is not None and (isinstance(self.num_params, bool)
                                            or not isinstance(self.num_params, int)
                                            or self.num_params < 1):
            problems.append(f"num_params={self.num_params!r} must be a positive int or None")
        for flag in ("tied_embeddings", "qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, flag), bool):
                problems.append(f"{flag}={getattr(self, flag)!r} must be a bool")
        # Canonical, so dataclasses.replace(spec, num_layers=2) of a windowed preset stays a spec: at most
        # every layer uses the window, and without a window no layer does.
        if self.sliding_window_layers > self.num_layers or not self.sliding_window:
            object.__setattr__(self, "sliding_window_layers",
                               min(self.sliding_window_layers, self.num_layers) if self.sliding_window else 0)
        if self.sliding_window and not self.sliding_window_layers:
            problems.append(f"sliding_window={self.sliding_window} needs sliding_window_layers >= 1 (the layers "
                            f"that use it; 0 for none means sliding_window=0)")
        if self.mla is not None and not isinstance(self.mla, MLADims):
            problems.append(f"mla={self.mla!r} must be an MLADims or None")
        return problems

    @property
    def is_moe(self) -> bool:
        """Whether any layer routes tokens to experts."""
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with a routed-expert MLP (0 for a dense model)."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) routes tokens to experts."""
        return self.is_moe and index >= self.num_dense_layers


def pricing_notes(spec: ModelSpec, *, seq: int | None = None) -> tuple[str, ...]:
    """What a plan of ``spec`` prices differently from the model (printed in the plan's header).

    Sliding-window layers are priced as full attention: the reference step, like XLA's
    ``dot_product`` lowering, computes the whole masked ``seq x seq`` score matrix, so memory and
    FLOPs are those of full attention; a kernel that skips the blocks outside the window does less.
    With ``seq`` at most the window the two are the same and no note is given.

    Args:
      spec: the model.
      seq: tokens per sequence of the step, when known.

    Returns:
      Zero or more sentences.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> pricing_notes(MODEL_SPECS["gemma3-27b"], seq=4096)[0][:60]
      '52 of 62 layers attend within a 1024-token sliding window; p'
      >>> pricing_notes(MODEL_SPECS["mistral-7b"], seq=4096)
      ()
    """
    spec = as_model_spec(spec)
    if not spec.sliding_window or (seq is not None and seq <= spec.sliding_window):
        return ()
    return (f"{spec.sliding_window_layers} of {spec.num_layers} layers attend within a {spec.sliding_window}-token "
            "sliding window; priced as full attention (the whole masked score matrix, as XLA's dot_product "
            "lowering computes it; a flash kernel that skips blocks outside the window does less)",)


def _check_counts(obj: Any, names: list[str], *, minimum: int, raise_now: bool = True) -> list[str]:
    """Check (with :func:`~meshplan.pure._check.as_count`) and canonicalize count fields of ``obj``.

    A value that is not an int raises at once; counts below ``minimum`` are
    returned (or, with ``raise_now``, raised together as one PlanError).
    """
    problems: list[str] = []
    type_errors: list[str] = []
    for name in names:
        value = collect(type_errors, problems, as_count, getattr(obj, name), name, minimum=minimum, error=PlanError)
        if type_errors:
            raise MeshplanTypeError(f"{type(obj).__name__}.{type_errors[0]}.")
        if value is not None:
            object.__setattr__(obj, name, value)  # numpy ints become Python ints
    if problems and raise_now:
        raise PlanError(f"{type(obj).__name__}: " + "; ".join(problems) + ".")
    return problems


class _Leaves:
    """Makes one ``ShapeDtypeStruct`` per distinct shape and reuses it.

    A 671B-parameter tree has ~45k leaves but a handful of distinct shapes;
    sharing the (immutable) structs keeps building it in milliseconds.
    """

    __slots__ = ("_cache", "dtype")

    def __init__(self, dtype: Any) -> None:
        self.dtype = preset_dtype(dtype)
        self._cache: dict[Shape, jax.ShapeDtypeStruct] = {}

    def __call__(self, *shape: int) -> jax.ShapeDtypeStruct:
        leaf = self._cache.get(shape)
        if leaf is None:
            leaf = self._cache[shape] = make_struct(shape, self.dtype)
        return leaf


def decoder_tree(spec: ModelSpec, leaf: _Leaves, layer: Callable[[int], ShapeTree]) -> ShapeTree:
    """The Hugging Face decoder skeleton shared by the Llama-family presets.

    ``model.embed_tokens``, ``model.layers.<i>`` (built by ``layer(i)``),
    ``model.norm`` and, unless the embeddings are tied, ``lm_head``.
    """
    d, v = spec.hidden_size, spec.vocab_size
    tree: ShapeTree = {
        "model": {
            "embed_tokens": {"weight": leaf(v, d)},
            "layers": {str(i): layer(i) for i in range(spec.num_layers)},
            "norm": {"weight": leaf(d)},
        }
    }
    if not spec.tied_embeddings:
        tree["lm_head"] = {"weight": leaf(v, d)}
    return tree


def preset_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a numpy dtype a weight can have; MeshplanTypeError otherwise."""
    out = canonical_dtype(dtype)
    # Extended (PRNG key) dtypes, objects, strings and datetimes are not weights.
    if not isinstance(out, np.dtype) or out.kind in "OSUMm":
        raise MeshplanTypeError(f"dtype={dtype!r} cannot hold weights; use e.g. jnp.bfloat16 or np.float32.")
    return out


def as_model_spec(spec: Any, what: str = "spec") -> ModelSpec:
    """``spec`` checked to be a :class:`ModelSpec` (the shape-tree builders take nothing else)."""
    if not isinstance(spec, ModelSpec):
        raise MeshplanTypeError(f"{what}={spec!r:.80} must be a ModelSpec (e.g. MODEL_SPECS['gpt2']), not "
                                f"{type(spec).__name__}.")
    return spec


def count_params(tree: PyTree) -> int:
    """Total elements over the leaves of ``tree`` that have a ``.shape``.

    Args:
      tree: any pytree of arrays or ``ShapeDtypeStruct``s; other leaves
        (``None``, scalars without a shape) count 0.

    Returns:
      The sum of ``prod(leaf.shape)``, an exact Python int.

    Example:
      >>> import jax, numpy as np
      >>> count_params({"w": jax.ShapeDtypeStruct((3, 4), np.float32), "b": None})
      12
    """
    # tree_facts decides what an array leaf is, once for the whole package
    # (a numpy scalar type or a string .shape is not one); Python scalars,
    # which it reads as 0-d arrays, have no .shape and count 0 here.
    facts = tree_facts(tree)
    leaves = facts.treedef.flatten_up_to(facts.source)
    return sum(math.prod(info.shape) for leaf, info in zip(leaves, facts.infos, strict=True)
               if info is not None and hasattr(leaf, "shape"))
