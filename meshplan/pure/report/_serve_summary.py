"""What a serving plan's reader sees first, decided once: the header facts, the ranked table's columns and
cells, the notes under it and the command. The terminal (``meshplan.cli._serve``), markdown
(:mod:`._serve_markdown`) and HTML (:mod:`._serve_html`) only lay these out, so they cannot disagree.

Example:
  >>> from meshplan.pure.serve import plan_serving
  >>> plan = plan_serving("llama3.1-8b", "1x8xH100", context=8192, concurrency=64)
  >>> serve_rows(plan)[0]["verdict"], [c.key for c in SERVE_COLUMNS][:3]
  ('best', ['rank', 'mesh', 'weights'])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.serve._result import ServePlan, ServeRow
from meshplan.pure.serve._time import TPU_CHECK

__all__ = ["SERVE_COLUMNS", "ServeColumn", "check_plan", "serve_headline", "serve_header", "serve_notes",
           "serve_rows", "step_text"]

Compiled = Mapping[str, tuple[int, str]]
"""Mesh text -> (XLA's compiled peak bytes of the decode step, the compiler and version that gave it)."""


class ServeColumn(NamedTuple):
    """One column of the ranked table: its cell key, header, priority (1 always shown; a narrow terminal drops
    the highest numbers first) and alignment."""

    key: str
    title: str
    priority: int
    numeric: bool = False


SERVE_COLUMNS: tuple[ServeColumn, ...] = (
    ServeColumn("rank", "#", 1, True),
    ServeColumn("mesh", "layout", 1),
    ServeColumn("weights", "weights/dev", 2, True),
    ServeColumn("memory", "HBM/dev", 1, True),
    ServeColumn("kv_token", "KV/token/dev", 3, True),
    ServeColumn("capacity", "KV tokens", 4, True),
    ServeColumn("sequences", "seqs", 1, True),
    ServeColumn("step", "step", 1, True),
    ServeColumn("range", "range", 3, True),
    ServeColumn("prefill", "prefill", 2, True),
    ServeColumn("tps", "tok/s/dev", 1, True),
    ServeColumn("bound", "bound", 2),
    ServeColumn("verdict", "verdict", 1),
)
"""The ranked table's columns in display order: ``HBM/dev`` is the weights plus the KV cache of the sequences
priced (XLA's compiled peak where verified), ``step`` the decode step with every sequence at the context;
verdicts: ``best``, the throughput against it, ``over limits``, ``KV short`` (the weights fit, the asked
sequences' cache does not), ``no room`` (the weights leave no KV cache)."""


def check_plan(plan: object) -> ServePlan:
    """``plan`` if it is a :class:`~meshplan.pure.serve.ServePlan`, else a MeshplanTypeError."""
    if not isinstance(plan, ServePlan):
        raise MeshplanTypeError(f"plan={plan!r:.80} must be a ServePlan (plan_serving(...)), not {type(plan).__name__}.")
    return plan


def step_text(seconds: float) -> str:
    """A step time as the tables print it.

    Example:
      >>> step_text(0.0312), step_text(1.5)
      ('31.2 ms', '1.50 s')
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not _finite(seconds):
        raise MeshplanTypeError(f"seconds={seconds!r:.40} must be a finite number.")
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range
        return False


def serve_headline(plan: ServePlan) -> str:
    """``'meshplan serve: llama3.1-70b on 1x8xH100 with vLLM'``."""
    plan = check_plan(plan)
    req = plan.request
    return f"meshplan serve: {req.model} on {req.cluster.text} with {req.engine.label}"


def serve_header(plan: ServePlan) -> tuple[tuple[str, str], ...]:
    """The header facts as ``(label, text)`` pairs."""
    plan = check_plan(plan)
    req, cal = plan.request, plan.calibration
    dev = req.cluster.device
    bw = f", {dev.hbm_bandwidth / 1e12:g} TB/s" if dev.hbm_bandwidth else ""
    asked = f"{req.concurrency} sequences at once" if req.concurrency else "the most sequences that fit"
    limits = []
    if req.max_tpot_s is not None:
        limits.append(f"decode step <= {req.max_tpot_s * 1e3:g} ms")
    if req.max_ttft_s is not None:
        limits.append(f"prefill <= {req.max_ttft_s * 1e3:g} ms")
    positions = f" (of its {req.positions} positions)" if req.positions else ""
    facts = [
        ("model", f"{req.model}; weights {req.quant.text}, KV cache {req.kv_dtype}"),
        ("cluster", f"{req.cluster.text}: {req.cluster.num_devices} x {dev.name}, "
                    f"{fmt_bytes(dev.hbm_bytes, style='exact')} HBM{bw} each"),
        ("asked", f"context {req.context} tokens{positions}, {asked}, prompt {req.prompt_tokens} tokens"
                  + (f"; limits: {', '.join(limits)}" if limits else "")),
        ("engine", f"{req.engine.label}: {req.engine.reserve_rule} ({req.engine.source})"),
        ("memory", "weights and KV cache exact per device for the layout (meshplan's layout, the one its "
                   "reference decode step compiles); the engine's own reserve by its rule"
                   + ("; vLLM's profiled forward is meshplan's estimate" if req.engine.name == "vllm" else "")),
        ("time", f"estimated: HBM reads at {cal.hbm_efficiency:.0%} of the datasheet, matmuls at "
                 f"{cal.matmul_efficiency:.0%} of peak, {cal.layer_overhead_s * 1e6:.0f} us a layer, collectives "
                 f"alpha-beta; every sequence at the full context; range {cal.low:.2f}-{cal.high:.2f}x "
                 f"(measured / predicted over {cal.fitted_rows} fitted and {cal.held_out_rows} held-out published "
                 f"rows, held-out median error {cal.held_out_error:.0%})"),
    ]
    if dev.ici_scope == "slice":
        facts.append(("note", "TPU times are not calibrated on TPU steps (none published was found): "
                              f"JetStream-PyTorch's v5e-8 throughput is {TPU_CHECK[0]:.2f}-{TPU_CHECK[1]:.2f}x "
                              "below what this model predicts"))
    return tuple(facts)


def _verdict(row: ServeRow, best: ServeRow | None) -> str:
    if row is best:
        return "best"
    if row.meets_limits and best is not None:
        return f"{row.tokens_per_s_per_device / best.tokens_per_s_per_device - 1:+.0%} tok/s"
    if row.fits:
        return "over limits"
    return "no room" if row.budget.kv_bytes <= 0 else "KV short"


def serve_rows(plan: ServePlan, compiled: Compiled | None = None) -> list[dict[str, str]]:
    """One dict of cells per row (keys of :data:`SERVE_COLUMNS`)."""
    plan = check_plan(plan)
    done = dict(compiled or {})
    best = plan.best
    out = []
    for i, row in enumerate(plan.rows, 1):
        used = row.weights.total + (row.kv.cache_bytes(row.sequences, row.context) if row.sequences else 0)
        memory = fmt_bytes(used)
        if row.mesh in done:
            memory = f"exact {fmt_bytes(done[row.mesh][0])}"
        out.append({
            "rank": str(i), "mesh": row.mesh, "weights": fmt_bytes(row.weights.total), "memory": memory,
            "kv_token": f"{row.kv.bytes_per_token / 1024:,.1f} KiB", "capacity": f"{row.kv_capacity_tokens:,}",
            "sequences": f"{row.sequences}" if row.fits else f"0 of {row.max_sequences}" if row.max_sequences else "0",
            "step": "-" if row.decode is None else step_text(row.decode.seconds),
            "range": "-" if row.decode is None else
            f"{row.decode.low * 1e3:.1f}-{row.decode.high * 1e3:.1f} ms",
            "prefill": "-" if row.prefill is None else step_text(row.prefill.seconds),
            "tps": "-" if not row.fits else f"{row.tokens_per_s_per_device:,.0f}",
            "bound": "-" if row.decode is None else row.decode.bound,
            "verdict": _verdict(row, best),
        })
    return out


def serve_notes(plan: ServePlan, *, limit: int = 4) -> tuple[str, ...]:
    """The lines under the table: why rows do not fit or miss a limit (the first ``limit``), the layouts the
    model cannot be split over, and the answer."""
    plan = check_plan(plan)
    notes = [f"#{i} {row.mesh}: {row.why}" for i, row in enumerate(plan.rows, 1) if row.why][:limit]
    if plan.left_out:
        notes.append("not splittable: " + "; ".join(f"{m} ({w})" for m, w in plan.left_out[:2])
                     + (f"; and {len(plan.left_out) - 2} more" if len(plan.left_out) > 2 else ""))
    if plan.best is None:
        notes.append(plan.answer)
    return tuple(notes)
