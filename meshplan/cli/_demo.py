"""``meshplan demo``: plan a small model, place it on simulated CPU devices, check the estimate.

Everything printed is computed live on real XLA CPU devices:

1. a few meshes built with :func:`meshplan.create_mesh` and friends;
2. :func:`meshplan.search_meshes` plans a tiny Llama-style model (GQA,
   untied head) for a one-host "cluster" of the simulated devices whose
   memory is small enough that replicating the model does not fit;
3. the best mesh is created with :func:`meshplan.create_mesh`, and the
   parameters, their gradients and two fp32 Adam moments are created as
   zeros directly sharded (``jax.jit`` with ``out_shardings``, so nothing is
   ever materialised whole);
4. the planner's bytes per device are printed next to the live bytes (the
   sum of ``addressable_shards`` per device). They must agree byte for byte;
   the demo exits with status 1 if they do not.
"""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

from meshplan.cli._args import positive

__all__ = ["add_parser", "run", "run_command", "tiny_llama", "use_cpu_devices"]

MAX_DEVICES = 1024
"""The most simulated CPU devices the demo runs on: beyond this XLA's CPU client fails or takes minutes."""


def _devices(text: str) -> int:
    n = positive(text)
    if n > MAX_DEVICES:
        raise argparse.ArgumentTypeError(f"{n} simulated devices is more than the demo runs (at most {MAX_DEVICES})")
    return n


def add_parser(sub: Any) -> None:
    """Register ``meshplan demo`` on the command line's subparsers."""
    demo = sub.add_parser("demo", help="plan a small model and place it on simulated CPU devices")
    demo.add_argument("--devices", type=_devices, default=8,
                      help=f"simulated CPU devices (default 8, at most {MAX_DEVICES})")
    demo.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    """``meshplan demo``: :func:`run` on ``--devices`` simulated CPU devices."""
    return run(num_devices=args.devices)

_MIB = 2**20


def use_cpu_devices(n: int) -> None:
    """Ask for ``n`` CPU devices (``chex.set_n_cpu_devices``); must run before jax's backend starts."""
    import jax

    from meshplan.facade._cpu import use_cpu_devices as ask

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # jax read JAX_PLATFORMS when the command line imported it, before the line above: say it again, or an
    # installed CUDA plugin (meshplan[gpu]) tries cuInit with no GPU and logs a traceback.
    jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])  # type: ignore[no-untyped-call]
    ask(n)


def tiny_llama() -> Any:
    """The demo's model: a 4-layer Llama-style :class:`~meshplan.pure.ModelSpec` (GQA, untied head).

    Example:
      >>> from meshplan.pure.presets import build_params, count_params
      >>> count_params(build_params(tiny_llama()))
      7096576
    """
    from meshplan.pure import ModelSpec

    return ModelSpec("tiny-llama", "llama", vocab_size=8192, hidden_size=256, num_layers=4, num_heads=8,
                     num_kv_heads=4, head_dim=32, intermediate_size=688)


def _mesh_rows(num_devices: int) -> list[tuple[str, str, str]]:
    import jax

    from meshplan import HybridMeshShape, MeshConfig, create_mesh, parse_mesh_from_string

    rows = []

    def add(label: str, mesh: jax.sharding.Mesh) -> None:
        shape = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
        ids = " ".join(str(d.id) for d in mesh.devices.flat)
        rows.append((label, shape, ids))

    add("create_mesh() default", create_mesh())
    add("create_mesh((2, -1), ('data', 'model'))", create_mesh((2, -1), ("data", "model")))
    if num_devices % 2 == 0:
        add('parse_mesh_from_string("dp:2,tp:-1")', parse_mesh_from_string("dp:2,tp:-1", ["dp", "tp"]))
        config = MeshConfig(
            mesh_shape=(1, -1), mesh_axis_names=("data", "model"),
            mesh_rules=[("cpu-.*", HybridMeshShape((2, num_devices // 2), (1, 1)))],
        )
        add(f"MeshConfig rule 'cpu-.*' (selector cpu-{num_devices})",
            config.create_device_mesh(mesh_selector=f"cpu-{num_devices}"))
    return rows


def _cluster(num_devices: int, state_bytes: int) -> Any:
    from meshplan.pure import Cluster, DeviceSpec

    # Memory: half the replicated training state per device, so the pure data-parallel meshes
    # are rejected and the planner has to shard (and the sharded step's peak, activations and
    # logits included, still fits). Links: made-up but NVLink-like figures.
    device = DeviceSpec("cpu-sim", hbm_bytes=max(state_bytes // 2, 1), intra_bandwidth=100e9,
                        inter_bandwidth=10e9, intra_latency_s=5e-6, inter_latency_s=2e-5,
                        devices_per_node=num_devices)
    return Cluster(device, num_nodes=1, devices_per_node=num_devices)


def _live_bytes(trees: dict[str, Any], mesh: Any) -> dict[str, list[int]]:
    """Bytes each device of ``mesh`` holds per tree, in mesh (row-major) order."""
    import jax

    position = {d.id: k for k, d in enumerate(mesh.devices.flat)}
    out = {}
    for name, tree in trees.items():
        per = [0] * mesh.devices.size
        for leaf in jax.tree.leaves(tree):
            for shard in leaf.addressable_shards:
                per[position[shard.device.id]] += shard.data.nbytes
        out[name] = per
    return out


def _place(params: Any, specs: Any, mesh: Any) -> dict[str, Any]:
    """Params, grads (same dtype) and two fp32 Adam moments as sharded zeros, built on device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, PartitionSpec))

    def zeros(dtype: Any = None) -> Any:
        make = jax.jit(lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, dtype or s.dtype), params),
                       out_shardings=shardings)
        return make()

    return {"params": zeros(), "grads": zeros(), "optimizer": (zeros(jnp.float32), zeros(jnp.float32))}


def run(*, num_devices: int = 8) -> int:
    """Run the demo on ``num_devices`` simulated CPU devices; 0 if estimate == live bytes, else 1."""
    use_cpu_devices(num_devices)
    import jax
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from meshplan import create_mesh, search_meshes
    from meshplan.pure import estimate_training_memory
    from meshplan.pure.presets import build_params, count_params

    console = Console(width=shutil.get_terminal_size((120, 40)).columns)
    n = jax.device_count()
    console.print(f"[bold]meshplan demo[/bold] on {n} {jax.default_backend()} devices")
    table = Table(title="Meshes")
    for col in ("request", "axes", "device ids (row-major)"):
        table.add_column(col)
    for row in _mesh_rows(n):
        table.add_row(*row)
    console.print(table)

    spec = tiny_llama()
    params = build_params(spec)
    state = count_params(params) * (2 + 2 + 8)  # bf16 params + bf16 grads + 2 fp32 moments
    cluster = _cluster(n, state)
    result = search_meshes(spec, cluster, params=params, batch=n, seq=256, top_k=3)
    best = result.best
    console.print(f"\n[bold]Planned[/bold] {spec.name} ({count_params(params):,} params, bf16) for {n} devices "
                  f"of {cluster.hbm_bytes / _MIB:.1f} MiB: {result.num_fitting} of {result.num_candidates} "
                  f"meshes fit; best {best.text} ({best.verdict})")
    for cand in result.rejected[:2]:
        console.print(f"  {cand.text}: {cand.verdict}")

    mesh = create_mesh(best.axis_sizes, best.axis_names)
    specs = best.specs_for(params)
    live = _live_bytes(_place(params, specs, mesh), mesh)
    est = estimate_training_memory(params, specs, best.mesh_shape, optimizer_copies=2,
                                   optimizer_dtype=np.float32)
    planned = {"params": est.params.per_device, "grads": est.grads.per_device,
               "optimizer": est.opt_state.per_device}
    out = Table(title=f"Bytes per device on mesh {dict(mesh.shape)}: planner estimate vs live arrays")
    for col in ("device", "params est / live", "grads est / live", "optimizer est / live", "match"):
        out.add_column(col, justify="right")
    ok = True
    for k, device in enumerate(mesh.devices.flat):
        same = all(planned[p][k] == live[p][k] for p in planned)
        ok = ok and same
        out.add_row(str(device.id), *(f"{planned[p][k]:,} / {live[p][k]:,}" for p in planned),
                    "yes" if same else "[red]NO[/red]")
    console.print(out)
    # The search's own figures (fullest device) must be the estimator's too.
    searched = (best.memory.params, best.memory.grads, best.memory.optimizer)
    ok = ok and searched == (est.params.max_per_device, est.grads.max_per_device, est.opt_state.max_per_device)
    if ok:
        console.print("[green]estimate == live bytes on every device[/green]; next: "
                      "meshplan plan --model llama3-70b --cluster 8x8xH100")
        return 0
    console.print("[red]MISMATCH between the planner's estimate and the live bytes[/red]", style="bold")
    return 1
