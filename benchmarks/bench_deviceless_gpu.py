"""A GPU compile with no GPU against the same compile on the GPU and against a real run's peak.

meshplan verifies GPU plans by compiling for a *described* GPU on a machine without one
(:func:`meshplan.gpu_topology_mesh` with the shipped ``gpu_targets/H100.txtpb``, in a process with
``JAX_PLATFORMS=cpu``). This script checks that stand-in on a machine that has the GPU. For each case
(the reference train step on one device) it prints:

- **deviceless**: ``compiled.memory_analysis()`` of the step compiled for the shipped description
  (a subprocess with ``JAX_PLATFORMS=cpu``: what a laptop gets; no autotuning);
- **on GPU**: the same step compiled for the local GPU (autotuned);
- **real peak**: the allocator's ``peak_bytes_in_use`` after a warm-up and 3 steps on zeros, and the
  step time (one case per process: the peak never resets);
- the planner's analytic estimate, for scale.

Run on a GPU machine (one GPU of a kind meshplan ships a description for)::

    XLA_PYTHON_CLIENT_MEM_FRACTION=.95 python benchmarks/bench_deviceless_gpu.py [--jsonl FILE]

``--deviceless I`` / ``--device I`` run one case and print one JSON line (the driver calls them);
``--tiny`` swaps the cases for one small one (a smoke test that runs on CPU too). ``--step-time FILE``
(any machine) reads a recorded run and prints its measured step times against the step-time model's
prediction, with the default efficiency and at a flat 0.4: a held-out check of the efficiency curve,
which was fit on H200 steps only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

# (model, layers or None for full size, batch, seq, ReferenceConfig fields); sized for an 80 GB H100.
CASES: tuple[tuple[str, int | None, int, int, dict[str, Any]], ...] = (
    ("llama3-8b", 4, 8, 2048, {}),
    ("llama3-8b", 4, 4, 2048, {"attention": "plain", "remat": "none"}),
    ("llama3-8b", 16, 2, 4096, {}),
    ("mixtral-8x7b", 2, 4, 2048, {}),
    ("gpt2", None, 16, 1024, {"attention": "plain", "remat": "none"}),
    ("llama3-8b", None, 2, 4096, {}),  # about 104 GiB on an H200: does not fit an H100; the real run must fail
)
TINY: tuple[tuple[str, int | None, int, int, dict[str, Any]], ...] = (("gpt2", 2, 4, 128, {}),)


def _case(index: int, tiny: bool) -> tuple[Any, str, int, int, Any]:
    from meshplan import ReferenceConfig
    from meshplan.pure.presets import MODEL_SPECS

    model, layers, batch, seq, cfg = (TINY if tiny else CASES)[index]
    spec = MODEL_SPECS[model]
    if layers is not None:
        dense = min(spec.num_dense_layers, layers - 1) if spec.is_moe else 0
        spec = dataclasses.replace(spec, name=f"{model}/{layers}L", num_layers=layers, num_dense_layers=dense,
                                   num_params=None)
    text = ", ".join(f"{k}={v}" for k, v in cfg.items()) or "default"
    return spec, text, batch, seq, ReferenceConfig(**cfg)


def _mem(mem: Any) -> dict[str, Any]:
    return {"arg": mem.argument_bytes, "out": mem.output_bytes, "alias": mem.alias_bytes, "temp": mem.temp_bytes,
            "peak": mem.peak_bytes, "compile_s": mem.compile_seconds, "kind": mem.device_kind}


def deviceless(index: int, tiny: bool, gpu: str) -> dict[str, Any]:
    """Compile case ``index`` for one described ``gpu`` in this process (JAX_PLATFORMS=cpu)."""
    import jax

    import meshplan
    from meshplan.facade.verify._compilers import compiler_version
    from meshplan.facade.verify._gpu_targets import gpu_target_config

    spec, text, batch, seq, config = _case(index, tiny)
    # The shipped description even where a GPU is present: what a machine without one compiles for.
    mesh = meshplan.gpu_topology_mesh(f"1x1x{gpu}", ("fsdp",), (1,), target_config=gpu_target_config(gpu))
    ref = meshplan.reference_step(spec, mesh, batch=batch, seq=seq, config=config)
    mem = meshplan.compiled_memory(ref.fn, *ref.args, top_buffers=0)
    return {"case": index, "mode": "deviceless", "compiler": compiler_version("gpu"), "jax": jax.__version__,
            **_mem(mem)}


def device(index: int, tiny: bool) -> dict[str, Any]:
    """Compile case ``index`` for the local device, then run it: XLA's figures, the allocator's peak, the step."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    import meshplan
    from meshplan.pure import parse_cluster, search_meshes
    from meshplan.pure.cost import TrainingRecipe

    spec, text, batch, seq, config = _case(index, tiny)
    dev = jax.devices()[0]
    mesh = Mesh(np.array([dev]).reshape(1), ("fsdp",), axis_types=(AxisType.Auto,))
    ref = meshplan.reference_step(spec, mesh, batch=batch, seq=seq, config=config)
    out: dict[str, Any] = {"case": index, "mode": "device", "model": spec.name, "config": text,
                           "batch_seq": f"{batch}x{seq}", "jax": jax.__version__, "device_kind": dev.device_kind}
    try:
        gpu = "H200" if "H200" in dev.device_kind else "H100"
        est = search_meshes(spec, parse_cluster(f"1x1x{gpu}"), axes=["fsdp"], fixed={"fsdp": 1}, batch=batch,
                            seq=seq, top_k=1, headroom=0.0,
                           recipe=TrainingRecipe(remat=config.remat, attention=config.attention, backend="gpu",
                                                 device=gpu))
        out["estimate"] = est.candidates[0].memory.total if est.candidates else None
    except meshplan.MeshplanError as err:
        out["estimate"] = None
        out["estimate_error"] = str(err)[:200]
    mem = meshplan.compiled_memory(ref.fn, *ref.args, top_buffers=0)
    out.update(_mem(mem))
    try:
        from bench_compiled import run_real  # the same run: zeros, a warm-up, 3 timed steps, the allocator's peak

        out["real_peak"], out["step_s"] = run_real(ref)
        out["bytes_limit"] = (dev.memory_stats() or {}).get("bytes_limit")
    except Exception as err:  # noqa: BLE001 -- the allocator's own out-of-memory is this case's answer
        out["run_error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"
        stats = dev.memory_stats() or {}
        out["bytes_limit"] = stats.get("bytes_limit")
    return out


def _sub(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-3:]
    return {"error": f"exit {proc.returncode}: {' | '.join(tail)[:400]}"}


def _gib(n: Any) -> str:
    return f"{n / 2**30:.2f} GiB" if isinstance(n, (int, float)) and n else "-"


def _ratio(a: Any, b: Any, digits: int = 3) -> str:
    return f"{a / b:.{digits}f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def drive(tiny: bool, gpu: str, jsonl: str | None, timeout: float) -> None:
    cases = range(len(TINY if tiny else CASES))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    flag = ["--tiny"] if tiny else []
    cpu_env = {**base, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    # The run compiles the step a second time (after compiled_memory's): the persistent cache serves it.
    base = {**base, "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR", "/tmp/meshplan-jaxcache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    cols = ("model", "batch x seq", "config", "estimate", "deviceless peak", "on-GPU peak", "deviceless / on-GPU",
            "real peak", "real / deviceless", "deviceless temp", "on-GPU temp", "step s")
    first: dict[str, Any] = {}
    out = open(jsonl, "w", encoding="utf-8") if jsonl else None  # noqa: SIM115 -- written row by row
    # The deviceless compiles use the CPU alone: they run beside the on-GPU cases.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        less = {i: pool.submit(_sub, ["--deviceless", str(i), "--gpu", gpu, *flag], cpu_env, timeout) for i in cases}
        for i in cases:
            d = _sub(["--device", str(i), *flag], base, timeout)
            dl = less[i].result()
            if not first and "device_kind" in d:
                first = d
                print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; on GPU: {d['device_kind']}, jax "
                      f"{d['jax']}; deviceless: {dl.get('compiler', '?')}; {os.cpu_count()} host cores\n")
                print("| " + " | ".join(cols) + " |")
                print("|" + "|".join("---" if k < 3 else "---:" for k in range(len(cols))) + "|")
            if out:
                out.write(json.dumps({"device": d, "deviceless": dl}) + "\n")
                out.flush()
            real = (d.get("real_peak") or None) if "run_error" not in d else None  # 0: no allocator (CPU)
            real_text = _gib(real) if real else ("fails: " + d["run_error"][:60] if "run_error" in d else "-")
            print("| " + " | ".join([
                d.get("model", "?"), d.get("batch_seq", "?"), d.get("config", "?"), _gib(d.get("estimate")),
                _gib(dl.get("peak")) if "peak" in dl else f"failed: {dl.get('error', '?')[:80]}",
                _gib(d.get("peak")) if "peak" in d else f"failed: {d.get('error', '?')[:80]}",
                _ratio(dl.get("peak"), d.get("peak")), real_text, _ratio(real, dl.get("peak")),
                _gib(dl.get("temp")), _gib(d.get("temp")),
                f"{d['step_s']:.3f}" if "step_s" in d else "-"]) + " |", flush=True)
    if out:
        out.close()
    limit = first.get("bytes_limit")
    if limit:
        print(f"\nallocator limit on the GPU: {_gib(limit)}")


def step_time_table(jsonl: str) -> None:
    """Measured step times of a recorded run against the predicted ones (default efficiency, and flat 0.4)."""
    from meshplan.pure import parse_cluster, search_meshes
    from meshplan.pure.cost import TrainingRecipe
    from meshplan.pure.cluster import DEVICE_SPECS

    rows = [json.loads(line) for line in open(jsonl, encoding="utf-8")]
    print("| model | batch x seq | config | measured s | predicted s | predicted / measured | efficiency | "
          "implied efficiency | predicted / measured at 0.4 |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        d = row["device"]
        if "step_s" not in d:
            continue
        spec, text, batch, seq, config = _case(d["case"], False)
        gpu = "H200" if "H200" in d["device_kind"] else "H100"
        fixed = {"fsdp": 1, "ep": 1} if spec.is_moe else {"fsdp": 1}
        recipe = TrainingRecipe(remat=config.remat, attention=config.attention, backend="gpu", residual_split=False)
        curve, flat = (search_meshes(spec, parse_cluster(f"1x1x{gpu}"), axes=tuple(fixed), fixed=fixed, batch=batch,
                                     seq=seq, recipe=recipe, headroom=0.0, top_k=1, micro_batches=1,
                                     efficiency=eff).best.step for eff in (None, 0.4))
        assert curve is not None and flat is not None
        implied = curve.flops / (d["step_s"] * DEVICE_SPECS[gpu].peak_bf16_flops)
        print(f"| {spec.name} | {batch}x{seq} | {text} | {d['step_s']:.3f} | {curve.step_s:.3f} | "
              f"{curve.step_s / d['step_s']:.2f} | {curve.efficiency:.2f} | {implied:.2f} | "
              f"{flat.step_s / d['step_s']:.2f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deviceless", type=int, metavar="I", help="compile case I for the described GPU, print JSON")
    p.add_argument("--device", type=int, metavar="I", help="compile and run case I on the local GPU, print JSON")
    p.add_argument("--gpu", default="H100", help="the shipped description compiled for (default H100)")
    p.add_argument("--tiny", action="store_true", help="one small case (a smoke test; runs on CPU too)")
    p.add_argument("--jsonl", help="also write every row's figures here")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per case and mode")
    p.add_argument("--step-time", metavar="FILE", help="a recorded run's step times against the step-time model")
    a = p.parse_args()
    if a.step_time is not None:
        step_time_table(a.step_time)
    elif a.deviceless is not None:
        print(json.dumps(deviceless(a.deviceless, a.tiny, a.gpu)))
    elif a.device is not None:
        print(json.dumps(device(a.device, a.tiny)))
    else:
        drive(a.tiny, a.gpu, a.jsonl, a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
