"""Tests for the ``meshplan`` command line: real subprocesses for the main paths, main() for the rest."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

from meshplan import cli
from meshplan.pure import SearchResult, search_meshes
from meshplan.pure.cost import FP8_EFFICIENCY_RATIO

ROOT = Path(__file__).resolve().parents[2]  # the repository root: `python -m meshplan` runs this checkout


def _run(*args: str, seed: str = "0") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_plan_detail_prints_the_ranking_the_split_the_memory_and_the_parameter_groups() -> None:
    # The summary (tests/cli/test_render.py) leaves the workings to --detail; these are its facts.
    out = _run("plan", "--model", "llama3-70b", "--cluster", "8x8xH100", "--detail", "--no-verify")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for needle in ("Ranked meshes", "best: first of the meshes tied", "~ best", "MFU", "exposed comm", "Predicted step:",
                   "Chosen mesh", "dcn_mesh_dims=",
                   "Memory per device", "activations (calibrated)", "Step communication", "Parameter groups",
                   "model/layers/*/self_attn/q_proj/weight", "tp=16 spans 2 nodes", "rejected:"):
        assert needle in text, needle
    assert out.stderr == ""


def test_plan_json_is_the_in_process_result_and_the_same_under_any_hash_seed() -> None:
    args = ("plan", "--model", "mixtral-8x7b", "--cluster", "4x8xH100", "--batch", "64", "--json")
    first, second = _run(*args, seed="1"), _run(*args, seed="12345")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout
    result = SearchResult.from_json(first.stdout)
    # On a GPU the CLI budgets what jax's allocator takes by default (75% of HBM): headroom 0.25.
    assert result == search_meshes("mixtral-8x7b", "4x8xH100", batch=64, headroom=0.25)
    assert json.loads(first.stdout)["candidates"][0]["rank"] == 1


@pytest.mark.parametrize("args,code,message", [
    (("plan", "--model", "llama9", "--cluster", "8x8xH100"), 1, "unknown model preset 'llama9'"),
    (("plan", "--model", "gpt2", "--cluster", "8x8xH1000"), 1, "unknown device 'h1000'"),
    (("plan", "--model", "deepseek-v3", "--cluster", "2xH100"), 1, "does not fit"),
    (("plan", "--model", "gpt2", "--cluster", "H100", "--fix", "tp"), 2, "is not name=size"),
    # --dcn goes through reconcile_dcn, as create_mesh's dcn_mesh_dims does: each failure names the axis.
    (("show-mesh", "--cluster", "2x4xH100", "--mesh", "fsdp=4,tp=2", "--dcn", "fsdp=3"), 1, "fsdp"),
    (("show-mesh", "--cluster", "2x4xH100", "--mesh", "fsdp=4,tp=2", "--dcn", "tp=4"), 1, "dcn"),
    (("show-mesh", "--cluster", "2x4xH100", "--mesh", "fsdp=4,tp=2", "--dcn", "ep=2"), 1, "--mesh lacks"),
])
def test_bad_requests_exit_with_a_message_and_no_traceback(args, code: int, message: str) -> None:
    out = _run(*args)
    assert out.returncode == code
    assert message in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_show_mesh_draws_which_host_each_device_sits_on() -> None:
    out = _run("show-mesh", "--cluster", "2x4xH100", "--mesh", "dp=2,tp=4")
    assert out.returncode == 0, out.stderr
    assert "dp (2): each group spans 2 nodes (DCN)" in out.stdout
    assert "tp (4): each group inside one node (ICI)" in out.stdout
    row = next(line for line in out.stdout.splitlines() if "dp=1" in line)
    assert ["4 h1", "5 h1", "6 h1", "7 h1"] == [c.strip() for c in row.split("│")[2:6]]


# --- in-process: main() with captured output ----------------------------------------------------


def test_rules_file_overrides_the_default_rule(tmp_path: Path, capsys) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([["embed_tokens", ["fsdp", None]], ["norm", []]]))
    assert cli.main(["plan", "--model", "llama3-8b", "--cluster", "2xH100", "--fix", "fsdp=4",
                     "--rules", str(rules), "--json"]) == 0
    best = SearchResult.from_json(capsys.readouterr().out).best
    groups = {g.pattern: g for g in best.groups}
    assert groups["model/embed_tokens/weight"].reason == "matched path rule #0 'embed_tokens'"
    assert groups["model/norm/weight"].spec == P()


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not valid JSON"),
    ('[["(", []]]', "not a valid regex"),
    ('{"rule": []}', "exactly one key"),
])
def test_bad_rules_files_exit_1(tmp_path: Path, capsys, content: str, message: str) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(content)
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "H100", "--rules", str(rules)]) == 1
    assert message in capsys.readouterr().err


def test_missing_files_and_repeated_fixes_exit_1(tmp_path: Path, capsys) -> None:
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "H100", "--rules", str(tmp_path / "no.json")]) == 1
    assert "cannot read --rules" in capsys.readouterr().err
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "H100", "--fix", "tp=2", "--fix", "tp=4"]) == 1
    assert "more than once" in capsys.readouterr().err
    assert cli.main(["show-mesh", "--plan", str(tmp_path / "no.json")]) == 1
    assert "cannot read --plan" in capsys.readouterr().err


def test_show_mesh_reads_a_saved_plan_and_an_explicit_dcn(tmp_path: Path, capsys) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(search_meshes("llama3-8b", "2x8xH100", top_k=2).to_json())
    assert cli.main(["show-mesh", "--plan", str(plan), "--rank", "2"]) == 0
    assert "2x8xH100: 16 devices" in capsys.readouterr().out
    assert cli.main(["show-mesh", "--plan", str(plan), "--rank", "9"]) == 1
    assert "the plan has 2 ranked meshes" in capsys.readouterr().err
    assert cli.main(["show-mesh", "--cluster", "2x4xH100", "--mesh", "fsdp=4,tp=2", "--dcn", "fsdp=2"]) == 0
    assert "fsdp (4): each group spans 2 nodes" in capsys.readouterr().out
    assert cli.main(["show-mesh", "--cluster", "2x4xH100", "--mesh", "dp=3,tp=4"]) == 1
    assert "multiply to 12, not 8" in capsys.readouterr().err


def test_png_without_matplotlib_is_a_clear_error(tmp_path: Path, capsys, monkeypatch) -> None:
    from meshplan.cli import _show_mesh

    monkeypatch.setattr(_show_mesh.importlib.util, "find_spec", lambda name: None)
    out = tmp_path / "mesh.png"
    assert cli.main(["show-mesh", "--cluster", "2x4xH100", "--mesh", "dp=2,tp=4", "--png", str(out)]) == 1
    assert "pip install 'meshplan[png]'" in capsys.readouterr().err
    assert not out.exists()


def test_png_is_written_when_matplotlib_is_installed(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "mesh.png"
    assert cli.main(["show-mesh", "--cluster", "2x4xH100", "--mesh", "dp=2,tp=4", "--png", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_states_the_recorded_spread_and_which_ranked_meshes_it_would_push_over_the_budget() -> None:
    # Llama-3-8B on v6e-8 (remat full by default): the best mesh fits at the estimate with 0.1 GiB to spare,
    # and not at the highest ratio recorded for v6e's coefficients with remat full.
    text = _run("plan", "--model", "llama3-8b", "--cluster", "v6e-8", "--detail", "--no-verify").stdout
    assert ("on 32 recorded XLA:TPU v6e compiles with remat full and fp32 scores (plain or dot_product attention), "
            "the peak held 0.66-1.46x") in " ".join(text.split())
    assert "highest recorded ratio (1.46x), #1" in text
    assert "peak at the recorded spread (0.66-1.46x the calibrated part)" in text
    # No recorded compile used remat dots: said so, and no margin is claimed.
    dots = " ".join(_run("plan", "--model", "llama3-8b", "--cluster", "v6e-8", "--remat", "dots",
                         "--detail", "--no-verify").stdout.split())
    assert "no recorded compile with remat dots and fp32 scores" in dots
    assert "highest recorded ratio" not in dots and "recorded spread" not in dots
    # A plan with room to spare at the high end names no mesh.
    roomy = _run("plan", "--model", "gpt2", "--cluster", "v6e-8", "--detail", "--no-verify").stdout
    assert "peak at the recorded spread" in roomy and "highest recorded ratio" not in roomy


def test_plan_matmul_dtype_float8_prices_fp8_weight_matmuls_and_says_so(capsys) -> None:
    base = ["plan", "--model", "llama3-8b", "--cluster", "2x8xH100", "--batch", "32", "--seq", "4096",
            "--no-verify", "--no-pipeline"]
    assert cli.main([*base, "--matmul-dtype", "float8", "--json"]) == 0
    fp8 = SearchResult.from_json(capsys.readouterr().out)
    assert cli.main([*base, "--json"]) == 0
    bf16 = SearchResult.from_json(capsys.readouterr().out)
    assert fp8.request.recipe.matmul_dtype == "float8" and bf16.request.recipe.matmul_dtype == "bfloat16"
    # The flag is the recipe field: the same result as the library call, and only the step time moves.
    assert fp8 == search_meshes("llama3-8b", "2x8xH100", batch=32, seq=4096, headroom=0.25,
                                recipe=dataclasses.replace(bf16.request.recipe, backend=None, device=None,
                                                           matmul_dtype="float8"))
    assert fp8.best.step.step_s < bf16.best.step.step_s and fp8.best.memory == bf16.best.memory
    # The summary's header says what the time was priced at.
    assert cli.main([*base, "--matmul-dtype", "float8"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    eff = fp8.best.step.efficiency
    assert f"FLOPs at {eff:.0%} of peak bf16, weight matmuls at {eff * FP8_EFFICIENCY_RATIO:.0%} of peak fp8 +" in text
    assert "fp8 weight matmuls" in text
    assert cli.main(base) == 0
    assert "fp8" not in capsys.readouterr().out


def test_plan_moe_dispatch_dropless_prices_the_routed_tokens_and_says_so(capsys) -> None:
    base = ["plan", "--model", "mixtral-8x7b", "--cluster", "4x8xH100", "--batch", "64", "--seq", "4096",
            "--no-verify", "--no-pipeline"]
    assert cli.main([*base, "--moe-dispatch", "dropless", "--json"]) == 0
    dropless = SearchResult.from_json(capsys.readouterr().out)
    assert cli.main([*base, "--json"]) == 0
    einsum = SearchResult.from_json(capsys.readouterr().out)
    assert dropless.request.recipe.moe_dispatch == "dropless" and einsum.request.recipe.moe_dispatch == "einsum"
    # The flag is the recipe field: the same result as the library call; the step is faster and no fuller.
    assert dropless == search_meshes("mixtral-8x7b", "4x8xH100", batch=64, seq=4096, headroom=0.25,
                                     recipe=dataclasses.replace(einsum.request.recipe, backend=None, device=None,
                                                                moe_dispatch="dropless"))
    same = {c.text: c for c in einsum.candidates if c.text in {d.text for d in dropless.candidates}}
    assert same and all(d.step.step_s < same[d.text].step.step_s and d.memory.total <= same[d.text].memory.total
                        for d in dropless.candidates if d.text in same)
    # The header says which dispatch an MoE plan priced, and that its memory is not a dropless fit.
    assert cli.main([*base, "--moe-dispatch", "dropless"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "MoE dropless dispatch (grouped GEMMs over the routed tokens)" in text
    assert "dropless: its routing terms removed, not fitted to a dropless compile" in text
    assert cli.main(base) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "MoE einsum dispatch (capacity factor 1.25, as the reference step)" in text and "dropless" not in text
    with pytest.raises(SystemExit) as info:  # argparse: not one of the choices
        cli.main([*base, "--moe-dispatch", "sparse"])
    assert info.value.code == 2
    assert "--moe-dispatch: invalid choice: 'sparse'" in capsys.readouterr().err


def test_plan_refuses_float8_on_a_device_without_fp8_units(capsys) -> None:
    args = ["plan", "--model", "gpt2", "--cluster", "8xA100", "--matmul-dtype", "float8", "--no-verify"]
    assert cli.main(args) == 1
    assert ("'A100-80GB' has no peak_fp8_flops. Devices with one: ['B200', 'GB200', 'H100', 'H20', 'H200', 'H800', "
            "'MI300X', 'MI325X', 'tpu7x']") in capsys.readouterr().err
    assert cli.main([*args, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["type"] == "PlanError"
    # A model that fits on no mesh is the PlanError subclass that says so.
    assert cli.main(["plan", "--model", "deepseek-v3", "--cluster", "2xH100", "--no-verify", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["type"] == "NothingFitsError"
    with pytest.raises(SystemExit) as info:  # argparse: not one of the choices
        cli.main(["plan", "--model", "gpt2", "--cluster", "H100", "--matmul-dtype", "fp8"])
    assert info.value.code == 2
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
