"""MaxText model ymls (meshplan.pure.presets.parse_maxtext_yml, model_spec_from_maxtext).

tests/data/models/maxtext/*.yml are copies of AI-Hypercomputer/maxtext's
src/maxtext/configs/models/<name>.yml (commit e591f30cbbf217ed67ef71263ec0538239f9c3b8).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import ModelConfigError
from meshplan.pure.presets import (
    MAXTEXT_DECODER_BLOCKS,
    ModelSpec,
    build_params,
    count_params,
    model_spec_from_hf_config,
    model_spec_from_maxtext,
    parse_maxtext_yml,
)

DATA = pathlib.Path(__file__).parents[2] / "data" / "models"
YMLS = sorted(p.stem for p in (DATA / "maxtext").glob("*.yml"))

# MaxText model -> (its exact parameter count, why). Where MaxText's shapes equal the HF checkpoint's,
# the count is the checkpoint's (test_model_configs.py cites it); Gemma's vocabulary MaxText pads.
MAXTEXT_COUNTS: dict[str, tuple[int, str]] = {
    "llama3.1-405b": (405_853_388_800, "= meta-llama/Llama-3.1-405B"),
    "mistral-7b": (7_241_732_096, "= mistralai/Mistral-7B-v0.1"),
    "mixtral-8x7b": (46_702_792_704, "= mistralai/Mixtral-8x7B-v0.1"),
    "qwen3-235b-a22b": (235_093_634_560, "= Qwen/Qwen3-235B-A22B"),
    "qwen3-8b": (8_190_735_360, "= Qwen/Qwen3-8B"),
    "qwen2.5-7b": (7_615_616_512, "= Qwen/Qwen2.5-7B(-Instruct): index total_size 15,231,233,024 bytes / 2"),
    "deepseek2-16b": (15_706_484_224, "= deepseek-ai/DeepSeek-V2-Lite"),
    "deepseek3-671b": (671_026_419_200, "= deepseek-ai/DeepSeek-V3 without MTP"),
    "gemma3-27b": (27_009_002_240, "keras-hub gemma3_27b_text 'params' (vocab 262,144, as MaxText's)"),
    "gemma2-27b": (27_227_718_144, "no published figure with MaxText's 256,128-row vocabulary: the HF closed form "
                                   "27,227,128,320 plus 128 x 4,608 padded rows"),
}
# MaxText yml -> the HF config.json of the same model, where their shapes agree exactly.
SAME_AS_HF = {"llama3.1-405b": "llama-3.1-405b.json", "mixtral-8x7b": "mixtral-8x7b.json",
              "qwen3-235b-a22b": "qwen3-235b-a22b.json", "qwen3-8b": "qwen3-8b.json",
              "deepseek2-16b": "deepseek-v2-lite.json", "deepseek3-671b": "deepseek-v3.json"}


def _spec(stem: str) -> ModelSpec:
    path = DATA / "maxtext" / f"{stem}.yml"
    return model_spec_from_maxtext(parse_maxtext_yml(path.read_text(), source=str(path)), name=stem,
                                   source=str(path))


def test_every_shipped_yml_has_an_expected_count() -> None:
    assert sorted(MAXTEXT_COUNTS) == YMLS


@pytest.mark.parametrize("stem", YMLS)
def test_maxtext_ymls_give_exact_counts(stem: str) -> None:
    expected, why = MAXTEXT_COUNTS[stem]
    assert count_params(build_params(_spec(stem))) == expected, why


@pytest.mark.parametrize("stem", sorted(SAME_AS_HF))
def test_a_maxtext_yml_and_the_hf_config_of_the_same_model_agree(stem: str) -> None:
    hf = model_spec_from_hf_config(json.loads((DATA / SAME_AS_HF[stem]).read_text()), name=stem)
    mt = _spec(stem)
    if mt.is_moe and not mt.num_dense_layers:  # no dense layer reads the dense MLP width (Qwen3-MoE)
        mt = dataclasses.replace(mt, intermediate_size=hf.intermediate_size)
    assert mt == hf


def test_maxtext_specifics_are_read() -> None:
    gemma2 = _spec("gemma2-27b")
    assert gemma2.num_layers == 46  # MaxText's gemma2 block is a local + global pair: 23 blocks
    assert (gemma2.sliding_window, gemma2.sliding_window_layers, gemma2.tied_embeddings) == (4096, 23, True)
    gemma3 = _spec("gemma3-27b")
    assert (gemma3.qk_norm, gemma3.sliding_window_layers, gemma3.vocab_size) == (True, 52, 262_144)
    assert _spec("qwen2.5-7b").qkv_bias and _spec("qwen3-8b").qk_norm
    assert _spec("deepseek3-671b").family == "deepseek_v3" and _spec("deepseek2-16b").family == "deepseek_v2"
    assert _spec("mistral-7b").name == "mistral-7b"


# --- the flat-YAML reader ---------------------------------------------------------------------------

_KEYS = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
_SCALARS = st.one_of(st.integers(-10**12, 10**12), st.booleans(),
                     st.floats(allow_nan=False, allow_infinity=False, width=64),
                     st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-<>.", min_size=1, max_size=12))


def _dump(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_dump(v) for v in value) + "]"
    return str(value)


@given(st.dictionaries(_KEYS, st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3)), min_size=1, max_size=8),
       st.booleans())
def test_flat_settings_round_trip_through_the_reader(settings: dict[str, Any], comments: bool) -> None:
    lines = ["# a model config"] if comments else []
    for key, value in settings.items():
        lines.append(f"{key}: {_dump(value)}" + ("  # why" if comments else ""))
        if comments:
            lines.append("")
    assert parse_maxtext_yml("\n".join(lines)) == settings


def test_maxtext_number_spellings_are_read() -> None:
    got = parse_maxtext_yml("a: 500_000\nb: 1.0e-5\nc: 1.e-05\nd: 1e-6\ne: <start_of_image>\nf: ~\ng: 'x'\nh: x#y")
    assert got == {"a": 500000, "b": 1e-5, "c": 1e-5, "d": 1e-6, "e": "<start_of_image>", "f": None, "g": "x",
                   "h": "x#y"}


@pytest.mark.parametrize("text, fragment", [
    ("a: 1\n  b: 2", "m.yml:2: indented line"),
    ("a: 1\n---\nb: 2", "m.yml:2: '---' starts another YAML document"),
    ("- a\n- b", "m.yml:1: '- a' is not a 'key: value' line"),
    ("a: 1\na: 2", "m.yml:2: key 'a' is given twice"),
    ("a: &anchor 1", "m.yml:1: value '&anchor 1' is not a scalar"),
    ("a: {b: 1}", "m.yml:1: value '{b: 1}' is not a scalar"),
    ("a: [[1, 2]]", "m.yml:1: nested list"),
    ("a:\n  - 1", "m.yml:2: indented line"),
    ("# only a comment\n", "m.yml: no 'key: value' settings"),
    ("\x00\x01binary", "m.yml:1:"),
])
def test_yaml_beyond_the_flat_subset_is_refused_naming_the_line(text: str, fragment: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_maxtext_yml(text, source="m.yml")
    assert fragment in str(info.value)


@pytest.mark.parametrize("change, fragment", [
    ({"decoder_block": "gpt3"}, "key 'decoder_block'='gpt3' is not one meshplan reads"),
    ({"base_num_kv_heads": 5}, "'base_num_kv_heads'=5 must divide base_num_query_heads=32"),
    ({"base_emb_dim": -4096}, "key 'base_emb_dim'=-4096 must be an int >= 1"),
    ({"base_mlp_dim": 1.5}, "key 'base_mlp_dim'=1.5 must be an int >= 1"),
    ({"num_experts_per_tok": 9}, "exceeds num_experts=8"),
    ({"num_experts": 1}, "routes tokens to experts but num_experts=1"),
    ({"logits_via_embedding": "yes"}, "must be true or false"),
])
def test_bad_maxtext_settings_name_the_file_and_key(change: dict[str, Any], fragment: str) -> None:
    settings = {**parse_maxtext_yml((DATA / "maxtext" / "mixtral-8x7b.yml").read_text()), **change}
    with pytest.raises(ModelConfigError) as info:
        model_spec_from_maxtext(settings, name="m", source="m.yml")
    assert "m.yml" in str(info.value) and fragment in str(info.value)


def test_a_missing_base_key_is_named() -> None:
    settings = parse_maxtext_yml((DATA / "maxtext" / "llama3.1-405b.yml").read_text())
    del settings["base_num_decoder_layers"]
    with pytest.raises(ModelConfigError, match="m.yml: key 'base_num_decoder_layers' is missing"):
        model_spec_from_maxtext(settings, name="m", source="m.yml")


@given(st.sampled_from(sorted(MAXTEXT_DECODER_BLOCKS)), st.integers(1, 3), st.sampled_from((1, 2, 4)))
def test_every_decoder_block_builds_a_tree_with_the_specs_layer_count(block: str, layers: int, kv: int) -> None:
    settings: dict[str, Any] = {"decoder_block": block, "base_emb_dim": 64, "base_num_query_heads": 4 * kv,
                                "base_num_kv_heads": kv, "base_mlp_dim": 96, "base_num_decoder_layers": layers,
                                "head_dim": 16, "vocab_size": 100, "num_experts": 4, "num_experts_per_tok": 2}
    spec = model_spec_from_maxtext(settings, name="x")
    tree = build_params(spec)
    assert len(tree["model"]["layers"]) == spec.num_layers == layers * (2 if block == "gemma2" else 1)
    assert spec.family == (MAXTEXT_DECODER_BLOCKS[block] if block != "deepseek" else "deepseek_v2")
    assert dataclasses.replace(spec, name="y").name == "y"


def test_absurd_numbers_are_refused_not_computed() -> None:
    with pytest.raises(ModelConfigError, match="m.yml:1: number 99999999999999999999... has 5000 digits"):
        parse_maxtext_yml("a: " + "9" * 5000, source="m.yml")
    settings = {**parse_maxtext_yml((DATA / "maxtext" / "mistral-7b.yml").read_text()),
                "base_num_decoder_layers": 10**6}
    with pytest.raises(ModelConfigError, match="'base_num_decoder_layers'=1000000 is past any model"):
        model_spec_from_maxtext(settings, name="m", source="m.yml")
