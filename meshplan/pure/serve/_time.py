"""What a decode step and a prefill take on a serving layout: a roofline with the latency it cannot hide.

A decode step (every running sequence emits one token) on one device of a replica costs

    step = max(read / (HBM bandwidth x hbm_efficiency), flops / (peak x matmul_efficiency))
           + collectives + layers x layer_overhead_s

- ``read``: every weight the step uses (all but the input embedding, whose rows it gathers, and the routed
  experts no token chose: an expert is read with probability ``1 - (1 - k/E)^tokens``, routing taken as
  uniform) plus the live KV cache (:meth:`~meshplan.pure.serve.KvGeometry.read_bytes`);
- ``flops``: two per weight a token meets, plus the attention over the cache (``4 x context x heads x
  head_dim`` per sequence and layer; MLA over its latent); FP8 weights run at the device's FP8 peak (W8A8),
  int8 weights at the bf16 peak (weight-only);
- ``collectives``: each layer's two ``tp`` all-reduces of the tokens' hidden states (an MoE layer with
  ``ep > 1``: the dispatch and combine all-to-alls over ``ep x tp``) and the logits' all-gather, priced by
  meshplan's alpha-beta model (:mod:`meshplan.pure.cost`) on the device's link with its per-step latency
  scaled by ``collective_latency_scale`` (a decode all-reduce is kilobytes: the small-message protocols NCCL
  and XLA pick for it are not the ring's ``2(n-1)`` latency steps);
- ``layer_overhead_s``: what a layer costs beyond its bytes and FLOPs (kernel launches, norms, rotary,
  sampling amortised).

A prefill of ``P`` tokens (time to first token, one prompt, no queue) is the same sum with ``P`` tokens:
compute-bound past a few hundred tokens; causal attention counts half the ``P x P`` scores.

The marker says which term holds: ``"memory"`` (the reads), ``"compute"`` (the FLOPs) or ``"latency"`` (the
collectives and per-layer overhead outweigh both). The four coefficients and the stated range are
:data:`SERVE_CALIBRATION`, fitted on published measurements (``benchmarks/bench_serve.py``, the rows in
``benchmarks/data/serving_published.json``) with part held out.

Example:
  >>> from meshplan.pure.cluster import parse_cluster
  >>> from meshplan.pure.presets import MODEL_SPECS
  >>> from meshplan.pure.serve import CacheFormat, ServeLayout, kv_geometry, weight_bytes
  >>> spec, layout, cluster = MODEL_SPECS["llama3-8b"], ServeLayout(8, 1), parse_cluster("1x8xH100")
  >>> kv = kv_geometry(spec, layout, "bfloat16", CacheFormat())
  >>> t = decode_step_time(spec, cluster, layout, weight_bytes(spec, layout), kv, sequences=1, context=1024)
  >>> t.bound, t.low < t.seconds < t.high
  ('memory', True)
"""

from __future__ import annotations

import dataclasses
import math

from meshplan.pure._check import as_count
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cluster._link import Link
from meshplan.pure.cost._collective_time import all_gather_time, all_reduce_time, all_to_all_time
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._spec import ModelSpec, as_model_spec
from meshplan.pure.serve._kv import KvGeometry
from meshplan.pure.serve._layout import ServeLayout
from meshplan.pure.serve._weights import WeightBytes, padded_vocab

__all__ = ["BOUNDS", "SERVE_CALIBRATION", "TPU_CHECK", "ServeCalibration", "StepTime", "decode_step_time", "prefill_time"]

BOUNDS: tuple[str, ...] = ("memory", "compute", "latency")
"""Which term of a step holds: its reads, its FLOPs, or its collectives and per-layer overhead."""


@dataclasses.dataclass(frozen=True, slots=True)
class ServeCalibration:
    """The serving time model's coefficients and the range its predictions are stated with.

    Attributes:
      hbm_efficiency: share of the datasheet HBM bandwidth a step's reads reach.
      layer_overhead_s: seconds per layer and step beyond bytes, FLOPs and collectives.
      collective_latency_scale: multiplies the device's per-ring-step latency for serving's small collectives.
      matmul_efficiency: share of the peak FLOP/s the matmuls reach (prefill; compute-bound decode).
      low, high: measured / predicted over every published row (fitted and held out): a prediction is
        stated as ``[low x t, high x t]``.
      fitted_rows, held_out_rows: how many published rows fitted the coefficients, and how many checked them.
      held_out_error: the held-out rows' median |measured / predicted - 1|.
      source: the command that reproduces the fit.
    """

    hbm_efficiency: float
    layer_overhead_s: float
    collective_latency_scale: float
    matmul_efficiency: float
    low: float
    high: float
    fitted_rows: int
    held_out_rows: int
    held_out_error: float
    source: str

    def __post_init__(self) -> None:
        for name in ("hbm_efficiency", "matmul_efficiency"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
                raise PlanError(f"ServeCalibration.{name}={value!r:.40} must be a fraction in (0, 1].")
        for name in ("layer_overhead_s", "collective_latency_scale", "low", "high"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not -1e300 < value < 1e300
                    or not math.isfinite(value) or value < 0):
                raise PlanError(f"ServeCalibration.{name}={value!r:.40} must be a finite number >= 0.")
        if not self.low <= 1 <= self.high:
            raise PlanError(f"ServeCalibration: low={self.low} <= 1 <= high={self.high} must hold.")


# Fitted on the 15 "fit" rows of benchmarks/data/serving_published.json (gpt-fast's batch-1 decode on A100s,
# TensorRT-LLM's H100 ITL and TTFT at 467 x 256); low / high span those and the 27 held-out rows (H200, other
# lengths, int8 weights). The latency the fit finds is per layer, not per collective: at tp 1 and tp 8 alike the
# measured steps sit about 60 us a layer above their bytes, and a ring all-reduce's 2(n-1) link steps would
# make tp 8 far slower than measured (its latency scale comes out near 0).
SERVE_CALIBRATION = ServeCalibration(
    hbm_efficiency=0.79, layer_overhead_s=60.1e-6, collective_latency_scale=0.054, matmul_efficiency=0.464,
    low=0.90, high=1.22, fitted_rows=15, held_out_rows=27, held_out_error=0.092,
    source="python benchmarks/bench_serve.py --fit")
"""The coefficients :func:`decode_step_time` and :func:`prefill_time` use (see ``benchmarks/RESULTS.md``)."""

TPU_CHECK: tuple[float, float] = (1.03, 1.79)
"""No published per-step TPU measurement was found to calibrate on: JetStream-PyTorch's ShareGPT throughput on
v5e-8 (four rows) sits this far below the decode throughput the model predicts at its batch (an upper bound:
it leaves prefills and idle slots out); bf16 rows 1.03-1.20, int8 rows 1.41-1.79."""


@dataclasses.dataclass(frozen=True, slots=True)
class StepTime:
    """One decode step or prefill on a replica, its parts, and the range it is stated with.

    Attributes:
      seconds: the estimate.
      low, high: its stated range (the calibration's measured / predicted span).
      bound: which term holds (:data:`BOUNDS`).
      memory_s, compute_s, collective_s, overhead_s: the terms.
      read_bytes: bytes one device reads (weights and KV).
      flops: FLOPs one device computes.
    """

    seconds: float
    low: float
    high: float
    bound: str
    memory_s: float
    compute_s: float
    collective_s: float
    overhead_s: float
    read_bytes: int
    flops: float


def _peak(cluster: Cluster, fp8: bool) -> float:
    dev = cluster.device
    if dev.peak_bf16_flops is None:
        raise PlanError(f"{dev.name} has no peak_bf16_flops; a serving time needs one (pass a DeviceSpec with it).")
    return dev.peak_fp8_flops if fp8 and dev.peak_fp8_flops else dev.peak_bf16_flops


def _bandwidth(cluster: Cluster) -> float:
    bw = cluster.device.hbm_bandwidth
    if bw is None:
        raise PlanError(f"{cluster.device.name} has no hbm_bandwidth; a serving time needs one (pass a DeviceSpec "
                        "with it).")
    return bw


def _link(cluster: Cluster, layout: ServeLayout, calibration: ServeCalibration) -> tuple[Link, Link]:
    """(the tp link, the ep link): intra-domain with the calibrated latency, or the network when a replica
    spans domains."""
    dev = cluster.device
    intra = Link(dev.intra_bandwidth, dev.intra_latency_s * calibration.collective_latency_scale)
    inter = Link(dev.inter_bandwidth, dev.inter_latency_s * calibration.collective_latency_scale)
    return intra, inter if layout.devices_per_replica > cluster.ici_domain_size else intra


def _attention_params(spec: ModelSpec, tp: int) -> float:
    """Linear parameters of one attention block on one device."""
    d, n = spec.hidden_size, spec.num_heads
    if spec.mla is None:
        kv = max(spec.num_kv_heads, tp)
        return (d * n * spec.head_dim + 2 * d * kv * spec.head_dim) / tp + n * spec.head_dim * d / tp
    m = spec.mla
    down = d * m.q_lora_rank + d * (m.kv_lora_rank + m.qk_rope_head_dim)
    q_up = m.q_lora_rank * n * m.qk_head_dim if m.q_lora_rank else d * n * m.qk_head_dim
    return down + (q_up + m.kv_lora_rank * n * (m.qk_nope_head_dim + m.v_head_dim) + n * m.v_head_dim * d) / tp


def _attention_core(spec: ModelSpec, tp: int, keys: float) -> float:
    """FLOPs of one query token attending to ``keys`` cached tokens in one layer, on one device."""
    heads = spec.num_heads / tp
    width = (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim + spec.mla.kv_lora_rank) / 2 if spec.mla else spec.head_dim
    return 4 * keys * heads * width


def _flops(spec: ModelSpec, layout: ServeLayout, tokens: int, rank_tokens: int, keys_full: float,
           keys_window: float, head_tokens: int) -> float:
    """FLOPs on one device: ``rank_tokens`` through attention and dense layers, ``tokens`` through the experts."""
    tp, d = layout.tp, spec.hidden_size
    dense_layers = spec.num_dense_layers if spec.is_moe else spec.num_layers
    moe_layers = spec.num_moe_layers
    per_token = spec.num_layers * _attention_params(spec, tp) + dense_layers * 3 * d * spec.intermediate_size / tp
    per_token += moe_layers * 3 * d * spec.num_shared_experts * spec.moe_intermediate_size / tp
    flops = 2 * rank_tokens * per_token
    if moe_layers:
        flops += 2 * tokens * spec.num_experts_per_tok * moe_layers * 3 * d * spec.moe_intermediate_size / (
            layout.devices_per_replica)
    window_layers = spec.sliding_window_layers if spec.sliding_window else 0
    flops += (spec.num_layers - window_layers) * _attention_core(spec, tp, keys_full)
    flops += window_layers * _attention_core(spec, tp, keys_window)
    return flops + 2 * head_tokens * d * padded_vocab(spec.vocab_size, tp) / tp


def _collectives(spec: ModelSpec, layout: ServeLayout, tp_link: Link, ep_link: Link, rank_tokens: int,
                 logits_tokens: int) -> float:
    d, tp = spec.hidden_size, layout.tp
    hidden = rank_tokens * d * 2
    moe_a2a = spec.num_moe_layers if layout.ep > 1 else 0
    seconds = 0.0
    if tp > 1:
        reduces = 2 * spec.num_layers - moe_a2a
        seconds += reduces * float(all_reduce_time(hidden, tp, tp_link))
        seconds += float(all_gather_time(logits_tokens * padded_vocab(spec.vocab_size, tp) * 2, tp, tp_link))
    if moe_a2a:
        routed = rank_tokens * spec.num_experts_per_tok * d * 2
        seconds += 2 * moe_a2a * float(all_to_all_time(routed, layout.devices_per_replica, ep_link))
    return seconds


def _finish(memory_s: float, compute_s: float, collective_s: float, overhead_s: float, read: int, flops: float,
            calibration: ServeCalibration) -> StepTime:
    body = max(memory_s, compute_s)
    seconds = body + collective_s + overhead_s
    bound = "latency" if collective_s + overhead_s > body else "memory" if memory_s >= compute_s else "compute"
    return StepTime(seconds, seconds * calibration.low, seconds * calibration.high, bound, memory_s, compute_s,
                    collective_s, overhead_s, read, flops)


def _checked(spec: ModelSpec, cluster: Cluster, layout: ServeLayout, weights: WeightBytes,
             calibration: ServeCalibration) -> ModelSpec:
    spec = as_model_spec(spec)
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster.")
    if not isinstance(layout, ServeLayout):
        raise MeshplanTypeError(f"layout={layout!r:.60} must be a ServeLayout.")
    if not isinstance(weights, WeightBytes):
        raise MeshplanTypeError(f"weights={weights!r:.60} must be a WeightBytes (from weight_bytes).")
    if not isinstance(calibration, ServeCalibration):
        raise MeshplanTypeError(f"calibration={calibration!r:.60} must be a ServeCalibration.")
    return spec


def decode_step_time(spec: ModelSpec, cluster: Cluster, layout: ServeLayout, weights: WeightBytes,
                     kv: KvGeometry, *, sequences: int, context: int,
                     calibration: ServeCalibration = SERVE_CALIBRATION) -> StepTime:
    """Seconds one decode step of ``sequences`` sequences (a replica's), each ``context`` tokens long, takes.

    Raises:
      PlanError: counts out of range, a device with no bandwidth or peak figure.
      MeshplanTypeError: arguments of the wrong type.
    """
    spec = _checked(spec, cluster, layout, weights, calibration)
    if not isinstance(kv, KvGeometry):
        raise MeshplanTypeError(f"kv={kv!r:.60} must be a KvGeometry (from kv_geometry).")
    sequences = as_count(sequences, "sequences", maximum=10**9, error=PlanError)
    context = as_count(context, "context", maximum=10**12, error=PlanError)
    rank = -(-sequences // layout.ep)
    touched = 1.0 - (1.0 - spec.num_experts_per_tok / spec.num_experts) ** sequences if spec.is_moe else 0.0
    embed_rows = rank * spec.hidden_size * 2 // layout.tp
    read = weights.dense + embed_rows + int(weights.experts * touched) + kv.read_bytes(sequences, context)
    memory_s = read / (_bandwidth(cluster) * calibration.hbm_efficiency)
    window = min(context, spec.sliding_window) if spec.sliding_window else context
    flops = _flops(spec, layout, sequences, rank, rank * context, rank * window, rank)
    compute_s = flops / (_peak(cluster, weights.quant.dtype == "float8") * calibration.matmul_efficiency)
    tp_link, ep_link = _link(cluster, layout, calibration)
    collective_s = _collectives(spec, layout, tp_link, ep_link, rank, rank)
    return _finish(memory_s, compute_s, collective_s, spec.num_layers * calibration.layer_overhead_s, read, flops,
                   calibration)


def prefill_time(spec: ModelSpec, cluster: Cluster, layout: ServeLayout, weights: WeightBytes, *, tokens: int,
                 calibration: ServeCalibration = SERVE_CALIBRATION) -> StepTime:
    """Seconds one replica takes to prefill one prompt of ``tokens`` tokens (its first token's time, unqueued).

    Raises:
      PlanError: counts out of range, a device with no bandwidth or peak figure.
      MeshplanTypeError: arguments of the wrong type.
    """
    spec = _checked(spec, cluster, layout, weights, calibration)
    tokens = as_count(tokens, "tokens", maximum=10**9, error=PlanError)
    read = weights.dense + weights.experts + tokens * spec.hidden_size * 2 // layout.tp
    memory_s = read / (_bandwidth(cluster) * calibration.hbm_efficiency)
    window = min(tokens, spec.sliding_window) if spec.sliding_window else tokens
    # Causal: token i attends to i + 1 keys, on average half the prompt (half a window's once past it).
    full_keys = tokens * (tokens + 1) / 2
    window_keys = window * (window + 1) / 2 + (tokens - window) * window
    flops = _flops(spec, layout, tokens, tokens, full_keys, window_keys, 1)
    compute_s = flops / (_peak(cluster, weights.quant.dtype == "float8") * calibration.matmul_efficiency)
    tp_link, ep_link = _link(cluster, layout, calibration)
    collective_s = _collectives(spec, layout, tp_link, ep_link, tokens, 1)
    return _finish(memory_s, compute_s, collective_s, spec.num_layers * calibration.layer_overhead_s, read, flops,
                   calibration)
