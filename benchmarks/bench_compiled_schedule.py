"""Step time read off the compiled schedule, against measured steps (GPU) and XLA's own floor (TPU).

Run from the repository root (no GPU or TPU needed; every compile is ahead of time)::

    JAX_PLATFORMS=cpu python benchmarks/bench_compiled_schedule.py [--gpu] [--tpu] [--cache DIR] [--fit]

``--gpu`` (the default when neither is given): the recorded single-device steps of
``benchmarks/data/step_time_h200.jsonl`` and ``step_time_h100.jsonl`` (``bench_step_time_gpu.py``: the
reference train step on one H200 / H100, the mean of 5 steps), each compiled deviceless for that GPU
(``gpu_topology_mesh`` with the shipped target description, no autotuning) with the same reference step,
read (``read_schedule``), simulated (``simulate_schedule`` with ``default_roofline``) and divided by the
measured step; beside it, the analytic step model's ratio on the same row (``search_meshes`` on the
one-device mesh, as ``bench_step_time_gpu.py`` prices it today). Which rows the roofline's constants
(``SCHEDULE_FIT``) were fitted on is said per row; the others are held out. ``--fit`` refits them on
those rows (a grid over ``e_max`` and ``half_s``, least squares on ``ln(simulated / measured)``; ``hbm_efficiency``
and ``launch_s`` stay at their stated values) and prints the table with the fit.

``--tpu``: a small grid of deviceless XLA:TPU compiles (libtpu), the simulated step against
``cost_analysis()["optimal_seconds"]`` of the same program (XLA's sum of each op's bottleneck time at
peak: a floor, expected at or below the simulation) and the analytic step model's figure.

``--cache DIR`` keeps each compiled HLO text in DIR and reads it back on later runs (the compile is the
slow part: 10-25 s per GPU row on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import pathlib
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bench_compiled import scaled  # noqa: E402  (benchmarks/, the script's directory)

from meshplan.pure.cluster import DEVICE_SPECS, parse_cluster  # noqa: E402
from meshplan.pure.cost import TrainingRecipe  # noqa: E402
from meshplan.pure.cost._roofline import SCHEDULE_FIT, Roofline, SizeEfficiency, default_roofline, schedule_links  # noqa: E402
from meshplan.pure.cost._schedule_time import simulate_schedule  # noqa: E402
from meshplan.pure.xla._schedule import read_schedule
from meshplan.pure.xla._schedule_records import ScheduledProgram  # noqa: E402

DATA = pathlib.Path(__file__).with_name("data")
# The rows SCHEDULE_FIT["gpu"] was fitted on (the rest are held out): one of each model family and step kind on
# the H200, so the held-out rows test other batch / remat / attention choices and another GPU (every H100 row).
FIT_ROWS = frozenset({
    "H200 llama3-8b/16L 2x4096 full dot_product",
    "H200 llama3-8b/4L 8x2048 none dot_product",
    "H200 llama3-70b/2L 4x4096 full dot_product",
    "H200 mixtral-8x7b/2L 4x2048 full dot_product",
    "H200 gpt2 16x1024 full dot_product",
})
# (TPU slice, model, mesh, batch, seq, remat): small widths (hidden 1024, 2 layers, vocabulary 4096), so each
# deviceless compile takes about a minute on 2 cores.
TPU_CASES: tuple[tuple[str, str, dict[str, int], int, int, str], ...] = (
    ("v5e-4", "llama3-8b", {"fsdp": 4}, 8, 512, "full"),
    ("v5e-8", "llama3-8b", {"fsdp": 8}, 16, 512, "full"),
    ("v5e-8", "llama3-8b", {"fsdp": 2, "tp": 4}, 16, 512, "none"),
    ("v6e-8", "llama3-8b", {"fsdp": 8}, 16, 512, "full"),
    ("v5p-8", "gpt2", {"fsdp": 4}, 8, 512, "none"),
    ("v5p-32", "llama3-8b", {"fsdp": 16}, 16, 512, "full"),
    ("v6e-16", "mixtral-8x7b", {"fsdp": 8, "ep": 2}, 16, 512, "full"),
    ("2xv5e-4", "llama3-8b", {"dp": 2, "fsdp": 4}, 16, 512, "full"),
)


def small(name: str) -> Any:
    """A preset cut to hidden 1024, 2 layers, vocabulary 4096 (an MoE keeps 4 experts of width 1024)."""
    from meshplan.pure.presets import MODEL_SPECS

    spec = MODEL_SPECS[name]
    kv = min(spec.num_kv_heads or 8, 8)
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 1024,
           "num_dense_layers": 0} if spec.is_moe else {}
    return dataclasses.replace(spec, name=f"{name}-small", num_layers=2, hidden_size=1024, num_heads=8,
                               num_kv_heads=kv, head_dim=128, intermediate_size=4096, vocab_size=4096,
                               num_params=None, **moe)


@dataclasses.dataclass(frozen=True)
class GpuRow:
    gpu: str
    model: str
    batch: int
    seq: int
    remat: str
    attention: str
    measured_s: float

    @property
    def label(self) -> str:
        return f"{self.gpu} {self.model} {self.batch}x{self.seq} {self.remat} {self.attention}"


def gpu_rows() -> list[GpuRow]:
    rows = []
    for gpu, name in (("H200", "step_time_h200.jsonl"), ("H100", "step_time_h100.jsonl")):
        for line in (DATA / name).read_text().splitlines():
            r = json.loads(line)
            rows.append(GpuRow(gpu, r["model"], r["batch"], r["seq"], r["remat"], r["attention"], r["measured_s"]))
    return rows


def _spec(model: str, layers: int | None = None) -> Any:
    name, _, cut = model.partition("/")
    return scaled(name, int(cut.removesuffix("L")) if cut else layers)


def _cached(cache: pathlib.Path | None, key: str, compile_text: Any) -> tuple[str, float]:
    path = cache / f"{key.replace('/', '_').replace(' ', '_')}.hlo" if cache else None
    if path is not None and path.exists():
        return path.read_text(), 0.0
    start = time.perf_counter()
    text = compile_text()
    seconds = time.perf_counter() - start
    if path is not None:
        path.write_text(text)
    return text, seconds


def gpu_program(row: GpuRow, cache: pathlib.Path | None) -> tuple[ScheduledProgram, float]:
    def compile_text() -> str:
        from meshplan.facade.verify._targets import gpu_topology_mesh
        from meshplan.facade.verify._reference import ReferenceConfig, reference_step

        mesh = gpu_topology_mesh(f"1x1x{row.gpu}", ("fsdp",), (1,))
        ref = reference_step(_spec(row.model), mesh, batch=row.batch, seq=row.seq,
                             config=ReferenceConfig(remat=row.remat, attention=row.attention))
        return str(ref.fn.lower(*ref.args).compile().as_text())

    text, seconds = _cached(cache, row.label, compile_text)
    return read_schedule(text), seconds


def analytic_step(row: GpuRow) -> float:
    """The analytic step model's step for this row (``bench_step_time_gpu.run_case``'s prediction)."""
    from meshplan.pure import search_meshes

    spec = _spec(row.model)
    fixed = {"fsdp": 1, "ep": 1} if spec.is_moe else {"fsdp": 1}
    recipe = TrainingRecipe(remat=row.remat, attention=row.attention, backend="gpu", residual_split=False)
    cand = search_meshes(spec, f"1x1x{row.gpu}", axes=tuple(fixed), fixed=fixed, batch=row.batch, seq=row.seq,
                         recipe=recipe, headroom=0.0, top_k=1, micro_batches=1).best
    assert cand.step is not None
    return float(cand.step.step_s)


def _roofline(gpu: str, fit: tuple[float, float, float, float]) -> Roofline:
    device = DEVICE_SPECS[gpu]
    assert device.peak_bf16_flops is not None and device.hbm_bandwidth is not None
    return Roofline(device.peak_bf16_flops, device.hbm_bandwidth, SizeEfficiency(fit[0], fit[1]), fit[2], fit[3])


def simulated(program: ScheduledProgram, gpu: str, fit: tuple[float, float, float, float] | None = None) -> Any:
    roof = default_roofline(DEVICE_SPECS[gpu]) if fit is None else _roofline(gpu, fit)
    return simulate_schedule(program, roof, schedule_links(parse_cluster(f"1x1x{gpu}")))


def fit_constants(rows: list[tuple[GpuRow, ScheduledProgram]]) -> tuple[float, float, float, float]:
    """The grid point of ``(e_max, half_s)`` minimising the squared ``ln(simulated / measured)`` over
    ``rows`` (ties: the first), ``hbm_efficiency`` and ``launch_s`` held at their stated values: five rows do
    not pin four constants (a free launch cost trades against the size curve)."""
    _, _, hbm, launch = SCHEDULE_FIT["gpu"]
    grid = itertools.product([0.5 + 0.025 * k for k in range(19)], [0.0] + [1e-6 * 2 ** (k / 2) for k in range(17)])
    best: tuple[float, tuple[float, float, float, float]] | None = None
    for e_max, half in grid:
        point = (round(e_max, 3), float(f"{half:.3g}"), hbm, launch)
        loss = sum(math.log(simulated(p, r.gpu, point).step_s / r.measured_s) ** 2 for r, p in rows)
        if best is None or loss < best[0] - 1e-12:
            best = (loss, point)
    assert best is not None
    return best[1]


def gpu_table(cache: pathlib.Path | None, refit: bool) -> None:
    rows = [(r, *gpu_program(r, cache)) for r in gpu_rows()]
    fit = fit_constants([(r, p) for r, p, _ in rows if r.label in FIT_ROWS]) if refit else None
    constants = fit or SCHEDULE_FIT["gpu"]
    print(f"roofline: e_max {constants[0]}, half_s {constants[1]:g}, hbm_efficiency {constants[2]}, "
          f"launch_s {constants[3]:g}{' (refitted now)' if fit else ' (SCHEDULE_FIT)'}\n")
    print("| row | rows fit on | measured s | simulated s | simulated / measured | analytic / measured | "
          "compute s | memory-bound share | compile s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios: dict[str, list[float]] = {"fit": [], "held out": []}
    analytic: dict[str, list[float]] = {"fit": [], "held out": []}
    for row, program, seconds in rows:
        t = simulated(program, row.gpu, fit)
        a = analytic_step(row)
        kernels = simulate_schedule(program, default_roofline(DEVICE_SPECS[row.gpu]) if fit is None else
                                    _roofline(row.gpu, fit), schedule_links(parse_cluster(f"1x1x{row.gpu}")),
                                    top=100_000).top_ops
        memory = sum(o.seconds for o in kernels if o.kind not in ("matmul", "attention")) / max(t.compute_s, 1e-12)
        group = "fit" if row.label in FIT_ROWS else "held out"
        ratios[group].append(t.step_s / row.measured_s)
        analytic[group].append(a / row.measured_s)
        print(f"| {row.label} | {group} | {row.measured_s:.3f} | {t.step_s:.3f} | {t.step_s / row.measured_s:.2f} | "
              f"{a / row.measured_s:.2f} | {t.compute_s:.3f} | {memory:.0%} | {seconds:.0f} |", flush=True)
    for group in ("fit", "held out"):
        r, a = ratios[group], analytic[group]
        if r:
            print(f"\n{group}: {len(r)} rows, simulated within 15%: {sum(abs(x - 1) <= 0.15 for x in r)}/{len(r)}, "
                  f"median |ln ratio| {statistics.median(abs(math.log(x)) for x in r):.3f} (analytic: within 15% "
                  f"{sum(abs(x - 1) <= 0.15 for x in a)}/{len(a)}, median |ln ratio| "
                  f"{statistics.median(abs(math.log(x)) for x in a):.3f})")


def tpu_table(cache: pathlib.Path | None) -> None:
    import jax

    from meshplan.facade.verify._compilers import libtpu_available
    from meshplan.facade.verify._targets import tpu_topology_mesh
    from meshplan.facade.verify._compiled_schedule import compiled_step_time
    from meshplan.facade.verify._reference import ReferenceConfig, reference_step
    from meshplan.pure import search_meshes

    if not libtpu_available():
        print("libtpu is not installed: no TPU table.")
        return
    print("Unrolled steps (scan_layers=False: XLA's cost analysis counts a loop body once). XLA's optimal_seconds "
          "sums each op's bottleneck time at peak; 'at peak' is the simulation at the same rates (matmul efficiency "
          "1, the datasheet HBM bandwidth); FLOPs and bytes: the reader's totals over XLA's.\n")
    print("| slice | model | mesh | b x s | remat | simulated s | XLA optimal s (reported) | simulated / optimal | "
          "at peak / optimal | FLOPs / XLA's | bytes / XLA's | analytic / optimal | exposed share | compile s |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for slice_name, model, mesh_axes, batch, seq, remat in TPU_CASES:
        spec = small(model)
        cluster = parse_cluster(slice_name)
        recipe = TrainingRecipe(remat=remat, attention="dot_product", backend="tpu", residual_split=False)
        cand = search_meshes(spec, cluster, axes=tuple(mesh_axes), fixed=mesh_axes, batch=batch, seq=seq,
                             recipe=recipe, headroom=0.0, top_k=1, micro_batches=1).best
        dcn = tuple(cluster.num_slices if k == "dp" else 1 for k in mesh_axes) if cluster.num_slices > 1 else None
        mesh = tpu_topology_mesh(slice_name, tuple(mesh_axes), tuple(mesh_axes.values()), dcn_shape=dcn)
        ref = reference_step(spec, mesh, batch=batch, seq=seq, plan=cand,
                             config=ReferenceConfig(remat=remat, attention="dot_product", scan_layers=False))
        start = time.perf_counter()
        with jax.set_mesh(mesh):
            compiled = ref.fn.lower(*ref.args).compile()
        seconds = time.perf_counter() - start
        t = compiled_step_time(compiled, cluster=cluster)
        program = read_schedule(compiled.as_text())
        device = cluster.device
        assert device.peak_bf16_flops is not None and device.hbm_bandwidth is not None
        peak = simulate_schedule(program, Roofline(device.peak_bf16_flops, device.hbm_bandwidth),
                                 schedule_links(cluster)).step_s
        once = program.totals(loops_once=True)
        opt, reported = t.xla_optimal_seconds, t.xla_reported_seconds
        analytic = cand.step.step_s if cand.step is not None else float("nan")
        mesh_text = ",".join(f"{k}={v}" for k, v in mesh_axes.items())
        opt_text = (f"{opt:.5f}" if opt else "none") + (f" ({reported:.5f})" if reported is not None and reported != opt
                                                          else "")

        def over(x: float, base: float | None) -> str:
            return f"{x / base:.2f}" if base else "-"

        print(f"| {slice_name} | {spec.name} | {mesh_text} | {batch}x{seq} | {remat} | {t.step_s:.5f} | {opt_text} | "
              f"{over(t.step_s, opt)} | {over(peak, opt)} | {over(once.flops + once.other_flops, t.xla_flops)} | "
              f"{over(once.bytes_accessed, t.xla_bytes_accessed)} | {over(analytic, opt)} | "
              f"{t.schedule.exposed_s / t.step_s:.0%} | {seconds:.0f} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="the recorded single-GPU steps (default)")
    parser.add_argument("--tpu", action="store_true", help="the deviceless TPU grid against optimal_seconds")
    parser.add_argument("--cache", type=pathlib.Path, help="keep compiled HLO texts in this directory")
    parser.add_argument("--fit", action="store_true", help="refit the GPU roofline constants on FIT_ROWS")
    args = parser.parse_args(argv)
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    if args.gpu or not args.tpu:
        gpu_table(args.cache, args.fit)
    if args.tpu:
        print()
        tpu_table(args.cache)


if __name__ == "__main__":
    sys.exit(main())
