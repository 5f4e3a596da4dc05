"""meshplan next to eformer 0.0.101 on the same inputs, each in its own process.

Run: ``python benchmarks/compare_eformer.py`` (see benchmarks/README.md).

It creates a virtual environment with ``eformer==0.0.101`` under /tmp (never
a meshplan dependency; about 1 GB) unless one exists, writes the inputs
once, then runs one worker per library and ``PYTHONHASHSEED`` in a separate
process (8 simulated CPU devices each) and prints a markdown table:

* planning time of AutoShardingRule, MemoryConstrainedShardingRule and
  MeshPartitionHelper (its planning half: analyze_pytree +
  create_partition_spec per leaf, without device_put; plus meshplan's
  whole-tree ``MeshPartitionHelper.plan``, which eformer lacks) per tree, next to one
  ``jax.tree_util.tree_map`` over the same tree (the floor);
* invalid specs emitted (errors from meshplan.pure.validate_specs, which
  agrees with jax.device_put: see tests/pure/specs/test_validate.py);
* leaves whose shard is over the MemoryConstrainedShardingRule budget;
* each library's own memory estimate against the live shard bytes of its
  own plan on a small tree placed with MeshPartitionHelper.auto_shard_pytree;
* whether the plan is the same under two ``PYTHONHASHSEED`` values.

Where eformer raises, the cell names the exception.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VENV = "/tmp/meshplan-eformer-venv"
EFORMER = "eformer==0.0.101"
MESH = {"dims": [1, 2, 1, 4, 1], "names": ["dp", "fsdp", "ep", "tp", "sp"]}
BUDGET = 512 * 2**20  # MemoryConstrainedShardingRule budget per device: every preset leaf can fit in it
RULES = ("AutoShardingRule", "MemoryConstrainedShardingRule", "MeshPartitionHelper",
         "MeshPartitionHelper.plan")  # the last is meshplan's whole-tree planner; eformer has none
SEEDS = (1, 2)

# --------------------------------------------------------------------------------------------------
# Worker: runs under either library's interpreter; imports only jax, numpy and the library.
# --------------------------------------------------------------------------------------------------


def _nest(leaves: list) -> dict:
    import jax
    import jax.numpy as jnp

    root: dict = {}
    for path, shape, dtype in leaves:
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))
    return root


def _entries(spec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def _worker(lib: str, inputs_path: str, timed: bool) -> None:
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec

    if lib == "meshplan":
        from meshplan import AutoShardingRule, MemoryConstrainedShardingRule, MeshPartitionHelper, ShardingAnalyzer
    else:
        from eformer.escale import (
            AutoShardingRule,
            MemoryConstrainedShardingRule,
            MeshPartitionHelper,
            ShardingAnalyzer,
        )
    with open(inputs_path) as f:
        inputs = json.load(f)
    mesh = jax.make_mesh(tuple(MESH["dims"]), tuple(MESH["names"]))
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731

    def helper_plan(tree):
        helper = MeshPartitionHelper(mesh)
        methods = helper.analyze_pytree(tree)
        return jax.tree_util.tree_map(lambda x: helper.create_partition_spec(x.shape, methods[x.shape]), tree)

    planners = {
        "AutoShardingRule": lambda t: AutoShardingRule(mesh=mesh).apply(t),
        "MemoryConstrainedShardingRule": lambda t: MemoryConstrainedShardingRule(BUDGET, mesh=mesh).apply(t),
        "MeshPartitionHelper": helper_plan,
    }
    if lib == "meshplan":
        planners["MeshPartitionHelper.plan"] = lambda t: MeshPartitionHelper(mesh).plan(t).specs
    out: dict = {"trees": {}}
    for name, leaves in inputs["trees"].items():
        tree = _nest(leaves)
        row: dict = {}
        if timed:
            row["floor"] = _median_time(lambda: jax.tree_util.tree_map(lambda x: x, tree), 7)
        for rule, plan in planners.items():
            try:
                specs = plan(tree)
            except Exception as err:  # noqa: BLE001 - the table reports any crash by type
                row[rule] = {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"}
                continue
            flat = jax.tree_util.tree_leaves(specs, is_leaf=is_spec)
            entry = {"specs": [_entries(s) for s in flat]}
            if timed:
                entry["time"] = _median_time(lambda: plan(tree), 3 if len(leaves) > 5000 else 7)
            row[rule] = entry
        out["trees"][name] = row
    # live bytes on a small tree placed for real
    small = jax.tree_util.tree_map(lambda x: np.ones(x.shape, x.dtype), _nest(inputs["small"]))
    try:
        placed = MeshPartitionHelper(mesh).auto_shard_pytree(small)
        live = [0] * len(mesh.devices.flat)
        index = {d: i for i, d in enumerate(mesh.devices.flat)}
        for leaf in jax.tree_util.tree_leaves(placed):
            for shard in leaf.addressable_shards:
                live[index[shard.device]] += shard.data.nbytes
        specs = jax.tree_util.tree_map(lambda x: x.sharding.spec, placed)
        estimate = ShardingAnalyzer(mesh).estimate_memory_usage(small, specs)
        out["live"] = {"live_max": max(live), "estimate": {k: int(v) for k, v in estimate.items()
                                                           if isinstance(v, (int, float, np.integer))}}
    except Exception as err:  # noqa: BLE001
        out["live"] = {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"}
    json.dump(out, sys.stdout)


# --------------------------------------------------------------------------------------------------
# Parent: builds inputs with meshplan, runs the workers, scores and prints.
# --------------------------------------------------------------------------------------------------


def _ensure_venv(path: str) -> str:
    python = os.path.join(path, "bin", "python")
    probe = [python, "-c", "import eformer.escale"]
    if os.path.exists(python) and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"creating {path} with {EFORMER} (about 1 GB) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", EFORMER], check=True)
    return python


def _leaves(tree) -> list:
    import jax

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
        out.append([keys, list(leaf.shape), str(leaf.dtype)])
    return out


def _inputs(quick: bool) -> dict:
    import dataclasses

    from meshplan.pure import get_preset

    from meshplan.pure.presets import MODEL_SPECS, build_params  # public subpackage

    names = ["gpt2", "llama3-8b", "mixtral-8x7b"] if quick else [
        "gpt2", "llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3"]
    trees = {name: _leaves(get_preset(name).params) for name in names}
    if not quick:
        trees["deepseek-v3 (unstacked experts)"] = _leaves(get_preset("deepseek-v3", unstack_experts=True).params)
    tiny = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=2, hidden_size=256,
                               intermediate_size=1024, vocab_size=4096, num_heads=8, num_kv_heads=4,
                               head_dim=32, num_params=None)
    import jax.numpy as jnp

    return {"trees": trees, "small": _leaves(build_params(tiny, dtype=jnp.float32))}


def _run(python: str, lib: str, inputs: str, seed: int, timed: bool) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=str(seed), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    cmd = [python, os.path.abspath(__file__), "--worker", lib, "--inputs", inputs]
    if timed:
        cmd.append("--timed")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"crash": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"rc={proc.returncode}"}
    return json.loads(proc.stdout)


def _spec(entries):
    from jax.sharding import PartitionSpec

    return PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in entries])


def _score(leaves: list, specs: list) -> tuple[int, int]:
    """(invalid specs, leaves over BUDGET) for one plan, by meshplan's validator and geometry."""
    import jax
    import jax.numpy as jnp

    from meshplan.pure import validate_specs
    from meshplan.pure.specs import array_bytes, shard_shape  # public subpackage

    sizes = dict(zip(MESH["names"], MESH["dims"]))
    tree = [jax.ShapeDtypeStruct(tuple(s), jnp.dtype(d)) for _, s, d in leaves]
    spec_list = [_spec(e) for e in specs]
    findings = validate_specs(tree, spec_list, sizes)
    bad = {f.path for f in findings if f.severity == "error"}
    over = 0
    for i, (leaf, spec) in enumerate(zip(tree, spec_list)):
        if str(i) in bad:
            continue
        if array_bytes(shard_shape(leaf.shape, spec, sizes), leaf.dtype) > BUDGET:
            over += 1
    return len(bad), over


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def _digest(result: dict) -> dict:
    out = {}
    for tree, row in result.get("trees", {}).items():
        for rule in RULES:
            cell = row.get(rule)
            if cell is None:
                continue
            out[(tree, rule)] = hashlib.sha256(json.dumps(cell.get("specs", cell.get("error"))).encode()).hexdigest()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=DEFAULT_VENV, help="where the eformer environment lives")
    parser.add_argument("--quick", action="store_true", help="three small presets, no DeepSeek")
    parser.add_argument("--worker", choices=["meshplan", "eformer"], help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--timed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.inputs, args.timed)
        return
    eformer_python = _ensure_venv(args.venv)
    inputs = _inputs(args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "inputs.json")
        with open(path, "w") as f:
            json.dump(inputs, f)
        results = {}
        for lib, python in (("meshplan", sys.executable), ("eformer", eformer_python)):
            for seed in SEEDS:
                results[lib, seed] = _run(python, lib, path, seed, timed=seed == SEEDS[0])
    _print(inputs, results)


def _print(inputs: dict, results: dict) -> None:
    libs = ("meshplan", "eformer")
    print(f"Mesh {dict(zip(MESH['names'], MESH['dims']))} on 8 CPU devices; "
          f"MemoryConstrainedShardingRule budget {BUDGET // 2**20} MiB per device.\n")
    print("| tree (leaves) | rule | tree_map floor | meshplan time | eformer time | meshplan invalid / over budget "
          "| eformer invalid / over budget | same plan, 2 hash seeds (meshplan / eformer) |")
    print("|---|---|---:|---:|---:|---|---|---|")
    digests = {(lib, s): _digest(results[lib, s]) for lib in libs for s in SEEDS}
    errors: dict[str, set] = {}
    for tree, leaves in inputs["trees"].items():
        for rule in RULES:
            cells = []
            for lib in libs:
                res = results[lib, SEEDS[0]]
                if "crash" in res:
                    cells.append((f"crashed: {res['crash'][:60]}", "-"))
                    continue
                cell = res["trees"][tree].get(rule)
                if cell is None:
                    cells.append(("n/a", "-"))
                    continue
                if "error" in cell:
                    errors.setdefault(f"{lib} {rule}", set()).add(cell["error"])
                    cells.append((f"raised {cell['error'].split(':')[0]}", "-"))
                    continue
                invalid, over = _score(leaves, cell["specs"])
                budget = str(over) if rule == "MemoryConstrainedShardingRule" else "-"
                cells.append((_fmt_time(cell["time"]), f"{invalid} / {budget}"))
            floor = results["meshplan", SEEDS[0]].get("trees", {}).get(tree, {}).get("floor")
            same = []
            for lib in libs:
                first, second = (digests[lib, s].get((tree, rule)) for s in SEEDS)
                same.append("-" if first is None or second is None else "yes" if first == second else "NO")
            print(f"| {tree} ({len(leaves)}) | {rule} | {_fmt_time(floor) if floor else '-'} | {cells[0][0]} | "
                  f"{cells[1][0]} | {cells[0][1]} | {cells[1][1]} | {same[0]} / {same[1]} |")
    print()
    print("| small tree (live, MeshPartitionHelper.auto_shard_pytree) | fullest device, live bytes | "
          "library's own estimate |")
    print("|---|---:|---|")
    for lib in libs:
        live = results[lib, SEEDS[0]].get("live", {"error": results[lib, SEEDS[0]].get("crash", "?")})
        if "error" in live:
            print(f"| {lib} | - | raised {live['error'].split(':')[0]} |")
            errors.setdefault(f"{lib} estimate_memory_usage", set()).add(live["error"])
        else:
            est = live["estimate"].get("size_per_device")
            print(f"| {lib} | {live['live_max']} | {est} ({'equal' if est == live['live_max'] else 'differs'}) |")
    if errors:
        print("\nErrors raised:\n")
        for where, messages in sorted(errors.items()):
            for message in sorted(messages):
                print(f"- {where}: `{message}`")


if __name__ == "__main__":
    main()
