"""XLA:GPU's collectives under tp: the comm model (backend ``gpu``) against HLO compiled for 1x8xH200.

No GPU is needed: the compiled bytes below were recorded on a lent H200 (``meshplan.gpu_topology_mesh``
compiles for a whole 1x8xH200 cluster from one of its GPUs; ``benchmarks/bench_collectives.py --gpu
1x8xH200`` and ``--gpu-large``, ratios in benchmarks/RESULTS.md; how read: docs/design-notes.md). The tp rules
were read from the optimized HLO of Llama (hidden 1024) fsdp=2 x tp=4 and tp=8 (and the remat-none rule
from dp=2 x tp=4); every other Llama / Mixtral tp row below is held out. MLA's rule was read from
DeepSeek (hidden 128) dp=2 x tp=4's HLO (remat full; remat none's expert sums from its totals);
fsdp=2 x tp=4 and tp=8 are held out. sp's fp32 dK sum was read from llama fsdp=2 x sp=4 (in-sample: the
only sp row).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import get_preset, parse_cluster
from meshplan.pure.presets import MODEL_SPECS, MLADims
from meshplan.pure.cost import TrainingRecipe, xla_collectives
from meshplan.pure.search import search_meshes
from meshplan.pure.xla import collective_shares, collective_totals, ratio_table
from meshplan.pure.cost._activation_collectives import activation_terms
from meshplan.pure.cost._placement import AxisPlacement

MINOR = 0.02  # kinds under 2% of the step's compiled and priced bytes are not checked (as in bench_collectives)


def _model(size: str, family: str) -> object:
    """bench_collectives' models: ``tiny`` (hidden 128, 16 x 512) and ``large`` (hidden 1024, 16 x 2048)."""
    h, kv = (128, 4) if size == "tiny" else (1024, 4)
    kv = 8 if family == "llama-kv8" else kv
    if family == "deepseek":  # one dense layer and one MoE layer, MLA attention
        return dataclasses.replace(MODEL_SPECS["deepseek-v3"], name="d", num_layers=2, hidden_size=128, num_heads=8,
                                   num_kv_heads=8, head_dim=16, intermediate_size=256, moe_intermediate_size=64,
                                   num_experts=8, num_experts_per_tok=2, num_shared_experts=1, num_dense_layers=1,
                                   vocab_size=512, num_params=None,
                                   mla=MLADims(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16,
                                               qk_rope_head_dim=8, v_head_dim=16))
    if family == "mixtral":
        return dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="m", num_layers=2, hidden_size=h, num_heads=8,
                                   num_kv_heads=4, head_dim=h // 8, intermediate_size=h if h > 128 else 256,
                                   moe_intermediate_size=h if h > 128 else 256,
                                   vocab_size=512 if h == 128 else 8192, num_params=None)
    return dataclasses.replace(MODEL_SPECS["llama3-8b"], name="l", num_layers=2, hidden_size=h, num_heads=8,
                               num_kv_heads=kv, head_dim=h // 8, intermediate_size=256 if h == 128 else 4096,
                               vocab_size=512 if h == 128 else 8192, num_params=None)


# Compiled bytes per device per step, per kind (bench_collectives' GPU output, 2026-11-23).
COMPILED = {
    ("large", "llama fsdp=8"): {"all-gather": 176_179_200, "reduce-scatter": 113_266_688, "all-reduce": 4},
    ("large", "llama fsdp=2,tp=4"): {"all-gather": 878_842_880, "reduce-scatter": 429_916_160,
                                     "all-reduce": 35_722_244, "all-to-all": 1_572_864,
                                     "collective-permute": 8_990_720},
    ("large", "mixtral fsdp=2,ep=4"): {"all-gather": 125_945_856, "reduce-scatter": 88_166_400,
                                       "all-reduce": 31_500_292, "all-to-all": 251_658_240},
    ("large", "llama fsdp=4,tp=2"): {"all-gather": 499_328_000, "reduce-scatter": 270_532_608,
                                     "all-reduce": 4_761_604, "all-to-all": 8_388_608,
                                     "collective-permute": 9_477_120},
    ("large", "llama dp=2,tp=4 none"): {"all-gather": 696_305_664, "reduce-scatter": 369_098_752,
                                        "all-reduce": 29_168_644},
    ("large", "llama dp=2,fsdp=2,tp=2"): {"all-gather": 473_956_352, "reduce-scatter": 257_949_696,
                                          "all-reduce": 28_878_852, "collective-permute": 6_305_792},
    ("large", "mixtral ep=4,tp=2"): {"all-gather": 549_668_864, "reduce-scatter": 150_994_944,
                                     "all-reduce": 284_764_164, "all-to-all": 503_316_480},
    ("large", "llama tp=8"): {"all-gather": 1_228_982_272, "reduce-scatter": 872_415_232,
                              "all-reduce": 186_777_600, "all-to-all": 2_621_440},
    ("tiny", "llama dp=2,tp=4"): {"all-gather": 25_434_368, "reduce-scatter": 13_631_488, "all-reduce": 524_932},
    ("tiny", "llama dp=2,tp=4 none"): {"all-gather": 21_240_064, "reduce-scatter": 11_534_336,
                                       "all-reduce": 459_396},
    ("tiny", "llama fsdp=2,tp=4"): {"all-gather": 26_614_016, "reduce-scatter": 12_812_288,
                                    "all-reduce": 1_343_810, "all-to-all": 24_576, "collective-permute": 286_720},
    ("tiny", "llama dp=2,fsdp=2,tp=2"): {"all-gather": 12_851_456, "reduce-scatter": 6_782_976,
                                         "all-reduce": 385_666, "collective-permute": 65_536},
    ("tiny", "llama tp=8"): {"all-gather": 38_082_816, "reduce-scatter": 27_262_976, "all-reduce": 6_324_224,
                             "all-to-all": 24_576},
    ("tiny", "llama-kv8 tp=8"): {"all-gather": 33_560_832, "reduce-scatter": 27_262_976, "all-reduce": 557_056,
                                 "all-to-all": 24_576},
    ("tiny", "mixtral ep=4,tp=2"): {"all-gather": 17_590_528, "reduce-scatter": 4_718_592,
                                    "all-reduce": 8_566_020, "all-to-all": 15_728_640},
    ("tiny", "llama dp=2,tp=4 mb=2"): {"all-gather": 25_696_512, "reduce-scatter": 13_631_488,
                                       "all-reduce": 590_472, "all-to-all": 32_768},
    ("tiny", "llama fsdp=2,tp=4 mb=2"): {"all-gather": 26_974_464, "reduce-scatter": 13_041_664,
                                         "all-reduce": 1_360_200, "all-to-all": 81_920,
                                         "collective-permute": 294_912},
    ("tiny", "llama fsdp=2,sp=4"): {"all-gather": 5_767_168, "reduce-scatter": 4_128_768, "all-reduce": 492_802},
    ("tiny", "deepseek dp=2,tp=4"): {"all-gather": 25_579_776, "reduce-scatter": 16_777_216, "all-reduce": 8_584_580},
    ("tiny", "deepseek dp=2,tp=4 none"): {"all-gather": 20_599_040, "reduce-scatter": 12_058_624,
                                          "all-reduce": 6_684_036},
    ("tiny", "deepseek fsdp=2,tp=4"): {"all-gather": 26_739_968, "reduce-scatter": 16_023_552,
                                       "all-reduce": 9_338_244, "collective-permute": 321_536},
    ("tiny", "deepseek tp=8"): {"all-gather": 36_983_040, "reduce-scatter": 33_554_432, "all-reduce": 16_547_840,
                                "all-to-all": 16_384},
    ("tiny", "deepseek tp=8 none"): {"all-gather": 27_545_856, "reduce-scatter": 24_117_248,
                                     "all-reduce": 12_746_752, "all-to-all": 16_384},
}


# Known misses (strict: a fix must say so here). Session 6 exposed one: Llama fsdp=4 x tp=2's all-reduce priced at
# 3.6x what XLA emits, the vocab-split lookup's sum; session 7 read on XLA:TPU that with the table split over fsdp
# wider than over tp the sum is a reduce-scatter, and XLA:GPU, which lowers tp as XLA:TPU does, agrees (this case
# then passes: held out for XLA:GPU).
_KNOWN_MISSES: set[tuple[str, str]] = set()


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(
    strict=True, reason="all-reduce priced 3.6x XLA's (the vocab-split lookup's sum)"))
    if c in _KNOWN_MISSES else c for c in COMPILED], ids=lambda c: f"{c[0]}-{c[1].replace(' ', '-')}")
def test_every_major_kind_is_within_10_percent_of_xla_gpu(case: tuple[str, str]) -> None:
    size, name = case
    family, mesh, *rest = name.split(" ")
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in mesh.split(","))}
    mb = int(rest[-1][3:]) if rest and rest[-1].startswith("mb=") else 1
    batch, seq = (16, 512) if size == "tiny" else (16, 2048)
    recipe = TrainingRecipe(backend="gpu", remat="none" if "none" in rest else "full", micro_batches=mb)
    best = search_meshes(_model(size, family), "1x8xH100", axes=tuple(sizes), fixed=sizes, batch=batch, seq=seq,
                         recipe=recipe).best
    analytic = collective_totals(xla_collectives(best.comm, backend="gpu", itemsize=2, micro_batches=mb))
    compiled = COMPILED[case]
    # A kind is held to 10% when it is major in the compiled program *or* in the model: a kind the model
    # prices and XLA never emits must fail, not pass as minor (the recorded totals keep bytes, not calls).
    table = ratio_table(analytic, {kind: (nbytes, 0) for kind, nbytes in compiled.items()})
    shares = collective_shares(table)
    for kind, priced, nbytes, _ in table:
        if shares[kind] >= MINOR:
            assert priced == pytest.approx(nbytes, rel=0.1), (kind, analytic, compiled)


@given(st.sampled_from(("llama3-8b", "llama3-70b", "mixtral-8x7b", "gpt2")), st.sampled_from((2, 4, 8)),
       st.sampled_from((1, 2)), st.sampled_from(("none", "full")), st.booleans())
def test_xla_gpu_is_xla_tpu_but_for_the_gathers_the_narrow_sums_and_the_row_statistics(
        name: str, tp: int, dp: int, remat: str, split: bool) -> None:
    model = get_preset(name).spec
    sizes = {"dp": dp, "tp": tp}
    p = AxisPlacement(("dp", "tp"), (dp, tp), (1, 1), parse_cluster("2x8xH100"))

    def terms(backend: str) -> list:
        return activation_terms(model, sizes, p, batch=16, seq=1024, itemsize=2, remat=remat, residual_split=split,
                                backend=backend)

    gpu, tpu = terms("gpu"), terms("tpu")
    b, s, h, L = 16 // dp, 1024, model.hidden_size, model.num_layers
    x, r, alone, vocab = b * s * h * 2, 1 if remat == "full" else 0, dp == 1, model.vocab_size % tp == 0
    assert not any("XLA:TPU" in t.what or "XLA:CPU" in t.what for t in gpu)
    stats = [t for t in gpu if "row statistics" in t.what]
    if split and h % tp == 0:
        # Each RMSNorm's mean of squares (2 per layer + the final norm; fwd, recompute, bwd) and the loss's
        # max, sum and gold logit over a vocab-split row: one fp32 value per token each.
        norms = 0 if model.family == "gpt2" else (4 + 2 * r) * L + 2
        assert [(t.kind, t.nbytes, t.calls) for t in stats] == ([("all-reduce", b * s * 4, norms + 3 * vocab)]
                                                       if norms + 3 * vocab else [])
    else:
        assert stats == []
    # Apart from those, XLA:GPU's terms are XLA:TPU's with the same bytes per call, except: the residual
    # stream's gathers (none fewer per step under a recompute; with tp alone 3 fewer per layer and not the
    # embedding's output gradient), K and V gradients gathered only with GQA, the sums of a shard narrower
    # than 256 kept as reduce-scatters (XLA:TPU all-reduces them), and without a recompute the experts'
    # forward sum an all-reduce (a reduce-scatter on XLA:TPU): sums are compared whatever their kind.
    def table(ts: list) -> dict:
        out: dict = {}
        for t in ts:
            if "row statistics" in t.what or "K and V gradients" in t.what:
                continue
            if "fused qkv" in t.what:  # GPT-2's c_attn reshard: read on XLA:TPU, XLA:GPU not compiled
                assert model.family == "gpt2" and t in tpu
                continue
            kind = "sum" if t.kind in ("all-reduce", "reduce-scatter") else t.kind
            out[(kind, t.nbytes)] = out.get((kind, t.nbytes), 0) + t.calls
        return out

    g, t = table(gpu), table(tpu)
    if split and tp > 1:
        dense = L - model.num_moe_layers
        extra = (1 if r and dense else 0) - (3 * dense + vocab if alone else 0)
        assert g.pop(("all-gather", x)) - t.pop(("all-gather", x)) == extra
    assert g == t
    gqa = model.num_kv_heads < model.num_heads
    assert any("K and V gradients" in t.what for t in gpu) <= gqa
