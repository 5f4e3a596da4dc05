"""Analytic step FLOPs against XLA's own count, on unrolled reference train steps.

For each case the reference step (``meshplan.facade.verify._reference.reference_step``,
layers unrolled so XLA's ``cost_analysis()`` sees every layer once; remat with
``prevent_cse=True``) is compiled on 8 simulated CPU devices, and XLA's
``flops`` -- **per device**: the SPMD-partitioned module one device runs -- is
printed next to ``step_flops(...).per_device`` (ratio analytic / XLA; 1.00 exact).

XLA counts every floating-point op, elementwise ones included (norms, softmax,
rope, the loss, the optimizer update); the analytic ``per_device`` counts the
matmuls plus ``StepFlops.elementwise`` (per-element counts derived from
single-device compiles, see ``meshplan/pure/cost/_flops.py``). The scaled-down models keep the real families'
structure (GQA, gated MLP, routed experts with capacity-based dispatch, MLA).

    python benchmarks/bench_flops.py            # the grid: 52 cases, about 10 minutes on 2 cores
    python benchmarks/bench_flops.py --quick    # 4 cases
    python benchmarks/bench_flops.py --quick --tpu v5e-8   # XLA:TPU, compiled ahead of time
    python benchmarks/bench_flops.py --devices 16 --only 'deepseek-v3-1layer:fsdp=2,tp=8:full'

``--only`` also takes DeepSeek-V3 at its real width (``deepseek-v3-1layer``: one dense layer, vocabulary
cut to 1024; about 10-15 s a compile) and, with ``--devices 16``, four 16-device meshes: where XLA's
partitioner splits or repeats MLA's tp-replicated down projections (``tp_replicated_splits``).

On TPU (``--tpu CLUSTER``, libtpu installed) the step is compiled for the slice's
topology with XLA:TPU's windowed einsums off (``LIBTPU_INIT_ARGS``; they run a
matmul as a loop whose body ``cost_analysis()`` counts once).

The last two columns split the ratio: ``matmul`` is the analytic matmul FLOPs
(``per_device - elementwise``) over the ``dot`` / ``convolution`` FLOPs read from
the compiled HLO (``matmul_flops``; XLA:TPU writes its matmuls as convolutions),
``other`` the analytic elementwise term over the rest of XLA's count.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Before jax starts: the simulated device count (8, or 16 for the 16-device meshes; --devices).
_DEVICES = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv[:-1] else "8"
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_DEVICES}"

import jax  # noqa: E402

from meshplan.facade.verify._targets import TPU_WINDOWED_EINSUM_OFF

# Before the first compile: libtpu reads its flags once, when it starts.
if "--tpu" in sys.argv:
    os.environ["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "") + " " + TPU_WINDOWED_EINSUM_OFF).strip()
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import meshplan  # noqa: E402
from meshplan.facade.verify._reference import ReferenceConfig, reference_step  # noqa: E402
from meshplan.pure.presets import MODEL_SPECS, MLADims  # noqa: E402
from meshplan.pure.cost._flops import step_flops  # noqa: E402

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
          "dp=2,fsdp=2,tp=2": ((2, 2, 2), ("dp", "fsdp", "tp")),
          # Added in session 4 (benchmarks/RESULTS.md says which rows were held out from which rule).
          "fsdp=4,tp=2": ((4, 2), ("fsdp", "tp")), "dp=2,tp=4": ((2, 4), ("dp", "tp")),
          "dp=4,tp=2": ((4, 2), ("dp", "tp"))}
# Outside the default grid (--only): DeepSeek-V3's real attention and dense MLP, and meshes of 16 devices.
WIDE_SPECS = {"deepseek-v3-1layer": dataclasses.replace(MODEL_SPECS["deepseek-v3"], name="deepseek-v3-1layer",
                                                        num_layers=1, num_dense_layers=1, vocab_size=1024,
                                                        num_params=None)}
MESHES_16 = {"fsdp=4,tp=4": ((4, 4), ("fsdp", "tp")), "fsdp=2,tp=8": ((2, 8), ("fsdp", "tp")),
             "dp=2,fsdp=2,tp=4": ((2, 2, 4), ("dp", "fsdp", "tp")),
             "dp=2,fsdp=4,tp=2": ((2, 4, 2), ("dp", "fsdp", "tp"))}
QUICK = [("llama", "fsdp=2,tp=4", "full"), ("llama", "fsdp=8", "none"), ("mixtral", "fsdp=8", "dots"),
         ("gpt2", "dp=2,fsdp=2,tp=2", "full")]


_DEF = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = \w+\[([0-9,]*)\]")
_MATMUL = re.compile(r"= \w+\[([0-9,]*)\][^=]* (dot|convolution)\(%([\w.\-]+), %([\w.\-]+)\)(.*)$")


def matmul_flops(hlo: str) -> float:
    """FLOPs of the ``dot`` and ``convolution`` ops of a compiled module's text (``compiled.as_text()``),
    2 per multiply-add; a convolution counts only the window positions that land on its input (not on
    padding or base-dilation holes), as XLA's cost analysis does."""
    shapes = {m.group(1): _dims(m.group(2)) for m in map(_DEF.match, hlo.splitlines()) if m}
    total = 0.0
    for line in hlo.splitlines():
        m = _MATMUL.search(line)
        if not m:
            continue
        out, kind, lhs, rhs, rest = _dims(m.group(1)), m.group(2), shapes[m.group(3)], shapes[m.group(4)], m.group(5)
        if kind == "dot":
            dims = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
            total += 2.0 * math.prod(out) * math.prod(lhs[int(d)] for d in _dims(dims.group(1) if dims else ""))
        else:
            total += _convolution_flops(rest, lhs, rhs, out)
    return total


def _dims(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _convolution_flops(attrs: str, lhs: list[int], rhs: list[int], out: list[int]) -> float:
    lhs_labels, rhs_labels, out_labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs).groups()  # type: ignore[union-attr]
    window = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(kv.split("=") for kv in window.group(1).split()) if window else {}
    spatial = sum(c.isdigit() for c in out_labels)

    def per_dim(key: str, default: int) -> list[int]:
        return [int(x) for x in fields[key].split("x")] if key in fields else [default] * spatial

    stride, base, dilate = per_dim("stride", 1), per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1)
    low = [int(p.split("_")[0]) for p in fields["pad"].split("x")] if "pad" in fields else [0] * spatial
    positions = 1
    for i in range(spatial):
        d = str(i)
        n, o, k = lhs[lhs_labels.index(d)], out[out_labels.index(d)], rhs[rhs_labels.index(d)]
        span = (n - 1) * base[i]
        positions *= sum(1 for a in range(o) for b in range(k)
                         if 0 <= (p := a * stride[i] + b * dilate[i] - low[i]) <= span and p % base[i] == 0)
    rest = math.prod(size for size, label in zip(out, out_labels) if not label.isdigit())
    return 2.0 * positions * rest * rhs[rhs_labels.index("i")]


def xla_flops(spec: Any, mesh_name: str, remat: str, *, batch: int, seq: int,
              tpu: str | None = None) -> tuple[float, float]:
    """Per-device FLOPs XLA's cost analysis reports for the unrolled reference step (on 8 CPU devices, or
    compiled for the TPU slice ``tpu``), and the matmul part of them read from the HLO."""
    shape, names = {**MESHES, **MESHES_16}[mesh_name]
    if tpu:
        mesh = meshplan.tpu_topology_mesh(tpu, names, shape)
    else:
        mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
    ref = reference_step(spec, mesh, batch=batch, seq=seq,
                         config=ReferenceConfig(remat=remat, attention="plain", scan_layers=False))
    compiled = ref.lower().compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"]), matmul_flops(compiled.as_text())


def analytic(spec: Any, mesh_name: str, remat: str, *, batch: int, seq: int) -> tuple[float, float]:
    """``step_flops(...).per_device`` and its elementwise part."""
    shape, names = {**MESHES, **MESHES_16}[mesh_name]
    f = step_flops(spec, dict(zip(names, shape)), batch=batch, seq=seq, remat=remat, attention="plain")
    return f.per_device, f.elementwise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 cases instead of the grid")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tpu", metavar="CLUSTER", help="compile for this 8-device TPU slice (v5e-8, v6e-8, v5p-16)")
    ap.add_argument("--devices", type=int, choices=(8, 16), default=8,
                    help="simulated XLA:CPU devices; 16 for the --only cases on MESHES_16")
    ap.add_argument("--only", help="';'-separated family:mesh:remat cases (e.g. 'llama:fsdp=8:full;gpt2:fsdp=2,tp=4:none')")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else [(f, m, r) for f in SPECS for m in MESHES for r in ("none", "dots", "full")
                                      if r != "dots" or m == "fsdp=8"]
    if args.only:
        cases = [tuple(c.split(":")) for c in args.only.split(";")]  # type: ignore[misc]
        meshes = MESHES if args.devices == 8 else MESHES_16
        if bad := [c for c in cases if len(c) != 3 or c[0] not in {**SPECS, **WIDE_SPECS} or c[1] not in meshes]:
            ap.error(f"--only {bad}: each case is family:mesh:remat, families {list(SPECS) + list(WIDE_SPECS)}, "
                     f"meshes {list(meshes)} (with --devices {args.devices})")
    elif args.devices != 8:
        ap.error("--devices 16 needs --only cases on the 16-device meshes")
    target = f"XLA:TPU {args.tpu} (AOT, windowed einsum off)" if args.tpu else \
        f"{jax.device_count()} x {jax.devices()[0].platform}"
    print(f"jax {jax.__version__}, {target}; batch {args.batch} x seq "
          f"{args.seq}; attention plain; unrolled; FLOPs per device")
    print(f"{'family':<9} {'mesh':<17} {'remat':<5} {'analytic':>12} {'XLA':>12} {'ratio':>6} {'matmul':>7} "
          f"{'other':>6} {'compile':>8}")
    worst = 0.0
    for family, mesh_name, remat in cases:
        spec = {**SPECS, **WIDE_SPECS}[family]
        start = time.perf_counter()
        got, got_matmul = xla_flops(spec, mesh_name, remat, batch=args.batch, seq=args.seq, tpu=args.tpu)
        took = time.perf_counter() - start
        want, want_other = analytic(spec, mesh_name, remat, batch=args.batch, seq=args.seq)
        worst = max(worst, abs(want / got - 1))
        print(f"{family:<9} {mesh_name:<17} {remat:<5} {want:12.4g} {got:12.4g} {want / got:6.3f} "
              f"{(want - want_other) / got_matmul:7.3f} {want_other / (got - got_matmul):6.3f} {took:7.1f}s",
              flush=True)
    print(f"largest deviation: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
