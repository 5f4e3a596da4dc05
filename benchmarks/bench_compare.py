"""How long ``meshplan compare`` takes: estimates only, verified from an empty cache, the cached re-run, and the
same cold comparison with its compiles on a local two-worker Dask cluster; and where a TPU compile spends its time.

Sections (each prints a table; ratios are against the ``--no-verify`` run of the same comparison, measured in the
same process):

- ``compare`` (default): ``python -m meshplan compare --model M --clusters C`` three ways, each in a fresh
  process: ``--no-verify``; verified (``--verify 3``) with ``MESHPLAN_CACHE_DIR`` emptied first; the same again
  (cached). ``--dask`` adds the cold run with ``--executor`` pointing at a scheduler and two workers started here
  on 127.0.0.1 (a fresh cache of its own).
- ``--tpu-profile``: a scanned llama3-8b step at several layer counts compiled ahead of time for v5e-8 (fsdp=8,
  batch 8 x 1024) in this process: compile seconds and XLA's peak per layer count (is the peak affine in the
  layers?), and one compile with every HLO pass dumped, the seconds between dump files summed per pass, and the
  buffer assignment written before codegen against the one ``memory_analysis`` reports.
- ``--tpu-hbm``: the largest array libtpu compiles onto one device of each TPU generation, bisected to 1 KiB
  (what the catalogue's ``hbm_bytes`` is).

Commands (RESULTS.md gives the figures):
  python benchmarks/bench_compare.py --model llama3-70b --clusters 4x8xH100,8x8xH100,4x8xH200,v5p-128 --dask
  python benchmarks/bench_compare.py --tpu-profile --layers 2,3,4,8,16,32
  python benchmarks/bench_compare.py --tpu-hbm
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cli(args: list[str], env: dict[str, str], timeout: float) -> tuple[float, str, str, int]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=timeout, check=False)
    return time.perf_counter() - start, proc.stdout, proc.stderr, proc.returncode


def _statuses(stdout: str) -> str:
    rows = json.loads(stdout)["rows"]
    return ", ".join(f"{r['cluster']} {r['status']}" for r in rows)


def _dask(tmp: Path) -> tuple[str, list[subprocess.Popen]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    sched = tmp / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                               "0", "--no-dashboard", "--scheduler-file", str(sched)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 60
    while not sched.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    for i in range(2):
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                       str(sched), "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1",
                                       "--no-dashboard", "--memory-limit", "0", "--name", f"w{i}"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    from distributed import Client

    address = json.loads(sched.read_text())["address"]
    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=120)
    return address, procs


def bench_compare(model: str, clusters: str, dask: bool, timeout: float, workdir: str | None) -> None:
    base = ["compare", "--model", model, "--clusters", clusters, "--json"]
    rows: list[tuple[str, float, str]] = []

    def done(name: str, t: float, status: str) -> None:
        rows.append((name, t, status))
        print(f"{name}: {t:.1f} s ({status})", flush=True)

    with (contextlib.nullcontext(workdir) if workdir else tempfile.TemporaryDirectory(prefix="bench-compare-")) as tmp:
        env = {**os.environ, "MESHPLAN_CACHE_DIR": str(Path(tmp) / "cache"), "MESHPLAN_VERIFY": "1"}
        t0, out, err, rc = _cli([*base, "--no-verify"], env, timeout)
        assert rc == 0, err[-2000:]
        done("--no-verify (baseline)", t0, _statuses(out))
        t, out, err, rc = _cli([*base, "--verify", "3"], env, timeout)
        assert rc == 0, err[-2000:]
        done("--verify 3, empty cache", t, _statuses(out))
        compiles = len(list((Path(tmp) / "cache").glob("*.json")))  # each compile's outcome, cached once
        print(f"cold: {compiles} compiles", flush=True)
        t, out, err, rc = _cli([*base, "--verify", "3"], env, timeout)
        assert rc == 0, err[-2000:]
        done("--verify 3, cached re-run", t, _statuses(out))
        if dask:
            address, procs = _dask(Path(tmp))
            try:
                env2 = {**env, "MESHPLAN_CACHE_DIR": str(Path(tmp) / "cache-dask")}
                t, out, err, rc = _cli([*base, "--verify", "3", "--executor", address], env2, timeout)
                assert rc == 0, err[-2000:]
                done("--verify 3 --executor (2 Dask workers), empty cache", t, _statuses(out))
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(timeout=30)
    print(f"meshplan compare --model {model} --clusters {clusters}: {compiles} compiles cold")
    print("| run | wall s | x baseline | rows |")
    print("|---|---:|---:|---|")
    for name, t, status in rows:
        print(f"| {name} | {t:.1f} | {t / t0:.1f} | {status} |")


def _tpu_step(layers: int, options: dict | None = None) -> dict:
    import dataclasses

    from meshplan.facade.verify._targets import tpu_topology_mesh
    from meshplan.facade.verify._reference import ReferenceConfig, reference_step
    from meshplan.pure import get_preset, parse_cluster, search_meshes

    spec = dataclasses.replace(get_preset("llama3-8b").spec, num_layers=layers, num_params=None)
    cluster = parse_cluster("v5e-8")
    mesh = tpu_topology_mesh(cluster, ("fsdp",), (8,))
    found = search_meshes(spec, cluster, batch=8, seq=1024, axes=["fsdp"], fixed={"fsdp": 8}, top_k=1, headroom=0.0)
    ref = reference_step(spec, mesh, batch=8, seq=1024, plan=found.candidates[0], config=ReferenceConfig())
    lowered = ref.fn.lower(*ref.args)
    start = time.perf_counter()
    compiled = lowered.compile(options)
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    return {"layers": layers, "compile_s": seconds, "peak": m.peak_memory_in_bytes, "temp": m.temp_size_in_bytes,
            "argument": m.argument_size_in_bytes}


def bench_tpu_profile(layers: list[int]) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    rows = [_tpu_step(n) for n in layers]
    print("llama3-8b reference step (scanned, remat full, AdamW), v5e-8 fsdp=8, batch 8 x 1024, libtpu AOT")
    print("| layers | compile s | x first | XLA peak B | peak step per layer B | temp B |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(rows):
        step = "" if i == 0 else f"{(r['peak'] - rows[i - 1]['peak']) / (r['layers'] - rows[i - 1]['layers']):,.0f}"
        print(f"| {r['layers']} | {r['compile_s']:.1f} | {r['compile_s'] / rows[0]['compile_s']:.2f} | "
              f"{r['peak']:,} | {step} | {r['temp']:,} |")
    # Where one compile spends its time: every pass dumped, the gap before each dump file summed per pass.
    dump = Path(tempfile.mkdtemp(prefix="bench-tpu-dump-"))
    try:
        r = _tpu_step(layers[0], {"xla_dump_to": str(dump), "xla_dump_hlo_pass_re": ".*", "xla_dump_hlo_as_text": True})
        files = sorted((p.stat().st_mtime, p.name) for p in dump.iterdir() if p.name.endswith(".txt"))
        per_pass: collections.Counter[str] = collections.Counter()
        for (t_prev, _), (t, name) in zip(files, files[1:]):
            stage = re.sub(r"^module_\d+\.[^.]+\.[^.]+\.", "", name)
            stage = re.sub(r"^\d+\.", "", stage).split(".after_")[-1].split(".before_")[0].removesuffix(".txt")
            per_pass[stage] += t - t_prev
        total = files[-1][0] - files[0][0]
        print(f"\none {layers[0]}-layer compile with every pass dumped: {r['compile_s']:.1f} s; dump files span "
              f"{total:.1f} s")
        print("| stage | s | share |")
        print("|---|---:|---:|")
        for name, s in per_pass.most_common(6):
            print(f"| {name} | {s:.2f} | {s / total:.0%} |")
        report = next(dump.glob("*after_optimizations-buffer-assignment.txt"))
        temp = sum(int(m.group(1)) for m in re.finditer(r"^allocation \d+: size (\d+)(?!.*(?:parameter|constant|"
                                                        r"thread-local|output))", report.read_text(), re.M))
        print(f"\nbuffer assignment before codegen: temp allocations {temp:,} B; memory_analysis after codegen: "
              f"temp {r['temp']:,} B (equal: {temp == r['temp']})")
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def bench_tpu_hbm() -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from meshplan.facade.verify._targets import _topology_devices
    from meshplan.pure.cluster import DEVICE_SPECS, parse_cluster, tpu_topology

    print("| TPU | device kind | largest array that compiles, B | GiB | catalogue hbm_bytes | bisect s |")
    print("|---|---|---:|---:|---:|---:|")
    for name, text in (("v4", "v4-8"), ("v5e", "v5e-4"), ("v5p", "v5p-8"), ("v6e", "v6e-4"), ("tpu7x", "tpu7x-8")):
        devices = _topology_devices(tpu_topology(parse_cluster(text)))
        one = NamedSharding(Mesh(np.array(devices[:1]), ("x",)), PartitionSpec())

        def fits(n: int) -> bool:
            try:
                jax.jit(lambda: jnp.zeros((n,), jnp.uint8), out_shardings=one).lower().compile()
            except Exception as err:  # noqa: BLE001 -- XLA's out-of-memory refusal is the answer
                if "RESOURCE_EXHAUSTED" not in str(err):
                    raise
                return False
            return True

        start = time.perf_counter()
        lo, hi = 2**30, 200 * 2**30
        while hi - lo > 1024:
            mid = (lo + hi) // 2 // 1024 * 1024
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        print(f"| {name} | {devices[0].device_kind} | {lo:,} | {lo / 2**30:.3f} | {DEVICE_SPECS[name].hbm_bytes:,} | "
              f"{time.perf_counter() - start:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--clusters", default="4x8xH100,8x8xH100,4x8xH200,v5p-128")
    parser.add_argument("--dask", action="store_true", help="also the cold run on a local two-worker Dask cluster")
    parser.add_argument("--timeout", type=float, default=3600.0, help="the most one CLI run may take")
    parser.add_argument("--workdir", help="keep the caches here (default: a temporary directory, removed)")
    parser.add_argument("--tpu-profile", action="store_true")
    parser.add_argument("--layers", default="2,3,4,8,16,32")
    parser.add_argument("--tpu-hbm", action="store_true")
    args = parser.parse_args()
    if args.tpu_hbm:
        bench_tpu_hbm()
    elif args.tpu_profile:
        bench_tpu_profile([int(n) for n in args.layers.split(",")])
    else:
        bench_compare(args.model, args.clusters, args.dask, args.timeout, args.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
