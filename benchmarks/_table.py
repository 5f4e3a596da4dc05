"""Shared helpers for the benchmark scripts: timing, a rich table, and presets cut to fewer layers."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any


def best_of(fn: Callable[[], object], *, repeat: int = 7, number: int = 1) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` rounds of ``number`` calls."""
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - start) / number)
    return statistics.median(rounds)


def print_table(title: str, rows: list[tuple[str, float, float]], baseline_label: str) -> None:
    """Rows of (case, seconds, baseline seconds), with the ratio to the baseline."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("case")
    table.add_column("time", justify="right")
    table.add_column(baseline_label, justify="right")
    table.add_column("ratio", justify="right")
    for case, seconds, base in rows:
        table.add_row(case, _fmt(seconds), _fmt(base), f"{seconds / base:.2f}x")
    Console().print(table)


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def cut_preset(name: str) -> Any:
    """A preset at full width (``"llama3-8b"``), or cut to fewer layers (``"llama3-8b/2L"``; its parameter
    count is then recounted from the shapes, not the preset's published total)."""
    from meshplan.pure.presets import MODEL_SPECS

    base, _, layers = name.partition("/")
    spec = MODEL_SPECS[base]
    return dataclasses.replace(spec, num_layers=int(layers.removesuffix("L")), num_params=None) if layers else spec
