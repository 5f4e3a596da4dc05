"""The comm model's collectives against the compiled program's, per kind, on unrolled reference steps.

For each case: the search's candidate for a fixed mesh (its ``MeshCandidate.comm``
terms, relowered for the backend by ``xla_collectives``) next to the
collectives in the optimized HLO of the same reference step (``scan_layers=False``,
so every layer's collectives are in the program; remat's ``prevent_cse=True``), read
by ``meshplan.compiled_collectives``. Bytes are per device per step, as the cost
model defines a collective's buffer; ratio = analytic / compiled.

Run: ``python benchmarks/bench_collectives.py`` (XLA:CPU, 8 simulated devices);
``--tpu v5e-8`` also compiles for that TPU topology (needs libtpu), in a subprocess
with windowed einsum off (``LIBTPU_INIT_ARGS`` must be set before libtpu starts).
``--gpu 1x8xH200`` compiles the XLA:CPU cases' steps for XLA:GPU on that cluster ahead of
time (``meshplan.gpu_topology_mesh``; needs one local GPU of that kind and jax with CUDA),
in a subprocess that leaves the CPU-only setup above out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

if __name__ == "__main__" and "--child" not in sys.argv:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

from _table import cut_preset  # noqa: E402  (benchmarks/, the script's directory)
from meshplan.facade.verify._targets import TPU_WINDOWED_EINSUM_OFF

Case = tuple[str, dict[str, int], str, int]
CASES: tuple[Case, ...] = (
    ("llama", {"dp": 8}, "full", 1),
    ("llama", {"fsdp": 8}, "full", 1),
    ("llama", {"dp": 2, "fsdp": 4}, "full", 1),
    ("llama", {"dp": 2, "tp": 4}, "full", 1),
    ("llama", {"dp": 2, "tp": 4}, "none", 1),
    ("llama", {"fsdp": 2, "tp": 4}, "full", 1),
    ("llama", {"dp": 2, "fsdp": 2, "tp": 2}, "full", 1),
    ("llama", {"tp": 8}, "full", 1),
    ("llama", {"fsdp": 2, "sp": 4}, "full", 1),
    ("mixtral", {"fsdp": 8}, "full", 1),
    ("mixtral", {"fsdp": 2, "ep": 4}, "full", 1),
    ("mixtral", {"ep": 4, "tp": 2}, "full", 1),
    ("llama", {"fsdp": 8}, "full", 2),
    ("llama", {"dp": 2, "fsdp": 4}, "full", 2),
    ("llama", {"dp": 2, "tp": 4}, "full", 2),
    ("llama", {"fsdp": 2, "tp": 4}, "full", 2),
    ("deepseek", {"fsdp": 8}, "full", 1),
    ("deepseek", {"dp": 2, "tp": 4}, "full", 1),
    ("deepseek", {"fsdp": 2, "tp": 4}, "full", 1),
    ("deepseek", {"dp": 2, "tp": 4}, "none", 1),
    ("deepseek", {"tp": 8}, "full", 1),
    ("llama-kv8", {"tp": 8}, "full", 1),
    ("deepseek", {"tp": 8}, "none", 1),
    ("gpt2", {"fsdp": 8}, "full", 1),
    ("gpt2", {"dp": 2, "fsdp": 4}, "full", 1),
    ("gpt2", {"fsdp": 8}, "none", 1),
    ("llama", {"fsdp": 8}, "none", 1),
    ("llama", {"fsdp": 8}, "dots", 1),
    ("deepseek", {"fsdp": 8}, "none", 1),
    ("llama", {"dp": 2, "fsdp": 4}, "none", 2),
    ("mixtral", {"fsdp": 2, "ep": 4}, "none", 1),
    ("gpt2", {"dp": 2, "tp": 4}, "full", 1),
    ("gpt2", {"fsdp": 2, "tp": 4}, "full", 1),
    ("gpt2", {"tp": 8}, "full", 1),
    ("gpt2", {"dp": 4, "tp": 2}, "full", 1),
    # Held out for the fused c_attn reshard (session 5): another mesh, no recompute, another width and depth.
    ("gpt2", {"fsdp": 4, "tp": 2}, "full", 1),
    ("gpt2", {"tp": 8}, "none", 1),
    ("gpt2-h192", {"dp": 2, "tp": 4}, "full", 1),
    ("gpt2-h192", {"dp": 4, "tp": 2}, "full", 1),
    ("gpt2", {"dp": 2, "tp": 4}, "dots", 1),
)
"""(family, mesh, remat policy, micro-batches); remat "full" is the reference step's and the search's default.
With micro-batches the step scans over them: the HLO lists the loop body once and the parser counts it
by XLA's known trip count."""
MINOR = 0.02
"""A kind carrying less than this share of a step's collective bytes, compiled and priced, is reported, not held to 10%
(XLA:CPU's reshards of weight gradients and embedding lookups: all-to-alls and permutes of a few KiB)."""
BATCH, SEQ = 16, 512
"""Tokens per device well above the weights' dims, so XLA's partitioner gathers weights (FSDP) rather
than moving activations, as it does for real steps (at 32 tokens per device it keeps weights sharded)."""


TPU_CASES: tuple[Case, ...] = (
    ("llama", {"dp": 8}, "full", 1),
    ("llama", {"fsdp": 8}, "full", 1),
    ("llama", {"dp": 2, "fsdp": 4}, "full", 1),
    ("llama", {"fsdp": 2, "tp": 4}, "full", 1),
    ("mixtral", {"fsdp": 2, "ep": 4}, "full", 1),
    ("llama", {"fsdp": 4, "tp": 2}, "full", 1),
    ("llama", {"dp": 2, "tp": 4}, "none", 1),
    ("llama", {"fsdp": 8}, "full", 2),
    ("llama", {"dp": 2, "fsdp": 2, "tp": 2}, "full", 1),
    ("mixtral", {"ep": 4, "tp": 2}, "full", 1),
    ("llama", {"tp": 8}, "full", 1),
    ("mixtral", {"fsdp": 2, "tp": 4}, "full", 1),
    ("llama-kv8", {"tp": 8}, "full", 1),
    ("llama-kv2", {"dp": 2, "tp": 4}, "full", 1),
    ("mixtral", {"fsdp": 2, "ep": 2, "tp": 2}, "full", 1),
    ("llama", {"fsdp": 8}, "none", 1),
    # XLA:TPU without remat keeps only the last layer's non-attention gathers for the backward (session 5).
    ("llama-4l", {"fsdp": 8}, "none", 1),
    ("mixtral", {"fsdp": 2, "ep": 4}, "none", 1),
    ("llama", {"dp": 2, "fsdp": 4}, "none", 1),
    ("llama", {"fsdp": 8}, "none", 2),
    ("deepseek", {"fsdp": 8}, "none", 1),
    ("gpt2", {"fsdp": 8}, "none", 1),
    ("gpt2", {"dp": 2, "tp": 4}, "full", 1),
    ("gpt2", {"fsdp": 2, "tp": 4}, "full", 1),
)
"""Few on purpose: each XLA:TPU compile of the TPU-sized steps takes minutes on a small machine."""
FULL_WIDTH_CASES: tuple[Case, ...] = (
    ("llama3-8b/2L", {"fsdp": 8}, "full", 1),
    ("mixtral-8x7b/2L", {"fsdp": 8}, "full", 1),
    # Session 7: which operand XLA gathers (meshplan.pure.cost._gathered_operand), held out on other meshes,
    # depths and batches either side of its thresholds (Llama: 131072 tokens at @64 against 128256 rows;
    # Mixtral: 24 x 640 slots per expert at @24 against 14336 rows).
    ("mixtral-8x7b/4L", {"fsdp": 8}, "full", 1),
    ("llama3-8b/2L", {"dp": 2, "fsdp": 4}, "full", 1),
    ("mixtral-8x7b/2L", {"dp": 2, "fsdp": 4}, "full", 1),
    ("llama3-8b/2L", {"fsdp": 4, "tp": 2}, "full", 1),
    ("llama3-8b/2L@32", {"fsdp": 8}, "full", 1),
    ("llama3-8b/2L@64", {"fsdp": 8}, "full", 1),
    ("mixtral-8x7b/2L@24", {"fsdp": 8}, "full", 1),
    ("llama3-8b/2L@64", {"dp": 4, "fsdp": 2}, "full", 1),
    ("mixtral-8x7b/2L@32", {"dp": 2, "fsdp": 4}, "full", 1),
    ("mixtral-8x7b/2L", {"fsdp": 8}, "none", 1),
    ("mixtral-8x7b/3L", {"fsdp": 8}, "none", 1),
    ("mixtral-8x7b/4L", {"fsdp": 8}, "none", 1),
    ("mixtral-8x7b/2L", {"dp": 2, "fsdp": 4}, "none", 1),
)
"""Presets at full width cut to 2-4 layers (``--full-width``, XLA:TPU only, 16 x 2048, or ``@B`` x 2048):
whether the partitioner still gathers weights where the TPU-sized cases say it does. A known miss: fsdp=4 x
tp=2's all-gathers (session 7: the embedding's lookup runs on its shard; see RESULTS.md). RESULTS.md records
Mixtral @24 and Mixtral without remat at 3 and 4 layers (and dp x fsdp) compiled for v6e-8, and the dp x fsdp
steps @32 / @64 for v5p-16, chosen for their HBM (v5e-8 was not tried for them; a step that does not fit fails
to compile and is reported as an error row). On v5p-16, fsdp=8 over the whole slice all-reduces the gradients
whole (session 6, not modelled)."""
TPU_BATCH, TPU_SEQ = 16, 2048
"""4,096 tokens per device on fsdp=8: where XLA:TPU's partitioner gathers weights (ZeRO-3) as at scale."""


def tpu_sized(family: str) -> object:
    """Presets at the smallest size where XLA:TPU partitions as for real steps: hidden 1024, 2 layers
    (``"llama3-8b/2L"``: a preset at full width, cut to that many layers)."""
    from meshplan.pure.presets import MODEL_SPECS

    if "/" in family:
        return cut_preset(family)

    if family == "mixtral":
        return dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="mixtral-1k", num_layers=2, hidden_size=1024,
                                   num_heads=8, num_kv_heads=4, head_dim=128, intermediate_size=1024,
                                   moe_intermediate_size=1024, vocab_size=8192, num_params=None)
    if family == "deepseek":  # one dense layer and one MoE layer (8 experts, top-2, a shared expert), MLA
        from meshplan.pure.presets import MLADims

        return dataclasses.replace(MODEL_SPECS["deepseek-v3"], name="deepseek-1k", num_layers=2, hidden_size=1024,
                                   num_heads=8, num_kv_heads=8, head_dim=128, intermediate_size=4096,
                                   moe_intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                                   num_shared_experts=1, num_dense_layers=1, vocab_size=8192, num_params=None,
                                   mla=MLADims(q_lora_rank=512, kv_lora_rank=256, qk_nope_head_dim=128,
                                               qk_rope_head_dim=64, v_head_dim=128))
    if family == "gpt2":  # fused c_attn (h, 3h), tied embeddings, learned positions
        return dataclasses.replace(MODEL_SPECS["gpt2"], name="gpt2-1k", num_layers=2, hidden_size=1024, num_heads=8,
                                   num_kv_heads=8, head_dim=128, intermediate_size=4096, vocab_size=8192,
                                   max_position_embeddings=2048, num_params=None)
    # "llama-kv2" / "llama-kv8": the same with 2 or 8 kv heads (K/V replicated over part of tp; no GQA).
    kv = int(family[len("llama-kv"):]) if family.startswith("llama-kv") else 4
    layers = 4 if family == "llama-4l" else 2  # "llama-4l": 4 layers
    return dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-1k", num_layers=layers, hidden_size=1024,
                               num_heads=8, num_kv_heads=kv, head_dim=128, intermediate_size=4096, vocab_size=8192,
                               num_params=None)


def tiny(family: str) -> object:
    """Scaled-down presets: every dim divisible by the mesh axes above."""
    from meshplan.pure.presets import MODEL_SPECS, MLADims

    if family == "deepseek":  # one dense layer and one MoE layer, MLA attention
        return dataclasses.replace(MODEL_SPECS["deepseek-v3"], name="tiny-deepseek", num_layers=2, hidden_size=128,
                                   num_heads=8, num_kv_heads=8, head_dim=16, intermediate_size=256,
                                   moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                   num_shared_experts=1, num_dense_layers=1, vocab_size=512, num_params=None,
                                   mla=MLADims(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16,
                                               qk_rope_head_dim=8, v_head_dim=16))
    if family == "gpt2":  # tied embeddings, learned positions, fused c_attn
        return dataclasses.replace(MODEL_SPECS["gpt2"], name="tiny-gpt2", num_layers=2, hidden_size=128, num_heads=8,
                                   num_kv_heads=8, head_dim=16, intermediate_size=512, vocab_size=512,
                                   max_position_embeddings=512, num_params=None)
    if family == "gpt2-h192":  # wider and deeper: 12 heads, 3 layers (c_attn's 576 outputs split otherwise)
        return dataclasses.replace(MODEL_SPECS["gpt2"], name="tiny-gpt2-h192", num_layers=3, hidden_size=192,
                                   num_heads=12, num_kv_heads=12, head_dim=16, intermediate_size=768,
                                   vocab_size=512, max_position_embeddings=512, num_params=None)
    if family == "mixtral":
        return dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="tiny-mixtral", num_layers=2,
                                   hidden_size=128, num_heads=8, num_kv_heads=4, head_dim=16,
                                   intermediate_size=256, moe_intermediate_size=256, vocab_size=512,
                                   num_params=None)
    kv = int(family[len("llama-kv"):]) if family.startswith("llama-kv") else 4  # "llama-kv8": 8 kv heads
    return dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny-llama", num_layers=2, hidden_size=128,
                               num_heads=8, num_kv_heads=kv, head_dim=16, intermediate_size=256, vocab_size=512,
                               num_params=None)


def compare(family: str, sizes: dict[str, int], mesh: object, backend: str, remat: str = "full",
            micro_batches: int = 1, large: bool = False) -> list[tuple[str, int, int, float, int, int]]:
    """``(kind, analytic bytes, compiled bytes, ratio, analytic calls, compiled calls)`` per kind."""
    import meshplan
    from meshplan.pure.cost import TrainingRecipe, xla_collectives
    from meshplan.pure.search import search_meshes
    from meshplan.pure.xla import collective_totals, ratio_table

    # XLA:GPU (mocked devices) compiles the XLA:CPU cases' steps: the same models, so the two lowerings compare.
    # large: the TPU cases' models and shapes (XLA:GPU with --gpu-large).
    large = large or backend == "tpu"
    family, _, at = family.partition("@")  # "llama3-8b/2L@64": that batch of TPU_SEQ tokens
    spec = tpu_sized(family) if large else tiny(family)
    batch, seq = (int(at) if at else TPU_BATCH, TPU_SEQ) if large else (BATCH, SEQ)
    cluster = "1x8xH100"  # the links price the terms; they do not change bytes or calls
    # Residual split over tp: the plan's activation specs.
    recipe = TrainingRecipe(backend=backend, remat=remat, micro_batches=micro_batches)
    cand = search_meshes(spec, cluster, axes=tuple(sizes), fixed=sizes, batch=batch, seq=seq, recipe=recipe).best
    ref = meshplan.reference_step(spec, mesh, batch=batch, seq=seq, plan=cand,
                                  config=meshplan.ReferenceConfig(scan_layers=False, remat=remat,
                                                                  micro_batches=micro_batches))
    options = {"xla_backend_optimization_level": 0} if backend == "cpu" else None
    compiled = collective_totals(meshplan.compiled_collectives(ref.fn, *ref.args, compiler_options=options))
    analytic = collective_totals(xla_collectives(cand.comm, backend=backend, itemsize=2, micro_batches=micro_batches))
    return [(k, a, c, r, analytic.get(k, (0, 0))[1], compiled.get(k, (0, 0))[1])
            for k, a, c, r in ratio_table(analytic, compiled)]


def run_cases(backend: str, topology: str | None, only: str = "", large: bool = False,
              full_width: bool = False) -> list[dict[str, object]]:
    import jax
    from jax.sharding import AxisType

    import meshplan
    from meshplan.pure.xla import collective_shares

    rows: list[dict[str, object]] = []
    cases = FULL_WIDTH_CASES if full_width else TPU_CASES if backend == "tpu" or large else CASES
    for family, sizes, remat, micro_batches in cases:
        if backend == "tpu":
            mesh = meshplan.tpu_topology_mesh(topology, tuple(sizes), tuple(sizes.values()))
        elif backend == "gpu":
            mesh = meshplan.gpu_topology_mesh(topology, tuple(sizes), tuple(sizes.values()))
        else:
            mesh = jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes))
        case = (f"{family} {','.join(f'{k}={v}' for k, v in sizes.items())}" + ("" if remat == "full" else f" {remat}")
                + ("" if micro_batches == 1 else f" mb={micro_batches}"))
        if only and not any(o == case or (o.endswith("*") and case.startswith(o[:-1])) for o in only.split(";")):
            continue
        start = time.perf_counter()
        try:
            table = compare(family, sizes, mesh, backend, remat, micro_batches, large)
        except Exception as err:  # a case the reference step or the search refuses: say so, keep going
            rows.append({"case": case, "kind": "error", "error": f"{type(err).__name__}: {str(err)[:120]}"})
            continue
        # A kind's share is the larger of its compiled and its priced share: a kind the model prices and XLA
        # never emits is a miss, not a minor kind.
        shares = collective_shares([(kind, a, c, r) for kind, a, c, r, _, _ in table])
        for kind, a, c, r, na, nc in table:
            rows.append({"case": case, "kind": kind, "analytic": a, "compiled": c, "ratio": r,
                         "calls_analytic": na, "calls_compiled": nc, "share": shares[kind],
                         "seconds": round(time.perf_counter() - start, 1)})
    return rows


def print_rows(title: str, rows: list[dict[str, object]]) -> None:
    print(f"\n{title}")
    print(f"{'case':<31} {'kind':<19} {'analytic B':>12} {'compiled B':>12} {'ratio':>7} {'calls a/c':>10}")
    for r in rows:
        if r["kind"] == "error":
            print(f"{r['case']:<31} {r['error']}")
            continue
        ratio = float(r["ratio"])  # type: ignore[arg-type]
        share = float(r.get("share", 1.0))  # type: ignore[arg-type]
        flag = ("" if 0.9 <= ratio <= 1.1 else f"  <- minor kind ({share:.1%} of the step's bytes)"
                if share < MINOR else "  <- outside 10%")
        print(f"{r['case']:<31} {r['kind']:<19} {r['analytic']:>12,} {r['compiled']:>12,} {ratio:>7.3f} "
              f"{str(r['calls_analytic']) + '/' + str(r['calls_compiled']):>10}{flag}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tpu", default=None, help="also compile for this TPU topology (e.g. v5e-8; needs libtpu)")
    ap.add_argument("--only", default="", help="run only these cases, ';'-separated, as the table names them "
                    "(e.g. 'llama fsdp=8;llama tp=8'; a trailing * matches a prefix: 'mixtral*')")
    ap.add_argument("--tpu-only", action="store_true", help="skip the XLA:CPU cases")
    ap.add_argument("--gpu", default=None, metavar="CLUSTER",
                    help="also compile for this GPU cluster ahead of time (e.g. 1x8xH200; needs one such GPU)")
    ap.add_argument("--gpu-large", action="store_true",
                    help="with --gpu: the TPU cases (hidden 1024, 16 x 2048) instead of the XLA:CPU cases")
    ap.add_argument("--full-width", action="store_true",
                    help="with --tpu: the FULL_WIDTH_CASES (presets at full width, 2 layers) instead of TPU_CASES")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # the TPU or GPU run, its environment already set by the parent
        print(json.dumps(run_cases("gpu" if args.gpu else "tpu", args.gpu or args.tpu, args.only, args.gpu_large,
                                   args.full_width)))
        return
    if not args.tpu_only:
        print_rows("XLA:CPU, 8 simulated devices (unrolled, prevent_cse=True; reduce-scatter = all-reduce on CPU, "
                   "bf16 collectives run in f32)", run_cases("cpu", None, args.only))
    if args.gpu:
        env = dict(os.environ, JAX_PLATFORMS="cuda")
        env.pop("XLA_FLAGS", None)
        out = subprocess.run([sys.executable, __file__, "--child", "--gpu", args.gpu, "--only", args.only]
                             + (["--gpu-large"] if args.gpu_large else []),
                             env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            print(f"\nXLA:GPU {args.gpu}: failed\n{out.stderr[-2000:]}")
        else:
            print_rows(f"XLA:GPU {args.gpu}, compiled ahead of time on one GPU (unrolled, prevent_cse=True)",
                       json.loads(out.stdout.splitlines()[-1]))
    if args.tpu:
        env = dict(os.environ, LIBTPU_INIT_ARGS=TPU_WINDOWED_EINSUM_OFF, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1")
        out = subprocess.run(["nice", sys.executable, __file__, "--child", "--tpu", args.tpu, "--only", args.only]
                             + (["--full-width"] if args.full_width else []),
                             env=env,
                             capture_output=True, text=True, check=False)
        if out.returncode:
            print(f"\nTPU {args.tpu}: failed\n{out.stderr[-2000:]}")
        else:
            print_rows(f"XLA:TPU AOT {args.tpu} (windowed einsum off)", json.loads(out.stdout.splitlines()[-1]))


if __name__ == "__main__":
    main()
