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
from meshplan.pure.serve._result import ServePlan, ServeRequest, ServeRow
from meshplan.pure.serve._quant import WeightQuant, kv_dtype
from meshplan.pure.serve._time import SERVE_CALIBRATION, ServeCalibration, StepTime, decode_step_time, prefill_time
from meshplan.pure.serve._weights import WeightBytes, weight_bytes

__all__ = ["plan_serving"]

_MAX_SEQUENCES = 10**6  # far beyond any engine's running batch; bounds the searches


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
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e12
            or value != value):
        raise PlanError(f"{what}={value!r:.40} must be a positive number of seconds (below 1e12) or None.")
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
