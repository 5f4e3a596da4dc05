"""Serving plans: what a model's weights and KV cache take on a serving layout, what its decode steps and
prefills cost, and the engine flags that serve it so (:func:`plan_serving`).

Layouts (:class:`ServeLayout`, :func:`serving_layouts`), weights per device exact for bf16 / int8 / fp8 with
their scales (:func:`weight_bytes`, :func:`serving_params`), the KV cache per device exact for GQA, MLA,
sliding windows and the engine's pages (:func:`kv_geometry`, :class:`KvGeometry`), the engines' own reserve
rules (:func:`kv_budget`), decode and prefill time with their calibrated range (:func:`decode_step_time`,
:func:`prefill_time`), and the commands (:func:`engine_command`).

Example:
  >>> p = plan_serving("llama3.1-8b", "1x8xH100", context=8192, concurrency=64)
  >>> p.best.layout.text, p.best.sequences
  ('tp=8', 64)
"""

from meshplan.pure.serve._context import (
    HF_REPOS,
    MAXTEXT_NAMES,
    MODEL_POSITIONS,
    SERVE_ALIASES,
    check_context,
    model_positions,
    serve_model,
)
from meshplan.pure.serve._engines import (
    ENGINES,
    Engine,
    KvBudget,
    default_engine,
    engine,
    engine_cache_format,
    kv_budget,
    sglang_mem_fraction_static,
)
from meshplan.pure.serve._flags import engine_command
from meshplan.pure.serve._kv import (
    CACHE_LAYOUTS,
    CacheFormat,
    KvGeometry,
    decode_input_bytes,
    decode_inputs_tree,
    kv_cache_tree,
    kv_geometry,
)
from meshplan.pure.serve._layout import LAYOUT_AXES, ServeLayout, check_layout, layout_problems, serving_layouts
from meshplan.pure.serve._plan import plan_serving
from meshplan.pure.serve._result import ServePlan, ServeRequest, ServeRow
from meshplan.pure.serve._quant import (
    KV_DTYPES,
    SCALE_GRANULARITIES,
    WEIGHT_DTYPES,
    WeightQuant,
    kv_dtype,
    kv_element_dtype,
    weight_quant,
)
from meshplan.pure.serve._time import (
    BOUNDS,
    SERVE_CALIBRATION,
    TPU_CHECK,
    ServeCalibration,
    StepTime,
    decode_step_time,
    prefill_time,
)
from meshplan.pure.serve._weights import (
    SERVED_FAMILIES,
    WeightBytes,
    kv_heads_stored,
    padded_vocab,
    serving_params,
    weight_bytes,
)

__all__ = [
    "BOUNDS", "CACHE_LAYOUTS", "ENGINES", "HF_REPOS", "KV_DTYPES", "LAYOUT_AXES", "MAXTEXT_NAMES",
    "MODEL_POSITIONS", "SCALE_GRANULARITIES", "SERVED_FAMILIES", "SERVE_ALIASES", "SERVE_CALIBRATION",
    "TPU_CHECK", "WEIGHT_DTYPES", "CacheFormat", "Engine", "KvBudget", "KvGeometry", "ServeCalibration", "ServeLayout",
    "ServePlan", "ServeRequest", "ServeRow", "StepTime", "WeightBytes", "WeightQuant", "check_context",
    "check_layout", "decode_input_bytes", "decode_inputs_tree", "decode_step_time", "default_engine", "engine",
    "engine_cache_format", "engine_command", "kv_budget", "kv_cache_tree", "kv_dtype", "kv_element_dtype",
    "kv_geometry", "kv_heads_stored", "layout_problems", "model_positions", "padded_vocab", "plan_serving",
    "prefill_time", "serve_model", "serving_layouts", "serving_params", "sglang_mem_fraction_static",
    "weight_bytes", "weight_quant",
]
