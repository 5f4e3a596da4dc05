"""How fast the compiler decides: deviceless compiles of full-size steps, a verified plan, the byte check.

Run (needs ``meshplan[gpu]`` and ``meshplan[tpu]``; no GPU or TPU)::

    JAX_PLATFORMS=cpu python benchmarks/bench_compile_gpu.py [--skip-compiles] [--skip-plan] [--skip-equality]

1. compile seconds of meshplan's scanned reference step at full size (Llama-3 8B / 70B on H100 clusters and
   on a TPU slice), each in one worker subprocess, one at a time (worker start included, and the compile
   alone as XLA's ``compile_seconds``);
2. ``meshplan plan --model llama3-70b --cluster 8x8xH100`` with its default verification (top 3), from a
   fresh compile cache, then the same command again (cached);
3. with ``--coverage TOP``: the stated range (the estimate, its calibrated part scaled by the recorded GPU
   spread, measured on an H200) against the compiled peak of the top TOP meshes on a held-out grid
   (H100 and A100, Llama-3 8B / 70B and Mixtral 8x7B, remat full and none);
4. the equality check: the compiled peak ``meshplan.verify_plan`` reports for ``llama3-8b`` on ``1x8xH100``,
   batch 16, equals an independent ``jax.jit(...).lower(...).compile()`` of the same reference step, to
   the byte.

Prints markdown tables for benchmarks/RESULTS.md (section "The compiler decides").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CUDA plugin with no GPU: compile only

from meshplan.facade.verify._compilers import compiler_version
from meshplan.facade.verify._reference import ReferenceConfig  # noqa: E402
from meshplan.facade.verify._jobs import CompileJob
from meshplan.facade.verify._worker import run_jobs
from meshplan.pure import get_preset, parse_cluster, search_meshes  # noqa: E402
from meshplan.pure._format import fmt_bytes  # noqa: E402
from meshplan.pure.errors import PlanError  # noqa: E402

COMPILES = (("llama3-8b", "1x8xH100", 16), ("llama3-70b", "8x8xH100", 64), ("llama3.1-405b", "32x8xH100", 256),
            ("llama3-8b", "v5p-16", 16), ("llama3-70b", "v5p-64", 64))


def _compiles(only: str | None = None) -> None:
    print("| model | cluster | mesh (rank 1) | batch x seq | target | compiled peak | compile s | job s (worker incl.) |")
    print("|---|---|---|---|---|---|---|---|")
    for model, cluster_text, batch in COMPILES:
        if only is not None and model != only:
            continue
        spec, cluster = get_preset(model).spec, parse_cluster(cluster_text)
        best = search_meshes(spec, cluster, batch=batch, seq=4096, top_k=1).best
        job = CompileJob(spec, cluster, best.axis_names, best.axis_sizes, best.dcn_shape, best, batch=batch,
                         seq=4096, config=ReferenceConfig())
        out = run_jobs([job], parallel=1, timeout_s=1200)[0]
        if out.memory is None:
            print(f"| {model} | {cluster_text} | {best.text} | {batch} x 4096 | {out.target} | not verified: "
                  f"{out.error} | - | {out.seconds:.1f} |", flush=True)
            continue
        print(f"| {model} | {cluster_text} | {best.text} | {batch} x 4096 | {out.target} | "
              f"{fmt_bytes(out.memory.peak_bytes)} | {out.memory.compile_seconds:.1f} | {out.seconds:.1f} |",
              flush=True)


def _plan() -> None:
    cmd = [sys.executable, "-m", "meshplan", "plan", "--model", "llama3-70b", "--cluster", "8x8xH100"]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MESHPLAN_CACHE_DIR": cache, "COLUMNS": "200"}
        print("| run | wall s | exact rows | exit |")
        print("|---|---|---|---|")
        for run in ("--no-verify (the estimate alone)", "fresh cache", "cached re-plan"):
            start = time.perf_counter()
            extra = ["--no-verify"] if run.startswith("--no-verify") else []
            proc = subprocess.run(cmd + extra, env=env, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - start
            exact = proc.stdout.count("│ exact: peak")
            print(f"| {run} | {wall:.1f} | {exact} | {proc.returncode} |", flush=True)
        print("\n```text\n" + proc.stdout.split("Verified:")[-1].strip() + "\n```")


def _equality() -> None:
    import io

    import meshplan
    from meshplan.facade.verify._targets import gpu_topology_mesh

    spec = get_preset("llama3-8b").spec
    found = search_meshes(spec, "1x8xH100", batch=16, seq=4096, top_k=1)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MESHPLAN_CACHE_DIR"] = cache
        row = meshplan.verify_plan(found, model=spec, top=1, stream=io.StringIO()).rows[0]
    best = found.best
    mesh = gpu_topology_mesh("1x8xH100", best.axis_names, best.axis_sizes)
    ref = meshplan.reference_step(spec, mesh, batch=16, seq=4096, plan=best, config=ReferenceConfig())
    start = time.perf_counter()
    ma = ref.fn.lower(*ref.args).compile().memory_analysis()  # ref.fn is the jax.jit(step, shardings, donation)
    seconds = time.perf_counter() - start
    print("| mesh | meshplan (worker) peak bytes | independent jit().lower().compile() peak bytes | equal | "
          "independent compile s |")
    print("|---|---|---|---|---|")
    print(f"| {best.text} | {row.peak_bytes} | {ma.peak_memory_in_bytes} | "
          f"{row.peak_bytes == ma.peak_memory_in_bytes} | {seconds:.1f} |")
    print(f"\ncompiler: {compiler_version('gpu')}")


COVERAGE_GPUS = ("H100", "A100-80GB")
COVERAGE_MODELS = (("llama3-8b", "1x8x{gpu}", 16), ("llama3-70b", "8x8x{gpu}", 64), ("mixtral-8x7b", "4x8x{gpu}", 32))


def _coverage(top: int) -> None:
    """Stated range vs compiled peak on H100 and A100 (the GPU spread was recorded on an H200: held out)."""
    from meshplan.pure.cost import TrainingRecipe, calibration_spread, peak_bounds

    print("| GPU | model | cluster | remat | mesh | estimate | stated range | compiled peak | inside |")
    print("|---|---|---|---|---|---|---|---|---|")
    inside = total = 0
    for gpu in COVERAGE_GPUS:
        for model, cluster_text, batch in COVERAGE_MODELS:
            for remat in ("full", "none"):
                spec, cluster = get_preset(model).spec, parse_cluster(cluster_text.format(gpu=gpu))
                try:
                    found = search_meshes(spec, cluster, batch=batch, seq=4096, top_k=top,
                                          recipe=TrainingRecipe(remat=remat))
                except PlanError:
                    print(f"| {gpu} | {model} | {cluster.text} | {remat} | no mesh fits | - | - | - | - |", flush=True)
                    continue
                spread = calibration_spread(found.request.recipe)
                jobs = [CompileJob(spec, cluster, c.axis_names, c.axis_sizes, c.dcn_shape, c, batch=batch,
                                   seq=4096, config=ReferenceConfig(remat=remat, micro_batches=(
                                       c.step.micro_batches if c.step else 1))) for c in found.candidates]
                for cand, out in zip(found.candidates, run_jobs(jobs, timeout_s=900), strict=True):
                    low, high = peak_bounds(cand.memory, spread[1]) if spread else (None, None)
                    if out.memory is None or low is None:
                        print(f"| {gpu} | {model} | {cluster.text} | {remat} | {cand.text} | "
                              f"{fmt_bytes(cand.memory.total)} | - | {out.error or 'no range'} | - |", flush=True)
                        continue
                    peak = out.memory.peak_bytes
                    ok = low <= peak <= high
                    inside += ok
                    total += 1
                    print(f"| {gpu} | {model} | {cluster.text} | {remat} | {cand.text} | "
                          f"{fmt_bytes(cand.memory.total)} | {fmt_bytes(low)} - {fmt_bytes(high)} | {fmt_bytes(peak)} | "
                          f"{'yes' if ok else 'below' if peak < low else 'above'} |", flush=True)
    print(f"\nheld-out coverage: {inside} of {total} compiled peaks inside the stated range "
          f"({inside / max(total, 1):.0%}).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for part in ("compiles", "plan", "equality"):
        parser.add_argument(f"--skip-{part}", action="store_true")
    parser.add_argument("--only-model", metavar="PRESET", help="compile-seconds rows of this preset only")
    parser.add_argument("--coverage", type=int, default=0, metavar="TOP",
                        help="also compile the top TOP meshes of a held-out H100 / A100 grid: range vs peak")
    args = parser.parse_args()
    if not args.skip_compiles:
        _compiles(args.only_model)
    if not args.skip_plan:
        _plan()
    if not args.skip_equality:
        _equality()
    if args.coverage:
        _coverage(args.coverage)


if __name__ == "__main__":
    main()
