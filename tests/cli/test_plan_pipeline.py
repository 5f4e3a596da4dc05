"""``meshplan plan``'s pipeline section: the ranked pp layouts with their schedule and bubble."""

from __future__ import annotations

import re

from meshplan import cli


def test_plan_shows_pipeline_layouts_with_schedule_and_bubble(capsys) -> None:
    # The summary gives the fastest layout in one line; the table is part of --detail.
    assert cli.main(["plan", "--model", "llama3-8b", "--cluster", "4x8xH100", "--batch", "64", "--top", "3"]) == 0
    summary = capsys.readouterr().out
    assert re.search(r"Pipelined \(pp outermost\): best pp=\d\S*, [0-9.]+ m?s \(estimate\), bubble \d+\.\d%",
                     " ".join(summary.split()))
    assert "Pipeline layouts (pp outermost" not in summary
    assert cli.main(["plan", "--model", "llama3-8b", "--cluster", "4x8xH100", "--batch", "64", "--top", "3",
                     "--detail"]) == 0
    text = capsys.readouterr().out
    assert "Pipeline layouts (pp outermost" in text
    rows = [line for line in text.splitlines() if re.search(r"│ \d │ pp=\d", line)]
    assert len(rows) == 3
    for row in rows:
        assert re.search(r"1f1b|interleaved", row) and re.search(r"\d+\.\d%", row)  # schedule and bubble
    assert "best pipeline layout pp=" in text and "bubble" in text


def test_plan_without_pipeline_and_with_fixed_axes_skips_them(capsys) -> None:
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "2x8xH100", "--no-pipeline"]) == 0
    assert "Pipeline layouts" not in capsys.readouterr().out
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "2x8xH100", "--fix", "dp=16"]) == 0
    assert "pipeline layouts: not searched with --fix" in capsys.readouterr().out
