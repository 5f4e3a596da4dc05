"""Analytic step FLOPs against XLA's own count, on unrolled reference train steps.

For each case the reference step (``meshplan.facade._reference.reference_step``,
layers unrolled so XLA's ``cost_analysis()`` sees every layer once; remat with
``prevent_cse=True``) is compiled on 8 simulated CPU devices, and XLA's
``flops`` -- **per device**: the SPMD-partitioned module one device runs -- is
printed next to ``step_flops(...).per_device`` (ratio analytic / XLA; 1.00 exact).

XLA counts every floating-point op, elementwise ones included (norms, softmax,
rope, the loss, the optimizer update); the analytic ``per_device`` counts the
matmuls plus ``StepFlops.elementwise`` (per-element counts derived from
single-device compiles, see ``meshplan/pure/search/_flops.py``). The scaled-down models keep the real families'
structure (GQA, gated MLP, routed experts with capacity-based dispatch, MLA).

    python benchmarks/bench_flops.py            # the grid (a few minutes on 2 cores)
    python benchmarks/bench_flops.py --quick    # 4 cases
    python benchmarks/bench_flops.py --quick --tpu v5e-8   # XLA:TPU, compiled ahead of time

On TPU (``--tpu CLUSTER``, libtpu installed) the step is compiled for the slice's
topology with XLA:TPU's windowed einsums off (``LIBTPU_INIT_ARGS``; they run a
matmul as a loop whose body ``cost_analysis()`` counts once).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402

from meshplan.facade._compiled import TPU_WINDOWED_EINSUM_OFF  # noqa: E402

# Before the first compile: libtpu reads its flags once, when it starts.
if "--tpu" in sys.argv:
    os.environ["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "") + " " + TPU_WINDOWED_EINSUM_OFF).strip()
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import meshplan  # noqa: E402
from meshplan.facade._reference import ReferenceConfig, reference_step  # noqa: E402
from meshplan.pure.presets import MODEL_SPECS, MLADims  # noqa: E402
from meshplan.pure.search._flops import step_flops  # noqa: E402

_COMMON = dict(num_layers=2, hidden_size=512, num_heads=4, num_kv_heads=4, head_dim=128, intermediate_size=1536,
               vocab_size=1024, num_params=None)
SPECS = {
    "gpt2": dataclasses.replace(MODEL_SPECS["gpt2"], name="gpt2-small", **{**_COMMON, "intermediate_size": 2048,
                                                                           "max_position_embeddings": 256}),
    "llama": dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-small", **{**_COMMON, "num_kv_heads": 2}),
    "mixtral": dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="mixtral-small", **_COMMON,
                                   num_experts=4, num_experts_per_tok=2, moe_intermediate_size=768),
    "deepseek": dataclasses.replace(
        MODEL_SPECS["deepseek-v3"], name="deepseek-small", **{**_COMMON, "num_layers": 2}, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=384, num_shared_experts=1, num_dense_layers=1,
        mla=MLADims(q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64)),
}
MESHES = {"fsdp=8": ((8,), ("fsdp",)), "fsdp=2,tp=4": ((2, 4), ("fsdp", "tp")),
          "dp=2,fsdp=2,tp=2": ((2, 2, 2), ("dp", "fsdp", "tp"))}
QUICK = [("llama", "fsdp=2,tp=4", "full"), ("llama", "fsdp=8", "none"), ("mixtral", "fsdp=8", "dots"),
         ("gpt2", "dp=2,fsdp=2,tp=2", "full")]


def xla_flops(spec: Any, mesh_name: str, remat: str, *, batch: int, seq: int, tpu: str | None = None) -> float:
    """Per-device FLOPs XLA's cost analysis reports for the unrolled reference step (on 8 CPU devices, or
    compiled for the TPU slice ``tpu``)."""
    shape, names = MESHES[mesh_name]
    if tpu:
        mesh = meshplan.tpu_topology_mesh(tpu, names, shape)
    else:
        mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
    ref = reference_step(spec, mesh, batch=batch, seq=seq,
                         config=ReferenceConfig(remat=remat, attention="plain", scan_layers=False))
    cost = ref.lower().compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def analytic(spec: Any, mesh_name: str, remat: str, *, batch: int, seq: int) -> float:
    shape, names = MESHES[mesh_name]
    return step_flops(spec, dict(zip(names, shape)), batch=batch, seq=seq, remat=remat,
                      attention="plain").per_device


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 cases instead of the grid")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tpu", metavar="CLUSTER", help="compile for this 8-device TPU slice (v5e-8, v6e-8, v5p-16)")
    ap.add_argument("--only", help="';'-separated family:mesh:remat cases (e.g. 'llama:fsdp=8:full;gpt2:fsdp=2,tp=4:none')")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else [(f, m, r) for f in SPECS for m in MESHES for r in ("none", "dots", "full")
                                      if r != "dots" or m == "fsdp=8"]
    if args.only:
        cases = [tuple(c.split(":")) for c in args.only.split(";")]  # type: ignore[misc]
        if bad := [c for c in cases if len(c) != 3 or c[0] not in SPECS or c[1] not in MESHES]:
            ap.error(f"--only {bad}: each case is family:mesh:remat, families {list(SPECS)}, meshes {list(MESHES)}")
    target = f"XLA:TPU {args.tpu} (AOT, windowed einsum off)" if args.tpu else \
        f"{jax.device_count()} x {jax.devices()[0].platform}"
    print(f"jax {jax.__version__}, {target}; batch {args.batch} x seq "
          f"{args.seq}; attention plain; unrolled; FLOPs per device")
    print(f"{'family':<9} {'mesh':<17} {'remat':<5} {'analytic':>12} {'XLA':>12} {'ratio':>6} {'compile':>8}")
    worst = 0.0
    for family, mesh_name, remat in cases:
        spec = SPECS[family]
        start = time.perf_counter()
        got = xla_flops(spec, mesh_name, remat, batch=args.batch, seq=args.seq, tpu=args.tpu)
        took = time.perf_counter() - start
        want = analytic(spec, mesh_name, remat, batch=args.batch, seq=args.seq)
        worst = max(worst, abs(want / got - 1))
        print(f"{family:<9} {mesh_name:<17} {remat:<5} {want:12.4g} {got:12.4g} {want / got:6.3f} {took:7.1f}s",
              flush=True)
    print(f"largest deviation: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
