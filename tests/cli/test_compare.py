"""``meshplan compare`` end to end: the table at 100 and 80 columns, markdown, one JSON row per option, the
HTML page in a real headless Chromium (two plots, no scripts, nothing fetched), and bad input as typed errors
with exit 1. Estimates only here (``MESHPLAN_VERIFY=0`` from conftest); verified comparisons are
tests/facade/test_compare.py's and, on Dask workers, tests/facade/test_executor_dask.py's."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from meshplan import cli
from meshplan.cli._compare import render_comparison
from meshplan.pure.report._compare_svg import KIND_COLORS
from tests.cli.test_html_report import _chromium, _console_messages, _has_color, _read_png, needs_chromium

ISSUE = ["compare", "--model", "llama3-70b", "--clusters", "4x8xH100,8x8xH100,4x8xH200,v5p-128"]
PRICED = ISSUE + ["--price", "H100=2.49,H200=3.50,v5p=4.20", "--tokens", "2T"]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def priced() -> object:
    from meshplan.facade._compare import compare_clusters

    return compare_clusters("llama3-70b", "4x8xH100,8x8xH100,4x8xH200,v5p-128", prices="H100=2.49,H200=3.50,v5p=4.20",
                            tokens="2T", verify=False, stream=io.StringIO())


@pytest.mark.parametrize("width", [100, 80])
def test_the_table_fits_the_terminal_and_keeps_the_figures_that_decide(priced, width: int) -> None:
    buf = io.StringIO()
    render_comparison(priced, Console(file=buf, width=width, color_system=None))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    for cell in ("cluster", "devices", "memory/device", "tokens/s", "$/M tok"):
        assert cell in text
    for cluster in ("4x8xH100", "8x8xH100", "4x8xH200", "v5p-128"):
        assert cluster in text
    flat = " ".join(text.split())  # the facts wrap at the console's width
    assert "best: " in flat and "smallest that fits: " in flat and "meshplan ships no price list" in flat


def test_the_cli_prints_the_issue_comparison_and_the_verdicts(capsys) -> None:
    code, out, err = _run(PRICED, capsys)
    assert code == 0, err
    assert "meshplan compare: llama3-70b on 4 options" in out
    assert "searching meshes of v5p-128" in err  # progress on stderr, the table on stdout


def test_json_gives_one_row_per_option_with_the_issue_fields(capsys) -> None:
    code, out, _ = _run(PRICED + ["--json"], capsys)
    assert code == 0
    data = json.loads(out)
    rows = data["rows"]
    assert sorted(r["cluster"] for r in rows) == sorted(["4x8xH100", "8x8xH100", "4x8xH200", "v5p-128"])
    for r in rows:
        for key in ("cluster", "devices", "fits", "mesh", "step_s", "tokens_per_s", "mfu", "verified",
                    "cost_per_million_tokens", "train_hours", "train_cost"):
            assert key in r, key
        assert r["verified"] is False  # MESHPLAN_VERIFY=0 here: estimates only, and the row says so
    assert data["price_source"] is None and data["tokens"] == 2 * 10**12
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    tps = [r["tokens_per_s"] for r in rows]
    assert tps == sorted(tps, reverse=True)  # --by time: the most tokens per second first


def test_by_cost_ranks_the_cheapest_token_first(capsys) -> None:
    code, out, _ = _run(PRICED + ["--by", "cost", "--json"], capsys)
    costs = [r["cost_per_million_tokens"] for r in json.loads(out)["rows"]]
    assert code == 0 and costs == sorted(costs)


def test_markdown_is_one_table_with_a_row_per_option(capsys) -> None:
    code, out, _ = _run(PRICED + ["--format", "markdown"], capsys)
    assert code == 0
    rows = [ln for ln in out.splitlines() if re.match(r"\| \d \| ", ln)]
    assert len(rows) == 4 and out.startswith("### meshplan compare: llama3-70b on 4 options")


def test_sizes_of_one_kind_find_the_smallest_that_fits_and_the_knee(capsys) -> None:
    code, out, _ = _run(["compare", "--model", "llama3-70b", "--nodes", "1,2,4,8,16", "--device", "H100",
                         "--batch", "128", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and len(data["rows"]) == 5
    fits = {r["cluster"]: r["fits"] for r in data["rows"]}
    assert fits["1x8xH100"] is False  # 70B with AdamW does not fit in 8 x 80 GB
    assert data["smallest_fitting"] in fits and fits[data["smallest_fitting"]]
    (h100,) = data["scaling"]
    assert h100["device"] == "H100" and h100["summary"].startswith("H100: ")
    rows = {r["cluster"]: r for r in data["rows"]}
    for step in h100["steps"]:  # one global batch: the step-time speedup over the device ratio
        speedup = rows[step["small"]]["step_s"] / rows[step["large"]]["step_s"]
        ratio = step["devices_large"] / step["devices_small"]
        assert abs(step["efficiency"] - speedup / ratio) < 1e-9
        # Above 1 only where the smaller cluster needs more micro-batches or another layout; never by much.
        assert 0 < step["efficiency"] < 1.1


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--clusters", "8x8xH100,8x8xQ100"], "cluster item 2 ('8x8xQ100'): unknown device 'q100'; known devices"),
    (["--clusters", "8x8xH100,,v5p-128"], "cluster item 2 is empty"),
    (["--clusters", "8x8xH100", "--price", "H100=-1"], "--price H100=-1: the price must be a finite number > 0"),
    (["--clusters", "8x8xH100", "--price", "H100=cheap"], "--price H100=cheap: the price must be a number"),
    (["--clusters", "8x8xH100", "--price", "v5p=4.2"], "--price v5p: no compared cluster has v5p devices"),
    (["--clusters", "8x8xH100", "--tokens", "lots"], "--tokens 'lots' is not a token count"),
    (["--clusters", "8x8xH100", "--by", "cost"], "--by cost needs prices"),
    (["--nodes", "1,2"], "--nodes and --device go together"),
    ([], "give --clusters LIST"),
    pytest.param(["--clusters", "8x8xH100", "--executor", "tcp://127.0.0.1:9", "--verify", "1"],
                 "cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'",
                 marks=pytest.mark.slow),  # waits out Dask's connect timeout (10 s): the second tier
])
def test_bad_input_is_a_typed_error_naming_it_with_exit_1(argv: list[str], fragment: str, capsys) -> None:
    code, out, err = _run(["compare", "--model", "gpt2", *argv], capsys)
    assert code == 1, (out, err)
    assert fragment in err and "Traceback" not in err


def test_bad_input_with_json_is_one_error_object_on_stdout(capsys) -> None:
    code, out, _ = _run(["compare", "--model", "gpt2", "--clusters", "2xQ100", "--json"], capsys)
    assert code == 1 and json.loads(out)["error"]["type"] == "ClusterError"


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("compare") / "compare.html"
    argv = ["compare", "--model", "llama3-70b", "--clusters", "4x8xH100,8x8xH100,16x8xH100,v5p-{128..512},GB200-NVL72",
            "--price", "H100=2.49,v5p=4.20,GB200=6", "--tokens", "2T", "--html", str(path)]
    assert cli.main(argv) == 0
    return path


def test_the_page_is_one_self_contained_file_with_two_plots(page: Path) -> None:
    text = page.read_text()
    assert "<script" not in text.lower() and "<link" not in text and "<img" not in text
    assert set(re.findall(r"https?://[^\"')\s]+", text)) == {"http://www.w3.org/2000/svg"}
    assert text.count('class="compare-plot"') == 2
    assert text.count('class="series"') >= 2  # H100 and v5p have three sizes each: a line per kind


@needs_chromium
def test_the_page_renders_in_chromium_with_its_table_and_plots(page: Path, tmp_path) -> None:
    out = _chromium(page, tmp_path, "--dump-dom")
    assert out.returncode == 0, out.stderr[-2000:]
    assert _console_messages(out.stderr) == []
    dom = out.stdout
    assert dom.count('class="compare-plot"') == 2
    assert dom.count("<tr class=") == 7  # a row per option
    assert dom.count('<tr class="best"') == 1
    assert dom.count("<circle") >= 2 * 6  # a marker per fitting option in each plot


@needs_chromium
def test_the_page_screenshot_shows_a_line_per_device_kind(page: Path, tmp_path) -> None:
    shot = tmp_path / "compare.png"
    out = _chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,1100")
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    img = _read_png(shot)
    inked = (img < 200).any(axis=2)
    assert 0.01 < inked.mean() < 0.6
    for color in KIND_COLORS[:3]:  # GB200, H100, v5p in sorted order
        assert _has_color(img, color), color
