"""Tests for the model presets (meshplan.pure.presets)."""

from __future__ import annotations

import dataclasses
import math
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import (
    MODEL_PRESETS,
    MODEL_SPECS,
    MLADims,
    ModelSpec,
    Preset,
    build_params,
    count_params,
    get_preset,
    preset_names,
    resolve_preset_name,
)
from meshplan.testing import model_specs
from tests.hash_seed import outputs_under_two_hash_seeds

PUBLISHED_TOTALS = {
    "gpt2": 124_439_808,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "mixtral-8x7b": 46_702_792_704,
    "deepseek-v3": 671_026_419_200,
    # The new presets: safetensors index metadata.total_size / 2 (bf16) of each checkpoint;
    # tests/pure/presets/test_model_configs.py cites each source.
    "mistral-7b": 7_241_732_096,
    "deepseek-v2-lite": 15_706_484_224,
    "gemma3-27b": 27_009_346_304,
    "qwen2.5-72b": 72_706_203_648,
    "qwen3-235b-a22b": 235_093_634_560,
    "llama3.1-405b": 405_853_388_800,
}
# Tensors in the HF checkpoints (DeepSeek-V3: without the MTP layer and the fp8 scale tensors).
HF_TENSOR_COUNTS_UNSTACKED = {
    "gpt2": 148,  # 12 per block x 12 + wte, wpe, ln_f.{weight,bias}; lm_head is tied
    "llama3-8b": 291,
    "llama3-70b": 723,
    "mixtral-8x7b": 995,  # per layer 4 attn + 2 norms + router + 8 x 3 experts
    "deepseek-v3": 45_395,  # 3 x 12 dense + 58 x (9 + 2 router + 768 experts + 3 shared) + 3
    "mistral-7b": 291,
    "qwen2.5-72b": 963,  # 12 per layer (q/k/v biases) x 80 + 3
    "qwen3-235b-a22b": 36_945,  # the index's tensor names: 94 x (11 + 384 experts) + 3
}


def _named(tree: object) -> dict[str, jax.ShapeDtypeStruct]:
    """HF-style names: the dict keys along each path joined with '.'."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(str(k.key) for k in path): leaf for path, leaf in flat}


@pytest.fixture(scope="module")
def trees() -> dict[tuple[str, bool], object]:
    return {(name, unstack): MODEL_PRESETS[name](unstack_experts=unstack)
            for name in preset_names() for unstack in (False, True)}


# --- totals and names -------------------------------------------------------------------------------


@pytest.mark.parametrize("unstack", [False, True])
@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTALS))
def test_preset_totals_match_the_published_figures_exactly(trees: dict, name: str, unstack: bool) -> None:
    assert count_params(trees[(name, unstack)]) == PUBLISHED_TOTALS[name]
    assert MODEL_SPECS[name].num_params == PUBLISHED_TOTALS[name]


@pytest.mark.parametrize("name", sorted(HF_TENSOR_COUNTS_UNSTACKED))
def test_unstacked_trees_have_as_many_leaves_as_the_hf_checkpoint(trees: dict, name: str) -> None:
    assert len(jax.tree_util.tree_leaves(trees[(name, True)])) == HF_TENSOR_COUNTS_UNSTACKED[name]


def test_registry_names_are_the_documented_ones() -> None:
    assert preset_names() == ("gpt2", "llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3", "mistral-7b",
                              "deepseek-v2-lite", "gemma3-27b", "qwen2.5-72b", "qwen3-235b-a22b", "llama3.1-405b")
    assert tuple(MODEL_SPECS) == preset_names()
    assert all(MODEL_SPECS[n].name == n for n in preset_names())


def test_gpt2_uses_hf_names_conv1d_shapes_and_a_tied_head(trees: dict) -> None:
    named = _named(trees[("gpt2", False)])
    assert named["transformer.wte.weight"].shape == (50257, 768)
    assert named["transformer.wpe.weight"].shape == (1024, 768)
    assert named["transformer.h.0.attn.c_attn.weight"].shape == (768, 2304)
    assert named["transformer.h.0.attn.c_attn.bias"].shape == (2304,)
    assert named["transformer.h.11.mlp.c_fc.weight"].shape == (768, 3072)
    assert named["transformer.h.11.mlp.c_proj.weight"].shape == (3072, 768)
    assert named["transformer.ln_f.bias"].shape == (768,)
    assert "lm_head.weight" not in named


def test_llama_uses_hf_names_and_out_in_linear_shapes(trees: dict) -> None:
    named = _named(trees[("llama3-8b", False)])
    assert named["model.embed_tokens.weight"].shape == (128256, 4096)
    assert named["model.layers.0.self_attn.q_proj.weight"].shape == (4096, 4096)
    assert named["model.layers.0.self_attn.k_proj.weight"].shape == (1024, 4096)
    assert named["model.layers.31.mlp.gate_proj.weight"].shape == (14336, 4096)
    assert named["model.layers.31.mlp.down_proj.weight"].shape == (4096, 14336)
    assert named["model.layers.7.input_layernorm.weight"].shape == (4096,)
    assert named["model.norm.weight"].shape == (4096,)
    assert named["lm_head.weight"].shape == (128256, 4096)
    assert not any(k.endswith(".bias") for k in named)
    named70 = _named(trees[("llama3-70b", False)])
    assert named70["model.layers.79.self_attn.o_proj.weight"].shape == (8192, 8192)
    assert named70["model.layers.79.self_attn.v_proj.weight"].shape == (1024, 8192)


def test_mixtral_stacks_experts_first_and_unstacks_to_hf_names(trees: dict) -> None:
    stacked = _named(trees[("mixtral-8x7b", False)])
    assert stacked["model.layers.0.block_sparse_moe.experts.w1.weight"].shape == (8, 14336, 4096)
    assert stacked["model.layers.31.block_sparse_moe.experts.w2.weight"].shape == (8, 4096, 14336)
    assert stacked["model.layers.0.block_sparse_moe.gate.weight"].shape == (8, 4096)
    assert not any(".mlp." in k for k in stacked)
    unstacked = _named(trees[("mixtral-8x7b", True)])
    assert unstacked["model.layers.0.block_sparse_moe.experts.7.w3.weight"].shape == (14336, 4096)
    assert "model.layers.0.block_sparse_moe.experts.8.w3.weight" not in unstacked


def test_deepseek_has_mla_dense_then_moe_layers_with_hf_names(trees: dict) -> None:
    named = _named(trees[("deepseek-v3", False)])
    attn = "model.layers.0.self_attn."
    assert named[attn + "q_a_proj.weight"].shape == (1536, 7168)
    assert named[attn + "q_a_layernorm.weight"].shape == (1536,)
    assert named[attn + "q_b_proj.weight"].shape == (128 * 192, 1536)
    assert named[attn + "kv_a_proj_with_mqa.weight"].shape == (576, 7168)
    assert named[attn + "kv_a_layernorm.weight"].shape == (512,)
    assert named[attn + "kv_b_proj.weight"].shape == (128 * 256, 512)
    assert named[attn + "o_proj.weight"].shape == (7168, 128 * 128)
    assert named["model.layers.2.mlp.gate_proj.weight"].shape == (18432, 7168)
    assert "model.layers.3.mlp.gate_proj.weight" not in named
    assert named["model.layers.3.mlp.gate.weight"].shape == (256, 7168)
    assert named["model.layers.3.mlp.gate.e_score_correction_bias"].shape == (256,)
    assert named["model.layers.3.mlp.experts.down_proj.weight"].shape == (256, 7168, 2048)
    assert named["model.layers.60.mlp.shared_experts.up_proj.weight"].shape == (2048, 7168)
    assert "model.layers.61.input_layernorm.weight" not in named  # no MTP layer
    unstacked = _named(trees[("deepseek-v3", True)])
    assert unstacked["model.layers.60.mlp.experts.255.gate_proj.weight"].shape == (2048, 7168)


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTALS))
def test_spec_metadata_agrees_with_the_tree(trees: dict, name: str) -> None:
    spec = MODEL_SPECS[name]
    tree = trees[(name, False)]
    layers = tree["transformer"]["h"] if spec.family == "gpt2" else tree["model"]["layers"]
    assert sorted(layers, key=int) == [str(i) for i in range(spec.num_layers)]
    if spec.family in ("llama", "mixtral"):
        q = layers["0"]["self_attn"]["q_proj"]["weight"].shape
        k = layers["0"]["self_attn"]["k_proj"]["weight"].shape
        assert q == (spec.num_heads * spec.head_dim, spec.hidden_size)
        assert k == (spec.num_kv_heads * spec.head_dim, spec.hidden_size)
    moe_layers = [i for i in layers if "experts" in str(_named(layers[i]))]
    assert len(moe_layers) == spec.num_moe_layers
    for leaf_name, leaf in _named(tree).items():
        if ".experts." in leaf_name:
            assert leaf.shape[0] == spec.num_experts


# --- dtype, determinism ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, "bfloat16", np.float16, jnp.float8_e4m3fn, jnp.int8])
def test_every_leaf_has_the_requested_dtype(dtype: object) -> None:
    for name in ("gpt2", "mixtral-8x7b", "deepseek-v3"):
        leaves = jax.tree_util.tree_leaves(get_preset(name, dtype=dtype).params)
        assert {leaf.dtype for leaf in leaves} == {jnp.dtype(dtype)}


def test_default_dtype_is_bfloat16() -> None:
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(get_preset("llama3-8b").params)} == {
        jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize("dtype", ["not-a-dtype", object, str, np.dtype("datetime64[s]")])
def test_bad_dtype_raises_a_type_error(dtype: object) -> None:
    with pytest.raises(MeshplanTypeError, match="dtype"):
        get_preset("gpt2", dtype=dtype)


def test_building_twice_gives_equal_trees_in_the_same_order() -> None:
    for name in preset_names():
        a, b = get_preset(name).params, get_preset(name).params
        assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
        assert list(_named(a).items()) == list(_named(b).items())


def test_leaf_order_does_not_depend_on_the_hash_seed() -> None:
    script = textwrap.dedent("""
        import hashlib, jax
        from meshplan.pure.presets import get_preset
        flat, _ = jax.tree_util.tree_flatten_with_path(get_preset("deepseek-v3").params)
        text = "|".join(jax.tree_util.keystr(p) + str(leaf.shape) for p, leaf in flat)
        print(hashlib.sha256(text.encode()).hexdigest())
    """)
    here, there = outputs_under_two_hash_seeds(script)
    assert here == there and here.strip()


# --- registry -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["Llama-3-8B", "llama3_8b", "LLAMA3-8B", " llama3-8b "])
def test_preset_names_ignore_case_and_separators(spelling: str) -> None:
    assert resolve_preset_name(spelling.strip()) == "llama3-8b"
    preset = get_preset(spelling)
    assert isinstance(preset, Preset) and preset.spec is MODEL_SPECS["llama3-8b"]


def test_unknown_preset_lists_the_known_names() -> None:
    with pytest.raises(PlanError) as info:
        get_preset("llama3-405b")
    for name in preset_names():
        assert name in str(info.value)
    with pytest.raises(PlanError, match="Did you mean 'mixtral-8x7b'"):
        get_preset("mixtral-8x7")
    with pytest.raises(ValueError):  # callers that only know the builtins can still catch it
        get_preset("bert-base")


def test_non_string_preset_name_is_a_type_error() -> None:
    with pytest.raises(MeshplanTypeError):
        get_preset(8)  # type: ignore[arg-type]


def test_unstack_experts_must_be_a_bool() -> None:
    with pytest.raises(MeshplanTypeError):
        get_preset("mixtral-8x7b", unstack_experts="yes")  # type: ignore[arg-type]


def test_dense_presets_ignore_unstack_experts(trees: dict) -> None:
    for name in ("gpt2", "llama3-8b"):
        assert _named(trees[(name, True)]).keys() == _named(trees[(name, False)]).keys()


def test_registry_mappings_are_read_only() -> None:
    with pytest.raises(TypeError):
        MODEL_PRESETS["x"] = MODEL_PRESETS["gpt2"]  # type: ignore[index]
    with pytest.raises(TypeError):
        MODEL_SPECS["x"] = MODEL_SPECS["gpt2"]  # type: ignore[index]


# --- ModelSpec and custom models --------------------------------------------------------------------------


def _llama_like_total(s: ModelSpec) -> int:
    d, q, kv = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    per_layer = 2 * d + 2 * d * q + 2 * d * kv
    dense = 3 * d * s.intermediate_size
    moe = s.num_experts * d + 3 * s.num_experts * d * s.moe_intermediate_size
    heads = 1 if s.tied_embeddings else 2
    return (heads * s.vocab_size * d + d + s.num_layers * per_layer
            + (s.num_layers - s.num_moe_layers) * dense + s.num_moe_layers * moe)


# Llama and Mixtral specs, tied or not, of 1-4 layers and up to 4 experts.
llama_like_specs = model_specs(family=("llama", "mixtral"), max_layers=4, max_experts=4)


@given(llama_like_specs)
def test_custom_llama_like_totals_follow_the_closed_form(spec: ModelSpec) -> None:
    stacked = build_params(spec)
    unstacked = build_params(spec, unstack_experts=True)
    assert count_params(stacked) == count_params(unstacked) == _llama_like_total(spec)
    assert ("lm_head" in stacked) == (not spec.tied_embeddings)


@given(st.integers(1, 4), st.integers(0, 3), st.integers(1, 8), st.integers(0, 2))
def test_custom_deepseek_like_stacked_and_unstacked_totals_agree(
        layers: int, dense: int, experts: int, shared: int) -> None:
    spec = dataclasses.replace(
        MODEL_SPECS["deepseek-v3"], name="tiny-dsv3", vocab_size=50, hidden_size=16, num_layers=layers,
        num_heads=4, num_kv_heads=4, head_dim=8, intermediate_size=24, num_experts=experts,
        num_experts_per_tok=1, moe_intermediate_size=6, num_shared_experts=shared,
        num_dense_layers=min(dense, layers), mla=MLADims(8, 4, 8, 2, 8), num_params=None)
    stacked, unstacked = build_params(spec), build_params(spec, unstack_experts=True)
    assert count_params(stacked) == count_params(unstacked)
    moe_layer = experts * 16 + experts + 3 * experts * 16 * 6 + 3 * 16 * 6 * shared
    dense_layer = 3 * 16 * 24
    attn = (8 * 16 + 8 + 4 * 10 * 8 + 6 * 16 + 4 + 4 * 16 * 4 + 16 * 32) + 2 * 16
    expected = 2 * 50 * 16 + 16 + layers * attn + spec.num_moe_layers * moe_layer + (
        layers - spec.num_moe_layers) * dense_layer
    assert count_params(stacked) == expected


@pytest.mark.parametrize(
    ("changes", "error", "fragment"),
    [
        ({"num_heads": 0}, PlanError, "num_heads=0"),
        ({"num_kv_heads": 3}, PlanError, "multiple of num_kv_heads=3"),
        ({"hidden_size": 4096.0}, MeshplanTypeError, "hidden_size"),
        ({"num_experts": 4}, PlanError, "num_experts_per_tok"),
        ({"num_experts": 2, "num_experts_per_tok": 4, "moe_intermediate_size": 8}, PlanError,
         "exceeds num_experts"),
        ({"num_dense_layers": 99}, PlanError, "num_dense_layers=99"),
        ({"num_params": -1}, PlanError, "num_params"),
        ({"name": ""}, MeshplanTypeError, "name"),
        ({"tied_embeddings": 1}, PlanError, "tied_embeddings"),
        ({"family": "bert"}, None, None),
    ],
)
def test_model_spec_validates_its_sizes(changes: dict, error: type | None, fragment: str | None) -> None:
    if error is None:  # a spec with an unknown family is valid data; building it is the error
        spec = dataclasses.replace(MODEL_SPECS["llama3-8b"], **changes)
        with pytest.raises(PlanError, match="unknown family='bert'"):
            build_params(spec)
        return
    with pytest.raises(error, match=fragment):
        dataclasses.replace(MODEL_SPECS["llama3-8b"], **changes)


def test_spec_moe_helpers() -> None:
    ds = MODEL_SPECS["deepseek-v3"]
    assert ds.is_moe and ds.num_moe_layers == 58
    assert [ds.is_moe_layer(i) for i in (0, 2, 3, 60)] == [False, False, True, True]
    assert ds.mla is not None and ds.mla.qk_head_dim == 192
    llama = MODEL_SPECS["llama3-70b"]
    assert not llama.is_moe and llama.num_moe_layers == 0 and not llama.is_moe_layer(5)


def test_count_params_counts_arrays_and_skips_shapeless_leaves() -> None:
    tree = {"a": np.zeros((2, 3)), "b": [jax.ShapeDtypeStruct((4,), jnp.float32), None, 1.5]}
    assert count_params(tree) == 10
    assert count_params({}) == 0
    assert count_params({"big": jax.ShapeDtypeStruct((2**20, 2**20, 2**10), jnp.int8)}) == 2**50
    assert math.prod((2**20, 2**20, 2**10)) == 2**50
