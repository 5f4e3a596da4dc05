"""``meshplan plan``'s pipeline section: the ranked pp layouts with their schedule and bubble."""

from __future__ import annotations

import re

import pytest

from meshplan import cli


def test_plan_shows_pipeline_layouts_with_schedule_and_bubble(capsys) -> None:
    # The summary gives the fastest layout in one line; the table is part of --detail.
    assert cli.main(["plan", "--model", "llama3-8b", "--cluster", "4x8xH100", "--batch", "64", "--top", "3", "--no-verify"]) == 0
    summary = capsys.readouterr().out
    assert re.search(r"Pipelined \(pp outermost\): best pp=\d\S*, [0-9.]+ m?s \(estimate\), bubble \d+\.\d%",
                     " ".join(summary.split()))
    assert "Pipeline layouts (pp outermost" not in summary
    assert cli.main(["plan", "--model", "llama3-8b", "--cluster", "4x8xH100", "--batch", "64", "--top", "3",
                     "--detail", "--no-verify"]) == 0
    text = capsys.readouterr().out
    assert "Pipeline layouts (pp outermost" in text
    rows = [line for line in text.splitlines() if re.search(r"│ \d │ pp=\d", line)]
    assert len(rows) == 3
    for row in rows:
        assert re.search(r"1f1b|interleaved", row) and re.search(r"\d+\.\d%", row)  # schedule and bubble
    assert "best pipeline layout pp=" in text and "bubble" in text


def test_plan_without_pipeline_and_with_fixed_axes_skips_them(capsys) -> None:
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "2x8xH100", "--no-pipeline", "--no-verify"]) == 0
    assert "Pipeline layouts" not in capsys.readouterr().out
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "2x8xH100", "--fix", "dp=16", "--no-verify"]) == 0
    assert "pipeline layouts: not searched with --fix" in capsys.readouterr().out


_TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
               "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
               "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64,
               "tie_word_embeddings": False, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu"}


def _tiny_model(tmp_path) -> str:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_TINY_LLAMA))
    return str(path)


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_plan_verify_compiles_the_best_circular_layout_against_its_own_estimate(capsys, tmp_path, monkeypatch) -> None:
    # A tiny 8-layer Llama on 8 XLA:CPU devices: the top unpipelined mesh compiles, and so does the best layout of
    # the schedule meshplan's step runs (circular): its compiled peak is set against the circular estimate.
    from meshplan.facade._model_file import load_model
    from meshplan.pure.search import search_pipelines

    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "cache"))
    model = _tiny_model(tmp_path)
    code = cli.main(["plan", "--model", model, "--cluster", "1x8xH100", "--batch", "8", "--seq", "8", "--verify",
                     "1", "--target", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    text = " ".join(out.split())
    spec = load_model(model)
    circular = search_pipelines(spec, "1x8xH100", batch=8, seq=8, top_k=1, headroom=0.25,
                                schedules=("circular",)).candidates[0]
    pipe = circular.pipeline
    sched = f"circular{f' v={pipe.virtual}' if pipe.virtual > 1 else ''} m={pipe.micro_batches}"
    line = re.search(rf"pipeline {re.escape(circular.text)} \({sched}\): exact: compiled peak ([0-9.]+ \w+) against "
                     r"the estimate ([0-9.]+ \w+)", text)
    assert line, text
    # The row is the schedule that compiled: no "(compiled: ...)" aside, no caveat.
    assert "(compiled:" not in text and "compiled as the circular schedule" not in text
    assert "pipeline peaks: the pipelined step compiled by XLA:CPU" in text
    assert "compiling the pipelined step of" in err and f"on {circular.text} (circular" in err
    # Every format renders the same report: markdown, --html and --json carry the compiled peaks of the ranked
    # mesh and of the pipeline layout the terminal shows (from the compile cache now: nothing compiles twice).
    exact = re.search(r"exact \(#1\): XLA's compiled peak, (XLA:CPU[^)]*\))", text)
    assert exact, text
    page = tmp_path / "plan.html"
    argv = ["plan", "--model", model, "--cluster", "1x8xH100", "--batch", "8", "--seq", "8", "--verify", "1",
            "--target", "cpu"]
    assert cli.main([*argv, "--format", "markdown", "--html", str(page)]) == 0
    markdown, err = capsys.readouterr()
    assert "compiling" not in err and "(cached)" in err
    html = page.read_text()
    for shown in (" ".join(markdown.split()), " ".join(html.split())):
        assert f"exact = XLA's compiled peak ({exact.group(1)}" in shown
        assert line.group(0) in shown and "pipeline peaks: the pipelined step compiled by XLA:CPU" in shown
    assert cli.main([*argv, "--json"]) == 0
    import json

    from meshplan.pure.report import PlanReport

    data = json.loads(capsys.readouterr().out)
    ranked = data["report"]["verification"]["rows"][0]
    assert ranked["status"] == "exact" and ranked["compiler"] == exact.group(1)
    piped = data["report"]["pipeline_verification"]["rows"][0]
    assert piped["mesh"] == circular.text and piped["status"] == "exact"
    report = PlanReport.from_json(json.dumps(data))
    assert report.pipeline_verification is not None and report.pipeline_verification.rows[0].peak_bytes == \
        piped["peak_bytes"]


def test_plan_says_why_no_pipeline_is_compiled_when_no_circular_layout_exists(capsys, tmp_path, monkeypatch) -> None:
    # 7 layers: no pp in 2, 4 divides them, so Megatron's 1F1B layouts are shown but the circular step (pp x v
    # dividing the layers) has none to compile; the plan says so instead of compiling a schedule it does not run.
    import json

    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_TINY_LLAMA, "num_hidden_layers": 7}))
    code = cli.main(["plan", "--model", str(path), "--cluster", "1x8xH100", "--batch", "8", "--seq", "8",
                     "--verify", "1", "--target", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    text = " ".join(out.split())
    assert "Pipelined (pp outermost): best pp=" in text
    assert "pipeline memory: not verified (no circular layout, the schedule meshplan's step compiles, fits the " \
           "budget)" in text
    assert "compiling the pipelined step" not in err


def test_plan_compiles_no_pipeline_without_pipelines_or_verification(capsys, tmp_path, monkeypatch) -> None:
    from meshplan.facade.verify import _pipelines as _verify_pipeline

    def refuse(*args, **kwargs):
        raise AssertionError("a pipeline layout was compiled")

    monkeypatch.setattr(_verify_pipeline, "verify_pipelines", refuse)
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "cache"))
    model = _tiny_model(tmp_path)
    for flags in (["--verify", "1", "--target", "cpu", "--no-pipeline"], ["--no-verify"], []):  # [] : MESHPLAN_VERIFY=0
        assert cli.main(["plan", "--model", model, "--cluster", "1x8xH100", "--batch", "8", "--seq", "8",
                         *flags]) == 0, capsys.readouterr().err
        assert "against the estimate" not in capsys.readouterr().out


def test_the_detail_table_puts_each_compiled_peak_on_its_own_rank() -> None:
    # pp=2 over the network and pp=2 inside each node have the same mesh text: the peaks go by rank.
    import dataclasses
    import io

    from rich.console import Console

    from meshplan.cli._pipeline import render_pipelines
    from meshplan.pure.verify import PlanVerification, VerifyRow
    from meshplan.pure import search_meshes
    from meshplan.pure.presets import MODEL_SPECS
    from meshplan.pure.search import search_pipelines

    tiny = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=8, hidden_size=256, num_heads=8,
                               num_kv_heads=8, head_dim=32, intermediate_size=512, vocab_size=1024, num_params=None)
    found = search_pipelines(tiny, "2x4xH100", batch=16, seq=64, top_k=4)
    same = [c for c in found.candidates if c.text == found.candidates[0].text]
    assert len(same) == 2 and same[0].dcn_shape != same[1].dcn_shape
    rows = (VerifyRow(same[0].text, same[0].rank, 1, 2 << 30, "", peak_bytes=3 << 20, status="exact"),
            VerifyRow(same[1].text, same[1].rank, 1, 2 << 30, "", status="not verified", error="not verified: x"))
    console = Console(width=250, record=True, file=io.StringIO())
    render_pipelines(found, search_meshes(tiny, "2x4xH100", batch=16, seq=64, top_k=1), console,
                     verified=PlanVerification(rows, (), "XLA:CPU", "", 1.0))
    text = console.export_text()
    lines = {int(m.group(1)): line for line in text.splitlines() if (m := re.match(r"│ (\d) │", line))}
    assert "exact 3.0 MiB" in lines[same[0].rank] and "not verified" in lines[same[1].rank]
    assert "XLA peak" in text
