"""Search time with the micro-batch choice (micro_batches=None) against one fixed micro-batch, same process.

    python benchmarks/research/bench_micro_batches.py

For the bench_search.py models and clusters (default batch: one sequence per device), the best of 2 x 3
runs of ``search_meshes`` each way, fixed and choosing alternated; ratio = choose / fixed. Choosing costs
more where more meshes fit with accumulation: each one is planned and priced exactly.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: bench_search

from bench_search import CLUSTERS, MODELS  # noqa: E402

from meshplan.pure import search_meshes  # noqa: E402
from meshplan.pure.presets import get_preset  # noqa: E402


def _best(fn: Callable[[], object], repeat: int = 3) -> float:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return min(out)


def main() -> None:
    for name in MODELS:
        preset = get_preset(name)
        for label, cluster in CLUSTERS:
            def run(m: int | None, cluster: str = cluster) -> Callable[[], object]:
                def search() -> object:
                    try:
                        return search_meshes(preset.spec, cluster, params=preset.params, micro_batches=m)
                    except ValueError:  # nothing fits
                        return None
                return search

            fixed, choose = _best(run(1)), _best(run(None))
            fixed, choose = min(fixed, _best(run(1))), min(choose, _best(run(None)))
            print(f"{name:<13} {label:<26} fixed 1: {fixed * 1e3:7.1f} ms  choose: {choose * 1e3:7.1f} ms  "
                  f"ratio {choose / fixed:.2f}", flush=True)


if __name__ == "__main__":
    main()
