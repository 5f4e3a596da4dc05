"""The step-time screen against every published run meshplan prices: its error, its resolution, its ranks.

Run: ``python benchmarks/bench_screen.py [--record FILE]``. Pure code only: no devices are used.

Every run of ``bench_published.py`` (torchtitan, MaxText, DeepSeek-V3, Megatron-LM Table 1, Llama 3 405B)
and ``bench_megatron_table2.py`` (Megatron-LM Table 2: PTD-P and DeepSpeed ZeRO-3) is priced at its published
layout and recipe, as those scripts price it; this one gathers them into the figures issue 36 asks of the screen:

- the share of runs whose predicted step is within 25% of the published one (``0.80 <= pred/pub <= 1.25`` in
  tokens/s);
- the median ``|ln(predicted / published)|``: the screen's resolution, which
  :data:`meshplan.pure.cost.STEP_TIME_RESOLUTION` holds (``--record`` writes the ratios to the file a test
  reads, ``benchmarks/data/published_step_ratios.jsonl``);
- where the practitioners' layout ranks among the meshes meshplan ranks: in the top 3, or tied with the best
  (within the resolution), or neither.

Nothing is fitted here: the runs are the check.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from typing import Any

from bench_megatron_table2 import MODELS, PTDP_RUNS, ZERO_RUNS, compare_pipeline, price_zero3
from bench_published import PIPELINE_RUNS, PUBLISHED_RUNS, _cluster, compare

from meshplan.pure.cost import STEP_TIME_RESOLUTION, resolution_percent


def rows() -> list[dict[str, Any]]:
    """One dict per published run: its key, kind, predicted / published tokens/s, rank and steps within reach."""
    out: list[dict[str, Any]] = []
    for run in PUBLISHED_RUNS:
        c = compare(run)
        if c.pinned_tokens_per_s is None:
            continue  # no layout to pin (DeepSeek-V3's is priced in the pipeline table)
        ratio = c.pinned_tokens_per_s / run.tokens_per_s
        tied = c.pinned_step_s is not None and c.pinned_step_s <= c.best_step_s * math.exp(STEP_TIME_RESOLUTION)
        out.append({"run": run.key, "kind": "unpipelined", "ratio": ratio, "rank": c.rank,
                    "ranked": c.num_fitting, "tied_with_best": bool(tied and c.rank is not None)})
    for run in PIPELINE_RUNS:
        out.append(_pipeline(compare_pipeline(run), run))
    for run in PTDP_RUNS:
        out.append(_pipeline(compare_pipeline(run, models=MODELS), run))
    for zrun in ZERO_RUNS:
        z = price_zero3(zrun)
        out.append({"run": zrun.key, "kind": "zero3", "ratio": zrun.pub_step / z.step_s, "rank": None,
                    "ranked": None, "tied_with_best": False})
    return out


def _pipeline(c: Any, run: Any) -> dict[str, Any]:
    devices = _cluster(run.cluster).num_devices
    pub_step = run.batch * run.seq / (run.tokens_per_s * devices)
    p = c.pinned
    ratio = None if p is None or p.step is None else pub_step / p.step.step_s
    best = c.steps[0] if c.steps else None
    tied = (p is not None and p.step is not None and best is not None and c.rank is not None
            and p.step.step_s <= best * math.exp(STEP_TIME_RESOLUTION))
    return {"run": run.key, "kind": "pipelined", "ratio": ratio, "rank": c.rank, "ranked": c.ranked,
            "tied_with_best": bool(tied)}


def summary(rows_: list[dict[str, Any]]) -> dict[str, Any]:
    """The screen's figures over ``rows_`` (runs with no price left out of the ratios)."""
    priced = [r for r in rows_ if r["ratio"] is not None]
    errors = [abs(math.log(r["ratio"])) for r in priced]
    ranked = [r for r in rows_ if r["rank"] is not None]
    placed = [r for r in ranked if r["rank"] <= 3 or r["tied_with_best"]]
    return {"runs": len(rows_), "priced": len(priced),
            "within_25": sum(1 for r in priced if 0.8 <= r["ratio"] <= 1.25), "median_abs_ln": statistics.median(errors),
            "ranked": len(ranked), "top3_or_tied": len(placed)}


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    got = rows()
    table = Table(title="The step-time screen against published runs (pred/pub tokens/s per device)")
    for col in ("run", "kind", "pred/pub", "|ln|", "rank", "top 3 or tied"):
        table.add_column(col, justify="left" if col in ("run", "kind") else "right")
    for r in got:
        ratio = r["ratio"]
        table.add_row(r["run"], r["kind"], "-" if ratio is None else f"{ratio:.2f}",
                      "-" if ratio is None else f"{abs(math.log(ratio)):.3f}",
                      "-" if r["rank"] is None else f"{r['rank']}/{r['ranked']}",
                      "-" if r["rank"] is None else ("yes" if r["rank"] <= 3 or r["tied_with_best"] else "no"))
    Console(width=160).print(table)
    s = summary(got)
    print(f"\n{s['within_25']} of {s['priced']} priced runs within 25%; median |ln(pred/pub)| {s['median_abs_ln']:.3f} "
          f"(STEP_TIME_RESOLUTION {STEP_TIME_RESOLUTION}, {resolution_percent():.1f}%); practitioners' layout in the "
          f"top 3 or tied with the best: {s['top3_or_tied']} of {s['ranked']} ranked.")
    if "--record" in sys.argv:
        path = sys.argv[sys.argv.index("--record") + 1]
        with open(path, "w", encoding="utf-8") as f:
            for r in got:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
