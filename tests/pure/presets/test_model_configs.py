"""ModelSpecs from real Hugging Face config.json files (meshplan.pure.presets.model_spec_from_hf_config).

The files in tests/data/models/ are copies of each model's config.json on the Hugging Face Hub
(tests/data/models/README.md names each repository). Every expected parameter count is the
checkpoint's own: its safetensors index ``metadata.total_size`` divided by the bytes per
parameter, or the exact figure a model card / model catalogue publishes; EXACT_COUNTS cites each.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import ModelConfigError, PlanError
from meshplan.pure.presets import (
    HF_MODEL_TYPES,
    MODEL_SPECS,
    MLADims,
    ModelSpec,
    build_params,
    count_params,
    model_spec_from_hf_config,
    pricing_notes,
)

DATA = pathlib.Path(__file__).parents[2] / "data" / "models"

# file -> (exact parameter count of the checkpoint, where that count comes from).
EXACT_COUNTS: dict[str, tuple[int, str]] = {
    "gpt2.json": (124_439_808, "openai-community/gpt2 model.safetensors: 124,439,808 parameters (HF model page), "
                               "the existing preset's figure"),
    "llama-2-7b.json": (6_738_415_616, "meta-llama/Llama-2-7b-hf index total_size 13,476,839,424 bytes = 2 x "
                                       "6,738,415,616 fp16 + 32 x 64 fp32 rotary inv_freq buffers (checked below)"),
    "llama-3.1-405b.json": (405_853_388_800, "meta-llama/Llama-3.1-405B index total_size 811,706,777,600 bytes "
                                             "(bf16) / 2"),
    "mistral-7b-v0.1.json": (7_241_732_096, "mistralai/Mistral-7B-v0.1 index total_size 14,483,464,192 bytes / 2"),
    "mixtral-8x7b.json": (46_702_792_704, "mistralai/Mixtral-8x7B-v0.1: the existing preset's published total"),
    "qwen2.5-72b.json": (72_706_203_648, "Qwen/Qwen2.5-72B(-Instruct) index total_size 145,412,407,296 bytes / 2"),
    "qwen3-8b.json": (8_190_735_360, "Qwen/Qwen3-8B index total_size 16,381,470,720 bytes / 2"),
    "qwen3-235b-a22b.json": (235_093_634_560, "Qwen/Qwen3-235B-A22B index total_size 470,187,269,120 bytes / 2 "
                                              "(36,945 tensor names)"),
    "gemma-3-27b.json": (27_009_346_304, "google/gemma-3-27b-it language model: the checkpoint's 27,432,406,640 "
                                         "less its SigLIP vision tower and projector (checked below); keras-hub's "
                                         "gemma3_27b_text (vocab 262,144) is 27,009,002,240, 64 x 5,376 fewer"),
    "deepseek-v2-lite.json": (15_706_484_224, "deepseek-ai/DeepSeek-V2-Lite index total_size 31,412,968,448 "
                                              "bytes / 2"),
    "deepseek-v3.json": (671_026_419_200, "deepseek-ai/DeepSeek-V3 without its MTP layer: the existing preset's "
                                          "published total"),
}
# Gemma 2 27B: no exact published figure was found (the model page rounds to 27.2B); the count is
# checked against the closed form only, and against MaxText's gemma2-27b (vocab padded) in
# test_maxtext_config.py.
GEMMA2_27B_CLOSED_FORM = 27_227_128_320

# The six presets built from these files (the spec the file gives, renamed, plus its exact count).
PRESET_FILES = {
    "mistral-7b": "mistral-7b-v0.1.json", "deepseek-v2-lite": "deepseek-v2-lite.json",
    "gemma3-27b": "gemma-3-27b.json", "qwen2.5-72b": "qwen2.5-72b.json",
    "qwen3-235b-a22b": "qwen3-235b-a22b.json", "llama3.1-405b": "llama-3.1-405b.json",
    "gpt2": "gpt2.json", "mixtral-8x7b": "mixtral-8x7b.json", "deepseek-v3": "deepseek-v3.json",
}


def _config(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())  # type: ignore[no-any-return]


def _spec(name: str) -> ModelSpec:
    return model_spec_from_hf_config(_config(name), source=name)


# --- exact counts from the real files -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXACT_COUNTS))
def test_real_config_counts_match_the_checkpoint_exactly(name: str) -> None:
    expected, source = EXACT_COUNTS[name]
    assert count_params(build_params(_spec(name))) == expected, source


def test_gemma2_27b_counts_its_closed_form() -> None:
    spec = _spec("gemma-2-27b.json")
    h, f, v, hd = 4608, 36864, 256000, 128
    layer = h * 32 * hd * 2 + h * 16 * hd * 2 + 3 * h * f + 4 * h  # q, o; k, v; gate, up, down; four norms
    assert count_params(build_params(spec)) == 46 * layer + v * h + h == GEMMA2_27B_CLOSED_FORM
    assert (spec.family, spec.sliding_window, spec.sliding_window_layers) == ("gemma", 4096, 23)


def test_gemma3_text_plus_its_vision_tower_is_the_published_checkpoint_total() -> None:
    # google/gemma-3-27b-it: 27,432,406,640 parameters (the HF model page; keras-hub's
    # medgemma_instruct_27b, same shapes). The vision side, from the file's vision_config: a SigLIP
    # encoder (patch conv + bias, 4096 positions, 27 layers of q/k/v/o with biases, a 4304-wide MLP with
    # biases and two LayerNorms, a final LayerNorm) and the projector (1152 x 5376 and its RMSNorm).
    vision = _config("gemma-3-27b.json")["vision_config"]
    d, f, n = vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    tower = 3 * vision["patch_size"] ** 2 * d + d + patches * d + n * layer + 2 * d
    projector = d * 5376 + d
    assert count_params(build_params(_spec("gemma-3-27b.json"))) + tower + projector == 27_432_406_640


def test_llama2_index_bytes_are_the_fp16_weights_plus_the_rotary_buffers() -> None:
    # The Llama-2-7b-hf index counts each layer's self_attn.rotary_emb.inv_freq (head_dim / 2 fp32).
    spec = _spec("llama-2-7b.json")
    assert 2 * count_params(build_params(spec)) + spec.num_layers * (spec.head_dim // 2) * 4 == 13_476_839_424


@pytest.mark.parametrize("preset", sorted(PRESET_FILES))
def test_presets_are_the_specs_their_real_configs_give(preset: str) -> None:
    from_file = _spec(PRESET_FILES[preset])
    shipped = MODEL_SPECS[preset]
    assert dataclasses.replace(from_file, name=preset, num_params=shipped.num_params) == shipped


def test_what_the_readers_take_from_each_architecture() -> None:
    assert _spec("qwen2.5-72b.json").qkv_bias and not _spec("qwen3-8b.json").qkv_bias
    assert _spec("qwen3-8b.json").qk_norm and _spec("qwen3-235b-a22b.json").qk_norm
    gemma = _spec("gemma-3-27b.json")
    assert (gemma.tied_embeddings, gemma.qk_norm, gemma.head_dim, gemma.vocab_size) == (True, True, 128, 262208)
    assert gemma.num_heads * gemma.head_dim != gemma.hidden_size  # an explicit head_dim, 4096 != 5376
    assert (gemma.sliding_window, gemma.sliding_window_layers) == (1024, 52)  # five local layers in six
    lite = _spec("deepseek-v2-lite.json")
    assert lite.mla is not None and lite.mla.q_lora_rank == 0 and lite.family == "deepseek_v2"
    tree = build_params(lite)
    assert "q_proj" in tree["model"]["layers"]["1"]["self_attn"]
    assert "e_score_correction_bias" not in tree["model"]["layers"]["1"]["mlp"]["gate"]
    v3 = _spec("deepseek-v3.json")
    assert (v3.num_layers, v3.num_dense_layers, v3.num_shared_experts) == (61, 3, 1)  # MTP layer left out
    assert _spec("mistral-7b-v0.1.json").sliding_window_layers == 32
    assert _spec("qwen2.5-72b.json").sliding_window == 0  # "use_sliding_window": false
    windowed = model_spec_from_hf_config({**_config("qwen2.5-72b.json"), "use_sliding_window": True,
                                          "sliding_window": 4096})
    assert (windowed.sliding_window, windowed.sliding_window_layers) == (4096, 10)  # from max_window_layers=70
    assert _spec("mixtral-8x7b.json").sliding_window == 0  # "sliding_window": null
    assert _spec("llama-3.1-405b.json").name == "llama"  # no name and no _name_or_path: the model_type


def test_qwen3_moe_uses_hf_expert_names() -> None:
    spec = dataclasses.replace(_spec("qwen3-235b-a22b.json"), num_layers=1)
    layer = build_params(spec, unstack_experts=True)["model"]["layers"]["0"]
    assert sorted(layer["mlp"]) == ["experts", "gate"]
    assert layer["mlp"]["experts"]["127"]["down_proj"]["weight"].shape == (4096, 1536)
    assert layer["self_attn"]["q_norm"]["weight"].shape == (128,)


def test_sliding_window_layers_carry_a_pricing_note_only_when_the_window_is_shorter_than_seq() -> None:
    gemma = _spec("gemma-3-27b.json")
    assert pricing_notes(gemma, seq=1024) == ()
    (note,) = pricing_notes(gemma, seq=8192)
    assert "52 of 62 layers" in note and "priced as full attention" in note
    assert pricing_notes(_spec("llama-3.1-405b.json"), seq=8192) == ()


# --- properties -----------------------------------------------------------------------------------


def _llama_config(draw: st.DrawFn) -> dict[str, Any]:
    kv = draw(st.sampled_from((1, 2, 4)))
    heads = kv * draw(st.sampled_from((1, 2, 3)))
    head_dim = draw(st.sampled_from((8, 16)))
    model_type = draw(st.sampled_from(("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")))
    config: dict[str, Any] = {
        "model_type": model_type, "vocab_size": draw(st.integers(1, 300)),
        "num_hidden_layers": draw(st.integers(1, 4)), "num_attention_heads": heads, "num_key_value_heads": kv,
        "intermediate_size": draw(st.integers(1, 64)),
        "tie_word_embeddings": draw(st.booleans()),
    }
    if draw(st.booleans()) or model_type in ("qwen3", "gemma2", "gemma3_text"):
        config["head_dim"] = head_dim
        config["hidden_size"] = draw(st.integers(1, 64))
    else:
        config["hidden_size"] = heads * head_dim
    if model_type == "mistral":
        config["sliding_window"] = draw(st.sampled_from((None, 4096)))
    return config


@st.composite
def llama_configs(draw: st.DrawFn) -> dict[str, Any]:
    return _llama_config(draw)


@given(llama_configs())
def test_counts_follow_the_closed_form_of_each_layout(config: dict[str, Any]) -> None:
    spec = model_spec_from_hf_config(config)
    h, f, v, layers = spec.hidden_size, spec.intermediate_size, spec.vocab_size, spec.num_layers
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    norms = 4 if config["model_type"] in ("gemma2", "gemma3_text") else 2
    layer = 2 * h * q + 2 * h * kv + 3 * h * f + norms * h
    layer += (q + 2 * kv) if config["model_type"] == "qwen2" else 0  # q/k/v biases
    layer += 2 * spec.head_dim if config["model_type"] in ("qwen3", "gemma3_text") else 0  # q/k norms
    head = 0 if spec.tied_embeddings else v * h
    assert count_params(build_params(spec)) == layers * layer + v * h + h + head


@given(llama_configs(), st.dictionaries(st.sampled_from(["rope_scaling", "rope_theta", "torch_dtype", "bos_token_id",
                                                         "attention_dropout", "initializer_range", "use_cache"]),
                                        st.one_of(st.none(), st.integers(), st.text(max_size=5)), max_size=4))
def test_keys_that_change_no_shape_change_no_spec(config: dict[str, Any], noise: dict[str, Any]) -> None:
    assert model_spec_from_hf_config({**config, **noise}) == model_spec_from_hf_config(config)


@given(llama_configs())
def test_gemma3_nested_under_text_config_reads_like_the_text_model(config: dict[str, Any]) -> None:
    config = {**config, "model_type": "gemma3_text"}
    config.setdefault("head_dim", 8)
    nested = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": config,
              "_name_or_path": "google/x"}
    assert model_spec_from_hf_config(nested) == model_spec_from_hf_config({**config, "_name_or_path": "google/x"})


@given(st.data())
def test_a_missing_required_key_names_the_file_and_the_key(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(EXACT_COUNTS)))
    config = _config(name)
    if "text_config" in config:
        config = dict(config["text_config"])
    required = sorted(k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                  "vocab_size", "n_embd", "n_layer", "n_head", "n_routed_experts",
                                  "kv_lora_rank", "moe_intermediate_size", "num_local_experts")
                      if k in config)
    key = data.draw(st.sampled_from(required))
    del config[key]
    with pytest.raises(ModelConfigError, match=f"{name}: key '{key}' is missing"):
        model_spec_from_hf_config(config, source=name)


@given(st.data())
def test_a_bad_size_names_the_file_the_key_and_what_is_valid(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(EXACT_COUNTS)))
    config = copy.deepcopy(_config(name))
    target = config["text_config"] if "text_config" in config else config
    key = data.draw(st.sampled_from(sorted(k for k in ("hidden_size", "num_hidden_layers", "vocab_size", "n_layer",
                                                       "intermediate_size") if k in target)))
    target[key] = data.draw(st.sampled_from((-1, 0, 4096.0, "4096", True, None, [1])))
    with pytest.raises(ModelConfigError, match=rf"key '{key}'=.* must be"):
        model_spec_from_hf_config(config, source=name)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, fragment", [
    ({"model_type": "falcon", "architectures": ["FalconForCausalLM"]}, "unknown architecture 'falcon'"),
    ({"model_type": None, "architectures": ["PhiForCausalLM"]}, "unknown architecture ['PhiForCausalLM']"),
    ({"model_type": "qwen2"}, "disagrees with 'architectures'"),
    ({"num_key_value_heads": 3}, "must divide num_attention_heads=128"),
    ({"num_attention_heads": 30, "num_key_value_heads": 30}, "must divide hidden_size=16384, or give head_dim"),
    ({"architectures": "LlamaForCausalLM"}, "must be a list of class names"),
    ({"attention_bias": True}, "is not supported"),
    ({"tie_word_embeddings": "no"}, "must be true or false"),
])
def test_bad_llama_configs_are_typed_errors_naming_the_key(change: dict[str, Any], fragment: str) -> None:
    config = {**_config("llama-3.1-405b.json"), **change}
    with pytest.raises(ModelConfigError) as info:
        model_spec_from_hf_config(config, source="llama.json")
    assert "llama.json" in str(info.value) and fragment in str(info.value)
    assert isinstance(info.value, PlanError) and isinstance(info.value, ValueError)


def test_experts_with_no_top_k_say_which_key_is_missing() -> None:
    config = _config("mixtral-8x7b.json")
    del config["num_experts_per_tok"]
    with pytest.raises(ModelConfigError, match="'num_local_experts'=8 names experts but 'num_experts_per_tok'"):
        model_spec_from_hf_config(config, source="mixtral.json")
    config["num_experts_per_tok"] = 9
    with pytest.raises(ModelConfigError, match="exceeds num_local_experts=8"):
        model_spec_from_hf_config(config, source="mixtral.json")


@pytest.mark.parametrize("change, fragment", [
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
    ({"first_k_dense_replace": 99}, "exceeds num_hidden_layers=27"),
    ({"q_lora_rank": -4}, "'q_lora_rank'=-4 must be >= 1"),
])
def test_bad_deepseek_configs_name_the_key(change: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ModelConfigError, match=fragment):
        model_spec_from_hf_config({**_config("deepseek-v2-lite.json"), **change}, source="ds.json")


def test_qwen3_moe_with_interleaved_dense_layers_is_refused_with_what_is_modelled() -> None:
    config = {**_config("qwen3-235b-a22b.json"), "mlp_only_layers": [3]}
    with pytest.raises(ModelConfigError, match=r"leading dense layers only"):
        model_spec_from_hf_config(config, source="q.json")
    ok = model_spec_from_hf_config({**config, "mlp_only_layers": [0, 1]}, source="q.json")
    assert ok.num_dense_layers == 2 and ok.num_moe_layers == 92


@pytest.mark.parametrize("config", [None, [1, 2], "config", 3])
def test_a_config_that_is_not_an_object_is_refused(config: Any) -> None:
    with pytest.raises(ModelConfigError, match="x.json: a config.json holds a JSON object"):
        model_spec_from_hf_config(config, source="x.json")


def test_gemma3_without_a_text_config_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="'text_config'"):
        model_spec_from_hf_config({"model_type": "gemma3"}, source="g.json")


@pytest.mark.parametrize("name", sorted(EXACT_COUNTS))
def test_architectures_alone_name_the_model_type(name: str) -> None:
    config = _config(name)
    without = {k: v for k, v in config.items() if k != "model_type"}
    assert model_spec_from_hf_config(without, name="m") == model_spec_from_hf_config(config, name="m")
    assert any(a in HF_MODEL_TYPES[config["model_type"]] for a in config["architectures"])


def test_a_config_path_given_as_a_preset_name_says_how_to_read_it() -> None:
    from meshplan.pure import search_meshes

    with pytest.raises(PlanError, match=r"meshplan.load_model\(path\)"):
        search_meshes("path/to/config.json", "8xH100")


# --- round trip: a spec written as the config.json transformers would save reads back as itself -----


def _hf_config_of(spec: ModelSpec) -> dict[str, Any]:
    """The config.json keys a Hugging Face model of ``spec``'s layout saves (the test's own writer)."""
    if spec.family == "gpt2":
        return {"model_type": "gpt2", "vocab_size": spec.vocab_size, "n_embd": spec.hidden_size,
                "n_layer": spec.num_layers, "n_head": spec.num_heads, "n_inner": spec.intermediate_size,
                "n_positions": spec.max_position_embeddings, "tie_word_embeddings": spec.tied_embeddings}
    common = {"vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
              "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
              "intermediate_size": spec.intermediate_size, "tie_word_embeddings": spec.tied_embeddings}
    if spec.mla is not None:
        m = spec.mla
        return {**common, "model_type": spec.family, "q_lora_rank": m.q_lora_rank or None,
                "kv_lora_rank": m.kv_lora_rank, "qk_nope_head_dim": m.qk_nope_head_dim,
                "qk_rope_head_dim": m.qk_rope_head_dim, "v_head_dim": m.v_head_dim,
                "n_routed_experts": spec.num_experts, "num_experts_per_tok": spec.num_experts_per_tok,
                "moe_intermediate_size": spec.moe_intermediate_size, "n_shared_experts": spec.num_shared_experts,
                "first_k_dense_replace": spec.num_dense_layers, "moe_layer_freq": 1}
    common["head_dim"] = spec.head_dim
    if spec.family == "mixtral":
        return {**common, "model_type": "mixtral", "num_local_experts": spec.num_experts,
                "num_experts_per_tok": spec.num_experts_per_tok, "intermediate_size": spec.moe_intermediate_size,
                "sliding_window": spec.sliding_window or None}
    if spec.family == "qwen3_moe":
        return {**common, "model_type": "qwen3_moe", "num_experts": spec.num_experts,
                "num_experts_per_tok": spec.num_experts_per_tok, "moe_intermediate_size": spec.moe_intermediate_size,
                "mlp_only_layers": list(range(spec.num_dense_layers))}
    if spec.family == "gemma":
        kinds = ["sliding_attention" if i < spec.sliding_window_layers else "full_attention"
                 for i in range(spec.num_layers)]
        return {**common, "model_type": "gemma3_text", "sliding_window": spec.sliding_window or 4096,
                "layer_types": kinds}
    model_type = "qwen2" if spec.qkv_bias else "qwen3" if spec.qk_norm else "mistral"
    return {**common, "model_type": model_type, "sliding_window": spec.sliding_window or None}


@st.composite
def new_layout_specs(draw: st.DrawFn) -> ModelSpec:
    family = draw(st.sampled_from(("gpt2", "llama", "mixtral", "qwen3_moe", "gemma", "deepseek_v2", "deepseek_v3")))
    kv = draw(st.sampled_from((1, 2, 4)))
    heads = kv * draw(st.sampled_from((1, 2, 3)))
    head_dim = draw(st.sampled_from((8, 16)))
    layers = draw(st.integers(1, 4))
    hidden = heads * head_dim if family == "gpt2" else draw(st.integers(4, 96))
    fields: dict[str, Any] = {}
    if family in ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3"):
        experts = draw(st.integers(2, 8))
        fields.update(num_experts=experts, num_experts_per_tok=draw(st.integers(1, experts)),
                      moe_intermediate_size=draw(st.integers(1, 32)))
        if family != "mixtral":
            fields["num_dense_layers"] = draw(st.integers(0, layers))
    if family == "gpt2" or family.startswith("deepseek"):
        kv = heads  # no grouped-query attention
    if family.startswith("deepseek"):
        fields["mla"] = MLADims(q_lora_rank=draw(st.sampled_from((0, 12))), kv_lora_rank=8, qk_nope_head_dim=8,
                                qk_rope_head_dim=4, v_head_dim=head_dim)
        fields["num_shared_experts"] = draw(st.integers(0, 2))
    if family == "llama":
        flavour = draw(st.sampled_from(("bias", "norm", "window", "plain")))
        fields.update(qkv_bias=flavour == "bias", qk_norm=flavour == "norm")
        if flavour == "window":
            fields.update(sliding_window=draw(st.integers(1, 8192)), sliding_window_layers=layers)
    if family == "gemma":
        local = draw(st.integers(0, layers))
        fields.update(qk_norm=True, tied_embeddings=True, sliding_window=1024 if local else 0,
                      sliding_window_layers=local)
    if family == "qwen3_moe":
        fields["qk_norm"] = True
    if family == "gpt2":
        fields.update(tied_embeddings=draw(st.booleans()), max_position_embeddings=draw(st.integers(1, 64)))
    elif family not in ("gemma",):
        fields["tied_embeddings"] = draw(st.booleans())
    return ModelSpec("m", family, vocab_size=draw(st.integers(1, 500)), hidden_size=hidden, num_layers=layers,
                     num_heads=heads, num_kv_heads=kv, head_dim=head_dim, intermediate_size=draw(st.integers(1, 64)),
                     **fields)


@given(new_layout_specs())
def test_specs_round_trip_through_their_hf_config(spec: ModelSpec) -> None:
    config = _hf_config_of(spec)
    back = model_spec_from_hf_config(json.loads(json.dumps(config)), name="m")
    if spec.family == "mixtral":  # Mixtral's config has one MLP width, the experts'
        spec = dataclasses.replace(spec, intermediate_size=spec.moe_intermediate_size)
    assert back == spec
    assert count_params(build_params(back)) == count_params(build_params(spec))


def test_the_conventions_reader_knows_what_the_new_layouts_add() -> None:
    from meshplan.pure.rules import leaf_layout

    # q/k norms are one head wide: never the embed dim a rule would shard like a residual-stream norm.
    assert leaf_layout("model/layers/0/self_attn/q_norm/weight", (128,)).dims == ("head_dim",)
    assert leaf_layout("model/layers/0/self_attn/k_norm/weight", (128,)).dims == ("head_dim",)
    bias = leaf_layout("model/layers/0/self_attn/k_proj/bias", (1024,), num_heads=64, num_kv_heads=8)
    assert (bias.role, bias.heads, bias.dims) == ("column", "kv", ("out",))
    assert leaf_layout("model/layers/0/pre_feedforward_layernorm/weight", (5376,)).dims == ("embed",)
    expert = leaf_layout("model/layers/0/mlp/experts/gate_proj/weight", (128, 1536, 4096), num_experts=128)
    assert expert.stacked_expert and expert.dims == ("experts", "out", "in")
    assert leaf_layout("model/layers/0/mlp/gate/weight", (128, 4096)).role == "other"  # the router


@pytest.mark.parametrize("key, value", [("num_hidden_layers", 10**9), ("vocab_size", 10**400),
                                        ("hidden_size", 10**13)])
def test_absurd_sizes_are_refused_before_any_tree_is_built(key: str, value: int) -> None:
    with pytest.raises(ModelConfigError, match=f"key '{key}'=.* is past any model"):
        model_spec_from_hf_config({**_config("llama-3.1-405b.json"), key: value}, source="x.json")


def test_a_windowed_preset_scaled_down_with_replace_stays_a_spec() -> None:
    small = dataclasses.replace(MODEL_SPECS["gemma3-27b"], num_layers=2, num_params=None)
    assert (small.sliding_window, small.sliding_window_layers) == (1024, 2)
    assert dataclasses.replace(MODEL_SPECS["mistral-7b"], sliding_window=0).sliding_window_layers == 0
    with pytest.raises(PlanError, match="sliding_window=1024 needs sliding_window_layers >= 1"):
        dataclasses.replace(MODEL_SPECS["llama3-8b"], sliding_window=1024)
