"""Properties of the analytic step FLOPs (meshplan.pure.cost._flops).

Agreement with XLA's own count is in tests/facade/test_flops_vs_xla.py.
"""

import dataclasses
import math

import jax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import MODEL_SPECS, build_params
from meshplan.pure.cost._flops import (RECOMPUTE, default_efficiency, fsdp_read, layer_flops, step_flops,
                                         tp_replicated_splits)
from meshplan.testing import model_specs

ATTENTION = st.sampled_from(("plain", "dot_product", "flash"))
REMAT = st.sampled_from(tuple(RECOMPUTE))


@st.composite
def meshes_for(draw, spec):
    """Axis sizes for ``spec``: tp divides the heads, the rest are free."""
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if spec.num_heads % d == 0]))
    sizes = {a: draw(st.sampled_from((1, 2, 4))) for a in ("dp", "fsdp", "sp")}
    if spec.is_moe:
        sizes["ep"] = draw(st.sampled_from((1, 2)))
    return {**sizes, "tp": tp}


@st.composite
def cases(draw, family=None):
    spec = draw(model_specs(family=family))
    return spec, draw(meshes_for(spec)), draw(st.integers(1, 8)), draw(st.sampled_from((16, 32, 128)))


@given(cases(), REMAT, ATTENTION)
def test_linear_in_tokens(case, remat, attention):
    spec, sizes, b, s = case
    one = step_flops(spec, sizes, batch=b, seq=s, remat=remat, attention=attention)
    two = step_flops(spec, sizes, batch=3 * b, seq=s, remat=remat, attention=attention)
    for name in ("model", "recompute", "overhead", "layer_forward", "head"):
        assert getattr(two, name) == pytest.approx(3 * getattr(one, name), rel=1e-12), name
    # A device's matmuls scale with the tokens, except that more tokens can make XLA repeat a tp-replicated
    # matmul it split (MLA's down projections, the router: tp_replicated_splits), never the reverse; the
    # elementwise term scales only partly (the optimizer update does not).
    mm_one, mm_two = one.per_device - one.elementwise, two.per_device - two.elementwise
    assert mm_two >= 3 * mm_one * (1 - 1e-12)
    if sizes["tp"] == 1 or (spec.mla is None and not spec.is_moe):
        assert mm_two == pytest.approx(3 * mm_one, rel=1e-12)
    assert one.elementwise < two.elementwise < 3 * one.elementwise


@given(cases(), REMAT, ATTENTION)
def test_per_device_times_devices_covers_the_step(case, remat, attention):
    spec, sizes, b, s = case
    f = step_flops(spec, sizes, batch=b, seq=s, remat=remat, attention=attention)
    n = math.prod(sizes.values())
    assert f.per_device * n >= f.executed * (1 - 1e-12)
    if sizes["tp"] == 1:  # nothing is replicated without tp
        assert (f.per_device - f.elementwise) * n == pytest.approx(f.executed, rel=1e-12)
    # The per-layer split adds back up to the device's total.
    layers = spec.num_layers
    assert (f.layer_forward + f.layer_backward) * layers + f.head == pytest.approx(f.per_device, rel=1e-9)


@given(cases(), ATTENTION)
def test_remat_adds_the_layer_forward(case, attention):
    spec, sizes, b, s = case
    by = {r: step_flops(spec, sizes, batch=b, seq=s, remat=r, attention=attention) for r in RECOMPUTE}
    assert by["none"].per_device == by["dots"].per_device
    assert by["full"].per_device > by["none"].per_device
    assert by["full"].per_device == by["offload"].per_device
    # Model FLOPs (the MFU numerator) never count recompute.
    assert len({f.model for f in by.values()}) == 1
    # Recompute is one forward pass of the layers (a third of their model FLOPs) less each layer's
    # last matmul, whose output the backward never reads.
    forward = (by["full"].model - 6.0 * b * s * spec.vocab_size * spec.hidden_size) / 3
    kw = dict(batch=b, seq=s, attention=attention, tp=sizes["tp"])
    dense = layer_flops(spec, moe_layer=False, **kw)
    tails = (spec.num_layers - spec.num_moe_layers) * dense.tail
    if spec.num_moe_layers:
        moe = layer_flops(spec, moe_layer=True, **kw)
        tails += spec.num_moe_layers * (moe.tail - moe.einsum)
    assert 0 < by["full"].recompute <= forward
    assert by["full"].recompute == pytest.approx(forward - tails, rel=1e-9)


@given(model_specs(family=("mixtral", "deepseek_v3")), st.integers(1, 4), st.sampled_from((32, 64)))
def test_moe_counts_top_k_experts_only(spec, b, s):
    more = dataclasses.replace(spec, num_experts=spec.num_experts * 2, num_params=None)
    a = step_flops(spec, {}, batch=b, seq=s)
    c = step_flops(more, {}, batch=b, seq=s)
    # Only the router grows with the expert count (it scores every expert).
    router = 6.0 * b * s * spec.hidden_size * spec.num_experts * spec.num_moe_layers
    assert c.model - a.model == pytest.approx(router, rel=1e-9)
    # A token's active weights: top_k experts, however many exist.
    one = layer_flops(spec, moe_layer=True, batch=b, seq=s)
    expert = 3 * spec.hidden_size * spec.moe_intermediate_size
    active = expert * (spec.num_experts_per_tok + spec.num_shared_experts)
    assert one.weights >= 2.0 * b * s * active


@given(model_specs(family=("gpt2", "llama")), st.integers(1, 4), st.sampled_from((16, 64)))
def test_dense_weights_are_six_times_the_matmul_parameters(spec, b, s):
    """Agreement with the preset's parameter tree: every >= 2-d weight but the embeddings is a matmul."""
    tree = build_params(spec)
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    skip = ("embed_tokens", "wte", "wpe")
    matmul = sum(math.prod(x.shape) for p, x in leaves
                 if len(x.shape) >= 2 and not any(k in jax.tree_util.keystr(p) for k in skip))
    if "lm_head" not in str(tree.keys()):  # tied: the embedding is the head
        matmul += spec.vocab_size * spec.hidden_size
    f = step_flops(spec, {}, batch=b, seq=s, remat="none", attention="flash")
    attention = sum(3 * layer_flops(spec, moe_layer=False, batch=b, seq=s).attention for _ in range(spec.num_layers))
    assert f.model - attention == pytest.approx(6.0 * matmul * b * s, rel=1e-9)


@given(cases(), REMAT, ATTENTION)
def test_elementwise_is_executed_not_model_work(case, remat, attention):
    spec, sizes, b, s = case
    f = step_flops(spec, sizes, batch=b, seq=s, remat=remat, attention=attention)
    alone = step_flops(spec, {}, batch=b, seq=s, remat=remat, attention=attention)
    none = step_flops(spec, sizes, batch=b, seq=s, remat="none", attention=attention)
    assert f.elementwise > 0 and f.model == none.model  # never in the MFU numerator
    # Splitting over devices never adds elementwise work to one device; remat reruns the forward's share.
    assert f.elementwise <= alone.elementwise
    assert (f.elementwise > none.elementwise) == (RECOMPUTE[remat] > 0)
    # tp repeats the residual stream's work on its shards; fsdp of the same size splits it (and the optimizer too).
    if sizes["tp"] > 1:
        flat = {**sizes, "tp": 1, "fsdp": sizes["fsdp"] * sizes["tp"]}
        assert f.elementwise * math.prod(sizes.values()) > step_flops(
            spec, flat, batch=b, seq=s, remat=remat, attention=attention).elementwise * math.prod(flat.values())


@given(cases(), REMAT, ATTENTION)
def test_weight_matmuls_are_a_part_of_every_total_they_belong_to(case, remat, attention):
    spec, sizes, b, s = case
    f = step_flops(spec, sizes, batch=b, seq=s, remat=remat, attention=attention)
    assert 0 < f.weight_matmuls <= (f.per_device - f.head - f.elementwise) * (1 + 1e-12)
    assert 0 < f.weight_forward < f.layer_forward  # the attention core is never a weight matmul
    assert 0 < f.weight_backward < f.layer_backward
    # The per-layer split adds back up to the device's weight matmuls (the head is none of them).
    assert (f.weight_forward + f.weight_backward) * spec.num_layers == pytest.approx(f.weight_matmuls, rel=1e-9)


@given(cases(), REMAT)
def test_the_attention_kernel_moves_no_weight_matmul(case, remat):
    spec, sizes, b, s = case
    by = {a: step_flops(spec, sizes, batch=b, seq=s, remat=remat, attention=a) for a in ("plain", "flash")}
    assert by["flash"].per_device < by["plain"].per_device  # flash skips the masked half of the scores
    for name in ("weight_matmuls", "weight_forward", "weight_backward"):
        assert getattr(by["flash"], name) == getattr(by["plain"], name), name


@given(cases(), REMAT, ATTENTION)
def test_the_output_head_is_not_a_weight_matmul(case, remat, attention):
    # FP8 recipes keep the logits matmul in bf16 (torchtitan, DeepSeek-V3, MaxText): a wider vocabulary
    # adds FLOPs, none of them to the weight matmuls.
    spec, sizes, b, s = case
    wider = dataclasses.replace(spec, vocab_size=2 * spec.vocab_size, num_params=None)
    kw = dict(batch=b, seq=s, remat=remat, attention=attention)
    f, g = step_flops(spec, sizes, **kw), step_flops(wider, sizes, **kw)
    assert g.head > f.head
    assert (g.weight_matmuls, g.weight_forward, g.weight_backward) == (f.weight_matmuls, f.weight_forward,
                                                                      f.weight_backward)


@given(model_specs(family=("gpt2", "llama")), st.sampled_from((1, 2, 4)), st.integers(1, 4),
       st.sampled_from((16, 64)), ATTENTION)
def test_dense_weight_matmuls_are_the_model_less_head_and_attention(spec, fsdp, b, s, attention):
    # Without tp nothing repeats: the weight matmuls are 6 x weights x tokens, spread over the devices, and
    # remat full adds its recompute less the attention core's.
    n, kw = fsdp, dict(batch=b, seq=s, attention=attention)
    none = step_flops(spec, {"fsdp": fsdp}, remat="none", **kw)
    full = step_flops(spec, {"fsdp": fsdp}, remat="full", **kw)
    attn = spec.num_layers * layer_flops(spec, moe_layer=False, **kw).attention
    head = 6.0 * b * s * spec.vocab_size * spec.hidden_size
    assert none.weight_matmuls * n == pytest.approx(none.model - head - 3 * attn, rel=1e-9)
    assert (full.weight_matmuls - none.weight_matmuls) * n == pytest.approx(full.recompute - attn, rel=1e-9)


def test_published_sizes():
    """Llama-3-70B, 64 x 4096 tokens: ~6 x 70B x 262k = 1.1e17 FLOPs before attention (the issue's 1.2e17)."""
    f = step_flops(MODEL_SPECS["llama3-70b"], {"fsdp": 8, "tp": 8}, batch=64, seq=4096, remat="none",
                   attention="flash")
    assert 1.1e17 < f.model < 1.2e17


def test_default_efficiency_follows_the_h200_fit():
    """The GPU curve's values at the fit set's widths (H200: GPT-2 768, Llama 4096, Llama-70B 8192)."""
    assert [round(default_efficiency("node", h), 2) for h in (768, 4096, 8192)] == [0.15, 0.41, 0.5]
    assert default_efficiency("slice", 768) == default_efficiency("slice", 16384) == 0.5


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.sampled_from(("node", "slice")))
def test_default_efficiency_never_falls_as_the_model_widens(a, b, scope):
    lo, hi = sorted((a, b))
    e_lo, e_hi = default_efficiency(scope, lo), default_efficiency(scope, hi)
    assert 0 < e_lo <= e_hi < 1
    if scope == "node" and lo < hi:
        assert e_lo < e_hi  # strictly: the GPU curve saturates, it never flattens


@given(st.sampled_from((0, -1, 1.5, "4096")))
def test_default_efficiency_refuses_a_width_that_is_not_a_positive_count(hidden):
    with pytest.raises((PlanError, MeshplanTypeError), match="hidden"):
        default_efficiency("node", hidden)


def test_bad_remat():
    with pytest.raises(PlanError, match="remat='some'"):
        step_flops(MODEL_SPECS["gpt2"], {}, batch=1, seq=8, remat="some")


@given(cases(), REMAT, ATTENTION)
def test_weight_shards_only_remove_repeated_work(case, remat, attention):
    """Moving dp onto fsdp (same devices, same tp) can only split more of the tp-replicated work: the
    per-device matmuls never grow, and the input gradient, one of 3 + r passes over the replicated
    weights, always stays repeated."""
    spec, sizes, b, s = case
    sizes = {**sizes, "dp": 2, "fsdp": 1}
    moved = {**sizes, "dp": 1, "fsdp": 2}
    kw = dict(batch=b, seq=s, remat=remat, attention=attention)
    a, c = step_flops(spec, sizes, **kw), step_flops(spec, moved, **kw)
    mm_a, mm_c = a.per_device - a.elementwise, c.per_device - c.elementwise
    assert mm_c <= mm_a * (1 + 1e-12)
    n = math.prod(sizes.values())
    total = (a.model + a.recompute + a.overhead) / n
    r = RECOMPUTE[remat]
    assert mm_a - mm_c <= (mm_a - total) * (2 + r) / (3 + r) * (1 + 1e-9) + 1e-6
    if sizes["tp"] == 1 or spec.family == "gpt2":  # nothing replicated over tp
        assert mm_a == pytest.approx(mm_c, rel=1e-12)


# What XLA:CPU's compiled HLO showed for MLA's q_a / kv_a (docs/design-notes.md, FLOPs): (out, hidden,
# tokens, tp, fsdp, batch shards, out_norm) -> devices the forward and the weight gradient divide among.
MEASURED = [
    ((1536, 7168, 1024, 4, 2, 2, True), (8, 2)),   # DeepSeek-V3 q_a, fsdp=2,tp=4, 8 x 128: forward split 4 ways
    ((576, 7168, 1024, 4, 2, 2, False), (8, 4)),   # its kv_a: the weight gradient split over fsdp too
    ((1536, 7168, 2048, 4, 2, 2, True), (8, 4)),   # 8 x 256: q_a's gradient stays split over the batch
    ((128, 512, 1024, 4, 2, 2, True), (2, 4)),     # width 512, 512 tokens a shard: forward repeated
    ((128, 512, 1024, 2, 2, 4, True), (8, 8)),     # dp=2,fsdp=2,tp=2: split (256 tokens a shard)
    ((128, 512, 2048, 2, 2, 4, True), (4, 8)),     # ... at 16 x 128: 512 tokens a shard, repeated
    ((1536, 7168, 1024, 2, 4, 4, True), (4, 4)),   # fsdp=4,tp=2: fsdp does not divide tp, all repeated
    ((1536, 7168, 1024, 4, 2, 4, True), (4, 8)),   # 16 devices, dp=2,fsdp=2,tp=4: fsdp != tp, != shards
    ((1536, 7168, 1024, 8, 2, 2, True), (16, 2)),  # 16 devices, fsdp=2,tp=8: split 8 ways
    ((576, 7168, 1024, 2, 1, 4, False), (4, 4)),   # dp=4,tp=2: the weight is whole, all repeated
]


@pytest.mark.parametrize("facts, devices", MEASURED)
def test_tp_replicated_splits_match_the_compiled_hlo(facts, devices):
    out, hidden, tokens, tp, fsdp, shards, out_norm = facts
    assert tp_replicated_splits(out, hidden, tokens=tokens, tp=tp, fsdp=fsdp, batch_shards=shards,
                                out_norm=out_norm) == devices


@given(st.integers(1, 4096), st.integers(1, 16384), st.integers(1, 1 << 20), st.sampled_from((1, 2, 4, 8, 16)),
       st.sampled_from((1, 2, 4, 8)), st.sampled_from((1, 2, 4)), st.booleans())
def test_tp_replicated_splits_properties(out, hidden, tokens, tp, fsdp, other, out_norm):
    shards = fsdp * other  # the batch shards: fsdp and any other batch axes (dp, ep, sp)
    kw = dict(tp=tp, fsdp=fsdp, batch_shards=shards, out_norm=out_norm)
    forward, grad = tp_replicated_splits(out, hidden, tokens=tokens, **kw)
    n = tp * shards
    # Each pass runs repeated on the tp shards or split evenly, never finer than the devices.
    assert forward in (shards, n) and n % grad == 0 and grad >= 1
    if forward == n and tp > 1:  # a split forward: the weight outweighs a batch shard's output
        assert hidden * shards > tokens and tp % fsdp == 0 and fsdp > 1
    # More tokens never make XLA split more (the all-reduced output grows, the all-gathered weight does not).
    assert tp_replicated_splits(out, hidden, tokens=2 * tokens, **kw)[0] <= forward
    if fsdp == 1 or tp % fsdp:  # the weight's split cannot land on a batch shard's tp devices
        assert (forward, grad) == (shards, shards)


@given(cases(), REMAT, ATTENTION)
def test_step_flops_read_fsdp_only_through_fsdp_read(case, remat, attention):
    """The search keys its FLOPs cache with fsdp_read: where it reads 1, fsdp's devices as sp give the same FLOPs."""
    spec, sizes, b, s = case
    kw = dict(batch=b, seq=s, remat=remat, attention=attention)
    moved = {**sizes, "fsdp": 1, "sp": sizes["sp"] * sizes["fsdp"]}
    same = step_flops(spec, sizes, **kw) == step_flops(spec, moved, **kw)
    assert same or fsdp_read(spec, sizes["tp"], sizes["fsdp"]) > 1
