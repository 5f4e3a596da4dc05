"""The new layouts (q/k/v biases, q/k norms and an explicit head_dim, Gemma's sandwich norms, Qwen3-MoE's
experts, DeepSeek-V2-Lite's uncompressed queries) compile in the reference step, and the analytic step FLOPs
agree with XLA's count of it (within 3%; the matmuls within 0.5% of the HLO's dots), as
tests/facade/test_flops_vs_xla.py holds the first five presets to. Scaled-down copies of the presets, one
layer group each, unrolled (``scan_layers=False``) so ``cost_analysis`` counts every layer.
"""

import dataclasses
import importlib.util
import pathlib

import jax
import pytest

from meshplan.facade.verify._reference import ReferenceConfig, reference_step
from meshplan.pure.cost._flops import step_flops
from meshplan.pure.presets import MODEL_SPECS, MLADims, build_params, count_params

_SMALL = dict(num_layers=1, hidden_size=512, num_heads=4, num_kv_heads=2, head_dim=128, intermediate_size=1536,
              vocab_size=1024, num_params=None, sliding_window=0, sliding_window_layers=0)
CASES = {
    # Qwen2's q/k/v biases with Qwen3's q/k norms and a head_dim wider than hidden / heads; tp=4 over 2 KV heads.
    "qwen-bias-norm-hd192-fsdp2-tp4-full": (
        dataclasses.replace(MODEL_SPECS["qwen2.5-72b"], name="qwen-small", qk_norm=True, **{**_SMALL, "head_dim": 192}),
        ((2, 4), ("fsdp", "tp")), "full"),
    # Gemma 3: four norms a layer, tanh GELU, tied head; its down projection is recomputed under remat.
    "gemma3-fsdp2-tp4-full": (
        dataclasses.replace(MODEL_SPECS["gemma3-27b"], name="gemma-small", **{**_SMALL, "head_dim": 160}),
        ((2, 4), ("fsdp", "tp")), "full"),
    # Qwen3-MoE: experts under mlp/, softmax router, no shared experts.
    "qwen3moe-fsdp8-none": (
        dataclasses.replace(MODEL_SPECS["qwen3-235b-a22b"], name="qwen-moe-small", num_experts=4,
                            num_experts_per_tok=2, moe_intermediate_size=768, **_SMALL),
        ((8,), ("fsdp",)), "none"),
    # DeepSeek-V2-Lite: MLA with one q_proj, a dense layer then an MoE layer with two shared experts.
    "deepseek-v2-lite-fsdp8-none": (
        dataclasses.replace(MODEL_SPECS["deepseek-v2-lite"], name="ds2-small", num_layers=2, num_dense_layers=1,
                            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, num_shared_experts=2,
                            hidden_size=256, num_heads=4, num_kv_heads=4, head_dim=32, intermediate_size=512,
                            vocab_size=256, num_params=None,
                            mla=MLADims(q_lora_rank=0, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
                                        v_head_dim=32)),
        ((8,), ("fsdp",)), "none"),
}


def _matmul_flops(hlo: str) -> float:
    """``benchmarks/bench_flops.py``'s HLO matmul count."""
    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "bench_flops.py"
    spec = importlib.util.spec_from_file_location("bench_flops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.matmul_flops(hlo))


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.parametrize("case", sorted(CASES))
def test_new_layouts_compile_and_their_flops_match_xla(case: str) -> None:
    spec, (shape, names), remat = CASES[case]
    mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
    ref = reference_step(spec, mesh, batch=8, seq=128,
                         config=ReferenceConfig(remat=remat, attention="plain", scan_layers=False))
    # The step trains exactly the preset layout's parameters (biases and norms included).
    assert count_params(ref.args[0][0]) == count_params(build_params(spec))
    compiled = ref.lower().compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = step_flops(spec, dict(zip(names, shape)), batch=8, seq=128, remat=remat, attention="plain")
    assert flops.per_device / cost["flops"] == pytest.approx(1.0, abs=0.03)
    matmuls = flops.per_device - flops.elementwise
    assert matmuls / _matmul_flops(compiled.as_text()) == pytest.approx(1.0, abs=0.005)


def test_reference_step_takes_a_model_config_path(tmp_path: pathlib.Path) -> None:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 256,
                                "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}))
    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    ref = reference_step(str(path), mesh, batch=8, seq=16)
    assert ref.model.qk_norm and ref.model.head_dim == 32
    params = ref.args[0][0]
    assert params["model"]["layers"]["dense"]["self_attn"]["q_norm"]["weight"].shape == (2, 32)
    assert ref.lower().compile() is not None
