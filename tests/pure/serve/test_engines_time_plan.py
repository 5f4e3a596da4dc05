"""The engines' reserve rules, the serving time model and the plan built from them."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.cluster import parse_cluster
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.serve import (
    SERVE_CALIBRATION,
    CacheFormat,
    ServeLayout,
    check_context,
    decode_step_time,
    engine,
    engine_cache_format,
    kv_budget,
    kv_geometry,
    plan_serving,
    prefill_time,
    serve_model,
    sglang_mem_fraction_static,
    weight_bytes,
)

H100 = parse_cluster("1x8xH100")


def test_sglang_default_fraction_is_its_formula() -> None:
    # SGLang's memory_hook.py: H100 as CUDA reports it (81559 MiB), tp 2: 512 + 1.5 x 8192 + 2/8 GiB + 256 x 2
    # + 58 prefill graphs x 8 = 14032 MB reserved. sgl-project/sglang issue #29092 saw 0.828 on an H100.
    assert sglang_mem_fraction_static(81559 * 2**20, tp=2) == 0.828
    # A device under 60 GiB keeps no 10 GiB floor; over it, the floor holds.
    # 24 GiB: chunked prefill 4096, max batch 48, 50 prefill graph sizes up to 4096 x 8 MB, no floor.
    assert sglang_mem_fraction_static(24 * 2**30, tp=1) == round(
        (24 * 1024 - (512 + 4096 * 1.5 + 1024 / 8 + 48 * 2 + 50 * 8)) / (24 * 1024), 3)
    # 192 GiB, tp 8 with DP attention over 8: chunk 16384, max batch 512, 74 prefill sizes, the DP padding terms.
    assert sglang_mem_fraction_static(192 * 2**30, tp=8, dp=8) == round(
        (192 * 1024 - (512 + 16384 * 1.5 + 1024 + 512 * 2 + 512 * 8 * 3 + 512 * 8 * 1.5 + 74 * 8)) / (192 * 1024), 3)
    # MLA replaces the prefill graphs' count with SGLang's flat 1.5 GiB.
    assert sglang_mem_fraction_static(81559 * 2**20, tp=8, mla=True) == round(
        (81559 - (512 + 8192 * 1.5 + 1024 + 512 * 2 + 1536)) / 81559, 3)


def test_each_engine_leaves_the_kv_cache_what_its_rule_says() -> None:
    spec, layout = MODEL_SPECS["llama3-70b"], ServeLayout(1, 8)
    w = weight_bytes(spec, layout)
    hbm = H100.device.hbm_bytes
    vllm = kv_budget(engine("vllm"), H100, spec, layout, w)
    assert vllm.kv_bytes == int(0.9 * hbm) - w.total - vllm.reserved_bytes and vllm.reserved_estimated
    sg = kv_budget(engine("sglang"), H100, spec, layout, w)
    assert sg.kv_bytes == int(sg.fraction * hbm) - w.total and sg.fraction == sglang_mem_fraction_static(hbm, tp=8)
    tpu = parse_cluster("v5p-16")
    vt = kv_budget(engine("vllm-tpu"), tpu, spec, layout, w)
    assert vt.kv_bytes == int(0.9 * tpu.device.hbm_bytes) - w.total and vt.reserved_bytes == 0
    assert kv_budget(engine("vllm"), H100, spec, layout, w, fraction=0.5).fraction == 0.5
    with pytest.raises(PlanError, match=r"\(0, 1\]"):
        kv_budget(engine("vllm"), H100, spec, layout, w, fraction=1.5)


def test_engine_cache_formats_follow_the_engines() -> None:
    v5e = parse_cluster("v5e-8")
    ds, llama = MODEL_SPECS["deepseek-v3"], MODEL_SPECS["llama3-8b"]
    assert engine_cache_format(engine("vllm"), ds, H100, context=4096).page_size == 64  # FlashMLA on Hopper
    assert engine_cache_format(engine("vllm"), llama, H100, context=4096).page_size == 16
    assert engine_cache_format(engine("sglang"), llama, H100, context=4096).page_size == 1
    assert engine_cache_format(engine("vllm-tpu"), llama, v5e, context=32768).page_size == 64  # SMEM minimum
    assert engine_cache_format(engine("vllm-tpu"), llama, v5e, context=4096).page_size == 256
    assert engine_cache_format(engine("vllm-tpu"), ds, v5e, context=4096).page_size == 512
    mt = engine_cache_format(engine("jetstream"), ds, v5e, context=4096)
    assert (mt.layout, mt.mla, mt.scales) == ("contiguous", "heads", "token")


@pytest.mark.parametrize("call,match", [
    (lambda: engine("tgi"), "valid: \\['vllm', 'sglang', 'maxtext', 'vllm-tpu'\\]"),
    (lambda: plan_serving("llama3.1-8b", "v5e-8", context=4096, engine_name="vllm"), "does not run on v5e-8"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, engine_name="vllm-tpu"), "does not run on"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, kv_dtype="int8"), "does not cache in int8"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, kv_dtype="fp4"), "not a dtype meshplan serves"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, weight_dtype="int4"), "valid: \\['bfloat16'"),
    (lambda: plan_serving("llama3-70b", "H100", context=32768), "8192 positions.*--allow-long-context.*llama3.1-70b"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, concurrency=0), "concurrency=0 must be >= 1"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, concurrency=-3), "concurrency=-3"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, prompt_tokens=5000), "longer than context"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=0), "context=0"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, layouts=[ServeLayout(1, 3)]),
     "tp=3 does not divide the 32 attention heads"),
    (lambda: plan_serving("llama3.1-8b", "H100", context=4096, max_tpot_s=-1.0), "max_tpot_s=-1.0"),
    (lambda: plan_serving("gpt2", "H100", context=512), "families"),
    (lambda: plan_serving("no-such-model", "H100", context=512), "known presets.*llama3.1-70b"),
])
def test_bad_requests_are_typed_errors_naming_the_value_and_what_is_valid(call, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError, match=match):
        call()


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(MeshplanTypeError):
        plan_serving(42, "H100", context=512)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError):
        plan_serving("llama3.1-8b", "H100", context=2.5)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError):
        engine(None)


def test_a_long_context_is_allowed_when_asked() -> None:
    assert check_context(MODEL_SPECS["llama3-70b"], 32768, 8192, allow_long=True) == 32768
    assert plan_serving("llama3-70b", "H100", context=32768, allow_long_context=True).rows


def _parts(name: str = "llama3-8b", tp: int = 1) -> tuple:  # type: ignore[type-arg]
    spec, layout = MODEL_SPECS[name], ServeLayout(8 // tp, tp)
    return spec, layout, weight_bytes(spec, layout), kv_geometry(spec, layout, "bfloat16", CacheFormat())


@given(st.integers(1, 2048), st.integers(1, 2048), st.integers(1, 100_000))
def test_a_decode_step_never_shrinks_with_more_sequences_or_context(s: int, extra: int, context: int) -> None:
    spec, layout, w, kv = _parts("mixtral-8x7b", 2)
    a = decode_step_time(spec, H100, layout, w, kv, sequences=s, context=context).seconds
    b = decode_step_time(spec, H100, layout, w, kv, sequences=s + extra, context=context).seconds
    c = decode_step_time(spec, H100, layout, w, kv, sequences=s, context=context + extra).seconds
    assert a <= b and a <= c


@given(st.integers(1, 4096), st.integers(1, 32768))
def test_a_decode_step_is_at_least_its_reads_at_the_bandwidth_and_stated_with_the_range(s: int, ctx: int) -> None:
    spec, layout, w, kv = _parts()
    t = decode_step_time(spec, H100, layout, w, kv, sequences=s, context=ctx)
    floor = (w.dense + kv.read_bytes(s, ctx)) / H100.device.hbm_bandwidth
    assert t.seconds >= floor
    assert t.low == pytest.approx(SERVE_CALIBRATION.low * t.seconds)
    assert t.high == pytest.approx(SERVE_CALIBRATION.high * t.seconds)
    assert t.bound in ("memory", "compute", "latency")


def test_the_bound_moves_from_memory_to_compute_as_the_batch_grows() -> None:
    spec, layout, w, kv = _parts()
    assert decode_step_time(spec, H100, layout, w, kv, sequences=1, context=128).bound == "memory"
    assert decode_step_time(spec, H100, layout, w, kv, sequences=4096, context=16).bound == "compute"
    one_per = decode_step_time(spec, H100, layout, w, kv, sequences=1, context=128).seconds
    many = decode_step_time(spec, H100, layout, w, kv, sequences=64, context=128).seconds
    assert many < 64 * one_per  # batching shares the weight reads


def test_prefill_is_compute_bound_and_grows_with_the_prompt() -> None:
    spec, layout, w, _ = _parts("llama3-70b", 8)
    short = prefill_time(spec, H100, layout, w, tokens=512)
    long = prefill_time(spec, H100, layout, w, tokens=32768)
    assert long.bound == "compute" and long.seconds > 50 * short.seconds
    # 2 x params x tokens of matmuls at the calibrated share of the peak, plus causal attention: the floor
    assert long.compute_s >= 2 * 70.5e9 * 32768 / 8 / (989e12 * SERVE_CALIBRATION.matmul_efficiency) * 0.99


def test_the_done_when_request_answers_with_every_json_field() -> None:
    plan = plan_serving("llama3.1-70b", "1x8xH100", context=32768)
    doc = json.loads(plan.to_json())
    need = {"mesh": str, "fits": bool, "weight_bytes_per_device": int, "kv_bytes_per_token_per_device": int,
            "kv_capacity_tokens": int, "max_sequences": int, "decode_step_s": float, "prefill_s": float,
            "tokens_per_s_per_device": float}
    fitting = [row for row in doc["layouts"] if row["fits"]]
    assert fitting and doc["best"] == fitting[0]["mesh"]
    for row in fitting:
        for key, kind in need.items():
            assert isinstance(row[key], kind), (key, row[key])
    assert doc["layouts"][0]["command"][0].startswith("vllm serve meta-llama/Llama-3.1-70B")


def test_ranked_rows_that_meet_the_limits_come_first_by_throughput_per_device() -> None:
    plan = plan_serving("mixtral-8x7b", "1x8xH100", context=8192, concurrency=64)
    good = [r for r in plan.rows if r.meets_limits]
    assert good and all(a.tokens_per_s_per_device >= b.tokens_per_s_per_device for a, b in zip(good, good[1:]))
    assert plan.rows[: len(good)] == tuple(good)
    assert any(r.layout.ep > 1 for r in plan.rows)


def test_concurrency_is_split_over_the_replicas() -> None:
    plan = plan_serving("llama3.1-8b", "1x8xH100", context=4096, concurrency=100)
    for row in plan.rows:
        if row.fits:
            assert row.sequences == math.ceil(100 / row.layout.replicas)


def test_a_tpot_limit_lowers_the_sequences_and_a_ttft_limit_marks_the_row() -> None:
    free = plan_serving("llama3.1-70b", "1x8xH100", context=8192).best
    assert free is not None
    limit = free.decode.seconds * 0.6
    capped = plan_serving("llama3.1-70b", "1x8xH100", context=8192, max_tpot_s=limit)
    assert capped.best is not None and capped.best.sequences < free.sequences
    assert capped.best.decode.seconds <= limit
    slow = plan_serving("llama3.1-70b", "1x8xH100", context=8192, max_ttft_s=1e-4)
    assert slow.best is None and all("time-to-first-token" in r.why for r in slow.rows if r.fits)


def test_does_not_fit_is_an_answer_with_what_would_fit() -> None:
    plan = plan_serving("llama3.1-70b", "1x8xH100", context=131072, concurrency=64)
    assert plan.best is None
    assert "at most" in plan.answer
    row = next(r for r in plan.rows if r.budget.kv_bytes > 0)
    assert row.max_sequences < 64 and 0 < row.max_context < 131072
    assert row.kv.cache_bytes(64, row.max_context) <= row.budget.kv_bytes
    weights_only = plan_serving("llama3.1-405b", "1x8xH100", context=4096, concurrency=1)
    assert weights_only.best is None and "weights alone" in weights_only.answer


def test_serving_names_carry_the_positions_of_their_config() -> None:
    spec, positions = serve_model("llama3.1-70b")
    assert spec.hidden_size == 8192 and positions == 131072
    assert plan_serving(spec, "1x8xH100", context=4096).request.positions == 131072


@given(st.sampled_from(["llama3.1-8b", "mixtral-8x7b", "deepseek-v2-lite", "gemma3-27b"]),
       st.sampled_from(["1x8xH100", "2xH200", "v5e-8", "1x4xA100-80GB"]), st.integers(1, 200_000),
       st.one_of(st.none(), st.integers(1, 5000)), st.sampled_from(["bfloat16", "float8"]))
def test_every_row_that_fits_holds_its_sequences_in_the_engines_budget(model: str, cluster: str, context: int,
                                                                     concurrency: int | None, kv: str) -> None:
    try:
        plan = plan_serving(model, cluster, context=context, concurrency=concurrency, kv_dtype=kv,
                            allow_long_context=True)
    except PlanError as err:  # an engine that does not cache in the dtype: the only refusal these requests get
        assert "does not cache in" in str(err)
        return
    for row in plan.rows:
        if row.fits:
            assert 1 <= row.sequences <= row.max_sequences
            assert row.kv.cache_bytes(row.sequences, context) <= row.budget.kv_bytes
            assert row.tokens_per_s_per_replica == pytest.approx(row.sequences / row.decode.seconds)
            assert concurrency is None or row.sequences == math.ceil(concurrency / row.layout.replicas)
        else:
            asked = 1 if concurrency is None else math.ceil(concurrency / row.layout.replicas)
            assert row.max_sequences < asked and row.why
    assert (plan.best is None) == (not any(r.meets_limits for r in plan.rows))
