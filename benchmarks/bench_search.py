"""Mesh search time for 64, 512 and 4096 devices, against baselines measured in the same process.

Run: ``python benchmarks/bench_search.py``. Pure code only: no devices are used.

Two baselines:

- *one exact plan*: ``plan_tree`` of the model with the search's default rule
  plus ``estimate_training_memory`` for a single mesh, i.e. what checking
  one mesh by hand costs. The ratio says how many such checks one whole
  search costs;
- *brute force*: the same exact plan for every factorization of the device
  count over the axes that meets the head/expert/domain constraints (no
  grouping, no plan cache, no memory bound, no pricing), timed once.

Goal: a search over 4096 devices well under a second (target < 100 ms).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _table import best_of, print_table  # noqa: E402

from meshplan.pure import (  # noqa: E402
    AxisKindRule,
    estimate_training_memory,
    get_preset,
    parse_cluster,
    plan_tree,
    search_meshes,
)

CLUSTERS = (("64 devices (8x8xH100)", "8x8xH100"), ("512 devices (64x8xH100)", "64x8xH100"),
            ("4096 devices (512x8xH100)", "512x8xH100"))
MODELS = ("llama3-70b", "mixtral-8x7b", "deepseek-v3")


def _one_plan(preset, sizes: dict[str, int]) -> None:
    specs = plan_tree(preset.params, AxisKindRule.for_model(preset.spec), sizes).specs
    estimate_training_memory(preset.params, specs, sizes, optimizer_copies=2, optimizer_dtype=np.float32)


def _brute_force(preset, cluster: str) -> tuple[float, int]:
    """Seconds to plan every constrained factorization exactly, and how many there were."""
    c = parse_cluster(cluster)
    n, spec = c.num_devices, preset.spec
    names = ("dp", "fsdp", "ep", "sp", "tp") if spec.is_moe else ("dp", "fsdp", "sp", "tp")
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    meshes = []
    for sizes in itertools.product(divisors, repeat=len(names)):
        m = dict(zip(names, sizes))
        if (math.prod(sizes) == n and spec.num_heads % m["tp"] == 0 and c.ici_domain_size % m["tp"] == 0
                and (not spec.is_moe or spec.num_experts % m["ep"] == 0) and n % m["dp"] == 0):
            meshes.append(m)
    start = time.perf_counter()
    for m in meshes:
        _one_plan(preset, m)
    return time.perf_counter() - start, len(meshes)


def main() -> None:
    rows, counts = [], []
    for name in MODELS:
        preset = get_preset(name)
        base = best_of(lambda: _one_plan(preset, {"dp": 8, "fsdp": 8, "tp": 8}), repeat=7)
        for label, cluster in CLUSTERS:
            def search() -> object:
                try:
                    return search_meshes(preset.spec, cluster, params=preset.params)
                except ValueError:  # PlanError: nothing fits (and the suggestion searches ran)
                    return None

            seconds = best_of(search, repeat=5)
            rows.append((f"{name}, {label}", seconds, base))
            try:
                result = search_meshes(preset.spec, cluster, params=preset.params)
                counts.append(f"{name} on {cluster}: {result.num_candidates} meshes priced, "
                              f"{result.num_fitting} fit, best {result.best.text}")
            except ValueError as err:
                counts.append(f"{name} on {cluster}: nothing fits ({str(err)[:90]}...)")
    print_table("search_meshes vs one exact plan (plan_tree + estimate_training_memory of one mesh)", rows,
                "one plan")
    preset = get_preset("llama3-70b")
    brute_rows = []
    for label, cluster in CLUSTERS:
        seconds = best_of(lambda: search_meshes(preset.spec, cluster, params=preset.params), repeat=5)
        brute, count = _brute_force(preset, cluster)
        brute_rows.append((f"llama3-70b, {label}: {count} meshes", seconds, brute))
    print_table("search_meshes vs brute force (exact plan of every constrained mesh, no pricing)", brute_rows,
                "brute force")
    for line in counts:
        print(line)


if __name__ == "__main__":
    main()
