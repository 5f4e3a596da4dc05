"""``meshplan profile``, ``meshplan measure`` and ``plan --profile`` on the suite's 8 CPU devices (main() in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan import cli

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 128,
        "max_position_embeddings": 64, "head_dim": 16, "tie_word_embeddings": False}


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import meshplan

    root = tmp_path_factory.mktemp("cli")
    (root / "tiny.json").write_text(json.dumps(TINY))
    settings = meshplan.ProfileSettings((16, 32), 32, (2**12, 2**16), (2**16,), repeats=2, inner=2)
    meshplan.profile_machine(settings=settings, out=root / "cpu.json")
    return {"root": root, "model": root / "tiny.json", "profile": root / "cpu.json"}


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_profile_out_writes_json_naming_the_device_kind_count_and_versions(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.json"
    code, text, _ = _main(capsys, "profile", "--quick", "--out", str(out))
    assert code == 0 and f"wrote {out}" in text and "links (alpha-beta fit" in text
    doc = json.loads(out.read_text())
    assert doc["device_kind"] == "cpu" and doc["device_count"] == 8
    assert {"jax", "jaxlib", "python"} <= set(doc["versions"])


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_measure_json_gives_one_row_per_layout_with_the_promised_keys(files, capsys) -> None:
    code, text, _ = _main(capsys, "measure", "--model", str(files["model"]), "--batch", "8", "--seq", "16",
                          "--top", "2", "--steps", "2", "--json", "--profile", str(files["profile"]),
                          "--out", str(files["root"] / "m.json"))
    assert code == 0
    doc = json.loads(text)
    assert doc["machine"] == "1x8xXLA:CPU" and len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert {"mesh", "measured_step_s", "predicted_step_s", "measured_peak_bytes", "error"} <= set(row)
        assert row["measured_peak_bytes"] is None and row["error"] == "" and row["predicted_step_s"] > 0
    assert [r["measured_step_s"] for r in doc["rows"]] == sorted(r["measured_step_s"] for r in doc["rows"])
    assert json.loads((files["root"] / "m.json").read_text()) == doc


def test_the_measured_rows_refine_the_profile_and_the_next_plan_says_so(files, capsys) -> None:
    if not (files["root"] / "m.json").exists():
        pytest.skip("needs the measure run above")
    refined = files["root"] / "refined.json"
    code, text, _ = _main(capsys, "profile", "--refine", str(files["profile"]), "--steps", str(files["root"] / "m.json"),
                          "--out", str(refined))
    assert code == 0 and "steps: factor" in text and "fitted to 2 measured steps" in text
    import meshplan

    before, after = meshplan.load_profile(files["profile"]), meshplan.load_profile(refined)
    assert after.id == before.id and len(after.steps) == 2 and not before.steps
    assert {r.profile_id for r in after.steps} == {before.id}


def test_plan_profile_states_which_profile_priced_it_and_when(files, tmp_path: Path, capsys) -> None:
    import meshplan

    p = meshplan.load_profile(files["profile"])
    doc = json.loads(files["profile"].read_text())
    doc.update(device_kind="NVIDIA H100 80GB HBM3", platform="gpu")
    del doc["id"]
    h100 = tmp_path / "h100.json"
    h100.write_text(json.dumps(doc))
    code, text, _ = _main(capsys, "plan", "--model", "llama3-8b", "--cluster", "8x8xH100", "--profile", str(h100),
                          "--no-verify", "--no-pipeline", "--format", "markdown")
    assert code == 0
    line = next(ln for ln in text.splitlines() if ln.startswith("- **profile**"))
    assert f"measured {p.measured_at}" in line and "8 x NVIDIA H100 80GB HBM3" in line
    assert "inter link: the catalogue's (the profile measured no link between hosts)" in line


def test_a_profile_for_another_device_or_version_is_refused_naming_both(files, tmp_path: Path, capsys) -> None:
    code, _, err = _main(capsys, "plan", "--model", "llama3-8b", "--cluster", "8xH100", "--profile",
                         str(files["profile"]), "--no-verify")
    assert code == 1 and "measured on 'cpu'" in err and "the cluster's device H100" in err
    doc = json.loads(files["profile"].read_text()) | {"format": 2}
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(doc))
    code, text, _ = _main(capsys, "plan", "--model", "llama3-8b", "--cluster", "8xH100", "--profile", str(newer),
                          "--json")
    error = json.loads(text)["error"]
    assert code == 1 and error["type"] == "ProfileError"
    assert f"{newer}: field format: this file is format 2; this meshplan reads format 1" in error["message"]


def test_refining_a_truncated_profile_fails_naming_the_file_and_writes_nothing(files, tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text(files["profile"].read_text()[:200])
    before = broken.read_bytes()
    steps = tmp_path / "m.json"
    steps.write_text(json.dumps({"kind": "meshplan measure", "format": 1, "rows": []}))
    code, _, err = _main(capsys, "profile", "--refine", str(broken), "--steps", str(steps))
    assert code == 1 and f"{broken}: not a complete JSON document" in err
    assert broken.read_bytes() == before and sorted(tmp_path.iterdir()) == [broken, steps]
