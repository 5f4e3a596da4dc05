"""How far XLA's peak ran from the analytic one on every recorded compile: the spread the CLI states.

Run: ``python benchmarks/bench_memory_spread.py [--markdown] [--python]`` (no compiling: it re-prices the
rows recorded by ``bench_memory_calibration.py`` in ``benchmarks/data/``).

The analytic peak is calibrated, not exact (``meshplan.pure.cost._step_memory``). What a user needs
besides the figure is how far the compiler's peak has been from it. Parameters, gradients and optimizer
state are exact, so the error is in the calibrated rest (activations, or the update's temporaries): for
each set of coefficients (``calibration_key``: ``tpu-v6e``, ``tpu-v5p``, ``cpu``, ``gpu``), remat
policy and attention class (``flash``, or ``scores`` for plain and XLA's dot_product attention), the
lowest and highest ratio of what XLA's peak held beyond the exact state to what the model
priced there, over the recorded compiles re-priced with today's model. (A ratio of totals would
understate the error of a small step and overstate that of a full-size one, whose state is most of it.)
``--python`` prints them as the literal of :data:`meshplan.pure.cost._memory_spread.SPREADS`, which
``tests/test_bench_memory_spread.py`` holds equal to this script's reading, so a model change that moves a
ratio cannot leave a stale spread behind.

Rows left out: ``memory_calibration_tpu_16x256.jsonl``. At 16 x 256 XLA:TPU's ``peak_memory_in_bytes`` is
mostly not the step's HBM buffers (RESULTS.md, "What changed on TPU, and why"): on-chip scratch
that no step-shaped model prices.

The baseline, in the same process: each row's recorded exact peak (``compiled.memory_analysis()``).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
from collections.abc import Iterable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from bench_memory_calibration import (  # (benchmarks/, the script's directory)
    CLUSTER,
    _generation,
    analytic,
    sizes_of,
)

from meshplan.pure.cost._memory_spread import Spread, attention_class
from meshplan.pure.cost._recipe import TrainingRecipe
from meshplan.pure.cost._step_memory import calibration_key

DATA = pathlib.Path(__file__).resolve().parent / "data"
LEFT_OUT = ("memory_calibration_tpu_16x256.jsonl",)
Row = dict[str, Any]


def recorded_rows(data: pathlib.Path = DATA) -> list[Row]:
    """Every recorded row of ``data/memory_calibration_*.jsonl`` but :data:`LEFT_OUT`, in file order."""
    return [json.loads(line) for path in sorted(data.glob("memory_calibration_*.jsonl")) if path.name not in LEFT_OUT
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def key_of(row: Row) -> str:
    """The coefficients that price ``row``: its compiler, and its TPU generation."""
    backend = str(row["backend"])
    device = _generation(str(row["cluster"])) if backend == "tpu" else None
    return calibration_key(TrainingRecipe(backend=backend, device=device))


def calibrated_ratio(row: Row) -> float:
    """What the compiler's peak held beyond the exact state, over what the model prices there: ``(exact -
    state) / activations``, ``state`` being what the model's peak phase holds exactly (parameters, optimizer
    state, and the gradients where they are live), ``activations`` the calibrated rest (the update's
    temporaries at an update peak)."""
    cand, _ = analytic(str(row["family"]), sizes_of(row), str(row["remat"]), str(row["attention"]),
                       int(row["batch"]), int(row["seq"]), str(row["backend"]), str(row.get("cluster", CLUSTER)))
    m = cand.memory
    return (int(row["exact"]) - (m.total - m.activations)) / m.activations


def spreads(rows: Iterable[Row]) -> dict[tuple[str, str, str], Spread]:
    """``(calibration key, remat, attention class) -> Spread`` of :func:`calibrated_ratio` over ``rows``,
    re-priced today; the bounds rounded outwards to hundredths, so the stated range holds every row.

    Example:
      >>> s = spreads(recorded_rows())
      >>> s["tpu-v6e", "none", "flash"].low <= 1.0 <= s["tpu-v6e", "none", "flash"].high
      True
    """
    ratios: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for row in rows:
        ratios[key_of(row), str(row["remat"]), attention_class(str(row["attention"]))].append(calibrated_ratio(row))
    return {k: Spread(math.floor(min(v) * 100) / 100, math.ceil(max(v) * 100) / 100, len(v))
            for k, v in sorted(ratios.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (for RESULTS.md)")
    parser.add_argument("--python", action="store_true", help="print SPREADS' literal")
    args = parser.parse_args()
    table = spreads(recorded_rows())
    if args.python:
        for (key, remat, kind), s in table.items():
            print(f'    ("{key}", "{remat}", "{kind}"): Spread({s.low}, {s.high}, {s.rows}),')
        return
    head = ("calibration", "remat", "attention", "rows", "calibrated part, lowest", "highest")
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|---|---|---|---:|---:|---:|")
        for (key, remat, kind), s in table.items():
            print(f"| {key} | {remat} | {kind} | {s.rows} | {s.low:.2f} | {s.high:.2f} |")
        return
    print(f"{head[0]:12s} {head[1]:8s} {head[2]:9s} {head[3]:>5s} {head[4]:>25s} {head[5]:>8s}")
    for (key, remat, kind), s in table.items():
        print(f"{key:12s} {remat:8s} {kind:9s} {s.rows:5d} {s.low:25.2f} {s.high:8.2f}")


if __name__ == "__main__":
    main()
