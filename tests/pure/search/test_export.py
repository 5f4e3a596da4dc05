"""Exports: flax's resolution of the exported table gives back the plan; MaxText's parallelism is the mesh."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
from flax import linen as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure import PlanError, SearchResult, get_preset, plan_from_specs, search_meshes
from meshplan.pure.report import export_plan, logical_export, maxtext_settings
from meshplan.pure.rules import logical_rule_from_json
from meshplan.pure.report import MAXTEXT_MESH_AXES
from meshplan.pure.specs import canonical_entries, spec_from_entries
from tests.pure.rules.test_logical import HF_LOGICAL

AXES = ("a", "b", "c")
POOL = ("embed", "mlp", "heads", "vocab")


@st.composite
def plans_with_names(draw):
    """A plan over up to 6 leaves with random valid specs, and random (clashing) logical names.

    Names repeat across leaves with different splits, so the export must rename; shrinks to one
    rank-0 leaf.
    """
    tree, specs, names = {}, {}, {}
    for i in range(draw(st.integers(1, 6))):
        rank = draw(st.integers(0, 3))
        free = list(AXES)
        entries = []
        for _ in range(rank):
            take = draw(st.lists(st.sampled_from(free), max_size=2, unique=True)) if free else []
            free = [a for a in free if a not in take]
            entries.append(tuple(take))
        dims = tuple(draw(st.integers(1, 4)) * math.prod(2 for _ in e) for e in entries)
        tree[f"l{i}"] = jax.ShapeDtypeStruct(dims, np.float32)
        specs[f"l{i}"] = spec_from_entries(entries)
        if draw(st.booleans()):
            names[f"l{i}"] = tuple(draw(st.lists(st.one_of(st.none(), st.sampled_from(POOL)), min_size=rank,
                                                 max_size=rank).filter(
                lambda ns: len([n for n in ns if n]) == len({n for n in ns if n}))))
    return plan_from_specs(tree, specs), names


def _flax_reproduces(plan, export):
    rules = [(n, None if not a else a) for n, a in export.rules]
    for i, info in enumerate(plan.infos):
        path = plan.path(i)
        got = nn.logical_to_mesh_axes(export.names[path], rules)
        rank = len(info.shape)
        assert canonical_entries(got, rank) == canonical_entries(plan.leaf_specs[i], rank), path


@settings(max_examples=max(150, settings.default.max_examples))
@given(plans_with_names())
def test_flax_applying_the_exported_table_reproduces_every_spec(case):
    plan, names = case
    export = logical_export(plan, names)
    _flax_reproduces(plan, export)
    # Each name has exactly one row, and the user's names survive wherever their split was the common one.
    assert len({n for n, _ in export.rules}) == len(export.rules)
    for path, given in names.items():
        assert all(g is None or e == g or e.startswith(f"{g}@") for g, e in zip(given, export.names[path], strict=True))


def test_a_searched_plan_exports_to_a_table_flax_resolves_back():
    preset = get_preset("llama3-8b")
    rule = logical_rule_from_json(HF_LOGICAL, mesh_axes=("dp", "fsdp", "sp", "tp"))
    result = search_meshes(preset.spec, "2x8xH100", params=preset.params, rule=rule, top_k=2)
    plan = result.best.plan(preset.params)
    export = logical_export(plan, rule)
    _flax_reproduces(plan, export)
    assert export.names["model/layers/0/self_attn/q_proj/weight"] == ("heads", "embed")
    text = export_plan(result, "flax", tree=preset.params, names=rule)
    data = json.loads(text)
    assert data["mesh"]["axis_names"] == list(result.best.axis_names)
    assert data["rules"] == [[n, None if not a else a[0] if len(a) == 1 else list(a)] for n, a in export.rules]


def test_without_names_the_export_names_dims_after_their_axes():
    plan = plan_from_specs({"w": np.zeros((4, 8)), "b": np.zeros(8)},
                           {"w": jax.sharding.PartitionSpec(("a", "b"), "c"), "b": jax.sharding.PartitionSpec()})
    export = logical_export(plan)
    assert export.names == {"b": (None,), "w": ("a+b", "c")}
    assert export.rules == (("a+b", ("a", "b")), ("c", ("c",)))


@pytest.mark.parametrize(("cluster", "model"), [("2x8xH100", "llama3-8b"), ("v5p-64", "llama3-70b"),
                                                ("2xv5e-256", "llama3-70b")])
def test_maxtext_parallelism_is_the_mesh_split(cluster, model):
    result = search_meshes(model, cluster, top_k=3)
    for cand in result.candidates:
        s = maxtext_settings(cand)
        ici = [s[f"ici_{'pipeline' if a == 'stage' else a}_parallelism"] for a in MAXTEXT_MESH_AXES]
        dcn = [s[f"dcn_{'pipeline' if a == 'stage' else a}_parallelism"] for a in MAXTEXT_MESH_AXES]
        assert math.prod(ici) * math.prod(dcn) == cand.num_devices == result.request.cluster.num_devices
        assert math.prod(dcn) == result.request.cluster.num_ici_domains
        mapped = {"dp": "data", "fsdp": "fsdp", "ep": "expert", "sp": "context", "tp": "tensor"}
        for name, i, d in zip(cand.axis_names, cand.ici_shape, cand.dcn_shape, strict=True):
            assert (s[f"ici_{mapped[name]}_parallelism"], s[f"dcn_{mapped[name]}_parallelism"]) == (i, d)


def test_maxtext_yaml_carries_the_logical_rules_over_maxtext_axes():
    preset = get_preset("llama3-8b")
    rule = logical_rule_from_json(HF_LOGICAL, mesh_axes=("dp", "fsdp", "sp", "tp"))
    result = search_meshes(preset.spec, "2x8xH100", params=preset.params, rule=rule, top_k=1)
    text = export_plan(result, "maxtext", tree=preset.params, names=rule)
    assert "ici_tensor_parallelism: " in text and "logical_axis_rules: [" in text
    rows = json.loads(text.split("logical_axis_rules: ", 1)[1])
    axes = {a for _, v in rows if v is not None for a in ([v] if isinstance(v, str) else v)}
    assert axes <= set(MAXTEXT_MESH_AXES)


def test_json_export_is_the_search_result():
    result = search_meshes("gpt2", "1x8xH100", top_k=1)
    assert SearchResult.from_json(export_plan(result, "json")) == result


@pytest.mark.parametrize(("call", "match"), [
    (lambda r: export_plan(r, "yaml"), r"format='yaml' is not one of \['json', 'flax', 'maxtext'\]"),
    (lambda r: export_plan(r, "flax"), "needs the parameter tree"),
    (lambda r: export_plan(r, "maxtext", rank=9), "rank=9: the result has 1 ranked meshes"),
    (lambda r: maxtext_settings(r.best, axis_map={"dp": "data"}), r"mesh axes \['fsdp', 'sp', 'tp'\] have no"),
    (lambda r: maxtext_settings(r.best, axis_map={"dp": "data", "fsdp": "data", "sp": "context", "tp": "tensor"}),
     r"MaxText axes \['data'\] that are repeated"),
])
def test_bad_export_requests_say_what_is_valid(call, match):
    result = search_meshes("gpt2", "1x8xH100", top_k=1)
    with pytest.raises(PlanError, match=match):
        call(result)


def test_maxtext_writes_replicated_rows_as_empty_lists_like_base_yml():
    preset = get_preset("llama3-8b")
    rule = logical_rule_from_json(HF_LOGICAL, mesh_axes=("dp", "fsdp", "sp", "tp"))
    result = search_meshes(preset.spec, "2x8xH100", params=preset.params, rule=rule, top_k=1)
    settings = maxtext_settings(result.best, logical_export(result.best.plan(preset.params), rule))
    assert ["norm", []] in settings["logical_axis_rules"]
