"""The schedule reader on real compiled programs (the fixtures) and on small hand-written ones."""

from __future__ import annotations

import collections
import gzip
import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.xla._schedule import read_schedule
from meshplan.pure.xla._schedule_records import OP_KINDS, ScheduledProgram

DATA = pathlib.Path(__file__).parent / "data" / "hlo"
FIXTURES = sorted(p.name.removesuffix(".hlo.gz") for p in DATA.glob("*.hlo.gz"))
COSTS = json.loads((DATA / "cost_analysis.json").read_text())


def fixture(name: str) -> str:
    return gzip.decompress((DATA / f"{name}.hlo.gz").read_bytes()).decode()


PROGRAMS = {name: read_schedule(fixture(name)) for name in FIXTURES}


def test_the_fixtures_cover_every_compiler() -> None:
    assert {n.split("_")[0] for n in FIXTURES} == {"cpu", "gpu", "tpu"}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_op_is_read_and_every_done_has_its_start_before_it(name: str) -> None:
    program = PROGRAMS[name]
    assert program.computations[0].name == program.entry
    for comp in program.computations:
        started: set[str] = set()
        for op in comp.ops:
            assert op.kind in OP_KINDS
            assert op.kind != "unknown", op
            if op.kind in ("collective-start", "collective", "copy-start") or (op.opcode == "recv"):
                started.add(op.pair)
            if op.kind in ("collective-done", "copy-done"):
                assert op.pair in started, (comp.name, op.name)
    assert program.notes == ()


@pytest.mark.parametrize("name", [n for n in FIXTURES if COSTS[n].get("flops")])
def test_flops_agree_with_xla_cost_analysis_of_the_same_program(name: str) -> None:
    # XLA counts each loop body once, and counts elementwise work one FLOP per element: so does the reader
    # with loops_once, its matmul and other FLOPs together.
    totals = PROGRAMS[name].totals(loops_once=True)
    assert totals.flops + totals.other_flops == pytest.approx(COSTS[name]["flops"], rel=0.01)
    assert totals.flops <= COSTS[name]["flops"]


def test_the_same_step_compiled_for_gpu_and_tpu_has_the_same_matmul_flops() -> None:
    gpu, tpu = PROGRAMS["gpu_h100_fsdp4_tp2"].totals(), PROGRAMS["tpu_v5e8_fsdp4_tp2"].totals()
    assert gpu.flops == pytest.approx(tpu.flops, rel=1e-3)
    assert gpu.flops > 2 * PROGRAMS["gpu_h100_fsdp4_tp2"].totals(loops_once=True).flops * 0.9  # 2 layers, scanned


def _collectives(program: ScheduledProgram) -> list:
    return [op.collective for c in program.computations for op in c.ops
            if op.collective is not None and op.kind in ("collective", "collective-start")]


def test_gpu_groups_cross_nodes_only_for_the_data_parallel_axis() -> None:
    colls = _collectives(PROGRAMS["gpu_2x8_dp2_fsdp8"])
    assert {c.group_size for c in colls} == {2, 8, 16}
    for c in colls:
        nodes = [{d // 8 for d in g} for g in c.groups]
        if c.group_size == 8:  # fsdp: inside one node
            assert all(len(n) == 1 for n in nodes)
        elif c.group_size == 2:  # dp: one device of each node
            assert all(n == {0, 1} for n in nodes)


def test_gpu_sync_starts_and_async_pairs() -> None:
    ops = [op for c in PROGRAMS["gpu_h100_fsdp4_tp2"].computations for op in c.ops]
    kinds = collections.Counter(op.kind for op in ops)
    assert kinds["collective"] > 0 and kinds["collective-start"] > 0
    assert kinds["collective-done"] == kinds["collective"] + kinds["collective-start"]
    assert {c.kind for c in _collectives(PROGRAMS["gpu_h100_fsdp4_tp2"])} >= {
        "all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute"}


def test_cudnn_fused_attention_is_priced_from_its_shapes() -> None:
    attention = [op for c in PROGRAMS["gpu_h100_single_flash"].computations for op in c.ops if op.kind == "attention"]
    # batch 4, 4 heads, 256 x 256 causal scores, head dim 64: forward Q K^T and P V, backward five products.
    fwd, bwd = 2 * 4 * 4 * 256 * 256 * (64 + 64) // 2, 2 * 4 * 4 * 256 * 256 * (3 * 64 + 2 * 64) // 2
    assert sorted(op.flops for op in attention) == [fwd, fwd, bwd]


def test_tpu_chains_start_and_finish_in_one_computation() -> None:
    for comp in PROGRAMS["tpu_v5e8_fsdp4_tp2"].computations:
        order = [(op.kind, op.pair) for op in comp.ops if op.pair.startswith("chain:")]
        starts = [p for k, p in order if k == "collective-start"]
        dones = [p for k, p in order if k == "collective-done"]
        assert sorted(starts) == sorted(dones)
        for p in starts:
            assert order.index(("collective-start", p)) < order.index(("collective-done", p))


def test_tpu_multislice_all_reduces_are_network_collectives() -> None:
    network = [c for c in _collectives(PROGRAMS["tpu_2xv5e4_dp2_fsdp4"]) if c.network]
    assert network and {c.kind for c in network} == {"all-reduce"}
    assert all(c.nbytes > 0 and c.group_size == 0 for c in network)


def _module(body: str, params: str = "") -> str:
    return f"HloModule m, is_scheduled=true, num_partitions=1\n{params}\nENTRY %main () -> f32[] {{\n{body}\n}}"


def test_cublas_calls_are_priced_from_their_operands_and_dimension_numbers() -> None:
    text = _module("""  %a = bf16[4,64,128]{2,1,0} parameter(0)
  %b = bf16[4,128,32]{2,1,0} parameter(1)
  %g = (bf16[4,64,32]{2,1,0}, s8[1024]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  %d = bf16[4,64,32]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %t = (bf16[4,64,32]{2,1,0}, bf16[4,64,32]{2,1,0}) tuple(%g, %d)""")
    ops = {op.name: op for op in read_schedule(text).computations[0].ops}
    assert ops["g"].kind == ops["d"].kind == "matmul"
    assert ops["g"].flops == ops["d"].flops == 2 * 4 * 64 * 32 * 128


def test_a_scan_over_stacked_weights_reads_one_slice_per_trip() -> None:
    fused = """%slice_it (p0: bf16[32,1024,1024], p1: s32[]) -> bf16[1,1024,1024] {
  %p0 = bf16[32,1024,1024]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = bf16[1,1024,1024]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,1024,1024}
}
%update_it (q0: bf16[32,1024,1024], q1: bf16[1,1024,1024], q2: s32[]) -> bf16[32,1024,1024] {
  %q0 = bf16[32,1024,1024]{2,1,0} parameter(0)
  %q1 = bf16[1,1024,1024]{2,1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %z2 = s32[] constant(0)
  %n = bf16[1,1024,1024]{2,1,0} negate(%q1)
  %v = bf16[32,1024,1024]{2,1,0} bitcast(%q0)
  ROOT %dus = bf16[32,1024,1024]{2,1,0} dynamic-update-slice(%v, %n, %q2, %z2, %z2)
}"""
    text = _module("""  %w = bf16[32,1024,1024]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %s = bf16[1,1024,1024]{2,1,0} fusion(%w, %i), kind=kLoop, calls=%slice_it
  ROOT %u = bf16[32,1024,1024]{2,1,0} fusion(%w, %s, %i), kind=kLoop, calls=%update_it""", fused)
    ops = {op.name: op for op in read_schedule(text).computations[0].ops}
    layer = 2 * 1024 * 1024
    assert (ops["s"].bytes_read, ops["s"].bytes_written) == (layer + 4, layer)  # the slice and its index
    assert (ops["u"].bytes_read, ops["u"].bytes_written) == (layer + 4, layer)  # the update and the index
    assert ops["s"].kind == ops["u"].kind == "memory"


def test_what_the_reader_does_not_know_is_said_not_dropped() -> None:
    text = _module("""  %a = f32[1024]{0} parameter(0)
  %c = f32[1024]{0} custom-call(%a), custom_call_target="my_kernel"
  %x = f32[1024]{0} frobnicate(%c)
  ROOT %w = f32[1024]{0} while(%x), condition=%nowhere, body=%nobody""")
    program = read_schedule(text)
    ops = {op.name: op for op in program.computations[0].ops}
    assert ops["c"].kind == ops["x"].kind == "unknown"
    assert ops["c"].bytes_accessed == ops["x"].bytes_accessed == 8192
    assert ops["w"].kind == "loop" and ops["w"].trips == 1
    notes = " ".join(program.notes)
    assert "unknown custom call my_kernel" in notes and "unknown opcode frobnicate" in notes
    assert "trip count not stated" in notes
    assert program.totals().unknown_ops == 2


@settings(max_examples=30)
@given(st.sampled_from(FIXTURES), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_cut_fixture_reads_without_an_exception(name: str, a: float, b: float) -> None:
    text = fixture(name)
    lo, hi = sorted((int(a * len(text)), int(b * len(text))))
    program = read_schedule(text[:lo] + text[hi:])
    program.totals()


@given(st.text(max_size=300))
def test_any_text_reads_without_an_exception(text: str) -> None:
    read_schedule(text).totals()


def test_a_non_string_is_a_typed_error_and_an_unknown_computation_is_named() -> None:
    with pytest.raises(MeshplanTypeError, match="HLO module's text"):
        read_schedule(None)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError, match="not a stream computation"):
        PROGRAMS["cpu_fsdp2_tp4"].computation("fused_computation")


def test_an_async_wrapped_reduce_scatter_pairs_its_start_and_done() -> None:
    text = """HloModule m, is_scheduled=true, num_partitions=4
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}
%wrapped (w: f32[64,8]) -> f32[16,8] {
  %w = f32[64,8]{1,0} parameter(0)
  ROOT %rs = f32[16,8]{1,0} reduce-scatter(%w), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
}
ENTRY %main (p: f32[64,8]) -> f32[16,8] {
  %p = f32[64,8]{1,0} parameter(0)
  %st = ((f32[64,8]{1,0}), f32[16,8]{1,0}) async-start(%p), calls=%wrapped
  %up = ((f32[64,8]{1,0}), f32[16,8]{1,0}) async-update(%st)
  ROOT %dn = f32[16,8]{1,0} async-done(%up)
}"""
    ops = read_schedule(text).computation("main").ops
    assert [(op.kind, op.pair) for op in ops] == [("free", ""), ("collective-start", "st"), ("free", ""),
                                                  ("collective-done", "st")]
    coll = ops[1].collective
    assert coll is not None and (coll.kind, coll.nbytes, coll.group_size, coll.groups) == (
        "reduce-scatter", 64 * 8 * 4, 4, ((0, 1, 2, 3),))


def test_a_conditional_names_its_branches_and_totals_count_the_costlier() -> None:
    text = """HloModule m, is_scheduled=true
%big (a: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  ROOT %d = f32[64,64]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
%small (b: f32[64,64]) -> f32[64,64] {
  ROOT %b = f32[64,64]{1,0} parameter(0)
}
ENTRY %main (i: s32[], x: f32[64,64]) -> f32[64,64] {
  %i = s32[] parameter(0)
  %x = f32[64,64]{1,0} parameter(1)
  ROOT %c = f32[64,64]{1,0} conditional(%i, %x, %x), branch_computations={%big, %small}
}"""
    program = read_schedule(text)
    cond = program.computation("main").ops[-1]
    assert cond.kind == "conditional" and cond.callees == ("big", "small")
    assert program.totals().flops == 2 * 64 * 64 * 64
