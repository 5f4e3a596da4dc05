"""Real flax nnx / linen / equinox / MaxText-style trees: every parameter kind gets its expected spec and pattern.

The expected specs are not read back from meshplan: they come from each library's documented
layout (a flax ``kernel`` is ``(in, out)``, an equinox/PyTorch ``weight`` ``(out, in)``, an
``Embed`` table ``(vocab, embed)``, ``nn.scan`` / ``nnx.vmap`` stack layers first, MaxText's
scan at dim 1) and the Megatron rule per layer kind (column-parallel: split out-features or
heads; row-parallel: in-features or heads; embeddings: the vocabulary; experts over ep).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from meshplan.pure import AxisKindRule, ModelSpec, plan_tree, search_meshes, tree_facts
from meshplan.pure.search._search import WEIGHT_AXES
from tests.facade import model_trees as mt

# module name -> (communication pattern in the reason, the feature tp splits); None: not over tp.
KINDS: dict[str, tuple[str, str] | None] = {
    **{m: ("column-parallel", "out") for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "q_b_proj",
                                              "kv_b_proj", "w1", "w3", "lm_head", "wi_0", "wi_1",
                                              "logits_dense")},
    **{m: ("column-parallel", "heads") for m in ("query", "key", "value")},
    **{m: ("row-parallel", "in") for m in ("o_proj", "down_proj", "w2", "wo")},
    "out": ("row-parallel", "heads"),
    **{m: ("vocab-parallel", "vocab") for m in ("embed_tokens", "token_embedder")},
    **{m: None for m in ("input_layernorm", "post_attention_layernorm", "norm", "gate", "q_a_proj",
                         "kv_a_proj_with_mqa", "q_a_layernorm", "kv_a_layernorm", "decoder_norm",
                         "pre_self_attention_layer_norm", "post_self_attention_layer_norm")},
}

# where each feature sits in an unstacked leaf, per library layout
FLAX = {"in": 0, "out": 1, "vocab": 0}
TORCH = {"in": 1, "out": 0, "vocab": 0}
MAXTEXT = {"in": 0, "out": 2, "vocab": 0, "heads": 2}  # (embed, L, heads, head_dim); out: (heads, L, hd, embed)

TREES = {
    "nnx-llama": (lambda: mt.nnx_params("llama"), FLAX, 0, "auto"),
    "nnx-llama-scanned": (lambda: mt.nnx_params("llama", scan=True), FLAX, 1, "auto"),
    "nnx-mixtral": (lambda: mt.nnx_params("mixtral"), FLAX, 0, "auto"),
    "nnx-deepseek": (lambda: mt.nnx_params("deepseek"), FLAX, 0, "auto"),
    "linen-llama": (lambda: mt.linen_params(), FLAX, 0, "auto"),
    "linen-mixtral-scanned": (lambda: mt.linen_params(scan=True, moe=True), FLAX, 1, "auto"),
    "maxtext-scanned": (mt.maxtext_params, MAXTEXT, 0, "maxtext"),
    "equinox-llama": (lambda: mt.eqx_params(), TORCH, 0, "auto"),
    "equinox-mixtral": (lambda: mt.eqx_params(moe=True), TORCH, 0, "auto"),
}
MESH = {"ep": 2, "tp": 2}


def _module(path: str) -> str:
    parts = path.split("/")
    parts = parts[1:] if parts[0] == "params" else parts
    parts = parts[:-1] if parts[-1] == "value" else parts
    return parts[-2] if parts[-1] in {"kernel", "weight", "bias", "scale", "embedding"} else parts[-1]


def _expected(path: str, shape: tuple[int, ...], layout: dict[str, int], stacks: int) -> tuple[P, str | None]:
    """The spec the library layout and the Megatron rule call for, and the pattern the reason names."""
    module = _module(path)
    kind = KINDS[module]
    stacks = stacks if "layers" in path.split("/") else 0  # embeddings, final norm, head: not scanned
    entries: list[Any] = [None] * len(shape)
    experts = "/experts/" in path and module in {"w1", "w2", "w3"}
    lead = stacks + int(experts)  # leading stack dims: scanned layers, then experts
    if experts:
        entries[stacks] = "ep"
    if kind is not None:
        pattern, feature = kind
        if layout is MAXTEXT and module == "out":
            dim = 0  # (heads, L, head_dim, embed)
        elif layout is MAXTEXT and module in {"wo", "wi_0", "wi_1"}:
            dim = {"in": 0, "out": 2}[feature]
        elif layout is MAXTEXT and module in {"logits_dense"}:
            dim = 1
        else:
            dim = lead + layout[feature]
        entries[dim] = "tp"
        return _trim(entries), pattern
    return _trim(entries), None


def _trim(entries: list[Any]) -> P:
    """A spec without trailing None entries (the form meshplan emits; jax treats both alike)."""
    while entries and entries[-1] is None:
        entries = entries[:-1]
    return P(*entries)


def _leaves(tree: Any) -> list[tuple[str, tuple[int, ...]]]:
    facts = tree_facts(tree)
    return [(facts.path(i), info.shape) for i, info in enumerate(facts.infos) if info is not None]


@pytest.mark.parametrize("name", sorted(TREES))
def test_every_parameter_kind_gets_its_layouts_spec_and_pattern(name: str) -> None:
    build, layout, stacks, convention = TREES[name]
    tree = build()
    rule = AxisKindRule(min_shard_size=0, convention=convention, **mt.HINTS)
    plan = plan_tree(tree, rule, MESH)
    specs = jax.tree.leaves(plan.specs, is_leaf=lambda x: isinstance(x, P))
    leaves = _leaves(tree)
    assert len(specs) == len(leaves) == len(plan.leaf_decisions)
    seen = set()
    for (path, shape), spec, decision in zip(leaves, specs, plan.leaf_decisions, strict=True):
        want, pattern = _expected(path, shape, layout, stacks)
        assert spec == want, f"{name} {path} {shape}: got {spec}, the layout calls for {want}"
        assert decision is not None
        if pattern is not None:
            assert pattern in decision.reason, (path, decision.reason)
        else:
            assert "not a tensor-parallel layer" in decision.reason, (path, decision.reason)
        assert "no axis of size > 1" not in decision.reason
        seen.add(_module(path))
    assert seen <= set(KINDS)


@pytest.mark.parametrize("name", ["nnx-llama", "linen-mixtral-scanned", "equinox-mixtral", "maxtext-scanned"])
def test_scanned_layer_and_expert_stacks_are_never_split_over_tp(name: str) -> None:
    build, _, stacks, convention = TREES[name]
    rule = AxisKindRule(min_shard_size=0, convention=convention, **mt.HINTS)
    for (path, shape) in _leaves(build()):
        lay = rule.layout(path, shape)
        spec = rule.decide(path, shape, {"fsdp": 3, "tp": 2, "ep": 2}).spec
        for d, kind in enumerate(lay.dims):
            entry = spec[d] if d < len(spec) else None
            axes = entry if isinstance(entry, tuple) else (entry,)
            if kind in {"layers", "experts"}:
                assert "tp" not in axes, (path, spec, lay.dims)
            if kind == "experts":
                assert "ep" in axes, (path, spec, lay.dims)
        # fsdp (3) divides every hidden dim here, so it never has to take a layer stack
        if "layers" in lay.dims and min(shape) >= 3 and any(
                shape[d] % 3 == 0 for d, k in enumerate(lay.dims) if k != "layers"):
            entry = spec[lay.dims.index("layers")] if lay.dims.index("layers") < len(spec) else None
            assert "fsdp" not in (entry if isinstance(entry, tuple) else (entry,)), (path, spec, lay.dims)


def test_nnx_split_and_state_and_linen_boxes_plan_like_plain_trees() -> None:
    from flax import nnx

    model = mt.nnx_model("llama")
    rule = AxisKindRule(min_shard_size=0, **mt.HINTS)
    _, state = nnx.split(model)
    by_split = {re.sub(r"/value$", "", p): s for p, s in zip(
        [p for p, _ in _leaves(state)],
        jax.tree.leaves(plan_tree(state, rule, MESH).specs, is_leaf=lambda x: isinstance(x, P)))}
    by_params = {re.sub(r"/value$", "", p): s for p, s in zip(
        [p for p, _ in _leaves(nnx.state(model, nnx.Param))],
        jax.tree.leaves(plan_tree(nnx.state(model, nnx.Param), rule, MESH).specs,
                        is_leaf=lambda x: isinstance(x, P)))}
    assert by_split == by_params and by_split["layers/0/self_attn/q_proj/kernel"] == P(None, "tp")


def _tiny_spec(name: str = "tiny") -> ModelSpec:
    return ModelSpec(name, "llama", vocab_size=mt.V, hidden_size=mt.D, num_layers=mt.L, num_heads=mt.H,
                     num_kv_heads=mt.KV, head_dim=mt.HD, intermediate_size=mt.F)


@pytest.mark.parametrize("name", ["nnx-llama", "linen-llama", "equinox-llama", "nnx-llama-scanned"])
def test_the_search_on_a_real_tree_splits_the_projections_on_the_ranked_tp_meshes(name: str) -> None:
    result = search_meshes(_tiny_spec(), "2xH100", params=TREES[name][0](), batch=4, seq=64, top_k=50)
    tp_meshes = [c for c in result.candidates if c.mesh_shape["tp"] > 1]
    assert tp_meshes, result.rejections
    for cand in result.candidates:
        used = {a for g in cand.groups for e in g.spec if e is not None
                for a in (e if isinstance(e, tuple) else (e,))}
        assert all(a in used for a in WEIGHT_AXES if cand.mesh_shape.get(a, 1) > 1), cand.text
        for g in cand.groups:
            assert "no axis of size > 1" not in g.reason or all(
                cand.mesh_shape.get(a, 1) == 1 for a in WEIGHT_AXES), (cand.text, g)
    q = [g for g in tp_meshes[0].groups if "q_proj" in g.pattern]
    assert q and all("column-parallel" in g.reason and "tp" in str(g.spec) for g in q)


def test_specs_for_takes_the_nnx_state_as_searched_split_or_in_fp32() -> None:
    from flax import nnx

    state = mt.nnx_params("llama")  # float32
    bf16 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), state)
    best = search_meshes(_tiny_spec(), "2xH100", params=bf16, batch=4, seq=64, fixed={"tp": 2}).best
    assert {g.dtype for g in best.groups} == {"bfloat16"}
    specs = best.specs_for(state)
    assert specs["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value() == P(None, "tp")
    assert specs["layers"][0]["self_attn"]["o_proj"]["kernel"].get_value() == P("tp")
    _, split_state = nnx.split(mt.nnx_model("llama"))
    want = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
    assert jax.tree.leaves(best.specs_for(split_state), is_leaf=lambda x: isinstance(x, P)) == want
    assert jax.tree.leaves(best.specs_for({"params": state}), is_leaf=lambda x: isinstance(x, P)) == want
