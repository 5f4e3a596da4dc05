"""The analytic step memory next to XLA's: analytic / exact peak per case, on CPU and TPU (AOT).

Run: ``python benchmarks/bench_memory_calibration.py [--backend cpu|tpu|gpu|both] [--tpu v6e-8|v5p-16]
[--mesh-indices 0,1] [--shape-indices 0] [--jsonl FILE]``; ``--case llama3-8b:fsdp=4:full:flash:4x2048``
(repeatable) compiles single cases instead of the grid, full-size presets included (``mixtral-8x7b/4L`` cuts
one to 4 layers); ``--reprice benchmarks/data/*.jsonl`` re-prices recorded rows (no compiling).

For every case (family x mesh x remat x attention x shape) it

- asks the search for that one mesh (``search_meshes(..., fixed=mesh, recipe=...)``): the
  *analytic* peak is the candidate's ``memory.total`` (params, grads and optimizer exact,
  activations calibrated, :mod:`meshplan.pure.cost._step_memory`);
- builds the reference train step with the candidate's own parameter specs
  (:func:`meshplan.facade.verify._reference.reference_step`: scanned layers, donated state,
  AdamW with fp32 state, fp32-logits cross-entropy) and compiles it with
  :func:`meshplan.compiled_memory` on 8 XLA:CPU devices or for an 8-device TPU slice
  (``--tpu``; libtpu, ahead of time): the *exact* peak is XLA's (on CPU: argument +
  output - alias + temp, since XLA:CPU's own peak leaves temporaries out);
- prints analytic, exact, their ratio and the phase the model put the peak in.

The baseline ("exact") is measured in the same process. Models are scaled down
(4 layers, hidden 512, vocab 4096) so a case compiles in seconds on CPU and in
12-50 s for TPU on an idle machine (minutes on a loaded 2-core one). On TPU the
attention kinds are plain and the Pallas flash kernel (``dot_product`` compiles to
the plain form's peak there) and the shapes are ``TPU_SHAPES``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from meshplan import compiled_memory  # noqa: E402
from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import gpu_topology_mesh, tpu_topology_mesh
from meshplan.facade.verify._reference import ReferenceConfig, reference_step  # noqa: E402
from meshplan.pure import MeshCandidate, search_meshes  # noqa: E402
from meshplan.pure.cluster._cluster import Cluster, parse_cluster  # noqa: E402
from meshplan.pure.cluster._devices import DEVICE_SPECS  # noqa: E402
from meshplan.pure.presets import MODEL_SPECS, ModelSpec  # noqa: E402
from meshplan.pure.cost._recipe import TrainingRecipe  # noqa: E402

from _table import cut_preset  # noqa: E402  (benchmarks/, the script's directory)

_SMALL = {"num_layers": 4, "hidden_size": 512, "num_heads": 8, "head_dim": 64, "vocab_size": 4096,
          "num_params": None}
FAMILIES = {
    "gpt2": dataclasses.replace(MODEL_SPECS["gpt2"], name="gpt2-small4", intermediate_size=2048, num_kv_heads=8,
                                max_position_embeddings=1024, **_SMALL),
    "llama": dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-small4", num_kv_heads=4,
                                 intermediate_size=1408, **_SMALL),
    "mixtral": dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="mixtral-small4", num_kv_heads=4,
                                   intermediate_size=1408, moe_intermediate_size=704, **_SMALL),
}
MESHES = ({"fsdp": 8}, {"dp": 2, "fsdp": 4}, {"fsdp": 4, "tp": 2}, {"dp": 2, "fsdp": 2, "tp": 2})
REMATS = ("full", "none")
ATTENTIONS = ("plain", "dot_product")
SHAPES = ((16, 256), (16, 512))
# On TPU the shapes are larger: at 16 x 256 XLA:TPU's peak_memory_in_bytes is mostly not the step's
# HBM buffers (GPT-2, remat none, flash: 159 MiB reported, 53 MiB of arguments + temporaries, with a
# 96 MiB preallocated temp in VMEM in its buffer assignment); at these shapes the step's HBM buffers
# are hundreds of MiB to GiBs, as in real runs.
TPU_SHAPES = ((32, 1024), (32, 2048))
# On TPU jax.nn.dot_product_attention compiles to the same peak as the plain form (XLA has no
# fused kernel there), so the TPU grid's second kind is the Pallas flash kernel.
TPU_ATTENTIONS = ("plain", "flash")
CLUSTER = "v6e-8"


def _mesh_for(sizes: dict[str, int], backend: str, cluster: str = CLUSTER) -> jax.sharding.Mesh:
    names, dims = tuple(sizes), tuple(sizes.values())
    if backend == "tpu":
        return tpu_topology_mesh(cluster, names, dims)
    if backend == "gpu" and _gpu_cluster(cluster) is not None:  # a GPU cluster, compiled ahead of time
        return gpu_topology_mesh(cluster, names, dims)
    devices = jax.devices(backend)[: int(np.prod(dims))]
    return jax.sharding.Mesh(np.array(devices).reshape(dims), names,
                             axis_types=(jax.sharding.AxisType.Auto,) * len(dims))


def analytic(family: str, sizes: dict[str, int], remat: str, attention: str, batch: int, seq: int,
             backend: str, cluster_name: str = CLUSTER) -> tuple[MeshCandidate, dict[str, int]]:
    """The search's candidate for exactly this mesh (its memory is the analytic figure), and the mesh.

    ``cluster_name``: the TPU slice compiled for; its generation (``v6e-8`` -> ``v6e``) is the recipe's
    ``device``, which picks that generation's coefficients (the search runs on a larger v5p slice)."""
    spec = _spec(family)
    gpus = _gpu_cluster(cluster_name) if backend == "gpu" else None
    if backend == "gpu" and gpus is None:  # one local GPU: the whole step on it
        sizes = {"fsdp": 1}
    if spec.is_moe:
        sizes = {"ep": 1, **sizes}
    axes = tuple(a for a in ("dp", "fsdp", "ep", "sp", "tp") if a in sizes)
    device = _generation(cluster_name) if backend == "tpu" else None
    recipe = TrainingRecipe(remat=remat, attention=attention, backend=backend, residual_split=False, device=device)
    # A large-memory device, so the search returns this mesh whether or not it fits a v6e.
    devices = int(np.prod(list(sizes.values())))
    cluster: str | Cluster = f"v5p-{max(8, 2 * devices)}"
    if backend == "gpu":
        # An H200 with room for any step, so a step the model prices above 141 GB (full-size
        # Llama-3-8B) still gets its figure instead of "does not fit".
        cluster = parse_cluster(f"1x{gpus.num_devices if gpus else 1}xH200", devices={
            "H200": dataclasses.replace(DEVICE_SPECS["H200"], hbm_bytes=2**50)})
    cand = search_meshes(spec, cluster, axes=axes, fixed=sizes, batch=batch, seq=seq, recipe=recipe, headroom=0.0,
                         top_k=1).best
    return cand, {a: sizes[a] for a in axes}


def _gpu_cluster(name: str) -> Cluster | None:
    """The GPU cluster a row is compiled for (``--gpu 1x8xH200``); None for the one local GPU (``gpu``)."""
    try:
        cluster = parse_cluster(name)
    except ValueError:
        return None
    return None if cluster.device.ici_scope == "slice" else cluster


def _generation(cluster: str) -> str:
    """The TPU generation of a slice name (``v5p-16`` -> ``v5p``)."""
    return parse_cluster(cluster).device.name


def _spec(family: str) -> ModelSpec:
    """A grid family, or a preset (``"llama3-8b"``; ``"mixtral-8x7b/4L"`` cut to 4 layers) for full-size rows;
    ``"mixtral{moe_intermediate_size=2048}"`` changes integer fields of either (held-out variants)."""
    base, brace, fields = family.partition("{")
    if brace:
        changes = {k: int(v) for k, v in (kv.split("=") for kv in fields.rstrip("}").split(";"))}
        return dataclasses.replace(_spec(base), name=f"{_spec(base).name}-{family[len(base):]}", num_params=None,
                                   **changes)
    if family in FAMILIES:
        return FAMILIES[family]
    return cut_preset(family)


def run_case(family: str, sizes: dict[str, int], remat: str, attention: str, batch: int, seq: int,
             backend: str, run: bool = False, cluster: str = CLUSTER) -> dict[str, object]:
    """One row: analytic and exact peak bytes per device, and what the model said."""
    spec = _spec(family)
    cand, sizes = analytic(family, sizes, remat, attention, batch, seq, backend, cluster)
    axes = tuple(sizes)
    mesh = _mesh_for({a: sizes[a] for a in axes}, backend, cluster)
    config = ReferenceConfig(remat=remat, attention=attention)
    start = time.perf_counter()
    ref = reference_step(spec, mesh, batch=batch, seq=seq, plan=cand, config=config)
    exact = compiled_memory(ref.fn, *ref.args, top_buffers=24)
    measured = _run_once(ref) if run else 0
    return {"measured": measured, "family": family, "mesh": cand.text, "remat": remat, "attention": attention, "batch": batch,
            "seq": seq, "backend": backend, "analytic": cand.memory.total, "exact": exact.peak_bytes,
            "ratio": cand.memory.total / exact.peak_bytes, "phase": cand.memory.phase,
            "state_exact": exact.argument_bytes, "state_analytic": cand.memory.params + cand.memory.optimizer,
            "temp": exact.temp_bytes, "seconds": time.perf_counter() - start,
            "cluster": cluster if backend == "tpu" or (backend == "gpu" and _gpu_cluster(cluster)) else backend,
            # XLA's biggest buffers live at its peak (where compiled_memory can read them), for finding
            # which phase the peak is in and what it holds.
            "largest": [[b.bytes, b.shape, b.kind, b.source[-90:]] for b in getattr(exact, "largest", ())[:24]],
            # How much of XLA's buffer assignment is live at its live-range peak (on TPU below
            # peak_bytes when the peak holds more than the listed device buffers).
            "largest_note": getattr(exact, "largest_note", "")}


def _run_once(ref: object) -> int:
    """Run one step on real buffers; the device's ``peak_bytes_in_use`` (this process's peak so far)."""
    import jax.numpy as jnp

    state, data = ref.args  # type: ignore[attr-defined]
    real = jax.tree.map(lambda s: jax.device_put(jnp.zeros(s.shape, s.dtype), s.sharding), (state, data))
    out = ref.fn(*real)  # type: ignore[attr-defined]
    jax.block_until_ready(out)
    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("peak_bytes_in_use", 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("cpu", "tpu", "gpu", "both"), default="cpu")
    parser.add_argument("--run", action="store_true",
                        help="also run one step on real buffers and record the device's peak_bytes_in_use "
                             "(GPU; run one case per process, the peak only grows)")
    parser.add_argument("--only-case", type=int, help="run only this case (index into the grid)")
    parser.add_argument("--attentions", help="attention kinds to run (default: plain,dot_product; on TPU "
                                               "plain,flash)")
    parser.add_argument("--tpu", default=CLUSTER, metavar="CLUSTER",
                        help="the TPU slice to compile for (8 devices: v6e-8, v5p-16, v5e-8)")
    parser.add_argument("--gpu", metavar="CLUSTER", help="with --backend gpu: compile the grid's 8-device meshes "
                        "for this GPU cluster ahead of time (e.g. 1x8xH200; needs one such local GPU)")
    parser.add_argument("--mesh-indices", help="comma-separated indices into MESHES, in this order")
    parser.add_argument("--shape-indices", help="comma-separated indices into SHAPES, in this order")
    parser.add_argument("--reprice", nargs="+", metavar="JSONL",
                        help="no compiling: re-price rows recorded earlier (e.g. on another machine) with the "
                             "current calibration and print the table")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (for RESULTS.md)")
    parser.add_argument("--groups", action="store_true", help="with --reprice: print only the band per file and "
                        "remat policy, as markdown (the table in RESULTS.md)")
    parser.add_argument("--only-mesh", type=int, help="run only this mesh (index into MESHES)")
    parser.add_argument("--quick", action="store_true", help="llama only, one shape")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--meshes", type=int, default=len(MESHES), help="how many of the meshes")
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="how many of the (batch, seq) shapes")
    parser.add_argument("--jsonl", help="append each row as JSON to this file")
    parser.add_argument("--case", action="append", metavar="FAMILY:MESH:REMAT:ATTENTION:BxS",
                        help="compile this one case instead of the grid (repeatable), e.g. "
                             "'llama3-8b:fsdp=4:full:flash:4x2048' (a preset, '/NL' cuts it to N layers)")
    args = parser.parse_args(argv)
    if args.reprice:
        if args.groups:
            _groups({path: [_reprice(json.loads(line)) for line in open(path, encoding="utf-8") if line.strip()]
                     for path in args.reprice})
            return
        _summary([_reprice(json.loads(line)) for path in args.reprice
                  for line in open(path, encoding="utf-8") if line.strip()], markdown=args.markdown)
        return
    backends = ("cpu", "tpu") if args.backend == "both" else (args.backend,)
    if "tpu" in backends and not libtpu_available():
        print("libtpu is not installed: TPU rows skipped (pip install 'meshplan[tpu]')", file=sys.stderr)
        backends = tuple(b for b in backends if b != "tpu")
    families = ["llama"] if args.quick else args.families.split(",")
    all_shapes = TPU_SHAPES if backends == ("tpu",) else SHAPES
    shapes = all_shapes[:1] if args.quick else all_shapes[: args.shapes]
    meshes = MESHES[: args.meshes] if args.only_mesh is None else MESHES[args.only_mesh: args.only_mesh + 1]
    if args.mesh_indices:
        meshes = tuple(MESHES[int(i)] for i in args.mesh_indices.split(","))
    if args.shape_indices:
        shapes = tuple(all_shapes[int(i)] for i in args.shape_indices.split(","))
    meshes = meshes[:1] if backends == ("gpu",) and not args.gpu else meshes
    rows = []
    out = open(args.jsonl, "a", encoding="utf-8") if args.jsonl else None
    grid = [(backend, family, sizes, shape, remat, attention)
            for backend in backends
            for family, sizes, shape, remat in itertools.product(families, meshes, shapes, REMATS)
            for attention in (args.attentions.split(",") if args.attentions
                              else TPU_ATTENTIONS if backend == "tpu" else ATTENTIONS)]
    if args.only_case is not None:
        grid = grid[args.only_case: args.only_case + 1]
    if args.case:
        grid = [_parse_case(text, backends[0]) for text in args.case]
    for backend, family, sizes, (batch, seq), remat, attention in grid:
        try:
            row = run_case(family, dict(sizes), remat, attention, batch, seq, backend, run=args.run,
                           cluster=args.gpu if backend == "gpu" and args.gpu else args.tpu)
        except Exception as err:  # noqa: BLE001 -- one case that does not compile must not end the grid
            print(f"{backend} {family} {sizes} {remat} {attention} b={batch} s={seq}: FAILED "
                  f"{type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        rows.append(row)
        if out is not None:
            out.write(json.dumps(row) + "\n")
            out.flush()
        print(f"{backend} {family:8} {row['mesh']:16} {remat:5} {attention:11} b={batch} s={seq}: analytic "
              f"{row['analytic'] / 2**20:8.1f} MiB exact {row['exact'] / 2**20:8.1f} MiB "
              f"ratio {row['ratio']:.2f} ({row['phase']})", flush=True)
    _summary(rows, markdown=args.markdown)


BAND = (0.95, 1.10)
"""The issue's band for analytic / exact."""


def sizes_of(row: dict[str, object]) -> dict[str, int]:
    """A recorded row's mesh, ``"dp=2,fsdp=4"`` -> ``{"dp": 2, "fsdp": 4}``."""
    return {k: int(v) for k, v in (kv.split("=") for kv in str(row["mesh"]).split(","))}


def _parse_case(text: str, backend: str) -> tuple[str, str, dict[str, int], tuple[int, int], str, str]:
    """``FAMILY:MESH:REMAT:ATTENTION:BxS`` -> a grid entry (``llama3-8b:fsdp=4:full:flash:4x2048``)."""
    family, mesh, remat, attention, shape = text.split(":")
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in mesh.split(","))}
    batch, seq = (int(v) for v in shape.split("x"))
    return backend, family, sizes, (batch, seq), remat, attention


def _reprice(row: dict[str, object]) -> dict[str, object]:
    cand, _ = analytic(str(row["family"]), sizes_of(row), str(row["remat"]), str(row["attention"]), int(row["batch"]),  # type: ignore[call-overload]
                       int(row["seq"]), str(row["backend"]), str(row.get("cluster", CLUSTER)))  # type: ignore[call-overload]
    return {**row, "analytic": cand.memory.total, "ratio": cand.memory.total / int(row["exact"]),  # type: ignore[call-overload]
            "phase": cand.memory.phase}


def _markdown(rows: list[dict[str, object]]) -> None:
    print("| target | family | mesh | remat | attention | b x s | analytic MiB | exact MiB | ratio | phase |")
    print("|---|---|---|---|---|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r.get('cluster', r['backend'])} | {r['family']} | {r['mesh']} | {r['remat']} | {r['attention']} | "
              f"{r['batch']}x{r['seq']} | {int(r['analytic']) / 2**20:.1f} | {int(r['exact']) / 2**20:.1f} | "  # type: ignore[call-overload]
              f"{float(r['ratio']):.2f} | {r['phase']} |")  # type: ignore[arg-type]


def _summary(rows: list[dict[str, object]], markdown: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    if markdown:
        _markdown(rows)
        _band(rows)
        return

    table = Table(title="analytic / exact peak per device (exact: XLA memory_analysis in the same process)")
    for col in ("backend", "family", "mesh", "remat", "attention", "b x s", "analytic MiB", "exact MiB", "ratio",
                "phase"):
        table.add_column(col, justify="right" if "MiB" in col or col == "ratio" else "left")
    for r in rows:
        table.add_row(str(r["backend"]), str(r["family"]), str(r["mesh"]), str(r["remat"]), str(r["attention"]),
                      f"{r['batch']}x{r['seq']}", f"{r['analytic'] / 2**20:.1f}",  # type: ignore[operator]
                      f"{r['exact'] / 2**20:.1f}", f"{r['ratio']:.2f}", str(r["phase"]))  # type: ignore[operator]
    Console(width=160).print(table)
    _band(rows)


def _groups(by_file: dict[str, list[dict[str, object]]]) -> None:
    """Markdown: per recorded file, target and remat policy, the rows' analytic / exact band."""
    print("| file | target | remat | rows | min / median / max | in 0.95-1.10 |")
    print("|---|---|---|---:|---|---:|")
    for path, rows in by_file.items():
        name = os.path.basename(path).removeprefix("memory_calibration_").removesuffix(".jsonl")
        keys = sorted({(str(r.get("cluster", r["backend"])), str(r["remat"])) for r in rows})
        for target, remat in keys:
            ratios = sorted(float(r["ratio"]) for r in rows  # type: ignore[arg-type]
                            if (str(r.get("cluster", r["backend"])), str(r["remat"])) == (target, remat))
            inside = sum(BAND[0] <= x <= BAND[1] for x in ratios)
            print(f"| {name} | {target} | {remat} | {len(ratios)} | {ratios[0]:.2f} / {ratios[len(ratios) // 2]:.2f}"
                  f" / {ratios[-1]:.2f} | {inside} |")


def _band(rows: list[dict[str, object]]) -> None:
    for backend in sorted({str(r.get("cluster", r["backend"])) for r in rows}):
        ratios = sorted(float(r["ratio"]) for r in rows  # type: ignore[arg-type]
                        if r.get("cluster", r["backend"]) == backend)
        inside = sum(BAND[0] <= x <= BAND[1] for x in ratios)
        print(f"{backend}: {len(ratios)} cases, ratio min {ratios[0]:.2f} median {ratios[len(ratios) // 2]:.2f} "
              f"max {ratios[-1]:.2f}; {inside} within 0.95-1.10")


if __name__ == "__main__":
    main()
