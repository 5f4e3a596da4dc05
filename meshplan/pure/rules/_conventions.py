"""Tree conventions: what a parameter's path and shape say about each of its dims.

JAX users write parameter trees in several conventions, and a planner that
reads only Hugging Face PyTorch names gets the others wrong (a flax ``kernel``
is ``(in, out)``, a PyTorch ``weight`` is ``(out, in)``). This module is the
one place that reads them. It sees only paths, shapes and dtypes:

- :func:`normalize_path` puts a key path in one form: ``"a/b/0"``, without
  a leading ``params/`` (linen's ``{"params": ...}``), without box tails
  (nnx ``Variable`` and linen ``nn.Partitioned`` leaves end in ``/value``;
  old flax in ``/raw_value``), whatever way the path was written
  (``"['params']['q_proj'].value"``, ``".layers[0].weight"``,
  ``"model.layers.0.q_proj.weight"``, a jax key path tuple).
- :func:`leaf_layout` derives each dim's meaning (:data:`DIM_KINDS`) and the
  leaf's tensor-parallel role from the normalised path, the convention and
  the shape:

  ============  ==============================  ===============================
  parameter     convention                      dims
  ============  ==============================  ===============================
  ``kernel``    flax nnx / linen / HF Flax      ``(in, out)``
  ``kernel``    q/k/v of ``DenseGeneral``       ``(in, heads, head_dim)``
  ``kernel``    out of ``DenseGeneral``         ``(heads, head_dim, out)``
  ``weight``    PyTorch / HF / equinox          ``(out, in)``
  ``weight``    GPT-2 ``Conv1D`` (c_attn ...)   ``(in, out)``
  ``embedding`` flax ``Embed``                  ``(vocab, embed)``
  ``scale``     norms                           ``(embed,)``
  ============  ==============================  ===============================

  Leading extra dims are stacks: ``experts`` (a stacked-expert leaf, one
  under an ``experts`` / ``moe`` component with no expert index after it)
  and ``layers`` (``nn.scan`` / ``lax.scan`` / ``nnx.vmap``-stacked layers);
  MaxText scans at ``param_scan_axis=1``, so with ``convention="maxtext"`` a
  leaf under a ``layers`` component has its ``layers`` dim at dim 1.
- an explicit ``dims=`` override wins over everything.

Roles (``column`` splits its output features or heads over tp, ``row`` its
input features or heads, ``vocab`` the vocabulary) come from the module name
(``q_proj``, ``query``, ``wq``, ``w1``, ``wi_0``, ``lm_head``, ...), the same
table for every convention; the dims say *where* those features are.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from meshplan.pure._check import as_count, as_sequence, as_shape, as_str
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError

__all__ = ["CONVENTIONS", "DIM_KINDS", "LeafLayout", "leaf_layout", "normalize_path"]

CONVENTIONS: tuple[str, ...] = ("auto", "flax", "torch", "maxtext")
"""``auto`` reads the parameter name (``kernel`` -> flax, ``weight`` -> PyTorch / equinox);
``flax`` / ``torch`` force a linear layout for every leaf; ``maxtext`` is flax with
``DenseGeneral`` attention and, under a ``layers`` component (a scanned decoder), the
layer stack at dim 1."""

DIM_KINDS: tuple[str, ...] = ("layers", "experts", "in", "out", "heads", "head_dim", "vocab", "embed", "other")
"""What a dim can mean."""

_BOX_TAILS = frozenset({"value", "raw_value"})
_PREFIXES = frozenset({"params"})
_KERNELS = frozenset({"kernel", "w"})  # flax, Haiku: (in, out)
_WEIGHTS = frozenset({"weight"})  # PyTorch, equinox: (out, in)
_PARAM_NAMES = frozenset({"kernel", "weight", "w", "bias", "b", "embedding", "scale"})

_COLUMN = frozenset({
    "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "gate_up_proj", "w1", "w3", "q_b_proj", "kv_b_proj",
    "c_attn", "c_fc", "query", "key", "value", "qkv", "qkv_proj", "query_key_value", "wq", "wk", "wv", "wqkv",
    "wi", "wi_0", "wi_1", "fc1", "fc_in", "lm_head", "logits_dense",
})
_ROW = frozenset({"o_proj", "out_proj", "down_proj", "w2", "c_proj", "out", "wo", "fc2", "fc_out"})
_VOCAB = frozenset({"embed_tokens", "wte", "tok_embeddings", "word_embeddings", "token_embedder", "embed",
                    "embedder", "embeddings", "shared"})
_LOGITS = frozenset({"lm_head", "logits_dense"})
_CONV1D = frozenset({"c_attn", "c_fc", "c_proj"})  # GPT-2 stores these (in, out) under the name weight
_Q_HEADS = frozenset({"q_proj", "q_b_proj", "kv_b_proj", "c_attn", "query", "wq", "qkv", "qkv_proj",
                      "query_key_value", "wqkv"})
_KV_HEADS = frozenset({"k_proj", "v_proj", "key", "value", "wk", "wv"})
_O_HEADS = frozenset({"o_proj", "out_proj", "out"})
_HEAD_NORMS = frozenset({"q_norm", "k_norm", "query_norm", "key_norm"})
_GENERAL_ATTENTION = frozenset({"query", "key", "value", "out"})  # flax DenseGeneral / MaxText names
_EXPERT_MARKERS = frozenset({"experts", "moe", "moe_block", "MoeBlock_0"})
_TOKEN = re.compile(r"""\[\s*'((?:[^'\\]|\\.)*)'\s*\]|\[\s*"((?:[^"\\]|\\.)*)"\s*\]|\[\s*(-?\d+)\s*\]|"""
                    r"""[./]?([^./\[\]]+)""")
_DIGITS = re.compile(r"^[0-9]+$")


def _key_part(key: Any) -> str:
    """One jax path key (DictKey, GetAttrKey, SequenceKey, FlattenedIndexKey) as text."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _parts(path: str | Sequence[Any]) -> list[str]:
    if isinstance(path, str):
        parts = []
        for m in _TOKEN.finditer(path):
            part = next((g for g in m.groups() if g is not None), "")
            parts.append(part.strip())
        return [p for p in parts if p]
    if isinstance(path, Sequence):
        return [p for p in (_key_part(k) for k in path) if p]
    raise MeshplanTypeError(f"path={path!r:.80} must be a string or a jax key path (a sequence of keys).")


def normalize_path(path: str | Sequence[Any]) -> str:
    """``path`` as ``"a/b/0"``, without a leading ``params/`` or trailing box ``/value``.

    Accepts meshplan's ``"a/b/0"`` paths, jax ``keystr`` forms
    (``"['params']['dense'].value"``, ``".layers[0].weight"``), dotted PyTorch
    names and jax key path tuples. A path that is only a prefix or a box tail
    is kept (never emptied). Idempotent: ``normalize_path(normalize_path(p))
    == normalize_path(p)``.

    Example:
      >>> normalize_path("params/layers_0/q_proj/kernel/value")
      'layers_0/q_proj/kernel'
      >>> normalize_path("['params']['decoder']['layers']['query']['kernel']")
      'decoder/layers/query/kernel'
      >>> normalize_path(".layers[3].attn.weight")
      'layers/3/attn/weight'
    """
    parts = _parts(path)
    del path
    while len(parts) > 1 and parts[0] in _PREFIXES:
        parts = parts[1:]
    while len(parts) > 1 and parts[-1] in _BOX_TAILS:
        parts = parts[:-1]
    return "/".join(parts)


@dataclasses.dataclass(frozen=True, slots=True)
class LeafLayout:
    """What a leaf's path and shape say about it.

    Attributes:
      path: the normalised path.
      module: the layer it belongs to (``"q_proj"``, ``"query"``, ``"embed_tokens"``).
      param: its parameter name (``"kernel"``, ``"weight"``, ``"bias"``, ``"embedding"``).
      role: ``"column"`` / ``"row"`` (tensor-parallel linear layers), ``"vocab"``
        (embeddings) or ``"other"`` (norms, routers, low-rank projections, unknown).
      heads: ``"q"``, ``"kv"`` or ``"o"`` for attention projections (whose tp split
        must divide the head count), else ``""``.
      dims: one :data:`DIM_KINDS` entry per dim.
      stacked_expert: a leaf holding every expert of a layer (its ``experts`` dim).
      per_expert: a leaf of one expert (the expert index is in the path).
    """

    path: str
    module: str
    param: str
    role: str
    heads: str
    dims: tuple[str, ...]
    stacked_expert: bool = False
    per_expert: bool = False

    def dim(self, kind: str) -> int | None:
        """The first dim meaning ``kind``, or ``None``."""
        kind = as_str(kind, "kind", error=ShardingRuleError)  # `in` on an array would compare element-wise
        return self.dims.index(kind) if kind in self.dims else None


def _role(module: str) -> str:
    if module in _VOCAB:
        return "vocab"
    if module in _COLUMN:
        return "column"
    if module in _ROW:
        return "row"
    return "other"


def _heads(module: str) -> str:
    if module in _Q_HEADS:
        return "q"
    if module in _KV_HEADS:
        return "kv"
    if module in _O_HEADS:
        return "o"
    return ""


def _is_norm(module: str) -> bool:
    low = module.lower()
    return "norm" in low or low.startswith("ln")


def _base_dims(module: str, param: str, role: str, rank: int, convention: str, shape: Sequence[int],
               hints: dict[str, int | None]) -> tuple[str, ...]:
    """The dims of one unstacked parameter (its trailing dims), most specific reading first."""
    out_kind = "vocab" if module in _LOGITS else "out"
    if param == "embedding" or (role == "vocab" and param in _WEIGHTS | _KERNELS):
        return ("vocab", "embed")
    if module in _HEAD_NORMS and param in {"weight", "scale"}:
        return ("head_dim",)  # Qwen3 / Gemma 3 normalise each head: the weight is one head wide
    if param == "scale" or (role == "other" and _is_norm(module)):
        return ("embed",)
    if param in {"bias", "b"}:
        if role == "column" and _general(module, convention, shape[-2:] if rank >= 2 else (), hints, 2):
            return ("heads", "head_dim")
        return (out_kind,) if role != "row" else ("out",)
    torch = convention == "torch" or (convention == "auto" and param in _WEIGHTS)
    if torch and module not in _CONV1D:
        return (out_kind, "in")
    if role in {"column", "row"} and _general(module, convention, shape[-3:] if rank >= 3 else (), hints, 3):
        heads = _heads(module)
        return ("heads", "head_dim", "out") if heads == "o" else ("in", "heads", "head_dim")
    return ("in", out_kind)


def _general(module: str, convention: str, tail: Sequence[int], hints: dict[str, int | None],
             rank: int) -> bool:
    """Whether an attention kernel (bias) is DenseGeneral-shaped: heads and head_dim as separate dims."""
    heads = _heads(module)
    if not heads or len(tail) < rank:
        return False
    want = hints["num_kv_heads"] if heads == "kv" else hints["num_heads"]
    if want is not None:  # the head count settles it: (in, heads, head_dim) / (heads, head_dim, out)
        return tail[0 if heads == "o" or rank == 2 else 1] == want
    return convention == "maxtext" or module in _GENERAL_ATTENTION


def _stack_dims(extra: int, shape: Sequence[int], num_experts: int | None,
                expert_stack: bool) -> tuple[str, ...]:
    """Meanings of the leading dims stacked on a parameter: layers, and one experts dim."""
    kinds = ["layers"] * extra
    if expert_stack and extra:
        # The innermost stack dim unless another has the expert count (a scan over MoE layers is (L, E, ...)).
        at = next((k for k in reversed(range(extra)) if shape[k] == num_experts), extra - 1)
        kinds[at] = "experts"
    return tuple(kinds)


def leaf_layout(
    path: str | Sequence[Any],
    shape: Sequence[int],
    *,
    convention: str = "auto",
    dims: Sequence[str] | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    num_experts: int | None = None,
) -> LeafLayout:
    """The :class:`LeafLayout` of a leaf (see the module docstring for the conventions).

    Args:
      path: the leaf's path in any form :func:`normalize_path` takes.
      shape: its shape.
      convention: one of :data:`CONVENTIONS`.
      dims: an explicit meaning per dim (each one of :data:`DIM_KINDS`), overriding the derivation.
      num_heads, num_kv_heads, num_experts: model facts, when known; they settle shapes the
        names leave open (is a rank-3 ``q_proj`` kernel ``(L, in, out)`` or
        ``(in, heads, head_dim)``? which leading dim of a scanned MoE leaf holds the experts?).

    Raises:
      ShardingRuleError: an unknown convention, or ``dims`` of the wrong length or kind.

    Example:
      >>> leaf_layout("params/layers/q_proj/kernel/value", (4, 64, 128)).dims
      ('layers', 'in', 'out')
      >>> leaf_layout("model/layers/0/self_attn/q_proj/weight", (128, 64)).dims
      ('out', 'in')
      >>> lay = leaf_layout("decoder/layers/self_attention/query/kernel", (64, 8, 16))
      >>> lay.role, lay.dims
      ('column', ('in', 'heads', 'head_dim'))
    """
    if not isinstance(convention, str) or convention not in CONVENTIONS:
        raise ShardingRuleError(f"convention={convention!r:.80} is not one of {list(CONVENTIONS)}.")
    norm = normalize_path(path)
    del path
    shape = as_shape(shape, "shape")
    num_heads, num_kv_heads, num_experts = (
        None if v is None else as_count(v, what, error=ShardingRuleError, hint="or None when unknown")
        for v, what in ((num_heads, "num_heads"), (num_kv_heads, "num_kv_heads"), (num_experts, "num_experts")))
    parts = norm.split("/")
    last = parts[-1]
    if last in _PARAM_NAMES and len(parts) >= 2:
        module, param = parts[-2], last
    else:  # a bare parameter named after its layer (MaxText's moe_block/wi_0, nnx custom Params)
        module, param = last, "kernel" if convention != "torch" else "weight"
    marker = next((i for i, p in enumerate(parts) if p in _EXPERT_MARKERS), None)
    per_expert = marker is not None and marker + 1 < len(parts) and bool(_DIGITS.match(parts[marker + 1]))
    stacked = marker is not None and not per_expert and module not in {"gate", "router"}
    role = "vocab" if param == "embedding" else _role(module)  # flax Embed, whatever its name
    heads = _heads(module)
    if dims is not None:
        given = as_sequence(dims, "dims")
        bad = [d for d in given if d not in DIM_KINDS]
        if len(given) != len(shape) or bad:
            raise ShardingRuleError(
                f"{norm}: dims={list(given)} must name one of {list(DIM_KINDS)} per dim of shape {shape}"
                + (f"; unknown {bad}" if bad else "") + ".")
        return LeafLayout(norm, module, param, role, heads, given, stacked, per_expert)
    hints: dict[str, int | None] = {"num_heads": num_heads, "num_kv_heads": num_kv_heads,
                                    "num_experts": num_experts}
    if convention == "maxtext" and "layers" in parts[:-1] and len(shape) >= 2:
        # A scanned MaxText decoder stacks every layer leaf at param_scan_axis=1.
        inner = leaf_layout(norm, shape[:1] + shape[2:], convention="flax", num_heads=num_heads,
                            num_kv_heads=num_kv_heads, num_experts=num_experts)
        return dataclasses.replace(inner, dims=inner.dims[:1] + ("layers",) + inner.dims[1:])
    base = _base_dims(module, param, role, len(shape), convention, shape, hints)
    if len(base) > len(shape):
        return LeafLayout(norm, module, param, role, heads, ("other",) * len(shape), stacked, per_expert)
    extra = len(shape) - len(base)
    out = (*_stack_dims(extra, shape, num_experts, stacked), *base)
    return LeafLayout(norm, module, param, role, heads, out, stacked and "experts" in out, per_expert)
