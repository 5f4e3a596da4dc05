"""``meshplan plan --html`` and ``show-mesh --html`` opened in a real headless Chromium: the page renders (a
screenshot that is not blank and shows the bars' colours), has the expected elements, logs nothing to the
console, and fetches nothing. Skips, saying why, where Debian's ``chromium`` is not installed (``.ci/run``
installs it)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from meshplan import cli
from meshplan.pure import search_meshes
from meshplan.pure.report._svg import BUBBLE_COLOR, MEMORY_COLORS

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium for a real browser "
                                "(apt-get install -y chromium; .ci/run installs it)")

_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync")


def _chromium(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"  # a fresh profile per run
    return subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                           *extra, page.as_uri()], capture_output=True, text=True, timeout=120, check=False)


def _console_messages(stderr: str) -> list[str]:
    """What the page logged: Chromium writes every console message (and uncaught error) as ``:CONSOLE``."""
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]


def _read_png(path: Path) -> np.ndarray:
    """An 8-bit RGB(A) PNG, as Chromium writes screenshots, to an (h, w, 3) array (no imaging library)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, chunk = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
    assert depth == 8 and interlace == 0 and ctype in (2, 6), (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    stride = w * bpp
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, stride + 1)
    out = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.int64)
    for r in range(h):  # undo each row's filter (PNG spec, section 9)
        f, line = raw[r, 0], raw[r, 1:].astype(np.int64)
        if f == 0:
            cur = line
        elif f == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) & 255
        elif f == 2:  # Up
            cur = (line + prev) & 255
        else:  # Average, Paeth: each byte depends on the one decoded left of it
            done, left, up = bytearray(stride), line.tolist(), prev.tolist()
            for i in range(stride):
                a = done[i - bpp] if i >= bpp else 0
                b = up[i]
                if f == 3:
                    done[i] = (left[i] + ((a + b) >> 1)) & 255
                    continue
                c = up[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                done[i] = (left[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.frombuffer(bytes(done), np.uint8).astype(np.int64)
        out[r], prev = cur, cur
    return out.reshape(h, w, bpp)[:, :, :3]


def _color_pixels(img: np.ndarray, hex_color: str) -> int:
    rgb = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(img.astype(int) - rgb).max(axis=2) <= 2).sum())


def _has_color(img: np.ndarray, hex_color: str) -> bool:
    return _color_pixels(img, hex_color) > 100


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    page = tmp_path_factory.mktemp("report") / "plan.html"
    assert cli.main(["plan", "--model", "llama3-70b", "--cluster", "8x8xH100", "--html", str(page)]) == 0
    return page


@pytest.fixture(scope="module")
def report_without_pipelines(tmp_path_factory) -> Path:
    page = tmp_path_factory.mktemp("report-no-pp") / "plan.html"
    assert cli.main(["plan", "--model", "llama3-70b", "--cluster", "8x8xH100", "--no-pipeline", "--html",
                     str(page)]) == 0
    return page


def test_plan_puts_its_pipeline_layouts_in_the_report_unless_told_not_to(report: Path,
                                                                         report_without_pipelines: Path) -> None:
    # The report shows what the terminal shows: the pipeline layouts, searched with the plan's own budget.
    with_pp, without = report.read_text(), report_without_pipelines.read_text()
    assert '<h2 id="pipelines">Pipeline layouts</h2>' in with_pp and 'id="pipelines"' not in without
    assert with_pp.count('<tr class="pipeline">') >= 1
    budget = re.search(r"55\.9 GiB", with_pp)  # the jax allocator's 75% of 80 GB, in the header
    assert budget is not None


def test_the_report_is_one_self_contained_file(report: Path) -> None:
    text = report.read_text()
    assert "<script" not in text.lower()
    # Nothing fetched: no external URL in an attribute or a stylesheet (the SVG namespace is a name, not a fetch).
    urls = set(re.findall(r"https?://[^\"')\s]+", text)) - {"http://www.w3.org/2000/svg"}
    assert not urls, urls
    assert "<link" not in text and "@import" not in text and "<img" not in text


@needs_chromium
def test_the_report_renders_in_chromium_with_its_elements_and_no_console_errors(report: Path, tmp_path) -> None:
    out = _chromium(report, tmp_path, "--dump-dom")
    assert out.returncode == 0, out.stderr[-2000:]
    assert _console_messages(out.stderr) == []
    dom = out.stdout
    assert dom.count('class="candidate"') == 5
    assert dom.count('class="memory-bar"') == 5 and dom.count('class="step-bar"') == 5
    assert len(re.findall(r"<tr class=\"(best)?\">", dom)) == 5  # the ranked table's rows
    assert dom.count('class="range"') == 5  # each estimate drawn with its range
    # The chosen mesh is the search's best (verification is off in the suite): one panel per axis it splits
    # over, each drawing the 64 devices and the hosts' edges, and the snippet that builds it.
    best = search_meshes("llama3-70b", "8x8xH100").best
    split = [n for n, k in zip(best.axis_names, best.axis_sizes) if k > 1]
    assert dom.count('class="axis-panel"') == len(split) >= 2
    assert dom.count('class="device"') == len(split) * 64
    assert dom.count('class="host-edge"') == len(split)
    assert f"meshplan.create_mesh(axis_dims={tuple(best.axis_sizes)}" in dom
    assert f"dcn_mesh_dims={tuple(best.dcn_shape)}" in dom


@needs_chromium
def test_the_screenshot_is_not_blank_and_shows_the_bars(report: Path, tmp_path) -> None:
    shot = tmp_path / "plan.png"
    out = _chromium(report, tmp_path, f"--screenshot={shot}", "--window-size=1280,1400")
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    img = _read_png(shot)
    assert img.shape == (1400, 1280, 3)
    inked = (img < 200).any(axis=2)  # pixels that are not white or near it: text, bars, grid
    assert 0.02 < inked.mean() < 0.6
    assert inked[:200].any() and inked[-600:].any()  # drawn from the header down to the device grid
    for part in ("params", "optimizer", "activations"):
        assert _has_color(img, MEMORY_COLORS[part]), part


@needs_chromium
def test_the_console_check_catches_an_error(tmp_path) -> None:
    # The check above can fail: a page that logs an error is caught.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p>x</p><script>undefinedFunction();</script></body></html>")
    out = _chromium(bad, tmp_path, "--dump-dom")
    assert any("undefinedFunction" in m for m in _console_messages(out.stderr))


@needs_chromium
def test_show_mesh_html_draws_the_device_grid(tmp_path, capsys) -> None:
    page = tmp_path / "mesh.html"
    assert cli.main(["show-mesh", "--cluster", "2x4xH100", "--mesh", "dp=2,tp=4", "--html", str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().err
    out = _chromium(page, tmp_path, "--dump-dom")
    assert _console_messages(out.stderr) == []
    assert out.stdout.count('class="device"') == 2 * 8 and out.stdout.count('class="axis-panel"') == 2


@pytest.fixture(scope="module")
def pipeline_report(tmp_path_factory):
    """A plan's report with its pipeline layouts, written as ``--html`` writes it (:mod:`meshplan.cli._html`)."""
    from meshplan.cli._html import write_plan_html
    from meshplan.pure import search_meshes
    from meshplan.pure.report import PlanReport
    from meshplan.pure.search import search_pipelines

    result = search_meshes("llama3-70b", "16x8xH100", batch=16, seq=4096, top_k=5)
    found = search_pipelines("llama3-70b", "16x8xH100", batch=16, seq=4096)
    assert len(found.candidates) == 5 and len(found.left_out) == 1
    page = tmp_path_factory.mktemp("pipelines") / "plan.html"
    write_plan_html(str(page), PlanReport(result, pipelines=found))
    return page, found


def test_the_report_with_pipelines_is_still_one_self_contained_file(pipeline_report) -> None:
    text = pipeline_report[0].read_text()
    assert "<script" not in text.lower() and "<link" not in text and "<img" not in text
    assert set(re.findall(r"https?://[^\"')\s]+", text)) == {"http://www.w3.org/2000/svg"}


@needs_chromium
def test_the_pipeline_section_renders_in_chromium(pipeline_report, tmp_path) -> None:
    page, found = pipeline_report
    out = _chromium(page, tmp_path, "--dump-dom")
    assert out.returncode == 0, out.stderr[-2000:]
    assert _console_messages(out.stderr) == []
    dom = out.stdout
    assert '<h2 id="pipelines">Pipeline layouts</h2>' in dom
    assert dom.index("<h2>Ranked meshes</h2>") < dom.index('id="pipelines"') < dom.index("<h2>Memory and step")
    assert dom.count('<tr class="pipeline">') == 5  # parsed as rows of the table
    assert dom.count('class="bubble-bar"') == 5 and dom.count('class="part-bubble"') == 5
    assert len(re.findall(r"<tr class=\"(best)?\">", dom)) == 5  # the ranked table is as it was
    for c in found.candidates:
        assert f"<td class=\"\">{c.text}</td>" in dom
        assert f"<td class=\"num\">{c.pipeline.bubble:.1%}</td>" in dom
    assert "interleaved v=2" in dom and "1f1b" in dom
    # The left-out lines are in the page, collapsed.
    details = re.search(r"<details class=\"left-out\"( open)?>", dom)
    assert details and details.group(1) is None
    assert "pp=8 inside each node" in dom[details.start():]


@needs_chromium
def test_the_pipeline_screenshot_shows_the_bubble_bars(pipeline_report, report_without_pipelines: Path,
                                                       tmp_path) -> None:
    shots = []
    for page in (pipeline_report[0], report_without_pipelines):
        shot = tmp_path / f"{page.parent.name}.png"
        out = _chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,1000")
        assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
        shots.append(_read_png(shot))
    # The bubble's colour is drawn on the report with pipelines (in the first screen: the section follows the
    # ranked table) and nowhere on the report without them. The legend's swatch alone is about 200 pixels; the
    # five bars' bubbles (12 px high, about 100 px wide together) about 1,250 more (1,477 in all here).
    assert _color_pixels(shots[0], BUBBLE_COLOR) > 800 and not _has_color(shots[1], BUBBLE_COLOR)


def test_an_unwritable_html_path_is_an_error_not_a_traceback(tmp_path, capsys) -> None:
    target = tmp_path / "no-such-dir" / "plan.html"
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "H100", "--html", str(target)]) == 1
    assert "cannot write --html" in capsys.readouterr().err


def test_html_with_json_keeps_stdout_json_only(tmp_path, capsys) -> None:
    import json

    page = tmp_path / "plan.html"
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "2x4xH100", "--json", "--html", str(page)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["candidates"] and f"wrote {page}" in err
    assert page.read_text().startswith("<!DOCTYPE html>")
