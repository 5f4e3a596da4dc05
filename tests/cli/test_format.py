"""``meshplan plan --format json|flax|maxtext`` and ``--rules`` with a logical table (in-process main())."""

from __future__ import annotations

import json
import math

import pytest
from flax import linen as nn

from meshplan import cli
from meshplan.pure import SearchResult, get_preset
from meshplan.pure.report import MAXTEXT_MESH_AXES
from meshplan.pure.specs import canonical_entries
from tests.pure.rules.test_logical import HF_LOGICAL

BASE = ("plan", "--model", "llama3-8b", "--cluster", "2x8xH100", "--top", "2", "--no-verify")


def _main(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main([*BASE, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def logical_file(tmp_path):
    path = tmp_path / "logical.json"
    path.write_text(json.dumps(HF_LOGICAL))
    return str(path)


def test_json_is_an_alias_of_format_json(capsys):
    code, by_flag, _ = _main(capsys, "--json")
    code2, by_format, _ = _main(capsys, "--format", "json")
    assert code == code2 == 0
    assert by_flag == by_format
    SearchResult.from_json(by_format)


def test_a_logical_rules_file_plans_and_exports_to_flax_which_gives_back_the_specs(capsys, logical_file):
    code, text, err = _main(capsys, "--rules", logical_file, "--format", "flax")
    assert code == 0, err
    data = json.loads(text)
    _, plan_json, _ = _main(capsys, "--rules", logical_file, "--json")
    best = SearchResult.from_json(plan_json).best
    assert data["mesh"]["axis_sizes"] == list(best.axis_sizes)
    params = get_preset("llama3-8b").params
    plan = best.plan(params)
    rules = [tuple(r) for r in data["rules"]]
    assert ["embed", "fsdp"] in data["rules"]
    for i, info in enumerate(plan.infos):
        path, rank = plan.path(i), len(info.shape)
        assert canonical_entries(nn.logical_to_mesh_axes(data["names"][path], rules), rank) == \
            canonical_entries(plan.leaf_specs[i], rank), path
    assert all(g.rule == "logical" for g in best.groups)


def test_maxtext_settings_multiply_to_the_cluster_and_carry_the_logical_rules(capsys, logical_file):
    code, text, err = _main(capsys, "--rules", logical_file, "--format", "maxtext")
    assert code == 0, err
    head, rules = text.split("logical_axis_rules: ", 1)
    settings = {k: json.loads(v) for k, v in (line.split(": ", 1) for line in head.splitlines())}
    keys = [f"{lvl}_{'pipeline' if a == 'stage' else a}_parallelism" for lvl in ("ici", "dcn") for a in MAXTEXT_MESH_AXES]
    assert sorted(settings) == sorted(keys)
    assert math.prod(settings.values()) == 16
    assert math.prod(settings[k] for k in keys if k.startswith("dcn_")) == 2
    assert ["embed", "fsdp"] in json.loads(rules)


def test_path_rules_files_still_work(capsys, tmp_path):
    path = tmp_path / "path.json"
    path.write_text(json.dumps([["embed_tokens", ["tp", "fsdp"]], ["norm", []]]))
    code, text, err = _main(capsys, "--rules", str(path), "--json")
    assert code == 0, err
    groups = SearchResult.from_json(text).best.groups
    assert any(g.rule == "path" for g in groups)


@pytest.mark.parametrize(("content", "message"), [
    ({"logical": []}, "or the keys 'logical_axis_rules' and 'logical_names' (a logical table); got keys ['logical']"),
    ("just text", "holds str 'just text'; expected path rules"),
    ({"logical_axis_rules": [["embed", "fsdpp"]], "logical_names": []},
     "row #0 'embed' names 'fsdpp'; the mesh axes are ['dp', 'fsdp', 'ep', 'sp', 'tp']"),
    ({"logical_axis_rules": [["embed", "fsdp"]], "logical_names": [["(", ["embed"]]]}, "not a valid regex"),
    ({"logical_axis_rules": [["embed", "fsdp"]], "logical_names": [["q_porj", ["heads", "embed"]]]},
     "pattern #0 'q_porj': matches no leaf"),
])
def test_a_rules_file_of_neither_form_or_with_a_bad_row_exits_1_and_says_why(capsys, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    code, _, err = _main(capsys, "--rules", str(path))
    assert code == 1
    assert message in err and "Traceback" not in err


def test_maxtext_without_a_logical_file_gives_only_the_parallelism(capsys):
    code, text, err = _main(capsys, "--format", "maxtext")
    assert code == 0, err
    assert "logical_axis_rules" not in text
    assert all(line.split(": ")[0].endswith("_parallelism") for line in text.splitlines())
