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

``python benchmarks/bench_search.py --cpu [--compare CHECKOUT [--rounds N]]``: only the 4096-device searches
of every preset and the one-plan baseline, as the least (and median) CPU time (``time.process_time``) of 9
runs each, which moves less than wall time on a loaded machine. With ``--compare``, the same measurement
also runs in a fresh process importing meshplan from another checkout (e.g. ``git worktree`` of an older
commit), alternating with this one N times (default 2), and prints each search's after / before CPU time and
the median of those ratios over the rounds.

``python benchmarks/bench_search.py --gc [--compare CHECKOUT]``: the garbage collections (young, middle, full)
per 4096-device search of every preset, over 30 searches after 3 warm-ups in a fresh process (and in one
importing meshplan from CHECKOUT): a full collection of a process holding jax costs 50-150 ms on a 2-core
machine, so how often a search triggers one moves its median more than its least time.

``python benchmarks/bench_search.py --check-against CHECKOUT``: no timing; runs :func:`equivalence_rows`
(every preset on GPU and TPU clusters of 8 to 4096 devices, under several recipes, fixed meshes and
rankings) here and, in a fresh process, with meshplan imported from CHECKOUT, and says how many
``SearchResult.to_json()`` texts (or ``PlanError`` messages) are byte-identical. A speed-up must
change no answer.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import os
import subprocess
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
from meshplan.pure.presets import preset_names  # noqa: E402

CLUSTERS = (("64 devices (8x8xH100)", "8x8xH100"), ("512 devices (64x8xH100)", "64x8xH100"),
            ("4096 devices (512x8xH100)", "512x8xH100"))
MODELS = preset_names()  # every preset: each must search 4096 devices in < 100 ms


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


def _cpu_times(fn: object, repeat: int = 9) -> tuple[float, float]:
    """(least, median) CPU seconds of ``repeat`` calls (garbage collections included, as a user meets them)."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()  # type: ignore[operator]
        times.append(time.process_time() - start)
    return min(times), sorted(times)[len(times) // 2]


def cpu_rows() -> None:
    """Print ``name search_ms search_median_ms plan_ms`` per preset: the 4096-device search (least and median
    CPU time of 9) and one plan (least of 9)."""
    for name in MODELS:
        preset = get_preset(name)
        plan = _cpu_times(lambda: _one_plan(preset, {"dp": 8, "fsdp": 8, "tp": 8}))[0]
        search, median = _cpu_times(lambda: search_meshes(preset.spec, CLUSTERS[-1][1], params=preset.params))
        print(f"{name} {search * 1e3:.1f} {median * 1e3:.1f} {plan * 1e3:.2f}", flush=True)


def gc_rows(repeat: int = 30) -> None:
    """Print per preset the collections per 4096-device search by generation (``gc.callbacks``), over
    ``repeat`` searches after 3 warm-ups."""
    import gc

    for name in MODELS:
        preset = get_preset(name)
        counts = [0, 0, 0]

        def count(phase: str, info: dict[str, int]) -> None:
            if phase == "stop":
                counts[info["generation"]] += 1

        def search() -> object:
            return search_meshes(preset.spec, CLUSTERS[-1][1], params=preset.params)

        for _ in range(3):
            search()
        gc.callbacks.append(count)
        try:
            for _ in range(repeat):
                search()
        finally:
            gc.callbacks.remove(count)
        young, middle, full = (c / repeat for c in counts)
        print(f"{name}: {young:.1f} young, {middle:.2f} middle, {full:.2f} full collections per search", flush=True)


def _measure(checkout: str) -> dict[str, tuple[float, float, float]]:
    out = _rows(checkout, "import bench_search; bench_search.cpu_rows()")
    return {n: (float(a), float(m), float(b)) for n, a, m, b in (line.split() for line in out.splitlines())}


CHECK_CLUSTERS = ("1x8xH100", "8x8xH100", "32x8xH100", "512x8xH100", "v5p-128", "2xv5p-256", "v5p-8192")


def _check_options() -> list[tuple[str, dict[str, object]]]:
    from meshplan.pure.cost import TrainingRecipe

    return [("default", {}), ("remat=full", {"recipe": TrainingRecipe(remat="full")}),
            ("remat=none", {"recipe": TrainingRecipe(remat="none", attention="flash")}),
            ("micro_batches=2", {"micro_batches": 2}), ("fixed tp=8", {"fixed": {"tp": 8}}),
            ("fixed fsdp=8,tp=4", {"fixed": {"fsdp": 8, "tp": 4}}), ("rank=comm", {"rank": "comm"}),
            ("no activations", {"activations": False}), ("top_k=12,batch=2x", {"top_k": 12, "batch": "2x"}),
            ("sgd, fp32 grads", {"recipe": TrainingRecipe(optimizer="sgd", grad_dtype="float32")})]


def equivalence_rows() -> None:
    """Print ``case sha256`` per search of :data:`CHECK_CLUSTERS` x presets x :func:`_check_options`: the
    hash of ``to_json()``, or of ``PlanError: message`` when nothing fits."""
    for cluster in CHECK_CLUSTERS:
        n = parse_cluster(cluster).num_devices
        for name in MODELS:
            for label, options in _check_options():
                kwargs = dict(options)
                if kwargs.get("batch") == "2x":
                    kwargs["batch"] = 2 * n
                try:
                    text = search_meshes(name, cluster, **kwargs).to_json()  # type: ignore[arg-type]
                except ValueError as err:
                    text = f"{type(err).__name__}: {err}"
                digest = hashlib.sha256(text.encode()).hexdigest()[:16]
                print(f"{cluster}|{name}|{label}\t{digest}", flush=True)


def _rows(checkout: str, code: str) -> str:
    # Absolute: the child runs in benchmarks/, where a relative CHECKOUT would name nothing and the
    # installed meshplan (this tree) would be measured against itself.
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)), env=env,
                          capture_output=True, text=True, check=True).stdout


def check_against(before: str) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import bench_search; bench_search.equivalence_rows()"
    old = dict(line.split("\t") for line in _rows(before, code).splitlines())
    new = dict(line.split("\t") for line in _rows(here, code).splitlines())
    differ = [case for case in new if old.get(case) != new[case]]
    for case in differ:
        print(f"DIFFERS: {case}")
    print(f"{len(new) - len(differ)} of {len(new)} searches byte-identical to {before} "
          f"({len(old)} cases there)")
    if differ or len(old) != len(new):
        sys.exit(1)


def compare(before: str, rounds: int = 2) -> None:
    """Alternate fresh processes of CHECKOUT (before) and this tree (after) ``rounds`` times; per round the
    least CPU time of 9 searches each, then per preset the median over rounds of after/before (of the least
    times and of the medians), which a loaded machine moves less than any one figure."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"load: {os.getloadavg()}")
    ratios: dict[str, list[tuple[float, float, float, float]]] = {}
    for round_ in range(1, rounds + 1):
        # Which tree goes first alternates too: on a shared VM the second process of a pair often met a
        # different neighbour than the first, and one fixed order leaned every ratio one way.
        if round_ % 2:
            old, new = _measure(before), _measure(here)
        else:
            new, old = _measure(here), _measure(before)
        for name in new:
            (s0, m0, p0), (s1, m1, p1) = old[name], new[name]
            ratios.setdefault(name, []).append((s1 / s0, m1 / m0, s1, m1))
            print(f"round {round_} {name}: before {s0:.1f} ms ({s0 / p0:.2f}x one plan), after {s1:.1f} ms "
                  f"({s1 / p1:.2f}x one plan), after/before {s1 / s0:.2f} (medians {m0:.1f} -> {m1:.1f})")
    print(f"load: {os.getloadavg()}")
    for name, rows in ratios.items():
        mid = len(rows) // 2
        best, median = sorted(r[0] for r in rows)[mid], sorted(r[1] for r in rows)[mid]
        print(f"{name}: after/before over {rounds} rounds, median {best:.2f} (least times), {median:.2f} (median "
              f"times); after: least {min(r[2] for r in rows):.1f} ms, median of medians "
              f"{sorted(r[3] for r in rows)[mid]:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="4096-device searches and one plan, CPU time only")
    parser.add_argument("--compare", metavar="CHECKOUT", help="with --cpu or --gc: also measure meshplan from CHECKOUT")
    parser.add_argument("--rounds", type=int, default=2, help="with --compare: alternations of the two (default 2)")
    parser.add_argument("--gc", action="store_true", help="garbage collections per 4096-device search")
    parser.add_argument("--check-against", metavar="CHECKOUT",
                        help="compare every search's JSON with meshplan from CHECKOUT (no timing)")
    args = parser.parse_args()
    if args.check_against:
        check_against(args.check_against)
    elif args.gc:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for label, tree in (("before", args.compare), ("after", here)) if args.compare else (("here", here),):
            print(f"{label} ({tree}):")
            print(_rows(tree, "import bench_search; bench_search.gc_rows()"), end="")
    elif args.cpu and args.compare:
        compare(args.compare, args.rounds)
    elif args.cpu:
        cpu_rows()
    else:
        main()
