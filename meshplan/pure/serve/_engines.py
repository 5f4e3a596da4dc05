"""The serving engines a plan is written for: their cache layout, what each reserves before the KV cache, and
the flags to type. Every rule here is the engine's own, quoted from its source; meshplan only evaluates it.

- **vLLM** (GPU; ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``, vllm-project/vllm at
  35d5cda): ``requested = gpu_memory_utilization x total``; the KV cache gets ``requested`` minus the weights,
  the torch peak of a profiled forward over ``max_num_batched_tokens`` tokens and the non-torch memory that
  forward added; CUDA graphs are captured afterwards, out of the ``1 - gpu_memory_utilization`` left.
  ``gpu_memory_utilization`` defaults to 0.9 (``vllm/config/cache.py`` at c1d8642; main at 002f10e has 0.92,
  so the flags always name it). Block size 16 (``CacheConfig.DEFAULT_BLOCK_SIZE``), 64 for MLA on Hopper
  (``vllm/platforms/cuda.py``: "Forcing kv cache block size to 64 for FlashMLA backend").
- **SGLang** (GPU; ``python/sglang/srt/arg_groups/memory_hook.py``, sgl-project/sglang at 031ed82):
  ``mem_fraction_static = (gpu_mem - reserved) / gpu_mem`` (weights + KV pool over capacity), ``reserved`` in
  MB = 512 + 1.5 x max(chunked_prefill_size, 2048) + tp x pp / 8 x 1024 + 2 x the decode CUDA-graph max batch
  (+ 3 x max batch x dp with DP attention, + 1.5 x max batch x dp above a max batch of 300) + the prefill
  CUDA graphs (8 MB per captured size; 1.5 GiB with MLA), at least 10 GiB on a device over 60 GiB; the
  chunked-prefill size and max batch are tiered by capacity. Its docstring calls the 1.5 "a heuristic value".
  Page size 1.
- **vLLM on TPU** (tpu-inference, ``tpu_inference/worker/tpu_worker.py`` ``determine_available_memory`` at
  4d6340b): the KV cache gets ``gpu_memory_utilization x HBM limit - HBM used`` (the weights: nothing is
  profiled); pages per ``vllm/v1/attention/backends/pallas.py`` (``get_page_size``: 16 past 8192 tokens, else
  ``next_power_of_2(max_model_len) / 16`` within [16, 256], raised to ``get_min_page_size`` so a request's
  pages fit SMEM), 512 for MLA with a latent over 256 wide (``PallasMLAttentionBackend.get_page_size``).
- **MaxText / JetStream** (TPU or GPU): no reserve rule: every slot is allocated ``max_target_length`` tokens
  (``per_device_batch_size x devices`` slots), and the step fits or not. meshplan holds it to the budget its
  training plans use (90% of a TPU's HBM; 75% of a GPU's, jax's default ``XLA_PYTHON_CLIENT_MEM_FRACTION``)
  less the decode step's estimated temporaries; ``meshplan check --serve`` compiles the step for the exact
  peak. MLA is cached up-projected (``mla_naive_kvcache: True``, MaxText's default); a quantized cache keeps a
  bfloat16 scale per token (``kv_quant_axis: heads_and_dkv``).

Example:
  >>> engine("jetstream").name, engine("vllm").default_fraction
  ('maxtext', 0.9)
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any

from meshplan.pure._check import as_count, as_flag
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._spec import ModelSpec, as_model_spec
from meshplan.pure.serve._kv import CacheFormat
from meshplan.pure.serve._layout import ServeLayout
from meshplan.pure.serve._quant import WeightQuant
from meshplan.pure.serve._weights import WeightBytes

__all__ = ["ENGINES", "Engine", "KvBudget", "default_engine", "engine", "engine_cache_format", "kv_budget",
           "sglang_mem_fraction_static"]

_MIB = 2**20
_GIB = 2**30


@dataclasses.dataclass(frozen=True, slots=True)
class Engine:
    """One serving engine as a plan needs it.

    Attributes:
      name: ``"vllm"``, ``"sglang"``, ``"maxtext"`` or ``"vllm-tpu"``.
      label: how reports name it.
      platforms: ``"gpu"`` and / or ``"tpu"``.
      weight_dtypes, kv_dtypes: what it serves.
      default_fraction: the memory fraction it takes by default (``None``: computed, SGLang).
      fraction_flag: the flag that sets it (``None``: none, MaxText).
      reserve_rule: its rule for the memory that is not KV cache, in a sentence.
      source: where the rule is written (repository, file, commit).
    """

    name: str
    label: str
    platforms: tuple[str, ...]
    weight_dtypes: tuple[str, ...]
    kv_dtypes: tuple[str, ...]
    default_fraction: float | None
    fraction_flag: str | None
    reserve_rule: str
    source: str


ENGINES: Mapping[str, Engine] = types.MappingProxyType({
    "vllm": Engine(
        "vllm", "vLLM", ("gpu",), ("bfloat16", "int8", "float8"), ("bfloat16", "float8"), 0.9,
        "--gpu-memory-utilization",
        "KV = gpu_memory_utilization x HBM - weights - the profiled forward's peak (max_num_batched_tokens "
        "tokens) - non-torch memory; CUDA graphs come out of the rest",
        "vllm-project/vllm vllm/v1/worker/gpu_worker.py (35d5cda), vllm/config/cache.py (c1d8642)"),
    "sglang": Engine(
        "sglang", "SGLang", ("gpu",), ("bfloat16", "int8", "float8"), ("bfloat16", "float8"), None,
        "--mem-fraction-static",
        "weights + KV pool = mem_fraction_static x HBM, its default (HBM - reserved) / HBM with reserved = 512 MB "
        "+ 1.5 MB x chunked_prefill_size + tp/8 GiB + CUDA graphs, at least 10 GiB (\"a heuristic value\")",
        "sgl-project/sglang python/sglang/srt/arg_groups/memory_hook.py (031ed82)"),
    "maxtext": Engine(
        "maxtext", "MaxText / JetStream", ("tpu", "gpu"), ("bfloat16", "int8", "float8"),
        ("bfloat16", "int8", "float8"), None, None,
        "no reserve rule: every slot holds max_target_length tokens; meshplan's budget (90% of TPU HBM, jax's "
        "75% of a GPU's) less the step's temporaries; compile the step for the exact peak",
        "AI-Hypercomputer/maxtext configs/base.yml (quantize_kvcache, kv_quant_axis, mla_naive_kvcache)"),
    "vllm-tpu": Engine(
        "vllm-tpu", "vLLM on TPU", ("tpu",), ("bfloat16", "int8", "float8"), ("bfloat16", "float8"), 0.9,
        "--gpu-memory-utilization",
        "KV = gpu_memory_utilization x HBM - HBM in use after loading (the weights)",
        "vllm-project/tpu-inference tpu_inference/worker/tpu_worker.py (4d6340b); vllm-project/vllm "
        "vllm/v1/attention/backends/pallas.py (page size)"),
})
"""The engines a plan writes flags for."""

_ALIASES: Mapping[str, str] = types.MappingProxyType({
    "jetstream": "maxtext", "maxtext/jetstream": "maxtext", "maxtext-jetstream": "maxtext",
    "vllm_tpu": "vllm-tpu", "tpu-inference": "vllm-tpu", "vllm/tpu": "vllm-tpu",
})


def engine(name: Any) -> Engine:
    """The :class:`Engine` named ``name`` (``"jetstream"`` is MaxText's engine; ``"tpu-inference"`` vLLM's TPU one).

    Raises:
      PlanError: an unknown engine (the message lists the known ones).
      MeshplanTypeError: not a str.

    Example:
      >>> engine("SGLang").label
      'SGLang'
    """
    if isinstance(name, Engine):
        return name
    if not isinstance(name, str):
        raise MeshplanTypeError(f"engine={name!r:.60} must be a str, one of {list(ENGINES)}.")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in ENGINES:
        raise PlanError(f"engine={name!r:.60} is not an engine meshplan writes flags for; valid: "
                        f"{list(ENGINES)} (or jetstream, for MaxText's).")
    return ENGINES[key]


def _platform(cluster: Cluster) -> str:
    return "tpu" if cluster.device.ici_scope == "slice" else "gpu"


def _cluster(cluster: Any) -> Cluster:
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster (parse_cluster('1x8xH100')).")
    return cluster


def default_engine(cluster: Cluster) -> Engine:
    """vLLM on GPUs, MaxText / JetStream on TPUs.

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> default_engine(parse_cluster("v5e-8")).name
      'maxtext'
    """
    cluster = _cluster(cluster)
    return ENGINES["maxtext" if _platform(cluster) == "tpu" else "vllm"]


def check_engine(eng: Engine, cluster: Cluster, quant: WeightQuant, kv: str) -> None:
    """Refuse an engine that does not run on ``cluster`` or serve these dtypes, naming what would."""
    platform = _platform(cluster)
    if platform not in eng.platforms:
        others = [e.name for e in ENGINES.values() if platform in e.platforms]
        raise PlanError(f"{eng.label} does not run on {cluster.text} ({platform.upper()}s); engines for it: {others}.")
    if quant.dtype not in eng.weight_dtypes:
        raise PlanError(f"{eng.label} does not serve {quant.dtype} weights; valid: {list(eng.weight_dtypes)}.")
    if kv not in eng.kv_dtypes:
        raise PlanError(f"{eng.label} does not cache in {kv}; valid --kv-dtype for it: {list(eng.kv_dtypes)}.")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def engine_cache_format(eng: Engine, spec: ModelSpec, cluster: Cluster, *, context: int,
                        max_num_seqs: int = 256) -> CacheFormat:
    """How ``eng`` lays its KV cache out for ``spec`` at ``context`` tokens (see the module docstring).

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> engine_cache_format(engine("vllm-tpu"), MODEL_SPECS["llama3-8b"], parse_cluster("v6e-8"),
      ...                     context=4096).page_size
      256
    """
    eng, spec, cluster = engine(eng), as_model_spec(spec), _cluster(cluster)
    context = as_count(context, "context", maximum=10**12, error=PlanError)
    max_num_seqs = as_count(max_num_seqs, "max_num_seqs", maximum=10**9, error=PlanError)
    if eng.name == "vllm":
        hopper = cluster.device.name.split("-")[0] in ("H100", "H200")
        return CacheFormat("paged", 64 if spec.mla is not None and hopper else 16, "latent", window_capped=True)
    if eng.name == "sglang":
        return CacheFormat("paged", 1, "latent", window_capped=True)
    if eng.name == "vllm-tpu":
        if spec.mla is not None:
            page = 512 if spec.mla.kv_lora_rank > 256 else 1024
        else:
            page = 16 if context > 8192 else min(256, max(16, _next_pow2(context) // 16))
            per_request = max(1, 1024 * 1024 // 2 // max(1, max_num_seqs) // 4)
            page = max(page, _next_pow2(-(-context // per_request)))
        return CacheFormat("paged", page, "latent", window_capped=True)
    return CacheFormat("contiguous", 1, "heads", window_capped=False, scales="token")


def _tier(gpu_mem_mb: float, tp: int) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, decode CUDA-graph max batch) for a device of ``gpu_mem_mb`` MB."""
    if gpu_mem_mb < 20 * 1024:
        return 2048, 8
    if gpu_mem_mb < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_mb < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mb < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _prefill_graph_sizes(max_bs: int) -> int:
    """How many token counts SGLang captures prefill CUDA graphs for (``generate_prefill_cuda_graph_batch_sizes``)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return sum(1 for s in sizes if s <= max_bs)


def sglang_mem_fraction_static(hbm_bytes: int, *, tp: int, dp: int = 1, mla: bool = False) -> float:
    """SGLang's default ``mem_fraction_static`` for one device of ``hbm_bytes`` in a ``tp``-way server.

    ``tp`` is SGLang's ``--tp`` (every GPU of the replica), ``dp`` its DP-attention size (1: off). The prefill
    CUDA graphs are counted as SGLang captures them by default (one size per
    ``generate_prefill_cuda_graph_batch_sizes`` step up to the chunked-prefill size).

    Example:
      >>> sglang_mem_fraction_static(81559 * 2**20, tp=2)  # an H100 as CUDA reports it, tp 2
      0.828
    """
    gpu_mem = as_count(hbm_bytes, "hbm_bytes", maximum=2**50, error=PlanError) / _MIB
    tp = as_count(tp, "tp", maximum=2**22, error=PlanError)
    dp = as_count(dp, "dp", maximum=2**22, error=PlanError)
    mla = as_flag(mla, "mla")
    chunk, max_bs = _tier(gpu_mem, tp)
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + max_bs * 2
    if dp > 1:
        reserved += max_bs * dp * 3 + (max_bs * dp * 1.5 if max_bs > 300 else 0)
    reserved += 1.5 * 1024 if mla else _prefill_graph_sizes(chunk) * 8
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem - reserved) / gpu_mem, 3)


@dataclasses.dataclass(frozen=True, slots=True)
class KvBudget:
    """What an engine leaves a device's KV cache.

    Attributes:
      kv_bytes: bytes for the KV cache on each device (negative: the weights alone do not fit).
      fraction: the memory fraction the engine takes (the flag's value), or ``None`` (MaxText).
      reserved_bytes: the engine's non-KV reserve inside the fraction other than the weights (vLLM's profiled
        forward, MaxText's step temporaries), an estimate; 0 where the rule has none (SGLang, vLLM on TPU).
      reserved_estimated: whether ``reserved_bytes`` is meshplan's estimate rather than the engine's rule.
      rule: the engine's rule, in a sentence.
      source: where it is written.
    """

    kv_bytes: int
    fraction: float | None
    reserved_bytes: int
    reserved_estimated: bool
    rule: str
    source: str


def _activation_bytes(spec: ModelSpec, layout: ServeLayout, tokens: int, sequences: int, vocab_rows: int) -> int:
    """meshplan's estimate of the torch peak of vLLM's profiled forward: the widest layer's live activations
    for ``tokens`` tokens in bf16, and the sampler's fp32 logits and probabilities for ``sequences``."""
    tp, d = layout.tp, spec.hidden_size
    width = spec.moe_intermediate_size * spec.num_experts_per_tok if spec.is_moe else spec.intermediate_size
    widest = max(spec.intermediate_size if (not spec.is_moe or spec.num_dense_layers) else 0, width)
    per_token = 4 * d + 3 * widest // tp + (spec.num_heads + 2 * max(spec.num_kv_heads, tp)) * spec.head_dim // tp
    return 2 * tokens * per_token + 2 * 4 * min(sequences, tokens) * vocab_rows


VLLM_MAX_NUM_BATCHED_TOKENS = 8192
"""The ``--max-num-batched-tokens`` meshplan writes for vLLM (and prices its profiled forward at)."""

VLLM_NON_TORCH_BYTES = _GIB
"""meshplan's allowance for the non-torch memory vLLM's profiled forward adds (NCCL and cuBLAS workspaces)."""


def kv_budget(eng: Engine, cluster: Cluster, spec: ModelSpec, layout: ServeLayout, weights: WeightBytes, *,
              fraction: float | None = None, max_num_seqs: int = 256, decode_temp_bytes: int = 0) -> KvBudget:
    """The KV bytes ``eng`` leaves each device of ``layout`` after the weights, by the engine's own rule.

    Args:
      eng: the engine.
      cluster: its device's HBM is the capacity.
      spec, layout, weights: the model, the layout and its :func:`~meshplan.pure.serve.weight_bytes`.
      fraction: the memory fraction to plan at instead of the engine's default (its flag's value).
      max_num_seqs: sequences the engine may run (vLLM's sampler buffers, vLLM-TPU's page size).
      decode_temp_bytes: MaxText: the decode step's temporaries (meshplan's estimate) kept out of the budget.

    Raises:
      PlanError: a fraction outside (0, 1].

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> from meshplan.pure.serve import ServeLayout, weight_bytes
      >>> spec, layout = MODEL_SPECS["llama3-70b"], ServeLayout(1, 8)
      >>> b = kv_budget(engine("vllm-tpu"), parse_cluster("v5p-16"), spec, layout, weight_bytes(spec, layout))
      >>> b.fraction, b.reserved_bytes
      (0.9, 0)
    """
    eng, spec, cluster = engine(eng), as_model_spec(spec), _cluster(cluster)
    if not isinstance(layout, ServeLayout):
        raise MeshplanTypeError(f"layout={layout!r:.60} must be a ServeLayout.")
    if not isinstance(weights, WeightBytes):
        raise MeshplanTypeError(f"weights={weights!r:.60} must be a WeightBytes (from weight_bytes).")
    max_num_seqs = as_count(max_num_seqs, "max_num_seqs", maximum=10**9, error=PlanError)
    decode_temp_bytes = as_count(decode_temp_bytes, "decode_temp_bytes", minimum=0, maximum=2**60, error=PlanError)
    hbm = cluster.device.hbm_bytes
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0 < fraction <= 1 or math.isnan(fraction)):
        raise PlanError(f"fraction={fraction!r:.40} must be a number in (0, 1] (the share of each device's memory "
                        "the engine takes).")
    if eng.name == "sglang":
        frac = fraction if fraction is not None else sglang_mem_fraction_static(
            hbm, tp=layout.devices_per_replica, dp=layout.ep, mla=spec.mla is not None)
        return KvBudget(int(frac * hbm) - weights.total, frac, 0, False, eng.reserve_rule, eng.source)
    if eng.name == "vllm-tpu":
        frac = fraction if fraction is not None else 0.9
        return KvBudget(int(frac * hbm) - weights.total, frac, 0, False, eng.reserve_rule, eng.source)
    if eng.name == "vllm":
        from meshplan.pure.serve._weights import padded_vocab

        frac = fraction if fraction is not None else 0.9
        act = _activation_bytes(spec, layout, VLLM_MAX_NUM_BATCHED_TOKENS, max_num_seqs, padded_vocab(
            spec.vocab_size, 1)) + VLLM_NON_TORCH_BYTES
        return KvBudget(int(frac * hbm) - weights.total - act, frac, act, True, eng.reserve_rule, eng.source)
    frac = fraction if fraction is not None else (0.9 if _platform(cluster) == "tpu" else 0.75)
    return KvBudget(int(frac * hbm) - weights.total - decode_temp_bytes, fraction, decode_temp_bytes, True,
                    eng.reserve_rule, eng.source)
