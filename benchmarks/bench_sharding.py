"""Spec planning and auto_shard_pytree, against baselines measured in the same process.

Run: ``python benchmarks/bench_sharding.py`` (8 simulated CPU devices).

1. Planning a Llama-like tree of ShapeDtypeStructs (300, 3k and 50k leaves,
   most of them repeated shapes) with each rule, as a ratio to one
   ``jax.tree_util.tree_map(lambda x: x, tree)``: the least any whole-tree
   pass can cost. Goal for shape-only rules: <= 2.
2. ``MeshPartitionHelper.auto_shard_pytree`` on numpy parameter trees, as a
   ratio to ``jax.device_put(tree, shardings)`` with the same shardings
   computed beforehand. Goal: <= 1.10.
3. ``--deepseek``: planning the DeepSeek-V3 preset with one leaf per expert
   (45,395 ShapeDtypeStructs) with the search's default rule
   (``AxisKindRule.for_model``, a path-reading rule) and the shape-only rules,
   on the mesh of compare_eformer.py, as a ratio to one ``tree_map``; each call
   alternates with a floor call, and the medians are compared. Goal: <= 2.
   Only this section runs with ``--deepseek`` (add ``--rounds N``), then 4.
4. ``--facade``: the same tree planned as users call it, through the facade
   (``AutoShardingRule(mesh=mesh, min_shard_size=1024).apply(tree)`` and the
   other public planners) on a real 8-device mesh, best of ``--best-of``
   rounds (default 5) against the best of the floor
   ``jax.tree_util.tree_map(lambda x: None, tree)`` in the same rounds; the
   garbage collector runs as in a user's program (nothing frozen), and each
   result is dropped before the next call (one row keeps it, and runs the
   young collection it is due inside its timing). Goal: <= 2. ``--cpu``: the
   same rows in this process's CPU time (steadier on a loaded machine);
   ``--gc``: how many full collections ran during each row's calls.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _table import best_of, print_table  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from meshplan import AutoShardingRule, MemoryConstrainedShardingRule, MeshPartitionHelper  # noqa: E402
from meshplan.pure import (  # noqa: E402
    AutoRule,
    AxisKindRule,
    CompositeRule,
    MemoryRule,
    ShapePatternRule,
    SuggestRule,
    plan_tree,
    tree_facts,
)


def _layer(d: int, ff: int, kv: int) -> dict[str, tuple[int, ...]]:
    """Shapes of one Llama-like block: 9 leaves."""
    return {"q": (d, d), "k": (d, kv), "v": (d, kv), "o": (d, d), "gate": (d, ff), "up": (d, ff),
            "down": (ff, d), "attn_norm": (d,), "mlp_norm": (d,)}


def llama_shapes(num_leaves: int, *, d: int = 4096, ff: int = 14336, kv: int = 1024,
                 vocab: int = 32000) -> dict:
    """A nested dict of shapes: embeddings, ``num_leaves // 9`` blocks, final norm and head."""
    blocks = max(1, (num_leaves - 3) // 9)
    return {"embed": (vocab, d), "layers": [_layer(d, ff, kv) for _ in range(blocks)],
            "final_norm": (d,), "lm_head": (d, vocab)}


def _is_shape(x: object) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def as_structs(shapes: dict, dtype: str = "bfloat16") -> dict:
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, np.dtype(dtype)), shapes, is_leaf=_is_shape)


def as_arrays(shapes: dict) -> dict:
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.standard_normal(s, np.float32), shapes, is_leaf=_is_shape)


def planning_rows(mesh) -> list[tuple[str, float, float]]:
    sizes = dict(mesh.shape)
    rules = {
        "auto": AutoRule(),
        "shape patterns": ShapePatternRule({(None, 4096): P(None, "tp"), (4096, None): P("fsdp", "tp"),
                                            (None,): P()}),
        "memory (64 MiB)": MemoryRule(64 * 2**20),
        "suggest": SuggestRule(),
        "composite(shape, auto)": CompositeRule((ShapePatternRule({(None, 1024): P("fsdp", "tp")}), AutoRule())),
    }
    facade_rule = AutoShardingRule(mesh=mesh)
    rows = []
    for n in (300, 3_000, 50_000):
        tree = as_structs(llama_shapes(n))
        # Long-lived trees sit in the oldest GC generation in real programs;
        # freezing them keeps collections from adding noise to every row.
        gc.collect()
        gc.freeze()
        leaves = len(jax.tree.leaves(tree))
        repeat = 5 if n > 10_000 else 9
        base = best_of(lambda: jax.tree_util.tree_map(lambda x: x, tree), repeat=repeat)
        # The leaf-facts walk every planner starts with: the floor for plan_tree.
        floor = best_of(lambda: tree_facts(tree), repeat=repeat)  # noqa: B023
        rows.append((f"{leaves} leaves: tree_facts (floor)", floor, base))
        for label, rule in rules.items():
            seconds = best_of(lambda: plan_tree(tree, rule, sizes), repeat=repeat)  # noqa: B023
            rows.append((f"{leaves} leaves: plan_tree {label}", seconds, base))
        rows.append((f"{leaves} leaves: AutoShardingRule.apply",
                     best_of(lambda: facade_rule.apply(tree), repeat=repeat), base))  # noqa: B023
        gc.unfreeze()
    return rows


def placement_rows(mesh) -> list[tuple[str, float, float]]:
    helper = MeshPartitionHelper(mesh)
    rows = []
    cases = [("~300 leaves, d=256 (~110 MB)", llama_shapes(300, d=256, ff=704, kv=64, vocab=4096)),
             ("~3k leaves, d=64 (~3 MB)", llama_shapes(3_000, d=64, ff=176, kv=16, vocab=512))]
    for label, shapes in cases:
        tree = as_arrays(shapes)
        specs = helper.plan(tree).specs
        shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
        leaves = len(jax.tree.leaves(tree))

        def baseline():
            jax.block_until_ready(jax.device_put(tree, shardings))  # noqa: B023

        def ours():
            jax.block_until_ready(helper.auto_shard_pytree(tree))  # noqa: B023

        def flat_baseline():
            jax.block_until_ready(jax.device_put(flat_leaves, flat_shardings))  # noqa: B023

        flat_leaves = jax.tree.leaves(tree)
        flat_shardings = jax.tree.leaves(shardings)
        for fn in (ours, baseline, flat_baseline):  # warm every path (first transfers allocate)
            fn()
        # Alternate the calls so drift in machine load hits all alike, and
        # keep each one's fastest run: on a shared machine, noise only adds.
        times: dict[str, list[float]] = {"ours": [], "base": [], "flat": []}
        for _ in range(11):
            for key, fn in (("ours", ours), ("base", baseline), ("flat", flat_baseline)):
                times[key].append(best_of(fn, repeat=1))
        base = min(times["base"])
        rows.append((f"{label}, {leaves} leaves: auto_shard_pytree", min(times["ours"]), base))
        rows.append((f"{label}, {leaves} leaves: device_put(list, list)", min(times["flat"]), base))
    return rows


def deepseek_rows(rounds: int) -> list[tuple[str, float, float]]:
    """plan_tree on DeepSeek-V3 with one leaf per expert, each rule's median against the floor's median."""
    from meshplan.pure.presets import MODEL_SPECS, build_params

    spec = MODEL_SPECS["deepseek-v3"]
    tree = build_params(spec, unstack_experts=True)
    sizes = {"dp": 1, "fsdp": 2, "ep": 1, "tp": 4, "sp": 1}  # compare_eformer.py's mesh
    rules = {
        # a fresh rule per call: its layout memo would otherwise carry over from the last call
        "AxisKindRule.for_model (search default)": lambda: AxisKindRule.for_model(spec),
        "AutoRule (AutoShardingRule's)": AutoRule,
        "SuggestRule (MeshPartitionHelper.plan's)": SuggestRule,
        "MemoryRule(512 MiB)": lambda: MemoryRule(512 * 2**20),
    }
    gc.collect()
    gc.freeze()  # the tree is long-lived, as in a real program
    leaves = len(jax.tree.leaves(tree))
    floor: list[float] = []
    times: dict[str, list[float]] = {label: [] for label in rules}
    for _ in range(rounds):
        for label, make in rules.items():
            start = time.perf_counter()
            jax.tree_util.tree_map(lambda x: x, tree)
            floor.append(time.perf_counter() - start)
            rule = make()
            start = time.perf_counter()
            plan_tree(tree, rule, sizes)
            times[label].append(time.perf_counter() - start)
    gc.unfreeze()
    base = statistics.median(floor)
    return [(f"{leaves} leaves: plan_tree {label}", statistics.median(t), base) for label, t in times.items()]


def facade_rows(best: int, clock: Callable[[], float] = time.perf_counter,
                collections: dict[str, int] | None = None) -> list[tuple[str, float, float]]:
    """The public planners on DeepSeek-V3 with one leaf per expert: ``AutoShardingRule(mesh=mesh,
    min_shard_size=1024)``, ``MemoryConstrainedShardingRule(512 MiB, mesh=mesh)`` (each built per call, as users
    write it), ``MeshPartitionHelper(mesh).plan(tree).specs``, the pure ``plan_tree(tree, AutoRule(), sizes).specs``
    the first binds, and the first again with its specs kept. Each row is its own block of rounds, floor and call
    alternating: its best call against the best floor of its block, timed by ``clock`` (``time.process_time``:
    this process's CPU time, which a loaded machine's neighbours move less than the wall clock). ``collections``,
    if given, gets per row the full collections that ran during its calls."""
    from meshplan.pure.presets import MODEL_SPECS, build_params

    tree = build_params(MODEL_SPECS["deepseek-v3"], unstack_experts=True)
    mesh = jax.make_mesh((1, 2, 1, 4, 1), ("dp", "fsdp", "ep", "tp", "sp"))  # compare_eformer.py's mesh
    sizes = dict(mesh.shape)
    cases = {
        "AutoShardingRule.apply": lambda: AutoShardingRule(mesh=mesh, min_shard_size=1024).apply(tree),
        "MemoryConstrainedShardingRule.apply":
            lambda: MemoryConstrainedShardingRule(512 * 2**20, mesh=mesh).apply(tree),
        "MeshPartitionHelper.plan": lambda: MeshPartitionHelper(mesh).plan(tree).specs,
        "plan_tree, AutoRule (pure)": lambda: plan_tree(tree, AutoRule(), sizes).specs,
    }
    kept: list[object] = [None]

    def keep() -> None:
        # As users call it: the specs are kept (the last call's dropped here), and the young-generation
        # collection the new spec tree is due is run inside the timing, so a call cannot leave it to the next.
        kept[0] = AutoShardingRule(mesh=mesh, min_shard_size=1024).apply(tree)
        gc.collect(0)

    cases["AutoShardingRule.apply, specs kept"] = keep
    rows = []
    full = [0]  # full collections while a row's calls ran (--gc)

    def count_full(phase: str, info: dict) -> None:
        full[0] += phase == "start" and info["generation"] == 2

    for label, fn in cases.items():  # one block per row: a row's garbage is not left to the next row's timing
        fn()  # warm: first calls fill jax's and meshplan's one-off caches
        gc.collect()  # a settled heap, as after a model is built; not frozen: collections cost what they cost users
        floor, times = [], []
        for _ in range(best):
            start = clock()
            jax.tree_util.tree_map(lambda x: None, tree)
            floor.append(clock() - start)
            start = clock()
            if collections is not None:
                gc.callbacks.append(count_full)
            fn()
            if collections is not None:
                gc.callbacks.remove(count_full)
            times.append(clock() - start)
        kept[0] = None
        rows.append((label, min(times), min(floor)))
        if collections is not None:
            collections[label], full[0] = full[0], 0
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepseek", action="store_true", help="only the DeepSeek-V3 45k-leaf planning rows")
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds for --deepseek (median)")
    parser.add_argument("--facade", action="store_true", help="only the DeepSeek-V3 rows through the facade")
    parser.add_argument("--best-of", type=int, default=5, help="rounds for the facade rows (best of)")
    parser.add_argument("--cpu", action="store_true", help="facade rows in this process's CPU time, not wall time")
    parser.add_argument("--gc", action="store_true", help="count the full collections during each facade row's calls")
    args = parser.parse_args()
    if args.deepseek:
        print_table("DeepSeek-V3, one leaf per expert: plan_tree (median of alternating rounds)",
                    deepseek_rows(args.rounds), "one tree_map (median)")
    if args.deepseek or args.facade:
        clock = time.process_time if args.cpu else time.perf_counter
        counted: dict[str, int] | None = {} if args.gc else None
        print_table(f"DeepSeek-V3, 45,395 leaves, as users call it (best of {args.best_of}{', CPU time' * args.cpu}; "
                    "GC not frozen; floor: tree_map(lambda x: None, tree))", facade_rows(args.best_of, clock, counted),
                    "floor (best)")
        for label, n in (counted or {}).items():
            print(f"{label}: {n} full collections in {args.best_of} calls")
        return
    mesh = jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)
    print_table("meshplan spec planning (8 CPU devices)", planning_rows(mesh), "one tree_map")
    print_table("meshplan auto_shard_pytree (8 CPU devices)", placement_rows(mesh),
                "device_put, shardings precomputed")


if __name__ == "__main__":
    main()
