"""A :class:`ModelSpec` from a MaxText model yml (``configs/models/llama3.1-405b.yml``).

MaxText's model files are flat ``key: value`` lines with comments: scalars
(``16384``, ``500_000``, ``1.0e-5``, ``true``, ``"llama2"``) and flow lists
(``["silu","linear"]``). :func:`parse_maxtext_yml` reads exactly that subset and
refuses anything else (indented or nested mappings, block lists, anchors,
multi-document streams, duplicate keys) with a :class:`ModelConfigError` naming
the file and line, so a file it cannot read is never half-read. meshplan's
runtime dependencies are jax, numpy, chex and rich; a twenty-line reader for a
flat format is cheaper and stricter than a PyYAML extra, whose full YAML (anchors,
tags, merge keys) a model file never uses.

:func:`model_spec_from_maxtext` maps the ``base_*`` keys, ``decoder_block`` and
the expert keys onto a :class:`ModelSpec`, with MaxText's ``base.yml`` defaults
(:data:`MAXTEXT_DEFAULTS`) for keys a model file leaves out. The spec counts the
parameters of MaxText's model, which can differ from the Hugging Face checkpoint
(MaxText pads Gemma's vocabulary: 262,144 rows where HF has 262,208).
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Any

from meshplan.pure.errors import ModelConfigError
from meshplan.pure.presets._show import show_int as _show_int
from meshplan.pure.presets._show import show_value as _show_value
from meshplan.pure.presets._spec import MLADims, ModelSpec

__all__ = ["MAXTEXT_DECODER_BLOCKS", "MAXTEXT_DEFAULTS", "model_spec_from_maxtext", "parse_maxtext_yml"]

MAXTEXT_DECODER_BLOCKS: Mapping[str, str] = types.MappingProxyType({
    "llama2": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "mixtral": "mixtral",
    "qwen3_moe": "qwen3_moe", "gemma2": "gemma", "gemma3": "gemma", "deepseek": "deepseek_v3",
})
"""MaxText ``decoder_block`` -> the :class:`ModelSpec` family (``deepseek`` is ``deepseek_v2`` without
``routed_bias``)."""

MAXTEXT_DEFAULTS: Mapping[str, Any] = types.MappingProxyType({
    # MaxText's configs/base.yml values for the keys read here.
    "decoder_block": "llama2", "head_dim": 128, "vocab_size": 32_000, "logits_via_embedding": False,
    "num_experts": 1, "num_experts_per_tok": 1, "base_moe_mlp_dim": -1, "first_num_dense_layers": 0,
    "shared_experts": 0, "routed_bias": False, "attention_bias": False, "use_qk_norm": False,
    "sliding_window_size": 0, "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "attention_type": "global",
})
"""Defaults (MaxText's ``base.yml``) for keys a model yml may leave out."""

_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)\s*:(?:\s+(.*))?$")
_INT = re.compile(r"^[-+]?[0-9][0-9_]*$")
_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9]+|[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?$")
_REFUSED_STARTS = ("{", "&", "*", "!", "|", ">", "%", "@", "`")


def _strip_comment(line: str) -> str:
    """The line without a ``# comment`` (a ``#`` inside quotes, or glued to a word, is kept)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(text: str, where: str) -> Any:
    text = text.strip()
    if not text or text in ("null", "~", "Null", "NULL"):
        return None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if _INT.match(text):
        if len(text) > 40:  # no model size has 40 digits (and int() refuses past 4,300)
            raise ModelConfigError(f"{where}: number {text[:20]}... has {len(text)} digits; no model size does.")
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    if text.startswith(_REFUSED_STARTS) or text.startswith(("[", "- ", "\"", "'")) or text == "-":
        raise ModelConfigError(f"{where}: value {text!r:.60} is not a scalar or a flat [a, b] list; a MaxText "
                               f"model yml holds only those (nested YAML is not read).")
    return text


def _value(text: str, where: str) -> Any:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        if "[" in inner or "{" in inner:
            raise ModelConfigError(f"{where}: nested list {text!r:.60} is not read; a MaxText model yml has flat "
                                   f"lists such as [\"silu\", \"linear\"].")
        return [_scalar(item, where) for item in inner.split(",")] if inner else []
    return _scalar(text, where)


def parse_maxtext_yml(text: str, *, source: str = "model.yml") -> dict[str, Any]:
    """The ``key: value`` settings of a flat MaxText model yml (see the module docstring for what is read).

    Args:
      text: the file's text.
      source: what to call the file in error messages (its path).

    Returns:
      A dict of the settings in file order: ints, floats, bools, ``None``, strings and flat lists.

    Raises:
      ModelConfigError: a line that is not ``key: value`` (indented, a block list, ``---``), a nested
        value, or a key given twice; the message names ``source``, the line and what is valid.
      MeshplanTypeError: never; a non-str ``text`` is a ModelConfigError too.

    Example:
      >>> parse_maxtext_yml('base_emb_dim: 16384  # width\\nrope_max_timescale: 500_000\\n'
      ...                   'mlp_activations: ["silu","linear"]\\ndecoder_block: "llama2"')
      {'base_emb_dim': 16384, 'rope_max_timescale': 500000, 'mlp_activations': ['silu', 'linear'], 'decoder_block': 'llama2'}
    """
    if not isinstance(text, str):
        raise ModelConfigError(f"{source}: a MaxText model yml is text, not {type(text).__name__}.")
    out: dict[str, Any] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        where = f"{source}:{number}"
        line = _strip_comment(raw)
        if not line.strip():
            continue
        if line[0] in " \t":
            raise ModelConfigError(f"{where}: indented line {raw.strip()!r:.60}; a MaxText model yml is flat "
                                   f"key: value lines (nested mappings are not read).")
        if line.strip() in ("---", "..."):
            raise ModelConfigError(f"{where}: {line.strip()!r} starts another YAML document; give one model's "
                                   f"flat key: value lines.")
        match = _KEY.match(line)
        if match is None:
            raise ModelConfigError(f"{where}: {raw.strip()!r:.60} is not a 'key: value' line (a MaxText model "
                                   f"yml holds only those).")
        key, value = match.group(1), match.group(2) or ""
        if key in out:
            raise ModelConfigError(f"{where}: key {key!r} is given twice; keep one.")
        out[key] = _value(value, where)
    if not out:
        raise ModelConfigError(f"{source}: no 'key: value' settings found; is this a MaxText model yml?")
    return out


class _Settings:
    """Checked reads of one settings mapping, naming the file and key in every error."""

    __slots__ = ("mapping", "source")

    def __init__(self, mapping: Mapping[str, Any], source: str) -> None:
        self.mapping, self.source = mapping, source

    def raw(self, key: str) -> Any:
        if key in self.mapping:
            return self.mapping[key]
        if key in MAXTEXT_DEFAULTS:
            return MAXTEXT_DEFAULTS[key]
        raise ModelConfigError(f"{self.source}: key {key!r} is missing; a MaxText model yml sets it (an int >= 1).")

    def count(self, key: str, minimum: int = 1) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ModelConfigError(f"{self.source}: key {key!r}={_show_value(value)} must be an int >= {minimum}.")
        # Layers and experts become dict entries of the tree: bound them (and every size) to real models.
        maximum = 10_000 if key == "base_num_decoder_layers" else 100_000 if key == "num_experts" else 10**12
        if value > maximum:
            raise ModelConfigError(f"{self.source}: key {key!r}={_show_int(value)} is past any model; it must be <= "
                                   f"{maximum:,}.")
        return value

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise ModelConfigError(f"{self.source}: key {key!r}={_show_value(value)} must be true or false.")
        return value


def model_spec_from_maxtext(settings: Mapping[str, Any], *, name: str,
                            source: str = "model.yml") -> ModelSpec:
    """The :class:`ModelSpec` of a MaxText model config (:func:`parse_maxtext_yml`'s settings).

    Reads ``base_emb_dim``, ``base_num_query_heads``, ``base_num_kv_heads``, ``base_mlp_dim``,
    ``base_num_decoder_layers``, ``head_dim``, ``vocab_size``, ``logits_via_embedding`` (tied head),
    ``decoder_block`` (:data:`MAXTEXT_DECODER_BLOCKS`), ``num_experts`` / ``num_experts_per_tok`` /
    ``base_moe_mlp_dim`` / ``first_num_dense_layers`` / ``shared_experts``, the MLA ranks,
    ``attention_bias``, ``use_qk_norm`` and ``sliding_window_size``. MaxText's ``gemma2`` block holds a
    local and a global layer, so its ``base_num_decoder_layers`` counts pairs (doubled here).

    Args:
      settings: the model file's settings.
      name: the model's name: MaxText's ``model_name``, the yml's file name without ``.yml``.
      source: what to call the file in error messages.

    Returns:
      A :class:`ModelSpec` named ``name`` (``num_params`` left ``None``).

    Raises:
      ModelConfigError: an unknown ``decoder_block``, a missing key, a bad value, heads that do not
        divide, experts with a bad top-k.

    Example:
      >>> s = model_spec_from_maxtext({"base_emb_dim": 4096, "base_num_query_heads": 32,
      ...     "base_num_kv_heads": 8, "base_mlp_dim": 14336, "base_num_decoder_layers": 32,
      ...     "decoder_block": "mistral"}, name="mistral-7b")
      >>> s.family, s.head_dim, s.vocab_size
      ('llama', 128, 32000)
    """
    if not isinstance(settings, Mapping):
        raise ModelConfigError(f"{source}: MaxText settings must be a mapping, not {type(settings).__name__}.")
    if not isinstance(name, str) or not name:
        raise ModelConfigError(f"name={_show_value(name)} must be a non-empty str (MaxText's model_name).")
    s = _Settings(settings, source)
    block = s.raw("decoder_block")
    if block not in MAXTEXT_DECODER_BLOCKS:
        raise ModelConfigError(f"{source}: key 'decoder_block'={_show_value(block)} is not one meshplan reads; known: "
                               f"{sorted(MAXTEXT_DECODER_BLOCKS)}.")
    family = MAXTEXT_DECODER_BLOCKS[block]
    hidden, heads, kv_heads = s.count("base_emb_dim"), s.count("base_num_query_heads"), s.count("base_num_kv_heads")
    if heads % kv_heads:
        raise ModelConfigError(f"{source}: key 'base_num_kv_heads'={kv_heads} must divide "
                               f"base_num_query_heads={heads}.")
    layers = s.count("base_num_decoder_layers") * (2 if block == "gemma2" else 1)
    experts = s.count("num_experts")
    moe: dict[str, Any] = {}
    if experts > 1:
        top_k = s.count("num_experts_per_tok")
        if top_k > experts:
            raise ModelConfigError(f"{source}: key 'num_experts_per_tok'={top_k} exceeds num_experts={experts}.")
        moe_dim = s.raw("base_moe_mlp_dim")
        moe = {"num_experts": experts, "num_experts_per_tok": top_k,
               "moe_intermediate_size": s.count("base_mlp_dim") if moe_dim == -1 else s.count("base_moe_mlp_dim"),
               "num_shared_experts": s.count("shared_experts", minimum=0),
               "num_dense_layers": s.count("first_num_dense_layers", minimum=0)}
    elif family in ("mixtral", "qwen3_moe", "deepseek_v3"):
        raise ModelConfigError(f"{source}: decoder_block={block!r} routes tokens to experts but num_experts="
                               f"{experts}; set num_experts (> 1) and num_experts_per_tok.")
    window = s.count("sliding_window_size", minimum=0)
    local = {"gemma2": layers // 2, "gemma3": layers - layers // 6}.get(block, layers) if window else 0
    common = dict(vocab_size=s.count("vocab_size"), hidden_size=hidden, num_layers=layers, num_heads=heads,
                  intermediate_size=s.count("base_mlp_dim"), tied_embeddings=s.flag("logits_via_embedding"), **moe)
    if family == "deepseek_v3":
        mla = MLADims(q_lora_rank=s.count("q_lora_rank", minimum=0), kv_lora_rank=s.count("kv_lora_rank"),
                      qk_nope_head_dim=s.count("qk_nope_head_dim"), qk_rope_head_dim=s.count("qk_rope_head_dim"),
                      v_head_dim=s.count("v_head_dim"))
        family = "deepseek_v3" if s.flag("routed_bias") else "deepseek_v2"
        return ModelSpec(name, family, num_kv_heads=heads, head_dim=mla.v_head_dim, mla=mla, **common)
    return ModelSpec(name, family, num_kv_heads=kv_heads, head_dim=s.count("head_dim"),
                     qkv_bias=s.flag("attention_bias"), qk_norm=s.flag("use_qk_norm") or block == "gemma3",
                     sliding_window=window, sliding_window_layers=local, **common)
