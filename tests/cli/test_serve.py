"""``meshplan serve`` and ``meshplan check --serve``: the terminal at 100 and 80 columns, markdown, JSON, HTML,
the notebook repr, the errors, and one compile on XLA:CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan import cli
from meshplan.pure.report import SERVE_COLUMNS, serve_html, serve_markdown
from meshplan.pure.serve import plan_serving

DONE = ["serve", "--model", "llama3.1-70b", "--cluster", "1x8xH100", "--context", "32768", "--max"]


def _serve(capsys, monkeypatch, width: int, *args: str) -> str:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main([*DONE, *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("width", [100, 80])
def test_no_line_is_wider_than_the_terminal_and_the_essentials_stay(capsys, monkeypatch, width: int) -> None:
    text = _serve(capsys, monkeypatch, width)
    assert [ln for ln in text.splitlines() if len(ln) > width] == []
    for col in (c for c in SERVE_COLUMNS if c.priority == 1):
        assert col.title in text
    assert "tp=8" in text and "vllm serve meta-llama/Llama-3.1-70B" in text and "--max-num-seqs" in text
    assert "KV = gpu_memory_utilization" in text and "vllm/v1/worker/gpu_worker.py" in text


def test_at_200_columns_every_column_is_shown(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    text = _serve(capsys, monkeypatch, 200)
    assert all(c.title in text for c in SERVE_COLUMNS)


def test_json_gives_every_field_the_issue_asks_for(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main([*DONE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = doc["layouts"][0]
    for key in ("mesh", "fits", "weight_bytes_per_device", "kv_bytes_per_token_per_device", "kv_capacity_tokens",
                "max_sequences", "decode_step_s", "prefill_s", "tokens_per_s_per_device"):
        assert key in row
    assert isinstance(row["weight_bytes_per_device"], int) and isinstance(row["decode_step_s"], float)
    assert doc["engine"]["name"] == "vllm" and doc["request"]["context"] == 32768


def test_markdown_and_html_say_what_the_terminal_says(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    page = tmp_path / "serve.html"
    assert cli.main([*DONE, "--format", "markdown", "--html", str(page)]) == 0
    text = capsys.readouterr().out
    plan = plan_serving("llama3.1-70b", "1x8xH100", context=32768)
    assert text == serve_markdown(plan)
    html = page.read_text()
    assert html == serve_html(plan) and "<script" not in html and "<svg" in html
    from meshplan.pure.report import show

    assert show(plan)._repr_markdown_() == serve_markdown(plan)
    assert show(plan)._repr_html_() == serve_html(plan, fragment=True)


@pytest.mark.parametrize("args,match", [
    (["--model", "llama3-70b", "--context", "32768"], "8192 positions"),
    (["--model", "llama3.1-8b", "--context", "4096", "--engine", "tgi"], "valid: \\['vllm'"),
    (["--model", "llama3.1-8b", "--context", "4096", "--kv-dtype", "fp4"], "not a dtype meshplan serves"),
    (["--model", "llama3.1-8b", "--context", "4096", "--weight-dtype", "int4"], "weight_dtype='int4'"),
    (["--model", "llama3.1-8b", "--context", "4096", "--prompt-tokens", "9000"], "longer than context"),
])
def test_bad_requests_exit_1_with_the_reason(capsys, args: list[str], match: str) -> None:  # type: ignore[no-untyped-def]
    import re

    assert cli.main(["serve", "--cluster", "1x8xH100", *args]) == 1
    assert re.search(match, capsys.readouterr().err)


def test_bad_usage_exits_2(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as err:
        cli.main(["serve", "--model", "llama3.1-8b", "--cluster", "H100", "--context", "0"])
    assert err.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["serve", "--model", "llama3.1-8b", "--cluster", "H100", "--context", "8", "--max",
                  "--concurrency", "4"])


def test_a_json_error_is_json(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["serve", "--model", "llama3-70b", "--cluster", "H100", "--context", "32768", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["type"] == "PlanError"


def test_does_not_fit_prints_what_would(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main(["serve", "--model", "llama3.1-70b", "--cluster", "1x8xH100", "--context", "131072",
                     "--concurrency", "64"]) == 0
    text = capsys.readouterr().out
    assert "does not fit as asked" in text and "at most" in text


def test_check_serve_compiles_the_decode_step_and_its_arguments_are_the_plans(capsys) -> None:  # type: ignore[no-untyped-def]
    code = cli.main(["check", "--serve", "--model", "llama3.1-8b", "--cluster", "1x8xH100", "--mesh", "tp=8",
                     "--layers", "1", "--context", "256", "--batch", "4", "--target", "cpu", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert [r["kind"] for r in doc["rows"]] == ["decode", "prefill"]
    assert all(r["arguments_match"] for r in doc["rows"])


def test_check_serve_refuses_training_axes(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["check", "--serve", "--model", "llama3.1-8b", "--cluster", "H100", "--mesh", "fsdp=8"]) == 1
    assert "serving axes dp, ep and tp" in capsys.readouterr().err


def test_serve_verifies_its_top_layout_by_compiling_it(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "120")
    assert cli.main(["serve", "--model", "llama3.1-8b", "--cluster", "1x8xH100", "--context", "512",
                     "--concurrency", "8", "--verify", "1", "--verify-layers", "1", "--target", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "compiled tp=8 (decode, 1 layers, 8 x XLA:CPU): exact: peak" in text
    assert "= the plan's weights + KV + inputs" in " ".join(text.split())
    # a one-layer copy's peak is not the plan's: the ranked row stays an estimate
    assert "exact 4" not in text and "exact 3" not in text
