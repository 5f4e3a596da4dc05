"""The comm model's collectives against the compiled program's (per kind, bytes per device per step).

The parser is checked on HLO text built from drawn shapes and groups; the model
(``MeshCandidate.comm`` relowered by ``xla_collectives``) on unrolled reference
steps compiled for 8 XLA:CPU devices (fsdp, dp x fsdp, dp x tp, Mixtral's fsdp x ep, dp x fsdp
with 2 micro-batches, DeepSeek's MLA, GPT-2's fused c_attn under dp x tp):
every kind within 10% of the HLO's bytes, except kinds under 2% of the step's bytes
(XLA:CPU reshards a few KiB of weight gradients and embedding rows with all-to-alls and
permutes the model does not price). The grid is benchmarks/bench_collectives.py
(ratios in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses

import jax
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType

import meshplan
from meshplan.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import MODEL_SPECS, MLADims
from meshplan.pure.cost import CommTerm, TrainingRecipe, xla_collectives
from meshplan.pure.search import search_meshes
from meshplan.pure.xla import (
    HLO_COLLECTIVE_KINDS,
    collective_shares,
    collective_totals,
    parse_hlo_collectives,
    ratio_table,
)

TINY = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny-llama", num_layers=2, hidden_size=128,
                           num_heads=8, num_kv_heads=4, head_dim=16, intermediate_size=256, vocab_size=512,
                           num_params=None)
ITEMSIZE = {"bf16": 2, "f32": 4, "s32": 4, "f64": 8, "u8": 1}


@st.composite
def hlo_collective(draw: st.DrawFn) -> tuple[str, str, list[tuple[str, tuple[int, ...]]], int, str]:
    kind = draw(st.sampled_from(HLO_COLLECTIVE_KINDS))
    operands = draw(st.lists(st.tuples(st.sampled_from(sorted(ITEMSIZE)),
                                       st.lists(st.integers(1, 9), min_size=0, max_size=3).map(tuple)),
                             min_size=1, max_size=3))
    n = draw(st.sampled_from([1, 2, 4, 8]))
    groups = draw(st.sampled_from(["iota", "list", "mesh"]))
    if kind == "collective-permute":
        attr = "source_target_pairs={{0,1},{1,0}}"
    elif groups == "iota":
        attr = f"replica_groups=[{8 // n},{n}]<=[8]"
    elif groups == "list":
        attr = "replica_groups={" + ",".join("{" + ",".join(str(g * n + i) for i in range(n)) + "}"
                                             for g in range(8 // n)) + "}"
    else:
        order = draw(st.sampled_from(["", ", device_ids=([2,4]T(1,0))"]))
        attr = f"replica_groups=mesh['a'={8 // n},'b'={n}]{order} {{'b'}}"
    start = draw(st.booleans()) and kind != "reduce-scatter"
    return kind, attr, operands, n, "-start" if start else ""


@given(st.lists(hlo_collective(), min_size=1, max_size=4))
def test_parser_reads_kind_bytes_and_groups_of_any_collective(drawn):
    lines, expected = ["ENTRY %main.1 (p: f32[]) -> f32[] {"], []
    for k, (kind, attr, operands, n, start) in enumerate(drawn):
        names = []
        for j, (dtype, dims) in enumerate(operands):
            names.append(f"%x.{k}.{j}")
            lines.append(f"  %x.{k}.{j} = {dtype}[{','.join(map(str, dims))}]{{0}} parameter({j})")
        rtype = "(" + ", ".join(f"{d}[1]" for d, _ in operands) + ")" if len(operands) > 1 else "f32[1]"
        lines.append(f"  %c.{k} = {rtype} {kind}{start}({', '.join(names)}), channel_id={k}, {attr}, "
                     "dimensions={0}, metadata={op_name=\"x\"}")
        if start:
            lines.append(f"  %d.{k} = f32[1] {kind}-done(%c.{k})")
        size = sum(ITEMSIZE[d] * _prod(dims) for d, dims in operands)
        expected.append((kind, size * n if kind == "all-gather" else size, len(operands)))
    lines.append("}")
    got = parse_hlo_collectives("\n".join(lines))
    assert [(c.kind, c.nbytes, c.calls) for c in got] == expected
    assert all(c.computation == "main.1" for c in got)
    totals = collective_totals(got)
    assert sum(b for b, _ in totals.values()) == sum(b for _, b, _ in expected)
    assert list(totals) == [k for k in HLO_COLLECTIVE_KINDS if k in totals]


@given(st.integers(1, 5), st.sampled_from([2, 4, 8]), st.integers(1, 64))
def test_an_xla_tpu_async_chain_counts_once_and_its_all_reduce_scatter_is_a_reduce_scatter(continuations, n, rows):
    # XLA:TPU: the start fusion, `continuations` fusions advancing it and the done fusion each hold a copy
    # of the all-gather with one chain_id; a reduce-scatter is an all-reduce + dynamic-slice fusion.
    gather = (f"  %ag.{{k}} = bf16[{rows * n},128] all-gather(%p.{{k}}), replica_groups=[1,{n}]<=[{n}], "
              'dimensions={{0}}, frontend_attributes={{chain_id="7"}}')
    parts = []
    for k, name in enumerate(["fused_computation.1"] + [f"async_collective_fusion.{i}" for i in range(continuations)]
                             + ["fused_computation.9"]):
        parts += [f"%{name} (p.{k}: bf16[{rows},128]) -> bf16[{rows * n},128] {{",
                  f"  %p.{k} = bf16[{rows},128] parameter(0)", gather.format(k=k), "}", ""]
    parts += [f"%all-reduce-scatter.3 (input: f32[{rows * n},128]) -> f32[{rows},128] {{",
              f"  %input = f32[{rows * n},128] parameter(0)",
              f"  %ar = f32[{rows * n},128] all-reduce(%input), replica_groups=[1,{n}]<=[{n}], to_apply=%add",
              f"  ROOT %ds = f32[{rows},128] dynamic-slice(%ar, %i, %j), dynamic_slice_sizes={{{rows},128}}", "}"]
    got = parse_hlo_collectives("\n".join(parts))
    assert [(c.kind, c.nbytes, c.computation) for c in got] == [
        ("all-gather", rows * n * 128 * 2, "fused_computation.1"),
        ("reduce-scatter", rows * n * 128 * 4, "all-reduce-scatter.3")]


@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(1, 9)), st.booleans()), min_size=0, max_size=3),
       st.integers(1, 4), st.integers(1, 64))
def test_a_collective_in_loops_counts_the_product_of_their_trip_counts(loops, callers, rows):
    # Nested while bodies (a scan over micro-batches around a scan over layers). A count is stated as
    # XLA:CPU does (known_trip_count) or, as on XLA:TPU, only by the condition `i < N`; a loop whose count
    # cannot be read (None: a bound that is not a constant) counts once. The innermost body is called
    # `callers` times from its parent: every call site counts.
    parts, expected = [], 1
    for depth in range(len(loops) + 1):
        parts.append(f"%body.{depth} (p.{depth}: f32[{rows},8]) -> f32[{rows},8] {{")
        parts.append(f"  %p.{depth} = f32[{rows},8] parameter(0)")
        if depth < len(loops):
            n, stated = loops[depth]
            config = f', backend_config={{"known_trip_count":{{"n":"{n}"}}}}' if stated and n else ""
            for k in range(callers if depth == len(loops) - 1 else 1):
                parts.append(f"  %w.{depth}.{k} = f32[{rows},8] while(%p.{depth}), condition=%cond.{depth}, "
                             f"body=%body.{depth + 1}{config}")
            expected *= (n or 1) * (callers if depth == len(loops) - 1 else 1)
        else:
            parts.append(f"  ROOT %ar = f32[{rows},8] all-reduce(%p.{depth}), replica_groups=[1,8]<=[8], "
                         "to_apply=%add")
        parts += ["}", ""]
        if depth < len(loops):  # the loop's condition: i < N against a constant, or against a parameter
            n, stated = loops[depth]
            bound = f"s32[]{{:T(128)}} constant({n})" if n and not stated else "s32[] parameter(1)"
            parts += [f"%cond.{depth} (c: (s32[], f32[{rows},8])) -> pred[] {{", f"  %n.{depth} = {bound}",
                      f"  %i.{depth} = s32[] get-tuple-element(%c), index=0",
                      f"  ROOT %lt.{depth} = pred[] compare(%i.{depth}, %n.{depth}), direction=LT", "}", ""]
    parts[0] = "ENTRY " + parts[0]
    (got,) = parse_hlo_collectives("\n".join(parts))
    assert got.trips == expected
    assert collective_totals([got]) == {"all-reduce": (rows * 8 * 4 * expected, expected)}


def _prod(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


@given(st.lists(st.tuples(st.sampled_from(("all-gather", "reduce-scatter", "all-reduce", "all-to-all")),
                          st.integers(0, 10**9), st.integers(0, 64)), max_size=6),
       st.sampled_from((1, 2, 4)))
def test_xla_lowering_keeps_bytes_per_kind_except_what_it_documents(raw, itemsize):
    terms = [CommTerm("t", kind, ("fsdp",), nbytes, calls, "intra", 0.0) for kind, nbytes, calls in raw]
    textbook = collective_totals(terms)
    assert collective_totals(xla_collectives(terms, backend="gpu", itemsize=itemsize)) == textbook
    assert collective_totals(xla_collectives(terms, backend="tpu", itemsize=itemsize)) == textbook
    cpu = collective_totals(xla_collectives(terms, backend="cpu", itemsize=itemsize))
    widen = 2 if itemsize == 2 else 1
    assert "reduce-scatter" not in cpu
    total = sum(b for b, _ in textbook.values())
    assert sum(b for b, _ in cpu.values()) == widen * total
    merged = textbook.get("all-reduce", (0, 0))[1] + textbook.get("reduce-scatter", (0, 0))[1]
    assert cpu.get("all-reduce", (0, 0))[1] == merged


@given(st.integers(1, 8), st.integers(1, 80), st.integers(1, 10**6))
def test_xla_cpu_hoists_the_loop_invariant_gathers_out_of_the_micro_batch_loop(m, layers, nbytes):
    # accumulate() repeats every gather and gradient sync per micro-batch; XLA:CPU runs the layers'
    # forward gathers and the embedding's and head's once per step (read from its HLO), XLA:TPU all m times.
    terms = [CommTerm("fsdp all-gather of params (fwd + bwd)", "all-gather", ("fsdp",), nbytes, 2 * layers * m,
                      "intra", 0.0),
             CommTerm("fsdp all-gather of params (embedding, head: once)", "all-gather", ("fsdp",), nbytes, m,
                      "intra", 0.0),
             CommTerm("fsdp all-gather of params (head: fwd + bwd)", "all-gather", ("fsdp",), nbytes, 2 * m,
                      "intra", 0.0),
             CommTerm("fsdp reduce-scatter of grads", "reduce-scatter", ("fsdp",), nbytes, layers * m, "intra", 0.0)]
    cpu = xla_collectives(terms, backend="cpu", itemsize=4, micro_batches=m)
    assert [t.calls for t in cpu] == [layers * (m + 1), 1, 2, layers * m]
    assert xla_collectives(terms, backend="tpu", itemsize=4, micro_batches=m) == tuple(terms)
    assert xla_collectives(terms, backend="cpu", itemsize=4, micro_batches=1) == xla_collectives(
        terms, backend="cpu", itemsize=4)


def test_collective_matmul_turns_tp_gathers_into_permutes():
    t = CommTerm("tp all-gather", "all-gather", ("tp",), 8000, 3, "intra", 0.0)
    (out,) = xla_collectives([t], backend="tpu", itemsize=2, collective_matmul=True, sizes={"tp": 4})
    assert (out.kind, out.nbytes, out.calls) == ("collective-permute", 2000, 9)  # 3 calls x (4-1) chunks of B/4
    with pytest.raises(PlanError, match="sizes="):
        xla_collectives([t], backend="tpu", itemsize=2, collective_matmul=True)
    with pytest.raises(PlanError, match="backend="):
        xla_collectives([t], backend="rocm", itemsize=2)
    with pytest.raises(MeshplanTypeError):
        parse_hlo_collectives(b"HloModule")  # type: ignore[arg-type]


MIXTRAL = dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="tiny-mixtral", num_layers=2, hidden_size=128,
                              num_heads=8, num_kv_heads=4, head_dim=16, intermediate_size=256,
                              moe_intermediate_size=256, vocab_size=512, num_params=None)
# One dense and one MoE layer with MLA attention (q_a / kv_a whole over tp, their up-projections split).
DEEPSEEK = dataclasses.replace(MODEL_SPECS["deepseek-v3"], name="tiny-deepseek", num_layers=2, hidden_size=128,
                               num_heads=8, num_kv_heads=8, head_dim=16, intermediate_size=256,
                               moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                               num_dense_layers=1, vocab_size=512, num_params=None,
                               mla=MLADims(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                           v_head_dim=16))
# Fused c_attn (h, 3h) split over tp in 3h/tp blocks, q / k / v pinned to their heads: resharded by XLA.
GPT2 = dataclasses.replace(MODEL_SPECS["gpt2"], name="tiny-gpt2", num_layers=2, hidden_size=128, num_heads=8,
                           num_kv_heads=8, head_dim=16, intermediate_size=512, vocab_size=512,
                           max_position_embeddings=512, num_params=None)
MINOR = 0.02  # a kind under 2% of the step's bytes (XLA:CPU's few-KiB reshards) is not held to 10%


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.parametrize("model,sizes,micro_batches",
                         [(TINY, {"fsdp": 8}, 1), (TINY, {"dp": 2, "fsdp": 4}, 1), (TINY, {"dp": 2, "tp": 4}, 1),
                          (MIXTRAL, {"fsdp": 2, "ep": 4}, 1), (TINY, {"dp": 2, "fsdp": 4}, 2),
                          (DEEPSEEK, {"dp": 2, "tp": 4}, 1), (DEEPSEEK, {"tp": 8}, 1), (GPT2, {"dp": 2, "tp": 4}, 1)],
                         ids=["fsdp8", "dp2-fsdp4", "dp2-tp4", "mixtral-fsdp2-ep4", "dp2-fsdp4-2-micro-batches",
                              "deepseek-mla-dp2-tp4", "deepseek-mla-tp8-alone", "gpt2-fused-qkv-dp2-tp4"])
def test_model_bytes_per_kind_within_ten_percent_of_xla_cpu(model, sizes, micro_batches):
    # With micro-batches the step scans over them: the gradients are synced in every micro-batch, the
    # backward's gathers repeat and XLA:CPU hoists the loop-invariant forward gathers (read by trip count).
    cand = search_meshes(model, "1x8xH100", axes=tuple(sizes), fixed=sizes, batch=16, seq=512,
                         recipe=TrainingRecipe(backend="cpu", micro_batches=micro_batches)).best
    assert cand.step is not None and cand.step.micro_batches == micro_batches
    mesh = jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes))
    ref = meshplan.reference_step(model, mesh, batch=16, seq=512, plan=cand,
                                  config=meshplan.ReferenceConfig(scan_layers=False, micro_batches=micro_batches))
    records = meshplan.compiled_collectives(ref.fn, *ref.args,
                                            compiler_options={"xla_backend_optimization_level": 0})
    assert any(r.trips == micro_batches for r in records)
    compiled = collective_totals(records)
    analytic = collective_totals(xla_collectives(cand.comm, backend="cpu", itemsize=2, micro_batches=micro_batches))
    table = ratio_table(analytic, compiled)
    assert "reduce-scatter" not in {k for k, *_ in table}, table  # XLA:CPU: all-reduce + dynamic-slice
    # Held: at least MINOR of the compiled or of the priced bytes (a kind priced and never emitted fails).
    shares = collective_shares(table)
    held = [(kind, ratio) for kind, _, _, ratio in table if shares[kind] >= MINOR]
    assert {k for k, _ in held} >= {"all-gather", "all-reduce"}
    if "ep" in sizes:
        assert "all-to-all" in {k for k, _ in held}  # GShard's dispatch: the experts' all-to-alls are there
    if model is GPT2:  # the q / k / v reshard: permutes forward and in the recompute, all-to-alls backward
        assert {k for k, _ in held} >= {"collective-permute", "all-to-all"}
    for kind, ratio in held:
        assert 0.9 <= ratio <= 1.1, (kind, ratio, table)
