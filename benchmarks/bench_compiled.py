"""Exact step memory: compile the reference train steps and compare XLA's figures with the planner's.

For each case the reference step (meshplan.reference_step) is built for the
planner's parameter specs, compiled for the target (the local backend, or a
TPU topology with --tpu CLUSTER), and XLA's per-device argument / temp / peak
bytes are printed next to the planner's analytic total (ratio analytic / XLA
peak; 1.00 is exact, below 1 the planner is optimistic). With --run on a GPU
the step also runs on real (zero-initialised) arrays: the allocator's
``peak_bytes_in_use`` and the step time are added.

    python benchmarks/bench_compiled.py                      # local backend, small cases
    python benchmarks/bench_compiled.py --tpu v5e-16         # TPU AOT (needs meshplan[tpu])
    python benchmarks/bench_compiled.py --run --cases gpu    # on a GPU machine: also run each step
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402

import meshplan  # noqa: E402
from meshplan.pure import search_meshes  # noqa: E402
from meshplan.pure.presets import MODEL_SPECS, ModelSpec  # noqa: E402
from meshplan.pure.cluster import Cluster, DEVICE_SPECS


def scaled(name: str, layers: int | None) -> ModelSpec:
    spec = MODEL_SPECS[name]
    if layers is None:
        return spec
    dense = min(spec.num_dense_layers, layers - 1) if spec.is_moe else 0
    return dataclasses.replace(spec, name=f"{name}/{layers}L", num_layers=layers, num_dense_layers=dense,
                               num_params=None)


# (model, layers or None for full size, mesh, batch, seq, config)
CASES: dict[str, list[tuple[str, int | None, dict[str, int], int, int, dict[str, Any]]]] = {
    "small": [
        ("gpt2", 2, {"fsdp": 2, "tp": 4}, 8, 256, {}),
        ("llama3-8b", 2, {"fsdp": 8}, 8, 256, {}),
        ("llama3-8b", 2, {"fsdp": 8}, 8, 256, {"attention": "plain", "remat": "none"}),
        ("mixtral-8x7b", 2, {"fsdp": 4, "ep": 2}, 8, 256, {}),
    ],
    "tpu16": [  # 16-device TPU slices: v5p-32 or v5e-16
        ("llama3-8b", None, {"fsdp": 16}, 16, 4096, {}),
        ("llama3-8b", None, {"fsdp": 4, "tp": 4}, 16, 4096, {"attention": "plain"}),
        ("mixtral-8x7b", 4, {"fsdp": 8, "ep": 2}, 16, 4096, {}),
        ("gpt2", None, {"dp": 2, "fsdp": 8}, 32, 1024, {"remat": "none"}),
    ],
    "gpu": [
        ("llama3-8b", 4, {"fsdp": 1}, 8, 2048, {}),
        ("llama3-8b", 4, {"fsdp": 1}, 8, 2048, {"remat": "none"}),
        ("llama3-8b", 4, {"fsdp": 1}, 4, 2048, {"attention": "plain", "remat": "none"}),
        ("llama3-8b", None, {"fsdp": 1}, 2, 4096, {}),
        ("mixtral-8x7b", 2, {"fsdp": 1}, 4, 2048, {}),
        ("gpt2", None, {"fsdp": 1}, 16, 1024, {"attention": "plain", "remat": "none"}),
    ],
}


def analytic(spec: ModelSpec, cluster: Cluster, mesh: dict[str, int], batch: int, seq: int) -> int | None:
    try:
        res = search_meshes(spec, cluster, axes=list(mesh), fixed=mesh, batch=batch, seq=seq, top_k=1,
                            headroom=0.0)
    except meshplan.MeshplanError:
        return None
    return res.candidates[0].memory.total


def run_real(ref: Any) -> tuple[int, float]:
    """Run the step on zeros; return (allocator peak bytes on device 0, seconds per step)."""
    state_abs, batch_abs = ref.args
    zeros = jax.jit(lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (state_abs, batch_abs)),
                    out_shardings=jax.tree.map(lambda s: s.sharding, (state_abs, batch_abs)))
    state, batch = zeros()
    compiled = ref.fn.lower(*ref.args).compile()
    state, _ = compiled(state, batch)  # warm-up
    jax.block_until_ready(state)
    t = time.perf_counter()
    steps = 3
    for _ in range(steps):
        state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    seconds = (time.perf_counter() - t) / steps
    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("peak_bytes_in_use", 0)), seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="small", choices=sorted(CASES))
    p.add_argument("--tpu", metavar="CLUSTER", help="compile for this TPU cluster's topology, e.g. v5e-16")
    p.add_argument("--run", action="store_true", help="also run each step on the local devices")
    p.add_argument("--only", type=int, nargs="*", help="case indices to run")
    args = p.parse_args()
    local = jax.devices()
    if args.tpu:
        cluster = meshplan.parse_cluster(args.tpu)
    else:
        kind = local[0].device_kind
        name = "H200" if "H200" in kind else "H100" if "H100" in kind else None
        device = DEVICE_SPECS[name] if name else dataclasses.replace(DEVICE_SPECS["H100"], name="cpu")
        cluster = Cluster(device, num_nodes=1, devices_per_node=len(local))
    print(f"# {time.strftime('%Y-%m-%d')} jax {jax.__version__}; target {cluster.text} "
          f"({'TPU topology, AOT' if args.tpu else local[0].device_kind}); {os.cpu_count()} host cores")
    cols = ["model", "mesh", "batch x seq", "config", "analytic", "XLA arg", "XLA temp", "XLA peak",
            "analytic/peak", "compile s"]
    if args.run:
        cols += ["real peak", "real/XLA peak", "step s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for i, (model, layers, mesh, batch, seq, cfg) in enumerate(CASES[args.cases]):
        if args.only is not None and i not in args.only:
            continue
        spec = scaled(model, layers)
        n = int(np.prod(list(mesh.values())))
        if args.tpu:
            if n != cluster.num_devices:
                mesh = {"fsdp": cluster.num_devices}
            m = meshplan.tpu_topology_mesh(cluster, tuple(mesh), tuple(mesh.values()))
        else:
            if n != len(local):
                mesh = {"fsdp": len(local)}
            m = Mesh(np.array(local).reshape(tuple(mesh.values())), tuple(mesh),
                     axis_types=(AxisType.Auto,) * len(mesh))
        config = meshplan.ReferenceConfig(**cfg)
        ref = meshplan.reference_step(spec, m, batch=batch, seq=seq, config=config)
        est = analytic(spec, cluster, mesh, batch, seq)
        text = ",".join(f"{a}={s}" for a, s in mesh.items())
        try:
            mem = meshplan.compiled_memory(ref.fn, *ref.args)
        except meshplan.CompiledOutOfMemoryError as err:
            print(f"| {spec.name} | {text} | {batch}x{seq} | {config.text} | {est} | does not fit: "
                  f"{err.required_bytes} of {err.available_bytes} |", flush=True)
            continue
        ratio = f"{est / mem.peak_bytes:.2f}" if est else "-"
        row = [spec.name, text, f"{batch}x{seq}", config.text, f"{est / 2**30:.2f} GiB" if est else "-",
               f"{mem.argument_bytes / 2**30:.2f} GiB", f"{mem.temp_bytes / 2**30:.2f} GiB",
               f"{mem.peak_bytes / 2**30:.2f} GiB", ratio, f"{mem.compile_seconds:.1f}"]
        if args.run:
            # peak_bytes_in_use never resets: run one case per process (--only i) for a clean figure.
            try:
                real, step = run_real(ref)
                row += [f"{real / 2**30:.2f} GiB", f"{real / mem.peak_bytes:.3f}", f"{step:.3f}"]
            except Exception as err:  # the allocator's own out-of-memory: report it, keep going
                row += [f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}", "-", "-"]
        print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
