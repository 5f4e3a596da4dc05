"""Serving geometry: layouts, weights per device, the KV cache per token and what a budget holds."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.cluster import parse_cluster
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.serve import (
    CacheFormat,
    ServeLayout,
    WeightQuant,
    check_layout,
    decode_input_bytes,
    decode_inputs_tree,
    kv_cache_tree,
    kv_geometry,
    kv_heads_stored,
    layout_problems,
    padded_vocab,
    serving_layouts,
    serving_params,
    weight_bytes,
)
from meshplan.pure.specs import estimate_memory

SERVED = [n for n, s in MODEL_SPECS.items() if s.family != "gpt2"]
small = {name: dataclasses.replace(MODEL_SPECS[name], num_layers=min(4, MODEL_SPECS[name].num_layers),
                                   num_dense_layers=min(1, MODEL_SPECS[name].num_dense_layers),
                                   sliding_window_layers=min(2, MODEL_SPECS[name].sliding_window_layers),
                                   num_params=None)
         for name in SERVED}


@pytest.mark.parametrize("name", SERVED)
def test_one_device_holds_every_weight_exactly_once_in_bf16(name: str) -> None:
    spec = MODEL_SPECS[name]
    assert weight_bytes(spec, ServeLayout(1, 1)).total == 2 * spec.num_params


@pytest.mark.parametrize("name", SERVED)
def test_weight_bytes_equal_estimate_memory_of_the_serving_tree(name: str) -> None:
    spec = small[name]
    for layout in serving_layouts(spec, parse_cluster("1x8xH100")):
        for quant in ("bfloat16", "int8", WeightQuant("float8", "tensor")):
            tree, specs = serving_params(spec, layout, quant)
            est = estimate_memory(tree, specs, layout.replica_axes)
            assert est.max_per_device == weight_bytes(spec, layout, quant).total
            assert len(set(est.per_device)) == 1  # every device of a replica holds the same bytes


@given(st.sampled_from(SERVED), st.sampled_from([1, 2, 4, 8]))
def test_tp_splits_all_but_the_replicated_leaves(name: str, tp: int) -> None:
    spec = small[name]
    layout = ServeLayout(1, tp)
    if layout_problems(spec, layout):
        return
    one = weight_bytes(spec, ServeLayout(1, 1)).total
    many = weight_bytes(spec, layout).total
    tree, specs = serving_params(spec, layout)
    leaves = jax.tree_util.tree_leaves(tree)
    flat = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    replicated = sum(math.prod(l.shape) * 2 for l, p in zip(leaves, flat) if not any(p))
    # the padded vocabulary and the copied kv heads add bytes; nothing else does
    extra = (padded_vocab(spec.vocab_size, tp) - padded_vocab(spec.vocab_size, 1)) * spec.hidden_size * 2 * (
        1 if spec.tied_embeddings else 2)
    kv_copies = (kv_heads_stored(spec, tp) - spec.num_kv_heads) * spec.head_dim * spec.hidden_size * 2 * 2 * (
        spec.num_layers if spec.mla is None else 0)
    assert many * tp == (one - replicated + extra + kv_copies) + replicated * tp


def test_kv_heads_are_copied_where_tp_exceeds_them() -> None:
    spec = MODEL_SPECS["llama3-70b"]
    tree, specs = serving_params(spec, ServeLayout(1, 16))
    k = tree["model"]["layers"]["0"]["self_attn"]["k_proj"]["weight"]
    assert k.shape == (16 * 128, 8192) and specs["model"]["layers"]["0"]["self_attn"]["k_proj"]["weight"][0] == "tp"
    g16 = kv_geometry(spec, ServeLayout(1, 16), "bfloat16", CacheFormat())
    g8 = kv_geometry(spec, ServeLayout(1, 8), "bfloat16", CacheFormat())
    assert g16.bytes_per_token == g8.bytes_per_token == 80 * 2 * 128 * 2  # one kv head per device either way


def test_quantized_linears_carry_float32_scales_per_output_channel() -> None:
    spec = small["llama3-8b"]
    tree, specs = serving_params(spec, ServeLayout(1, 4), "int8")
    q = tree["model"]["layers"]["0"]["self_attn"]["q_proj"]
    o = specs["model"]["layers"]["0"]["self_attn"]["o_proj"]
    assert q["weight"].dtype == np.int8 and q["weight_scale"].shape == (4096,) and q["weight_scale"].dtype == np.float32
    assert o["weight_scale"] == jax.sharding.PartitionSpec(None)  # row-parallel: its output dim is whole
    assert tree["model"]["embed_tokens"]["weight"].dtype != np.int8  # embeddings stay bfloat16
    full = MODEL_SPECS["llama3-8b"]
    bf16, int8 = weight_bytes(full, ServeLayout(1, 1)).total, weight_bytes(full, ServeLayout(1, 1), "int8").total
    embeddings = 2 * 128256 * 4096 * 2
    linears = bf16 - embeddings - 2 * (65 * 4096)  # less the norms
    scales = 32 * 4 * (4096 + 1024 + 1024 + 4096 + 14336 * 2 + 4096)
    assert int8 == embeddings + 2 * (65 * 4096) + linears // 2 + scales


def test_experts_split_whole_over_ep_times_tp_or_by_width_over_tp() -> None:
    spec = small["mixtral-8x7b"]
    a = weight_bytes(spec, ServeLayout(1, 4))
    b = weight_bytes(spec, ServeLayout(1, 2, ep=2))
    assert a.experts == b.experts and a.num_experts_per_device == 8 and b.num_experts_per_device == 2
    assert b.dense > a.dense  # attention and the head split 2, not 4, ways


@pytest.mark.parametrize("name,tp,expected", [
    ("llama3-8b", 1, 32 * 2 * 8 * 128 * 2), ("llama3-8b", 4, 32 * 2 * 2 * 128 * 2),
    ("deepseek-v3", 8, 61 * (512 + 64) * 2), ("mixtral-8x7b", 8, 32 * 2 * 1 * 128 * 2),
])
def test_kv_bytes_per_token_match_the_published_formulas(name: str, tp: int, expected: int) -> None:
    g = kv_geometry(MODEL_SPECS[name], ServeLayout(1, tp), "bfloat16", CacheFormat())
    assert g.bytes_per_token == expected


def test_maxtext_caches_mla_up_projected_and_scales_each_token() -> None:
    spec = MODEL_SPECS["deepseek-v3"]
    g = kv_geometry(spec, ServeLayout(1, 8), "int8", CacheFormat("contiguous", mla="heads", scales="token"))
    assert g.bytes_per_token == 61 * (128 // 8 * (192 + 128) + 4)


def test_sliding_window_layers_hold_their_window_in_paged_engines_only() -> None:
    spec = MODEL_SPECS["gemma3-27b"]
    capped = kv_geometry(spec, ServeLayout(1, 1), "bfloat16", CacheFormat("paged", 16, window_capped=True))
    full = kv_geometry(spec, ServeLayout(1, 1), "bfloat16", CacheFormat("paged", 16))
    slots = kv_geometry(spec, ServeLayout(1, 1), "bfloat16", CacheFormat("contiguous"))
    per_layer = capped.full_token_bytes // 10
    assert capped.sequence_bytes(65536) == 10 * per_layer * 65536 + 52 * per_layer * (1024 + 16)
    assert full.sequence_bytes(65536) == slots.sequence_bytes(65536) == 62 * per_layer * 65536
    assert capped.sequence_bytes(1000) == full.sequence_bytes(1000)


@given(st.integers(1, 200_000), st.sampled_from([1, 16, 64, 256]))
def test_pages_round_each_sequence_up(context: int, page: int) -> None:
    g = kv_geometry(MODEL_SPECS["llama3-8b"], ServeLayout(1, 2), "bfloat16", CacheFormat("paged", page))
    assert g.sequence_bytes(context) == g.bytes_per_token * math.ceil(context / page) * page


@given(st.integers(1, 10**6), st.integers(1, 2**36), st.sampled_from([1, 2, 4]))
def test_max_sequences_and_max_context_are_the_largest_that_fit(context: int, budget: int, ep: int) -> None:
    spec = MODEL_SPECS["mixtral-8x7b"]
    g = kv_geometry(spec, ServeLayout(1, 2, ep=ep), "float8", CacheFormat("paged", 16))
    most = g.max_sequences(context, budget)
    assert g.cache_bytes(most, context) <= budget or (most == 0 and budget < g.fixed_bytes)
    assert g.cache_bytes(most + ep, context) > budget  # one more sequence on every rank does not fit
    seqs = max(1, most)
    longest = g.max_context(seqs, budget, limit=2 * 10**6)
    if longest:
        assert g.cache_bytes(seqs, longest) <= budget
        assert longest == 2 * 10**6 or g.cache_bytes(seqs, longest + 1) > budget


@pytest.mark.parametrize("fmt", [CacheFormat("paged", 8), CacheFormat("contiguous", scales="token"),
                                 CacheFormat("paged", 4, mla="heads")])
@pytest.mark.parametrize("name", ["llama3-8b", "deepseek-v2-lite", "qwen3-235b-a22b"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float8", "int8"])
def test_the_cache_arrays_hold_exactly_the_planned_bytes(fmt: CacheFormat, name: str, dtype: str) -> None:
    spec = small[name]
    for layout in (ServeLayout(1, 2), ServeLayout(1, 4, ep=2) if spec.is_moe else ServeLayout(1, 8)):
        if layout_problems(spec, layout):
            continue
        g = kv_geometry(spec, layout, dtype, fmt)
        tree, specs = kv_cache_tree(spec, layout, g, sequences=5, context=37)
        assert estimate_memory(tree, specs, layout.replica_axes).max_per_device == g.cache_bytes(5, 37)
        inputs, ispecs = decode_inputs_tree(layout, g, sequences=5, context=37)
        assert estimate_memory(inputs, ispecs, layout.replica_axes).max_per_device == decode_input_bytes(
            layout, g, sequences=5, context=37)


def test_layouts_keep_tp_inside_a_node_and_list_every_problem() -> None:
    spec = MODEL_SPECS["llama3-70b"]
    texts = [l.text for l in serving_layouts(spec, parse_cluster("2x8xH100"))]
    assert "tp=16" not in texts and "dp=2,tp=8" in texts
    with pytest.raises(PlanError, match="tp=3 does not divide the 64 attention heads.*dense MLP"):
        check_layout(spec, ServeLayout(1, 3))
    with pytest.raises(PlanError, match="ep=2 needs an MoE model"):
        check_layout(spec, ServeLayout(1, 4, ep=2))
    with pytest.raises(PlanError, match="must divide the 8 devices of a node"):
        check_layout(spec, ServeLayout(1, 16), parse_cluster("2x8xH100"))


@pytest.mark.parametrize("bad", [0, -1, 2.0, "2", None, True])
def test_bad_layout_counts_are_typed_errors(bad: object) -> None:
    with pytest.raises((PlanError, MeshplanTypeError)):
        ServeLayout(bad, 1)  # type: ignore[arg-type]


def test_gpt2_is_not_laid_out_and_says_which_families_are() -> None:
    with pytest.raises(PlanError, match="llama"):
        serving_params(MODEL_SPECS["gpt2"], ServeLayout(1, 1))
