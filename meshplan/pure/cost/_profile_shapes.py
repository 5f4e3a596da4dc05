"""Which matmuls a machine profile times: the shapes a model's layers produce on one device, per tp split.

One layer of a transformer runs, per device, for ``T`` tokens (the batch's share of the device) and a
tensor-parallel split ``tp``: the query, key and value projections ``(T, h) @ (h, width / tp)`` (key/value heads
split ``gcd(tp, kv_heads)`` ways, whole heads, as :mod:`meshplan.pure.cost._flops` counts them), the output
projection ``(T, heads x head_dim / tp) @ (., h)``, the MLP (gate and up ``(T, h) @ (h, f / tp)``, down
``(T, f / tp) @ (., h)``; GPT-2 has no gate) and the output head ``(T, h) @ (h, vocab / tp)``. A hidden-size
sweep (:func:`sweep_shapes`) times the MLP's two shapes at several widths, for the efficiency curve.

Example:
  >>> from meshplan.pure.presets import MODEL_SPECS
  >>> [s[:4] for s in matmul_shapes(MODEL_SPECS["llama3-8b"], tokens=4096, tp=2)][:3]
  [('q', 4096, 4096, 2048), ('k', 4096, 4096, 512), ('v', 4096, 4096, 512)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshplan.pure._check import as_count, as_sequence
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec

__all__ = ["MatmulShape", "matmul_shapes", "sweep_shapes"]

MatmulShape = tuple[str, int, int, int]
"""``(label, m, k, n)``: one ``(m, k) @ (k, n)`` matmul."""

_MAX = 2**31  # tokens, widths: far beyond one device's matmul


def matmul_shapes(model: ModelSpec, *, tokens: int, tp: int = 1) -> tuple[MatmulShape, ...]:
    """The matmuls of one layer of ``model`` and its output head on one device (see the module docstring).

    Raises:
      PlanError: counts below 1 or absurd; MeshplanTypeError: not a ModelSpec.
    """
    if not isinstance(model, ModelSpec):
        raise MeshplanTypeError(f"model={model!r:.60} must be a ModelSpec.")
    t = as_count(tokens, "tokens", maximum=_MAX, error=PlanError)
    k = as_count(tp, "tp", maximum=_MAX, error=PlanError)
    h = model.hidden_size
    head_dim = model.mla.qk_head_dim if model.mla is not None else model.head_dim
    q = max(model.num_heads * head_dim // k, 1)
    kv = max(model.num_kv_heads * model.head_dim // math.gcd(k, max(model.num_kv_heads, 1)), 1)
    o = max(model.num_heads * (model.mla.v_head_dim if model.mla is not None else model.head_dim) // k, 1)
    f = max((model.intermediate_size or model.moe_intermediate_size or 4 * h) // k, 1)
    mlp: list[MatmulShape] = [("up", t, h, f), ("down", t, f, h)]
    if model.family != "gpt2":
        mlp.insert(0, ("gate", t, h, f))
    return (("q", t, h, q), ("k", t, h, kv), ("v", t, h, kv), ("o", t, o, h), *mlp,
            ("head", t, h, max(model.vocab_size // k, 1)))


def sweep_shapes(hidden_sizes: Sequence[int], *, tokens: int) -> tuple[tuple[int, MatmulShape], ...]:
    """``(hidden, shape)`` of an MLP's up ``(T, h) @ (h, 4h)`` and down ``(T, 4h) @ (4h, h)`` per hidden size.

    Example:
      >>> sweep_shapes([64], tokens=128)
      ((64, ('sweep up', 128, 64, 256)), (64, ('sweep down', 128, 256, 64)))
    """
    t = as_count(tokens, "tokens", maximum=_MAX, error=PlanError)
    out: list[tuple[int, MatmulShape]] = []
    for i, value in enumerate(as_sequence(hidden_sizes, "hidden_sizes")):
        h = as_count(value, f"hidden_sizes[{i}]", maximum=2**20, error=PlanError)
        out += [(h, ("sweep up", t, h, 4 * h)), (h, ("sweep down", t, 4 * h, h))]
    return tuple(out)
