"""``meshplan check`` and ``plan --verify``: the reference step compiled, XLA's figures next to the estimate.

One compile (GPT-2 cut to one layer, 8 simulated CPU devices, in-process: the
suite's 8 CPU devices are the target); the other cases fail before compiling.
"""

from __future__ import annotations

import re

import pytest

import meshplan
from meshplan import cli
from meshplan.facade.verify._compilers import libtpu_available


@pytest.fixture(autouse=True)
def _own_compile_cache(tmp_path, monkeypatch):
    """Each test compiles afresh into its own cache (never the user's ~/.cache/meshplan)."""
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "compile-cache"))


def _bytes(text: str) -> float:
    """``'414.8 MiB'`` -> bytes (as printed: to a tenth of the unit)."""
    number, unit = text.split()
    return float(number) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(unit)


def _table_row(text: str, mesh: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if f" {mesh} " in ln and "│" in ln)
    return [c.strip() for c in line.split("│")[1:-1]]


def test_check_compiles_one_layout_and_prints_xlas_figures(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    code = cli.main(["check", "--model", "gpt2", "--cluster", "H100", "--mesh", "dp=2,tp=4", "--layers", "1",
                     "--seq", "64", "--target", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "compiling the reference step of gpt2 (1 layers) on dp=2,tp=4 for 8 x XLA:CPU" in err
    assert re.search(r"dp=2,tp=4: exact: peak [0-9.]+ [KMG]iB; step [0-9.]+ [mµ]?s \(compute .*\) \(XLA:CPU .*\) in [0-9.]+ s", err)
    row = _table_row(out, "dp=2,tp=4")
    # columns: #, mesh, micro-batches, target, analytic, XLA argument, XLA temp, XLA peak, analytic/peak, fits,
    # compile
    assert row[2] == "1" and row[3] == "8 x XLA:CPU" and row[9] == "yes"
    assert all(re.fullmatch(r"[0-9.]+ [KMG]iB", c) for c in row[4:8]), row
    assert float(row[8]) > 0
    assert "XLA:CPU's peak_memory_in_bytes leaves temporaries out" in out
    # The five biggest buffers live at XLA's peak, one line each: name, size, shape, kind, jax source.
    assert "largest buffers live at the peak: XLA's buffer assignment: the 5 biggest" in out
    listed = out.split("largest buffers live at the peak")[1].splitlines()[1:6]
    assert all(re.match(r"  \S+ [0-9.]+ (B|KiB|MiB|GiB) [a-z0-9]+\[[0-9,]*\] \w", ln) for ln in listed), listed
    # Where XLA's peak falls against the recorded spread of XLA:CPU's remat-full coefficients, and the word
    # agrees with the figures printed.
    said = re.search(r"spread: on \d+ recorded XLA:CPU compiles with remat full and .*; for this estimate "
                     r"(\S+ \S+) - (\S+ \S+), and XLA's peak \((\S+ \S+)\) is (inside|below|above) it\.",
                     " ".join(out.split()))
    assert said, out
    low, high, peak = (_bytes(said.group(i)) for i in (1, 2, 3))
    assert said.group(4) == ("below" if peak < low else "above" if peak > high else "inside")


def test_check_json_carries_xlas_figures_and_the_largest_buffers(capsys):
    import json

    code = cli.main(["check", "--model", "gpt2", "--cluster", "H100", "--mesh", "dp=8", "--layers", "1",
                     "--seq", "32", "--target", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)
    assert row["mesh"] == "dp=8" and row["peak_bytes"] >= row["argument_bytes"] > 0
    sizes = [b["bytes"] for b in row["largest"]]
    assert len(sizes) == 5 and sizes == sorted(sizes, reverse=True) and sum(sizes) <= row["peak_bytes"]
    assert {"name", "shape", "dtype", "kind", "source"} <= set(row["largest"][0])
    spread = row["spread"]
    assert spread["calibration"] == "cpu" and spread["remat"] == "full" and spread["attention"] == "scores"
    assert spread["peak_low_bytes"] <= row["analytic_bytes"] <= spread["peak_high_bytes"]
    # the step of the compiled program, simulated from its schedule (XLA:CPU here: a check of the reader)
    assert row["compiled_step_s"] > 0 and row["compiled_step_s"] == row["compiled_step"]["step_s"]


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_check_prices_the_step_it_compiles(capsys):
    # --remat, --attention and the compiler the step compiles on (--target cpu: XLA:CPU's coefficients)
    # are what the estimate prices; before, check priced remat full on the cluster's compiler whatever it
    # compiled.
    import json

    from meshplan.pure.presets import scaled_model
    from meshplan.pure import get_preset, search_meshes
    from meshplan.pure.cost import TrainingRecipe

    analytic = {}
    for remat in ("full", "none"):
        code = cli.main(["check", "--model", "gpt2", "--cluster", "H100", "--mesh", "fsdp=8", "--layers", "1",
                         "--seq", "64", "--target", "cpu", "--remat", remat, "--attention", "plain", "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        analytic[remat] = json.loads(out)["analytic_bytes"]
        spec = scaled_model(get_preset("gpt2").spec, 1)
        want = search_meshes(spec, "H100", axes=["fsdp"], fixed={"fsdp": 8}, batch=8, seq=64, top_k=1, micro_batches=1,
                             recipe=TrainingRecipe(remat=remat, attention="plain", backend="cpu")).best.memory.total
        assert analytic[remat] == want, remat
    assert analytic["none"] > analytic["full"]


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_verify_compiles_each_candidate_with_the_micro_batches_its_estimate_priced():
    # The search priced these candidates with 2 accumulation steps; the flags' config says 1. The compile
    # must run what was priced (before, every candidate compiled with the best mesh's count).
    import io

    from meshplan.pure.presets import scaled_model
    from meshplan.facade.verify._reference import ReferenceConfig
    from meshplan.pure import get_preset, search_meshes

    spec = scaled_model(get_preset("gpt2").spec, 1)
    found = search_meshes(spec, "1x8xH100", axes=["dp", "fsdp"], batch=16, seq=32, top_k=2, micro_batches=2)
    checked = meshplan.verify_plan(found, model=spec, top=2, target="cpu", config=ReferenceConfig(micro_batches=1),
                                   stream=io.StringIO())
    rows = checked.rows
    assert [r.micro_batches for r in rows] == [c.step.micro_batches for c in found.candidates] == [2, 2]
    assert all(r.status == "exact" and not r.error and r.peak_bytes for r in rows)


def test_verify_without_the_cuda_plugin_shows_estimates_and_says_what_to_install(capsys, monkeypatch):
    # What a user without meshplan[gpu] sees: the plan, and one line saying how to get exact figures.
    from meshplan.facade.verify import _compilers

    real = _compilers._version
    monkeypatch.setattr(_compilers, "_version", lambda dist: None if dist.startswith("jax-cuda") else real(dist))
    monkeypatch.delenv("MESHPLAN_VERIFY", raising=False)  # the default: verify where the compiler is installed
    code = cli.main(["plan", "--model", "gpt2", "--cluster", "H100", "--seq", "64"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Ranked meshes" in out
    said = " ".join(out.split())
    assert "memory: estimates only: the jax CUDA plugin is not installed; pip install 'meshplan[gpu]'" in said
    assert "compiling" not in err


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_verify_on_cpu_for_a_gpu_plan_says_which_lowering_each_figure_is(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    code = cli.main(["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--seq", "64", "--batch", "8",
                     "--verify", "1", "--target", "cpu", "--detail"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "8 x XLA:CPU" in out
    assert "priced for XLA:GPU, the plan's cluster, and compiled on XLA:CPU" in " ".join(out.split())


@pytest.mark.parametrize("flags, env, wanted", [
    ({}, None, True),                                   # the default: verify where the compiler is installed
    ({}, "0", False), ({}, "off", False),               # MESHPLAN_VERIFY=0 makes --no-verify the default
    ({"verify": 2}, "0", True),                         # ... and --verify K still asks for it
    ({"no_verify": True}, None, False),
    ({"format": "json"}, None, True), ({"format": "markdown"}, None, True),  # every format shows the same report
    ({"format": "flax"}, None, False), ({"format": "maxtext"}, None, False),  # the exports: the best mesh's settings
    ({"params": "p.py:tree"}, None, False),  # the estimate only
])
def test_when_plan_verifies(monkeypatch, flags, env, wanted):
    import argparse

    from meshplan.cli._flags import verification_wanted

    if env is None:
        monkeypatch.delenv("MESHPLAN_VERIFY", raising=False)
    else:
        monkeypatch.setenv("MESHPLAN_VERIFY", env)
    args = argparse.Namespace(**{"verify": None, "no_verify": False, "format": "table", "params": None, **flags})
    assert verification_wanted(args) is wanted


def test_verify_is_refused_with_the_exports_only(capsys):
    # The exports print the best mesh's settings; every other format shows the verified report.
    code = cli.main(["plan", "--model", "gpt2", "--cluster", "H100", "--verify", "1", "--format", "flax"])
    assert code == 1
    assert "--verify compiles the plan's meshes to check their memory; --format flax" in capsys.readouterr().err


def test_check_rejects_bad_layouts_before_compiling(capsys):
    code = cli.main(["check", "--model", "gpt2", "--cluster", "H100", "--mesh", "dp=3", "--target", "cpu"])
    err = capsys.readouterr().err
    assert code == 1 and "error:" in err and "Traceback" not in err


@pytest.mark.skipif(libtpu_available(), reason="libtpu is installed: TPU targets compile")
def test_tpu_target_without_libtpu_names_the_extra(capsys):
    code = cli.main(["check", "--model", "gpt2", "--cluster", "v5e-4", "--mesh", "dp=4", "--layers", "1"])
    assert code == 1 and "meshplan[tpu]" in capsys.readouterr().err


def test_a_gpu_plans_budget_is_what_jaxs_allocator_takes_and_says_so(capsys, monkeypatch):
    import json

    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    base = ["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--seq", "64", "--no-verify"]
    for extra, env, fraction, source in [([], None, 0.75, "its default"),
                                         (["--mem-fraction", "0.5"], "0.9", 0.5, "--mem-fraction"),
                                         ([], "0.9", 0.9, "XLA_PYTHON_CLIENT_MEM_FRACTION")]:
        if env is not None:
            monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", env)
        assert cli.main([*base, *extra]) == 0
        said = " ".join(capsys.readouterr().out.split())
        assert f"less {1 - fraction:.0%} headroom (jax's GPU allocator takes {fraction:.0%}: {source}" in said
        assert cli.main([*base, *extra, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["request"]["headroom"] == pytest.approx(1 - fraction)
    # --headroom still wins, and a TPU keeps its 10%.
    assert cli.main([*base, "--headroom", "0.2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["request"]["headroom"] == 0.2
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "v5e-8", "--no-verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["request"]["headroom"] == 0.1
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "lots")
    assert cli.main(base) == 1
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION='lots' must be a fraction in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("cluster", ["1x8xH100", "2x8xH200", "v5e-8", "v5p-16", "4xA100"])
def test_the_library_and_the_command_line_give_the_same_budget(capsys, monkeypatch, cluster):
    # One default for both: search_meshes(headroom=None) and meshplan plan with no --headroom / --mem-fraction.
    import json

    from meshplan.pure import search_meshes

    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert cli.main(["plan", "--model", "gpt2", "--cluster", cluster, "--seq", "64", "--no-verify", "--no-pipeline",
                     "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["request"]
    library = search_meshes("gpt2", cluster, seq=64).request
    assert planned["headroom"] == library.headroom
    assert int(planned["cluster"]["device"]["hbm_bytes"] * (1 - planned["headroom"])) == library.budget


def test_check_compiles_for_a_gpu_cluster_with_no_gpu(capsys):
    import json

    from meshplan.facade.verify._compilers import cuda_plugin_problem

    if cuda_plugin_problem() is not None:
        pytest.skip(f"needs the jax CUDA plugin: {cuda_plugin_problem()}")
    code = cli.main(["check", "--model", "gpt2", "--cluster", "1x8xH100", "--mesh", "dp=8", "--layers", "1",
                     "--seq", "64", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)
    assert row["target"] == "8 x NVIDIA H100 80GB HBM3 (no GPU: meshplan's shipped description)"
    assert row["status"] == "exact" and row["compiler"].startswith("XLA:GPU (jax-cuda12-plugin ")
    assert row["peak_bytes"] >= row["argument_bytes"] > 0 and row["peak_source"] == "peak_memory_in_bytes"
    assert row["budget_bytes"] == int(80e9 * 0.75)  # jax's default preallocation on a GPU


def test_a_dropless_moe_plan_compiles_nothing_and_each_row_says_why(capsys, monkeypatch):
    # The reference step runs the einsum dispatch only: its compiled peak (capacity padding, s x s routing
    # tensors) is not a dropless plan's, so no row is compiled, none is removed for it, and the reason the
    # rows share is said once, after the three of them.
    monkeypatch.setenv("COLUMNS", "400")
    args = ["plan", "--model", "mixtral-8x7b", "--cluster", "4x8xH100", "--seq", "64", "--batch", "32", "--top", "3",
            "--verify", "2", "--target", "cpu", "--no-pipeline"]
    code = cli.main([*args, "--moe-dispatch", "dropless"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "compiling" not in err
    said = [ln for ln in out.splitlines() if "not verified (not compiled: the plan priced the dropless MoE" in ln]
    assert len(said) == 1 and [w for w in said[0].split() if w.startswith("#")] == ["#1", "#2", "#3"]
    assert "meshplan's reference step runs the einsum dispatch only" in said[0]


def test_the_dropless_reason_is_per_row_in_the_library_and_never_for_einsum_or_a_dense_model():
    import dataclasses
    import io

    from meshplan.pure.presets import scaled_model
    from meshplan.facade.verify._pipelines import verify_pipelines
    from meshplan.pure.verify import uncompiled_dispatch
    from meshplan.pure import get_preset, search_meshes
    from meshplan.pure.cost import TrainingRecipe
    from meshplan.pure.search import search_pipelines

    moe = scaled_model(get_preset("mixtral-8x7b").spec, 2)
    dropless = TrainingRecipe(moe_dispatch="dropless")
    found = search_meshes(moe, "1x8xH100", batch=8, seq=64, top_k=3, recipe=dropless)
    checked = meshplan.verify_plan(found, model=moe, top=1, target="cpu", stream=io.StringIO())
    assert len(checked.rows) == len(found.candidates) == 3 and not checked.removed and not checked.compiler
    assert all(r.status == "not verified" and "dropless MoE dispatch" in r.error and r.peak_bytes is None
               for r in checked.rows)
    pipes = search_pipelines(moe, "2x8xH100", batch=8, seq=64, top_k=2, recipe=dropless)
    rows = verify_pipelines(pipes, found, model=moe, top=2, target="cpu", stream=io.StringIO()).rows
    assert rows and all(r.status == "not verified" and "dropless MoE dispatch" in r.error for r in rows)
    # The einsum recipe, and any dense model, compile as before: nothing to say.
    assert uncompiled_dispatch(moe, TrainingRecipe()) == ""
    gpt2 = scaled_model(get_preset("gpt2").spec, 1)
    assert uncompiled_dispatch(gpt2, dropless) == ""
    assert uncompiled_dispatch(dataclasses.replace(moe, num_dense_layers=2), dropless) == ""  # no MoE layer left


def test_check_refuses_a_dropless_moe_step_and_says_what_to_run(capsys):
    args = ["check", "--model", "mixtral-8x7b", "--cluster", "1x8xH100", "--mesh", "fsdp=8", "--layers", "2",
            "--seq", "64", "--target", "cpu", "--moe-dispatch", "dropless"]
    assert cli.main(args) == 1
    out, err = capsys.readouterr()
    assert "compiling" not in err
    assert ("--moe-dispatch dropless: meshplan check compiles the reference step, which runs the einsum MoE dispatch "
            "only") in err
    assert "'meshplan plan --moe-dispatch dropless --no-verify'" in err
    assert cli.main([*args, "--json"]) == 1
    import json

    assert json.loads(capsys.readouterr().out)["error"]["type"] == "PlanError"


def test_a_pinned_layout_the_estimate_puts_over_the_budget_is_compiled_before_it_is_refused(capsys):
    # gpt2 dp=8: the estimate 1.87 GB, its stated range from 1.72 GB; a budget of 1.80 GB lies inside it, so the
    # estimate cannot say the pinned layout does not fit: XLA:CPU compiles it (2.5 GiB here: over, as estimated).
    base = ["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--batch", "8", "--seq", "1024", "--fix", "dp=8",
            "--target", "cpu", "--verify", "1", "--no-pipeline"]
    code = cli.main([*base, "--headroom", "0.9775"])
    out, err = capsys.readouterr()
    assert code == 1 and "does not fit" in err
    assert "over the budget by the estimate, its range reaching it" in err  # the compile's progress line
    assert "XLA's compiled peak agrees: dp=8 " in err and "XLA:CPU" in err
    # With the budget below the range, the estimate decides alone and says how to compile it anyway.
    code = cli.main([*base, "--headroom", "0.99"])
    out, err = capsys.readouterr()
    assert code == 1 and "its stated range does not reach the budget, so it was not compiled" in err.lower()
    assert "compiling" not in err


def test_a_pinned_layout_over_even_with_sixteen_times_the_memory_keeps_the_estimates_refusal(capsys):
    # DeepSeek-V3 on one H100 needs terabytes: the search with room fails too, and the plan says what the
    # estimate said (with the real budget), compiling nothing.
    code = cli.main(["plan", "--model", "deepseek-v3", "--cluster", "H100", "--fix", "dp=1", "--target", "cpu",
                     "--verify", "1", "--no-pipeline"])
    out, err = capsys.readouterr()
    assert code == 1 and "does not fit" in err and "55.9 GiB" in err  # the real budget, not sixteen times it
    assert "compiling" not in err and "compiled peak" not in err
