"""Predicted against measured on one GPU, with the catalogue's figures and with the GPU's own profile.

Run once on a machine with one NVIDIA GPU (a few minutes; each step in its own process, so each reads its own
peak memory): ``python benchmarks/bench_measure_gpu.py --out benchmarks/data/measure_gpu``. On a CPU-only
machine ``--smoke`` runs the same flow on one XLA:CPU device with a tiny model (seconds; it proves the script
runs, it measures nothing worth recording).

What it does:

1. ``meshplan.profile_machine()`` on the GPU (matmul sweep 1024-8192 at 8192 tokens, bf16 and FP8 where the
   device has FP8 units, HBM copies; one GPU has no link to time) -> ``OUT/profile.json``;
2. for each recorded single-GPU case of ``bench_step_time_gpu.py`` (the shapes in
   ``benchmarks/data/step_time_h200.jsonl``), in a fresh process: the one-device plan priced with the
   catalogue's figures and with the profile, and ``meshplan.measure_plan`` of that layout (one warm-up, five
   timed steps, the device's peak bytes in use) -> ``OUT/rows.jsonl``;
3. prints, per case: measured, predicted by the catalogue, by the profile's matmuls alone, and by the profile
   refitted with the measured steps; the last is a *fit* on the rows it prices, so each row is also priced by
   the factor fitted to the *other* rows (leave-one-out), which is the check (the issue's goal: within 10% with
   the profile on every row); then the profile's matmul efficiencies against the catalogue's curve.

Paste the printed tables into ``benchmarks/RESULTS.md`` with the date, the machine and this command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

# (model, layers or None for full size, batch, seq, remat, attention): bench_step_time_gpu.py's cases.
CASES: tuple[tuple[str, int | None, int, int, str, str], ...] = (
    ("llama3-8b", 16, 2, 4096, "full", "dot_product"),
    ("llama3-8b", 8, 8, 2048, "full", "dot_product"),
    ("llama3-8b", 4, 8, 2048, "none", "dot_product"),
    ("llama3-8b", 8, 4, 2048, "none", "plain"),
    ("llama3-70b", 2, 4, 4096, "full", "dot_product"),
    ("mixtral-8x7b", 2, 4, 2048, "full", "dot_product"),
    ("gpt2", None, 16, 1024, "full", "dot_product"),
    ("gpt2", None, 16, 1024, "none", "plain"),
)
SMOKE = (("gpt2", 1, 2, 32, "full", "dot_product"),)


def _spec(name: str, layers: int | None, smoke: bool) -> Any:
    from bench_compiled import scaled

    spec = scaled(name, layers)
    if smoke:  # one narrow layer: a CPU runs it in seconds
        spec = dataclasses.replace(spec, name="gpt2/tiny", hidden_size=64, num_heads=2, num_kv_heads=2, head_dim=32,
                                   intermediate_size=128, vocab_size=256, num_params=None)
    return spec


def _plan(spec: Any, cluster: Any, batch: int, seq: int, remat: str, attention: str, backend: str,
          profile: Any) -> Any:
    from meshplan.pure import search_meshes
    from meshplan.pure.cost import TrainingRecipe

    fixed = {"fsdp": 1, "ep": 1} if spec.is_moe else {"fsdp": 1}
    recipe = TrainingRecipe(remat=remat, attention=attention, backend=backend, residual_split=False)
    return search_meshes(spec, cluster, axes=tuple(fixed), fixed=fixed, batch=batch, seq=seq, recipe=recipe,
                         headroom=0.25, top_k=1, micro_batches=1, profile=profile)


def run_case(index: int, profile_path: str, smoke: bool) -> dict[str, Any]:
    """One case in this process: plan it both ways, measure it once."""
    import meshplan

    name, layers, batch, seq, remat, attention = (SMOKE if smoke else CASES)[index]
    spec = _spec(name, layers, smoke)
    cluster = meshplan.live_cluster()
    backend = "cpu" if smoke else "gpu"
    profile = meshplan.load_profile(profile_path)
    catalogue = _plan(spec, cluster, batch, seq, remat, attention, backend, None)
    profiled = _plan(spec, cluster, batch, seq, remat, attention, backend, profile)
    measured = meshplan.measure_plan(profiled, model=spec, top=1, steps=5, warmup=1, timeout_s=900)
    row = measured.rows[0]
    return {"case": f"{spec.name} {batch}x{seq} {remat} {attention}", "device": measured.device_kind,
            "catalogue_s": catalogue.best.step.step_s, "row": row.to_dict()}


def _child(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def _report(rows: list[dict[str, Any]], profile: Any) -> None:
    from meshplan.errors import ClusterError
    from meshplan.pure.cluster import StepTiming, device_for_kind
    from meshplan.pure.cost import profile_figures, refine_profile
    from meshplan.pure.cost._flops import default_efficiency
    from meshplan.pure.cost._profile_fit import fit_steps

    steps = [StepTiming.from_dict(r["row"]) for r in rows]
    try:
        spec = device_for_kind(profile.device_kind, profile.platform)
    except ClusterError:  # a device the catalogue lacks: efficiencies against its fastest matmul
        spec = None
    peak = None if spec is None else spec.peak_bf16_flops
    base = profile_figures(profile, peak_bf16_flops=peak)
    refined = profile_figures(refine_profile(profile, [s for s in steps if s.measured_step_s]), peak_bf16_flops=peak)
    print("| case | measured s | catalogue | profile (matmuls) | profile + steps (fit) | leave-one-out (check) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r, s in zip(rows, steps, strict=True):
        if s.measured_step_s is None:
            print(f"| {r['case']} | {s.error} | | | | |")
            continue
        peak_s = s.predicted_compute_s * s.efficiency
        matmul_e = base.matmul.at(s.hidden)
        others = [o for o in steps if o is not s and o.measured_step_s]
        loo = fit_steps(others, base.matmul.at) if others else None

        def at(scale: float, s: StepTiming = s, peak_s: float = peak_s, matmul_e: float = matmul_e) -> float:
            return peak_s / min(matmul_e * scale, 1.0) + s.predicted_exposed_s

        m = s.measured_step_s
        fit = at(refined.steps.scale) if refined.steps else float("nan")
        check = at(loo.scale) if loo else float("nan")
        print(f"| {r['case']} | {m:.4f} | {r['catalogue_s'] / m:.2f} | {s.predicted_step_s / m:.2f} | {fit / m:.2f} | "
              f"{check / m:.2f} |")
    print("\npredicted / measured per column. Matmul efficiency, the profile against meshplan's curve:")
    print("| hidden | profile (bf16 matmuls) | default curve |")
    print("|---:|---:|---:|")
    for h, e in base.matmul.points:
        print(f"| {h} | {e:.3f} | {default_efficiency('node', h):.3f} |")
    if base.matmul.fp8_ratio:
        print(f"\nFP8 / bf16 matmul rate at the same shapes: {base.matmul.fp8_ratio:.2f}")
    if refined.steps:
        loo = refined.steps.loo_max_error
        print(f"\nstep factor {refined.steps.scale:.3f} fitted to {refined.steps.rows} steps (within "
              f"{refined.steps.max_error:.1%}; leave-one-out " + ("n/a: one row" if loo is None else f"within {loo:.1%}")
              + ")")
    for s in steps:
        print(f"{s.mesh} {s.model}: measured peak {s.measured_peak_bytes} ({s.peak_note}); compiled "
              f"{s.compiled_peak_bytes}; estimate {s.predicted_memory_bytes}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE / "data" / "measure_gpu"), help="directory for the results")
    parser.add_argument("--smoke", action="store_true", help="one tiny case on XLA:CPU (no GPU needed)")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)  # a child: run this case, print one JSON line
    parser.add_argument("--profile-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    if args.smoke:
        env |= {"JAX_PLATFORMS": "cpu"}
    if args.profile_only:
        import meshplan

        settings = meshplan.ProfileSettings.for_platform("cpu" if args.smoke else "gpu", quick=args.smoke)
        p = meshplan.profile_machine(settings=settings, out=out / "profile.json")
        print(json.dumps({"id": p.id}))
        return
    if args.case is not None:
        print(json.dumps(run_case(args.case, str(out / "profile.json"), args.smoke)))
        return
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--out", str(out)] + (["--smoke"] if args.smoke else [])
    print(f"profile: {_child(['--profile-only', *extra], env)}", flush=True)
    rows = []
    for i in range(len(SMOKE if args.smoke else CASES)):
        rows.append(json.loads(_child(["--case", str(i), *extra], env)))
        print(f"case {i}: {rows[-1]['case']} measured {rows[-1]['row']['measured_step_s']}", flush=True)
    with open(out / "rows.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    import meshplan

    _report(rows, meshplan.load_profile(out / "profile.json"))


if __name__ == "__main__":
    main()
