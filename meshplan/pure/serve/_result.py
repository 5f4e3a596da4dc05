"""A serving plan's result: the request, each layout priced (:class:`ServeRow`), and the ranked plan
(:class:`ServePlan`) with its answer, JSON and notebook views.

Example:
  >>> from meshplan.pure.serve import plan_serving
  >>> row = plan_serving("llama3.1-8b", "H100", context=2048, concurrency=8).best
  >>> row.to_dict()["mesh"], type(row.to_dict()["weight_bytes_per_device"]).__name__
  ('tp=8', 'int')
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.serve._engines import Engine, KvBudget
from meshplan.pure.serve._kv import KvGeometry
from meshplan.pure.serve._layout import ServeLayout
from meshplan.pure.serve._quant import WeightQuant
from meshplan.pure.serve._time import ServeCalibration, StepTime
from meshplan.pure.serve._weights import WeightBytes

__all__ = ["ServePlan", "ServeRequest", "ServeRow"]


@dataclasses.dataclass(frozen=True, slots=True)
class ServeRequest:
    """What a serving plan was asked (every default resolved).

    Attributes:
      model: the model's name.
      cluster: the cluster.
      context: the longest sequence (prompt and output), the engine's max model length.
      concurrency: sequences the cluster holds at once (``None``: the most that fit).
      prompt_tokens: the prompt a prefill is priced for.
      quant: the weights' storage.
      kv_dtype: the cache's dtype.
      engine: the engine.
      fraction: the memory fraction asked for (``None``: the engine's default rule).
      max_tpot_s, max_ttft_s: the latency limits (``None``: none).
      positions: the model's positions (``None``: unknown).
    """

    model: str
    cluster: Cluster
    context: int
    concurrency: int | None
    prompt_tokens: int
    quant: WeightQuant
    kv_dtype: str
    engine: Engine
    fraction: float | None
    max_tpot_s: float | None
    max_ttft_s: float | None
    positions: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"model": self.model, "cluster": self.cluster.text, "context": self.context,
                "concurrency": self.concurrency, "prompt_tokens": self.prompt_tokens, "weight_dtype": self.quant.dtype,
                "weight_scales": self.quant.scales if self.quant.quantized else None, "kv_dtype": self.kv_dtype,
                "engine": self.engine.name, "mem_fraction": self.fraction, "max_tpot_s": self.max_tpot_s,
                "max_ttft_s": self.max_ttft_s, "positions": self.positions}


@dataclasses.dataclass(frozen=True, slots=True)
class ServeRow:
    """One layout, priced.

    Attributes:
      layout: the layout.
      fits: the weights and the asked sequences' KV cache fit the engine's budget.
      meets_limits: it fits and its decode step and prefill meet the latency limits.
      why: the reason when it does not (``""`` when it does).
      weights: bytes per device (exact).
      kv: the cache's geometry (exact bytes per token and per sequence).
      budget: what the engine leaves the cache, by its rule.
      kv_capacity_tokens: tokens a replica's caches hold.
      max_sequences: sequences of ``context`` tokens a replica holds.
      max_context: the longest context at which the asked sequences fit (0: none does).
      sequences: sequences per replica the row is priced with (0 when none fit).
      decode, prefill: the step times (``None`` when nothing fits).
      tokens_per_s_per_replica, tokens_per_s_per_device: the decode throughput.
      command: the engine's command for one replica.
      context: the context the row is priced at.
    """

    layout: ServeLayout
    fits: bool
    meets_limits: bool
    why: str
    weights: WeightBytes
    kv: KvGeometry
    budget: KvBudget
    kv_capacity_tokens: int
    max_sequences: int
    max_context: int
    sequences: int
    decode: StepTime | None
    prefill: StepTime | None
    tokens_per_s_per_replica: float
    tokens_per_s_per_device: float
    command: tuple[str, ...]
    context: int

    @property
    def mesh(self) -> str:
        """The layout as mesh text (``"dp=2,tp=4"``)."""
        return self.layout.text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: bytes as ints, seconds as floats."""
        def step(t: StepTime | None) -> dict[str, Any] | None:
            return None if t is None else {"seconds": t.seconds, "low_s": t.low, "high_s": t.high, "bound": t.bound,
                                           "memory_s": t.memory_s, "compute_s": t.compute_s,
                                           "collective_s": t.collective_s, "overhead_s": t.overhead_s,
                                           "read_bytes": t.read_bytes, "flops": t.flops}
        return {
            "mesh": self.mesh, "replicas": self.layout.replicas, "tp": self.layout.tp, "ep": self.layout.ep,
            "fits": self.fits, "meets_limits": self.meets_limits, "why": self.why,
            "weight_bytes_per_device": self.weights.total,
            "kv_bytes_per_token_per_device": self.kv.bytes_per_token,
            "kv_bytes_per_sequence_per_device": self.kv.sequence_bytes(self.context),
            "kv_budget_bytes_per_device": self.budget.kv_bytes, "mem_fraction": self.budget.fraction,
            "reserved_bytes_per_device": self.budget.reserved_bytes,
            "kv_capacity_tokens": self.kv_capacity_tokens, "max_sequences": self.max_sequences,
            "max_context": self.max_context, "sequences": self.sequences,
            "page_size": self.kv.format.page_size, "cache_layout": self.kv.format.layout,
            "decode_step_s": None if self.decode is None else self.decode.seconds,
            "prefill_s": None if self.prefill is None else self.prefill.seconds,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "tokens_per_s_per_replica": self.tokens_per_s_per_replica,
            "bound": None if self.decode is None else self.decode.bound,
            "decode": step(self.decode), "prefill": step(self.prefill), "command": list(self.command),
        }



@dataclasses.dataclass(frozen=True, slots=True)
class ServePlan:
    """A serving plan: the request, every layout priced (best first), the layouts left out and why.

    Attributes:
      request: what was asked.
      rows: every valid layout, ranked: those that fit and meet the limits by tokens/s per device, then the
        ones that fit but miss a limit, then the ones that do not fit.
      left_out: layouts of the cluster the model cannot be split over, with the reason.
      calibration: the time model's coefficients and stated range.
    """

    request: ServeRequest
    rows: tuple[ServeRow, ...]
    left_out: tuple[tuple[str, str], ...]
    calibration: ServeCalibration

    @property
    def best(self) -> ServeRow | None:
        """The top row that fits and meets the limits (``None``: none does)."""
        return self.rows[0] if self.rows and self.rows[0].meets_limits else None

    @property
    def answer(self) -> str:
        """One sentence: the best layout, or why none serves and what would."""
        best = self.best
        req = self.request
        if best is not None:
            return (f"{best.mesh}: {best.sequences} sequences per replica at {req.context} tokens, "
                    f"{best.tokens_per_s_per_device:,.0f} tokens/s per device")
        fitting = [r for r in self.rows if r.fits]
        if fitting:
            return "no layout meets the limits; " + fitting[0].why
        most = max((r.max_sequences for r in self.rows), default=0)
        longest = max((r.max_context for r in self.rows), default=0)
        if most:
            return (f"does not fit as asked: at {req.context} tokens at most {most} sequences per replica fit "
                    f"({max(self.rows, key=lambda r: r.max_sequences).mesh})"
                    + (f"; at the asked concurrency the longest context that fits is {longest}" if longest else ""))
        if longest:
            return f"does not fit as asked: the longest context that fits the asked concurrency is {longest} tokens"
        heaviest = min(self.rows, key=lambda r: r.weights.total) if self.rows else None
        return ("does not fit: the weights alone exceed what the engine leaves on every layout"
                + (f" (least: {fmt_bytes(heaviest.weights.total)} per device on {heaviest.mesh})" if heaviest else ""))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the request, the answer, every row, the layouts left out, the calibration."""
        c = self.calibration
        return {"request": self.request.to_dict(), "answer": self.answer,
                "best": None if self.best is None else self.best.mesh,
                "layouts": [r.to_dict() for r in self.rows],
                "left_out": [{"mesh": m, "why": w} for m, w in self.left_out],
                "engine": {"name": self.request.engine.name, "reserve_rule": self.request.engine.reserve_rule,
                           "source": self.request.engine.source},
                "calibration": {"low": c.low, "high": c.high, "held_out_error": c.held_out_error,
                                "fitted_rows": c.fitted_rows, "held_out_rows": c.held_out_rows, "source": c.source}}

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=2)
