"""What a comparison shows, decided once: the header facts, the ranked table's columns and cells, the verdicts.

The terminal (``meshplan.cli._compare``), markdown and HTML renderers only lay these
out, so they cannot disagree. Each column has a priority: a narrow terminal drops
the highest numbers first (the table at 80 columns keeps rank, cluster, devices,
memory, step, tokens per second and, when priced, the cost per million tokens).

Every figure's provenance is in its cell or its header line: ``exact 45.2 GiB`` is a
compiled peak (the compilers are listed under the table), ``est 44.7 GiB`` the
planner's estimate (with its calibrated range in ``--detail`` and the HTML); step
time, throughput and MFU are always estimates, and costs are the user's prices.
"""

from __future__ import annotations

import dataclasses

from meshplan.pure._format import fmt_bytes
from meshplan.pure.compare import Comparison, CompareOption
from meshplan.pure.errors import MeshplanTypeError

__all__ = ["COMPARE_COLUMNS", "CompareColumn", "compare_header", "compare_rows", "compare_verdicts", "fmt_count",
           "fmt_duration", "fmt_money", "fmt_seconds", "shown_columns"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompareColumn:
    """One column of the ranked table: its key in :func:`compare_rows`' cells, title, priority, alignment."""

    key: str
    title: str
    priority: int  # 1 is never dropped; a narrow terminal drops the highest first
    right: bool = True
    priced: bool = False  # shown only when some option has a price
    timed: bool = False  # shown only when a token budget was asked


COMPARE_COLUMNS: tuple[CompareColumn, ...] = (
    CompareColumn("rank", "#", 1),
    CompareColumn("cluster", "cluster", 1, right=False),
    CompareColumn("devices", "devices", 1),
    CompareColumn("mesh", "best layout", 3, right=False),
    CompareColumn("memory", "memory/device", 1),
    CompareColumn("headroom", "headroom", 4),
    CompareColumn("step", "step", 2),
    CompareColumn("tokens", "tokens/s", 1),
    CompareColumn("per_device", "tok/s/dev", 3),
    CompareColumn("mfu", "MFU", 3),
    CompareColumn("cost", "$/M tok", 1, priced=True),
    CompareColumn("train_time", "train time", 2, timed=True),
    CompareColumn("train_cost", "train cost", 2, priced=True, timed=True),
)
"""The ranked table's columns, in order."""


def _check(comparison: object) -> Comparison:
    if not isinstance(comparison, Comparison):
        raise MeshplanTypeError(f"comparison={comparison!r:.60} must be a Comparison (what compare_clusters returns).")
    return comparison


def fmt_count(x: float) -> str:
    """``1.2M``, ``35.1k``, ``812``: a rate or count in three significant figures.

    Example:
      >>> fmt_count(1_234_567), fmt_count(35_120.0), fmt_count(812.4)
      ('1.23M', '35.1k', '812')
    """
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_seconds(seconds: float) -> str:
    """``4.63 s``, ``812 ms``, ``261 us`` (three significant figures).

    Example:
      >>> fmt_seconds(4.6312), fmt_seconds(0.8121), fmt_seconds(0.000261)
      ('4.63 s', '812 ms', '261 us')
    """
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def fmt_money(usd: float) -> str:
    """``$0.271``, ``$35.6k``, ``$1.24M`` (three significant figures).

    Example:
      >>> fmt_money(0.2712), fmt_money(35_555.5), fmt_money(1_240_000)
      ('$0.271', '$35.6k', '$1.24M')
    """
    return "$" + (fmt_count(usd) if usd >= 1000 else f"{usd:.3g}")


def fmt_duration(hours: float) -> str:
    """``45 min``, ``12.5 h``, ``11.6 days``.

    Example:
      >>> fmt_duration(0.75), fmt_duration(12.5), fmt_duration(277.8)
      ('45 min', '12.5 h', '11.6 days')
    """
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.3g} h"
    return f"{hours / 24:.3g} days"


def _memory(o: CompareOption) -> str:
    if o.memory_bytes is None:
        return "-"
    if o.status in ("exact", "over budget"):
        return f"exact {fmt_bytes(o.memory_bytes)}"
    return f"est {fmt_bytes(o.memory_bytes)}"


def _row(rank: int, o: CompareOption, tokens: int | None) -> dict[str, str]:
    trained = o.train(tokens) if tokens is not None else None
    cost = o.cost_per_million_tokens
    headroom = o.headroom_bytes
    return {
        "rank": str(rank) if o.fits else "-",
        "cluster": o.cluster,
        "devices": str(o.devices),
        "mesh": o.mesh or ("none fits" if o.status == "none fits" else "-"),
        "memory": _memory(o),
        "headroom": "-" if headroom is None else fmt_bytes(headroom),
        "step": fmt_seconds(o.step_s) if o.fits else "-",
        "tokens": fmt_count(o.tokens_per_s) if o.fits else "-",
        "per_device": fmt_count(o.tokens_per_s_per_device) if o.fits else "-",
        "mfu": f"{o.mfu:.1%}" if o.fits and o.mfu > 0 else "-",
        "cost": "-" if cost is None else fmt_money(cost),
        "train_time": "-" if trained is None else fmt_duration(trained[0]),
        "train_cost": "-" if trained is None or trained[1] is None else fmt_money(trained[1]),
    }


def shown_columns(comparison: Comparison) -> tuple[CompareColumn, ...]:
    """The columns this comparison shows: cost columns only with prices, train columns only with ``tokens``."""
    priced = any(o.price_per_device_hour is not None for o in _check(comparison).options)
    return tuple(c for c in COMPARE_COLUMNS if (priced or not c.priced) and (comparison.tokens or not c.timed))


def compare_rows(comparison: Comparison) -> list[dict[str, str]]:
    """One dict of cells per option, ranked (options where nothing fits get rank ``-``).

    Example:
      >>> from meshplan.pure.compare import build_comparison
      >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "exact", 40 * 2**30, 60 * 2**30, 2.0, 8192, .4)
      >>> compare_rows(build_comparison("gpt2", 8, 1024, [a]))[0]["memory"]
      'exact 40.0 GiB'
    """
    _check(comparison)
    rank = 0
    out = []
    for o in comparison.options:
        rank += 1 if o.fits else 0
        out.append(_row(rank, o, comparison.tokens))
    return out


def compare_header(comparison: Comparison) -> list[tuple[str, str]]:
    """The facts above the table: (label, text) pairs.

    Example:
      >>> from meshplan.pure.compare import build_comparison
      >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 1, 2, 2.0, 8192, .4)
      >>> dict(compare_header(build_comparison("gpt2", 8, 1024, [a])))["step"]
      'one global batch for every option: 8 x 1024 tokens (8,192 per step)'
    """
    c = _check(comparison)
    facts = [("model", c.model),
             ("step", f"one global batch for every option: {c.batch} x {c.seq} tokens ({c.batch * c.seq:,} per step)"
              if c.batch is not None else f"each option's own batch: one sequence of {c.seq} tokens per device "
              "(--batch N for one global batch, so step times compare)"),
             ("ranked", {"time": "by time (cluster tokens per second: the shortest run)",
                         "cost": "by cost (USD per million tokens at the prices given)",
                         "tokens-per-device": "by tokens per second per device"}[c.by])]
    if c.tokens:
        facts.append(("tokens", f"train time and cost for {fmt_count(c.tokens)} tokens ({c.tokens:,})"))
    priced = sorted({(o.device, o.price_per_device_hour) for o in c.options if o.price_per_device_hour is not None})
    if priced:
        prices = ", ".join(f"{d} ${p:g}" for d, p in priced)
        facts.append(("prices", f"{prices} per device-hour ({c.price_source or 'the user'}'s figures; meshplan "
                                "ships no price list)"))
    facts.append(("figures", "memory: exact = XLA's compiled peak, est = the planner's estimate; step, tokens/s "
                             "and MFU: estimated (FLOPs at the assumed efficiency + exposed collectives)"))
    return facts


def compare_verdicts(comparison: Comparison) -> list[str]:
    """The lines under the table: the best option, the smallest that fits, each kind's knee, the notes.

    Example:
      >>> from meshplan.pure.compare import build_comparison
      >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 1, 2, 2.0, 8192, .4)
      >>> compare_verdicts(build_comparison("gpt2", 8, 1024, [a]))[:2]
      ['best: 1x8xH100 (fsdp=8), 4.1k tokens/s', 'smallest that fits: 1x8xH100 (8 devices)']
    """
    c = _check(comparison)
    out = []
    best = c.best
    if best is None:
        out.append("nothing fits on any option compared; see each row's note")
    else:
        cost = best.cost_per_million_tokens
        out.append(f"best: {best.cluster} ({best.mesh}), {fmt_count(best.tokens_per_s)} tokens/s"
                   + ("" if cost is None else f", {fmt_money(cost)} per million tokens"))
    if c.smallest is not None:
        out.append(f"smallest that fits: {c.smallest.cluster} ({c.smallest.devices} devices)")
    out.extend(k.describe() for k in c.scaling if k.steps)
    for o in c.options:
        if o.note:
            out.append(f"{o.cluster}: {o.note}")
    compilers = sorted({o.compiler for o in c.options if o.compiler})
    if compilers:
        out.append("exact: " + "; ".join(compilers))
    out.extend(c.notes)
    return out

