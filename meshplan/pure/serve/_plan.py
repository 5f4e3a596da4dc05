"""Plan serving: every layout of a cluster, its weights and KV cache by the engine's rule, its decode and
prefill time, ranked by tokens per second per device among those that fit and meet the latency limits.

``concurrency`` is the number of sequences the whole cluster holds at once, split evenly over the replicas;
``None`` asks for the most each replica can hold at ``context`` (its KV capacity), fewer where a
``max_tpot_s`` limit needs it. Every decode step is priced with every running sequence at ``context`` tokens
(the slowest step the server reaches); the prefill is one prompt of ``prompt_tokens`` on an idle replica.
A layout that does not fit is an answer, not an error: its row says the most sequences that fit at the
context and the longest context that fits at the concurrency.

Example:
  >>> p = plan_serving("llama3.1-70b", "1x8xH100", context=32768)
  >>> p.best.layout.text, p.best.fits, p.best.sequences > 0
  ('tp=8', True, True)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from meshplan.pure._check import as_count, as_flag, as_sequence
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster._cluster import Cluster, parse_cluster
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._spec import ModelSpec
from meshplan.pure.serve._context import check_context, model_positions, serve_model
from meshplan.pure.serve._engines import (
    Engine,
    KvBudget,
    check_engine,
    default_engine,
    engine,
    engine_cache_format,
    kv_budget,
)
from meshplan.pure.serve._flags import engine_command
from meshplan.pure.serve._kv import KvGeometry, kv_geometry
from meshplan.pure.serve._layout import ServeLayout, check_layout, serving_layouts
from meshplan.pure.serve._quant import WeightQuant, kv_dtype
from meshplan.pure.serve._time import SERVE_CALIBRATION, ServeCalibration, StepTime, decode_step_time, prefill_time
from meshplan.pure.serve._weights import WeightBytes, weight_bytes

__all__ = ["ServePlan", "ServeRequest", "ServeRow", "plan_serving"]

_MAX_SEQUENCES = 10**6  # far beyond any engine's running batch; bounds the searches


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

    def _repr_markdown_(self) -> str:
        """The plan as markdown (Jupyter calls this): ``meshplan.pure.report.serve_markdown``."""
        return _report("serve_markdown")(self)  # type: ignore[no-any-return]

    def _repr_html_(self) -> str:
        """The plan as HTML (Jupyter calls this): ``meshplan.pure.report.serve_html``, a fragment."""
        return _report("serve_html")(self, fragment=True)  # type: ignore[no-any-return]


def _report(name: str) -> Any:
    # The renderers sit in the report room, a layer above this one; the notebook hook must be on the object
    # Jupyter is handed, so it finds them by name when called, and the import graph keeps pointing down.
    import importlib

    return getattr(importlib.import_module("meshplan.pure.report"), name)


def _resolve(model: Any, cluster: Any) -> tuple[ModelSpec, int | None, Cluster]:
    if isinstance(model, str):
        spec, positions = serve_model(model)
    elif isinstance(model, ModelSpec):
        spec, positions = model, model_positions(model)
    else:
        raise MeshplanTypeError(f"model={model!r:.60} must be a ModelSpec or a name (a preset or llama3.1-70b).")
    if isinstance(cluster, str):
        cluster = parse_cluster(cluster)
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster or its text ('1x8xH100').")
    return spec, positions, cluster


def _limit(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise PlanError(f"{what}={value!r:.40} must be a positive number of seconds or None.")
    return float(value)


def _decode(spec: ModelSpec, cluster: Cluster, layout: ServeLayout, w: WeightBytes, kv: KvGeometry, seqs: int,
            context: int, cal: ServeCalibration) -> StepTime:
    return decode_step_time(spec, cluster, layout, w, kv, sequences=seqs, context=context, calibration=cal)


def _most_within(spec: ModelSpec, cluster: Cluster, layout: ServeLayout, w: WeightBytes, kv: KvGeometry,
                 cap: int, context: int, tpot: float, cal: ServeCalibration) -> int:
    """The most sequences (at most ``cap``) whose decode step meets ``tpot`` (the step grows with them)."""
    if _decode(spec, cluster, layout, w, kv, 1, context, cal).seconds > tpot:
        return 0
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _decode(spec, cluster, layout, w, kv, mid, context, cal).seconds <= tpot else (lo, mid - 1)
    return lo


def _row(spec: ModelSpec, req: ServeRequest, layout: ServeLayout, cal: ServeCalibration) -> ServeRow:
    cluster, context, eng = req.cluster, req.context, req.engine
    w = weight_bytes(spec, layout, req.quant)
    asked = None if req.concurrency is None else -(-req.concurrency // layout.replicas)
    seqs_hint = asked or 256
    for _ in range(2):  # the engine's budget and pages depend on the sequences it runs: settle them
        fmt = engine_cache_format(eng, spec, cluster, context=context, max_num_seqs=seqs_hint)
        kv = kv_geometry(spec, layout, req.kv_dtype, fmt)
        budget = kv_budget(eng, cluster, spec, layout, w, fraction=req.fraction, max_num_seqs=seqs_hint,
                           decode_temp_bytes=_decode_temps(spec, layout, seqs_hint))
        most = min(kv.max_sequences(context, budget.kv_bytes), _MAX_SEQUENCES) if budget.kv_bytes > 0 else 0
        seqs_hint = max(1, asked or most)
    capacity = kv.capacity_tokens(budget.kv_bytes) if budget.kv_bytes > 0 else 0
    limit = req.positions or 10**7
    longest = kv.max_context(asked or 1, budget.kv_bytes, limit=limit) if budget.kv_bytes > 0 else 0
    command = engine_command(eng, req.model, layout, context=context, sequences=max(1, asked or most),
                             fraction=budget.fraction, quant=req.quant, kv_dtype=req.kv_dtype,
                             prompt_tokens=req.prompt_tokens)
    row = ServeRow(layout=layout, fits=False, meets_limits=False, why="", weights=w, kv=kv, budget=budget,
                   kv_capacity_tokens=capacity, max_sequences=most, max_context=longest, sequences=0, decode=None,
                   prefill=None, tokens_per_s_per_replica=0.0, tokens_per_s_per_device=0.0, command=command,
                   context=context)
    if budget.kv_bytes <= 0:
        return dataclasses.replace(row, why=f"the weights ({fmt_bytes(w.total)} per device) leave no KV cache in "
                                            f"what {eng.label} takes ({_takes(budget, cluster)})")
    if most == 0 or (asked is not None and asked > most):
        need = asked or 1
        why = (f"{need} sequences of {context} tokens need {fmt_bytes(kv.cache_bytes(need, context))} of KV per "
               f"device, {eng.label} leaves {fmt_bytes(budget.kv_bytes)}: at most {most} fit"
               + (f", or {longest} tokens each at {need}" if longest else ""))
        return dataclasses.replace(row, why=why)
    seqs, why = asked or most, ""
    if req.max_tpot_s is not None:
        within = _most_within(spec, cluster, layout, w, kv, seqs, context, req.max_tpot_s, cal)
        if asked is None and within:
            seqs = within
        elif within < seqs:
            over = _decode(spec, cluster, layout, w, kv, seqs, context, cal).seconds
            why = (f"a decode step of {seqs} sequences takes {over * 1e3:.1f} ms, over the {req.max_tpot_s * 1e3:g} "
                   "ms limit" + (f" (at most {within} sequences meet it)" if within else ""))
    decode = _decode(spec, cluster, layout, w, kv, seqs, context, cal)
    prefill = prefill_time(spec, cluster, layout, w, tokens=req.prompt_tokens, calibration=cal)
    if not why and req.max_ttft_s is not None and prefill.seconds > req.max_ttft_s:
        why = (f"a {req.prompt_tokens}-token prefill takes {prefill.seconds * 1e3:.1f} ms, over the "
               f"{req.max_ttft_s * 1e3:g} ms time-to-first-token limit")
    if seqs != (asked or most):
        command = engine_command(eng, req.model, layout, context=context, sequences=seqs, fraction=budget.fraction,
                                 quant=req.quant, kv_dtype=req.kv_dtype, prompt_tokens=req.prompt_tokens)
    per_replica = seqs / decode.seconds
    return dataclasses.replace(row, fits=True, meets_limits=not why, why=why, sequences=seqs, decode=decode,
                               prefill=prefill, tokens_per_s_per_replica=per_replica,
                               tokens_per_s_per_device=per_replica / layout.devices_per_replica, command=command)


def _takes(budget: KvBudget, cluster: Cluster) -> str:
    frac = budget.fraction
    share = f"{frac:g} of {fmt_bytes(cluster.device.hbm_bytes)}" if frac is not None else "its budget"
    return share + (f", less {fmt_bytes(budget.reserved_bytes)} it reserves" if budget.reserved_bytes else "")


def _decode_temps(spec: ModelSpec, layout: ServeLayout, sequences: int) -> int:
    """meshplan's estimate of a decode step's temporaries (MaxText's budget): a layer's activations for the
    running sequences and their fp32 logits, twice over for the buffers XLA double-books."""
    rank = -(-sequences // layout.ep)
    width = max(spec.intermediate_size, spec.moe_intermediate_size * max(spec.num_experts_per_tok, 1))
    return 2 * rank * (2 * (4 * spec.hidden_size + 3 * width // layout.tp) + 4 * spec.vocab_size // layout.tp)


def _rank_key(row: ServeRow) -> tuple[int, float, int, int]:
    group = 0 if row.meets_limits else 1 if row.fits else 2
    score = -row.tokens_per_s_per_device if row.fits else -row.max_sequences
    return group, score, row.layout.devices_per_replica, row.layout.ep


def plan_serving(model: ModelSpec | str, cluster: Cluster | str, *, context: int, concurrency: int | None = None,
                 prompt_tokens: int | None = None, weight_dtype: str | WeightQuant = "bfloat16",
                 kv_dtype: str = "bfloat16", engine_name: str | Engine | None = None, fraction: float | None = None,
                 max_tpot_s: float | None = None, max_ttft_s: float | None = None, allow_long_context: bool = False,
                 positions: int | None = None, layouts: Sequence[ServeLayout] | None = None,
                 calibration: ServeCalibration = SERVE_CALIBRATION) -> ServePlan:
    """Price every serving layout of ``cluster`` for ``model`` and rank them.

    Args:
      model: a :class:`~meshplan.pure.presets.ModelSpec`, a preset name or a serving name (``llama3.1-70b``).
      cluster: a :class:`~meshplan.pure.cluster.Cluster` or its text.
      context: the longest sequence, prompt and output (the engine's max model length).
      concurrency: sequences the whole cluster holds at once; ``None``: the most each replica holds.
      prompt_tokens: the prompt a prefill (time to first token) is priced for (default: ``context``).
      weight_dtype: ``"bfloat16"``, ``"int8"``, ``"float8"`` or a :class:`~meshplan.pure.serve.WeightQuant`.
      kv_dtype: ``"bfloat16"``, ``"float8"`` or ``"int8"`` (the engine's choices).
      engine_name: ``"vllm"``, ``"sglang"``, ``"maxtext"`` (``"jetstream"``), ``"vllm-tpu"``; default vLLM on
        GPUs, MaxText on TPUs.
      fraction: the memory fraction the engine takes, instead of its default rule.
      max_tpot_s, max_ttft_s: a decode step's and a prefill's limits, in seconds.
      allow_long_context: plan a context past the model's positions.
      positions: the model's positions, where the name does not say them (a config file's).
      layouts: only these layouts (default: :func:`~meshplan.pure.serve.serving_layouts`).
      calibration: the time model's coefficients.

    Returns:
      A :class:`ServePlan`.

    Raises:
      PlanError: a context past the positions, a prompt longer than the context, an engine that does not run
        on the cluster or serve the dtypes, counts or limits out of range, a family not served, no layout.
      MeshplanTypeError: arguments of the wrong type.
    """
    spec, known, clus = _resolve(model, cluster)
    del model, cluster
    positions = known if positions is None else as_count(positions, "positions", maximum=10**12, error=PlanError)
    context = check_context(spec, context, positions, allow_long=as_flag(allow_long_context, "allow_long_context"))
    if concurrency is not None:
        concurrency = as_count(concurrency, "concurrency", maximum=10**9, error=PlanError,
                               hint="sequences held at once; None for the most that fit")
    prompt = context if prompt_tokens is None else as_count(prompt_tokens, "prompt_tokens", maximum=10**12,
                                                            error=PlanError)
    if prompt > context:
        raise PlanError(f"prompt_tokens={prompt} is longer than context={context} (the prompt is part of it).")
    eng = default_engine(clus) if engine_name is None else engine(engine_name)
    quant = weight_dtype if isinstance(weight_dtype, WeightQuant) else WeightQuant(weight_dtype)
    cache = _kv_name(kv_dtype)
    check_engine(eng, clus, quant, cache)
    req = ServeRequest(spec.name, clus, context, concurrency, prompt, quant, cache, eng, fraction,
                       _limit(max_tpot_s, "max_tpot_s"), _limit(max_ttft_s, "max_ttft_s"), positions)
    if not isinstance(calibration, ServeCalibration):
        raise MeshplanTypeError(f"calibration={calibration!r:.60} must be a ServeCalibration.")
    from meshplan.pure.serve._weights import SERVED_FAMILIES

    if spec.family not in SERVED_FAMILIES:
        raise PlanError(f"{spec.name}: serving plans cover the {list(SERVED_FAMILIES)} families, not {spec.family!r}.")
    if layouts is None:
        chosen = serving_layouts(spec, clus)
    else:
        chosen = tuple(check_layout(spec, l, clus) for l in as_sequence(layouts, "layouts"))
    if not chosen:
        raise PlanError(f"no layout of {clus.text} can split {spec.name} (its heads, kv heads, MLP and expert "
                        "widths must divide over tp inside a node or slice).")
    rows = sorted((_row(spec, req, l, calibration) for l in chosen), key=_rank_key)
    return ServePlan(req, tuple(rows), _left_out(spec, clus, chosen), calibration)


def _kv_name(value: Any) -> str:
    return kv_dtype(value)


def _left_out(spec: ModelSpec, cluster: Cluster, chosen: Sequence[ServeLayout]) -> tuple[tuple[str, str], ...]:
    from meshplan.pure.serve._layout import _divisors, layout_problems

    kept = {l.text for l in chosen}
    out = []
    for tp in _divisors(cluster.ici_domain_size):
        if cluster.num_devices % tp:
            continue
        layout = ServeLayout(cluster.num_devices // tp, tp)
        if layout.text not in kept:
            problems = layout_problems(spec, layout, cluster)
            if problems:
                out.append((layout.text, "; ".join(problems)))
    return tuple(out)
