"""Logical-axis rules: flax's resolution, made divisibility-aware, as a pure rule for plan_tree and the search."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import linen as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import AxisKindRule, LogicalRule, ShardingRuleError, get_preset, plan_tree, search_meshes
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.rules import (
    canonical_logical_table,
    logical_names_by_path,
    logical_rule_from_json,
    logical_table_to_json,
    resolve_logical_axes,
)
from meshplan.pure.specs import canonical_entries
from tests.pure.rules.maxtext_rules import MAXTEXT_LOGICAL_AXIS_RULES, MAXTEXT_MESH_AXES

AXES = ("a", "b", "c", "d")
LOGICAL = ("batch", "embed", "mlp", "heads", "vocab", "kv")
# Cheap pure-Python draws: more than the profile's default, never fewer than it asks for.
AGREEMENT = settings(max_examples=max(200, settings.default.max_examples))


def _flax(names, shape_rank, table):
    """flax's own answer for a canonical table (rows as flax takes them)."""
    rules = [(n, None if not axes else axes) for n, axes in table]
    return canonical_entries(nn.logical_to_mesh_axes(names, rules), shape_rank)


@st.composite
def cases(draw, *, divisible: bool, mesh_axes_only: bool):
    """(names, shape, table, sizes): up to 4 mesh axes of sizes 1-4, up to 10 rows, rank 0-4.

    Shrinks towards an empty table and rank 0.
    """
    n_axes = draw(st.integers(1, 4))
    sizes = {AXES[i]: draw(st.integers(1, 4)) for i in range(n_axes)}
    pool = list(sizes) if mesh_axes_only else list(AXES)
    value = st.one_of(st.none(), st.sampled_from(pool),
                      st.lists(st.sampled_from(pool), max_size=3, unique=True).map(tuple))
    table = canonical_logical_table(draw(st.lists(st.tuples(st.sampled_from(LOGICAL), value), max_size=10)))
    rank = draw(st.integers(0, 4))
    names = draw(st.lists(st.one_of(st.none(), st.sampled_from(LOGICAL)), min_size=rank, max_size=rank)
                 .filter(lambda ns: len({n for n in ns if n}) == len([n for n in ns if n])))
    if divisible:
        every = math.prod(sizes.values())
        shape = tuple(every * draw(st.integers(1, 3)) for _ in range(rank))
    else:
        shape = tuple(draw(st.sampled_from([1, 2, 3, 4, 5, 6, 8, 9, 12, 16])) for _ in range(rank))
    return tuple(names), shape, table, sizes


@AGREEMENT
@given(cases(divisible=True, mesh_axes_only=True))
def test_resolution_equals_flax_where_flax_semantics_apply(case):
    names, shape, table, sizes = case
    spec, _ = resolve_logical_axes(names, shape, table, sizes)
    assert canonical_entries(spec, len(shape)) == _flax(names, len(shape), table)


@AGREEMENT
@given(cases(divisible=False, mesh_axes_only=False))
def test_resolution_equals_flax_on_the_rows_that_fit_this_leaf(case):
    # Skipping a row that does not divide its dim (or names an axis the mesh lacks) has no
    # other effect: the answer is flax's on the table without those rows.
    names, shape, table, sizes = case
    dim_of = {n: d for d, n in enumerate(names) if n is not None}

    def fits(row):
        name, axes = row
        if name not in dim_of:
            return True
        return all(a in sizes for a in axes) and shape[dim_of[name]] % math.prod(sizes[a] for a in axes) == 0

    spec, reason = resolve_logical_axes(names, shape, table, sizes)
    assert canonical_entries(spec, len(shape)) == _flax(names, len(shape), tuple(filter(fits, table)))
    # Every skipped row that mattered is named in the reason.
    for k, row in enumerate(table):
        if not fits(row):
            assert f"row #{k} " in reason.split("skipped: ", 1)[1]


@given(cases(divisible=False, mesh_axes_only=True))
def test_resolved_specs_always_store_the_leaf(case):
    names, shape, table, sizes = case
    spec, _ = resolve_logical_axes(names, shape, table, sizes)
    entries = canonical_entries(spec, len(shape))
    used = [a for e in entries for a in e]
    assert len(used) == len(set(used))
    assert all(d % math.prod(sizes[a] for a in e) == 0 for d, e in zip(shape, entries, strict=True))


@given(cases(divisible=False, mesh_axes_only=False))
def test_table_json_round_trips(case):
    _, _, table, _ = case
    assert canonical_logical_table(logical_table_to_json(table)) == table


def test_flax_docstring_example():
    # flax.linen.logical_to_mesh_axes's own worked example.
    table = canonical_logical_table((("batch", "X"), ("features", "X"), ("heads", "Y"), ("batch", "Z")))
    spec, _ = resolve_logical_axes(("batch", "length", "heads", "features"), (8, 8, 8, 8), table,
                                   {"X": 2, "Y": 2, "Z": 2})
    assert spec == P("X", None, "Y")
    assert nn.logical_to_mesh_axes(("batch", "length", "heads", "features"), table_rows(table)) == \
        P("X", None, "Y", None)


def table_rows(table):
    return [(n, None if not a else a[0] if len(a) == 1 else a) for n, a in table]


# MaxText's Llama-style decoder with scanned layers (param_scan_axis=1), as MaxText names its dims.
MAXTEXT_LLAMA = {
    "token_embedder/embedding": ((32000, 4096), ("vocab", "embed")),
    "decoder/layers/self_attention/query/kernel": ((4096, 32, 32, 128), ("embed", "layers", "q_heads", "kv")),
    "decoder/layers/self_attention/key/kernel": ((4096, 32, 8, 128), ("embed", "layers", "kv_heads", "kv_head_dim")),
    "decoder/layers/self_attention/out/kernel": ((32, 32, 128, 4096), ("heads", "layers", "kv", "embed")),
    "decoder/layers/mlp/wi_0/kernel": ((4096, 32, 14336), ("embed", "layers", "mlp")),
    "decoder/layers/mlp/wo/kernel": ((14336, 32, 4096), ("mlp", "layers", "embed")),
    "decoder/layers/pre_self_attention_layer_norm/scale": ((4096, 32), ("norm", "layers")),
    "decoder/logits_dense/kernel": ((4096, 32000), ("embed", "vocab")),
}


def _maxtext_mesh(**sizes):
    return {a: sizes.get(a, 1) for a in MAXTEXT_MESH_AXES}


def _maxtext_tree():
    tree: dict = {}
    for path, (shape, _) in MAXTEXT_LLAMA.items():
        *parents, leaf = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = jax.ShapeDtypeStruct(shape, np.float32)
    return tree


def test_maxtext_default_table_on_a_maxtext_llama_matches_flax():
    rule = LogicalRule(MAXTEXT_LOGICAL_AXIS_RULES, names={p: n for p, (_, n) in MAXTEXT_LLAMA.items()},
                       mesh_axes=MAXTEXT_MESH_AXES)
    sizes = _maxtext_mesh(fsdp=4, tensor=2)
    plan = plan_tree(_maxtext_tree(), rule, sizes)
    for path, decision in plan.items():
        shape, names = MAXTEXT_LLAMA[path]
        expected = nn.logical_to_mesh_axes(names, MAXTEXT_LOGICAL_AXIS_RULES)
        assert canonical_entries(decision.spec, len(shape)) == canonical_entries(expected, len(shape)), path
    # mlp takes fsdp_transpose first, so embed falls back to its second row (MaxText's design).
    wi = plan.explain("decoder/layers/mlp/wi_0/kernel")
    assert "dim 0 'embed' <- 'fsdp'(4)*'context'(1)" in wi and "'fsdp_transpose' is already used" in wi


def test_an_indivisible_row_falls_back_where_flax_would_emit_an_unstorable_spec():
    # 8 kv heads on tensor=16: flax returns 'tensor' for the kv_heads dim (8 % 16 != 0, which
    # device_put rejects); meshplan skips the row, the dim stays replicated, and the reason says why.
    names = ("embed", "layers", "kv_heads", "kv_head_dim")
    sizes = _maxtext_mesh(fsdp=4, tensor=16)
    table = canonical_logical_table(MAXTEXT_LOGICAL_AXIS_RULES)
    spec, reason = resolve_logical_axes(names, (4096, 32, 8, 128), table, sizes)
    flax = canonical_entries(nn.logical_to_mesh_axes(names, MAXTEXT_LOGICAL_AXIS_RULES), 4)
    assert flax[2] == ("tensor", "tensor_sequence", "autoregressive")
    assert canonical_entries(spec, 4)[2] == ()
    assert "'kv_heads'->('tensor', 'tensor_sequence', 'autoregressive')" in reason
    assert "does not divide dim 2 (8)" in reason


HF_LOGICAL = {
    "logical_axis_rules": [["vocab", "tp"], ["heads", "tp"], ["kv_heads", "tp"], ["mlp", "tp"],
                           ["embed", "fsdp"], ["norm", None]],
    "logical_names": [["embed_tokens|lm_head", ["vocab", "embed"]], ["q_proj", ["heads", "embed"]],
                      ["[kv]_proj", ["kv_heads", "embed"]], ["o_proj", ["embed", "heads"]],
                      ["gate_proj|up_proj", ["mlp", "embed"]], ["down_proj", ["embed", "mlp"]],
                      ["norm", ["norm"]]],
}


def test_search_meshes_plans_with_a_logical_rule():
    preset = get_preset("llama3-8b")
    rule = logical_rule_from_json(HF_LOGICAL, mesh_axes=("dp", "fsdp", "sp", "tp"))
    result = search_meshes(preset.spec, "8xH100", params=preset.params, rule=rule, top_k=3)
    best = result.best
    sizes = best.mesh_shape
    specs = best.specs_for(preset.params)
    q = specs["model"]["layers"]["0"]["self_attn"]["q_proj"]["weight"]
    expected = resolve_logical_axes(("heads", "embed"), (4096, 4096), rule.table, sizes)[0]
    assert q == expected
    assert all(g.rule == "logical" for g in best.groups)


def test_names_match_normalised_paths_and_patterns_come_after_exact_names():
    rule = LogicalRule([("embed", "fsdp")], names={"params/dense/kernel/value": ("embed", None)},
                       patterns=[("kernel", (None, "embed"))])
    assert rule.names_for("params/dense/kernel") == ("embed", None)
    assert rule.names_for("dense/kernel") == ("embed", None)
    assert rule.names_for("params/other/kernel/value") == (None, "embed")
    assert rule.names_for("params/other/bias") is None


def test_leaves_without_names_go_to_the_fallback():
    tree = {"named": jax.ShapeDtypeStruct((64, 64), np.float32), "other": jax.ShapeDtypeStruct((64, 64), np.float32)}
    rule = LogicalRule([("embed", "tp")], names={"named": ("embed", None)}, fallback=AxisKindRule(min_shard_size=1))
    plan = plan_tree(tree, rule, {"tp": 4})
    assert plan.specs["named"] == P("tp")
    assert plan.leaf_decisions[1].rule != "logical"
    no_fallback = plan_tree(tree, LogicalRule([("embed", "tp")], names={"named": ("embed", None)}), {"tp": 4})
    assert no_fallback.leaf_decisions[1] is None


def test_names_from_a_flax_partition_spec_tree():
    specs = {"params": {"dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}}, "step": None}
    assert logical_names_by_path(specs) == {"dense/bias": ("mlp",), "dense/kernel": ("embed", "mlp")}


def test_names_longer_than_the_rank_name_the_leaf_and_shorter_ones_pad():
    rule = LogicalRule([("embed", "tp")], names={"w": ("embed", None, None)})
    with pytest.raises(ShardingRuleError, match=r"w: logical names \('embed', None, None\) have 3 entries but the"):
        plan_tree({"w": np.zeros((4, 4))}, rule, {"tp": 2})
    short = LogicalRule([("embed", "tp")], names={"w": ("embed",)})
    assert plan_tree({"w": np.zeros((4, 4))}, short, {"tp": 2}).specs == {"w": P("tp")}


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: LogicalRule([("embed", "tpp")], mesh_axes=("dp", "tp")), ShardingRuleError,
     r"row #0 'embed' names 'tpp'; the mesh axes are \['dp', 'tp'\]"),
    (lambda: LogicalRule([("embed", ["tp", "tp"])]), ShardingRuleError, r"uses mesh axes \['tp'\] twice"),
    (lambda: LogicalRule([("embed",)]), MeshplanTypeError, "row #0"),
    (lambda: LogicalRule("embed"), MeshplanTypeError, "list of"),
    (lambda: LogicalRule([("embed", 3)]), MeshplanTypeError, "mesh axis name or a list"),
    (lambda: LogicalRule([], names={"w": ("embed", "embed")}), ShardingRuleError, "more than one dim"),
    (lambda: LogicalRule([], patterns=[("(", ("embed",))]), ShardingRuleError, "not a valid regex"),
    (lambda: logical_rule_from_json([["embed", "tp"]]), MeshplanTypeError, "needs 'logical_axis_rules'"),
    (lambda: logical_rule_from_json({"logical_axis_rules": [], "extra": 1}), MeshplanTypeError, "unknown keys"),
])
def test_bad_tables_and_names_are_refused_when_built(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_group_keys_group_equal_names_and_shapes():
    from meshplan.pure import LeafContext, tree_facts

    tree = {"a": np.zeros((4, 4)), "b": np.zeros((4, 4)), "c": np.zeros((4, 8))}
    facts = tree_facts(tree)
    rule = LogicalRule([("embed", "tp")], patterns=[(".", ("embed", None))])
    keys = [rule.group_key(LeafContext(facts.infos[i].shape, facts.infos[i].dtype, {"tp": 2}, i, facts))
            for i in range(3)]
    assert keys[0] == keys[1] != keys[2]
    assert rule.reads_axes == ("tp",)


def test_check_rule_names_bad_rows_names_and_patterns_before_any_mesh():
    from meshplan.pure import RuleValidationError, check_rule

    tree = {"params": {"q": {"kernel": np.zeros((8, 4))}, "norm": {"scale": np.zeros(8)}}}
    rule = LogicalRule([("embed", "fsdpp"), ("heads", "tp")], names={"q/kernel": ("embed", "heads", None)},
                       patterns=[("mlp", ("embed", "mlp")), ("norm", ("norm",))])
    with pytest.raises(RuleValidationError) as err:
        check_rule(rule, tree, ["fsdp", "tp"])
    text = str(err.value)
    assert "row #0 'embed' -> ['fsdpp']: ['fsdpp'] are not axes of the mesh; valid axes: ['fsdp', 'tp']" in text
    assert "pattern #0 'mlp': matches no leaf" in text
    assert "leaf 'params/q/kernel' of shape (8, 4) has 3 logical names" in text
    assert "pattern #1" not in text  # the norm pattern matches a leaf
    # Declared mesh axes make an axis some meshes lack legitimate (skipped there, not an error).
    fine = LogicalRule([("embed", "ep")], patterns=[("kernel", ("embed", None))], mesh_axes=("ep", "fsdp", "tp"))
    check_rule(fine, tree, ["fsdp", "tp"])


def test_search_meshes_refuses_a_logical_rule_with_a_typo_before_searching():
    from meshplan.pure import RuleValidationError

    preset = get_preset("gpt2")
    rule = LogicalRule([("embed", "fsdp")], patterns=[("q_porj", ("heads", "embed"))])
    with pytest.raises(RuleValidationError, match="pattern #0 'q_porj': matches no leaf"):
        search_meshes(preset.spec, "1x8xH100", params=preset.params, rule=rule)
