"""The plan's summary in a terminal: no line longer than the terminal, no table cell wrapped, columns dropped by
priority at 80 columns, the chosen mesh with the lines to type, and plain-text --help."""

from __future__ import annotations

import ast
import re

import pytest

from meshplan import cli
from meshplan.pure import search_meshes
from meshplan.pure.report._summary import RANK_COLUMNS
from meshplan.pure.search import tied_count
from tests.cli.reports import report

_ARGS = ["plan", "--model", "llama3-70b", "--cluster", "8x8xH100"]


@pytest.fixture(scope="module")
def result():
    # The CLI budgets what jax's GPU allocator takes by default (75% of HBM): headroom 0.25.
    return search_meshes("llama3-70b", "8x8xH100", top_k=5, headroom=0.25)


def _plan(capsys, monkeypatch, width: int, *extra: str, pipelines: bool = False) -> str:
    # The pipeline search takes seconds and has its own tests (test_plan_pipeline.py); the width test keeps it.
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main([*_ARGS, *extra, *(() if pipelines else ("--no-pipeline",))]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def _table_lines(text: str) -> list[str]:
    """The ranked table's rows: from its header line to the first line that is not a ranked row."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(r"#\s+mesh\s", ln))
    body = lines[start + 2:]  # header, rule
    return body[:next(i for i, ln in enumerate(body) if not re.match(r"\d+\s", ln))]


@pytest.mark.parametrize("width", [100, 80])
def test_no_line_is_longer_than_the_terminal_and_no_cell_wraps(capsys, monkeypatch, result, width: int) -> None:
    text = _plan(capsys, monkeypatch, width, pipelines=True)
    assert "Pipelined (pp outermost)" in text
    too_long = [ln for ln in text.splitlines() if len(ln) > width]
    assert not too_long, too_long
    # The summary's one table is the ranked one, borderless; a boxed table (whose cells rich wraps) is --detail's.
    assert "│" not in text and "┃" not in text
    rows = _table_lines(text)
    # One line per ranked mesh, each carrying its whole mesh, memory, step and verdict: nothing wrapped or cut.
    assert len(rows) == len(result.candidates)
    for row, cand in zip(rows, result.candidates, strict=True):
        cells = row.split()
        assert cells[0] == str(cand.rank) and cells[1] == cand.text, row
        assert "…" not in row
        # The best, the meshes tied with it within the model's resolution ("~ best"), then "+x.x% time".
        assert row.rstrip().endswith(("best",) if cand.rank <= tied_count(result.candidates) else ("time",)), row


def test_at_80_columns_the_table_drops_low_priority_columns_not_the_essential_ones(capsys, monkeypatch) -> None:
    wide, narrow = _plan(capsys, monkeypatch, 100), _plan(capsys, monkeypatch, 80)
    header = {w: next(ln for ln in t.splitlines() if re.match(r"#\s+mesh\s", ln)) for w, t in ((100, wide),
                                                                                              (80, narrow))}
    for col in (c for c in RANK_COLUMNS if c.priority == 1):
        assert col.title in header[80], col
    assert "range or exact" in header[100] and "exposed comm" in header[100]
    assert "range or exact" not in header[80]
    # A terminal wide enough for everything shows every column (the compiled step's only where something compiled).
    assert all(c.title in _plan(capsys, monkeypatch, 200) for c in RANK_COLUMNS if c.key != "compiled")


def test_the_summary_leads_with_facts_and_ends_with_the_lines_to_type(capsys, monkeypatch, result) -> None:
    text = _plan(capsys, monkeypatch, 100)
    lines = text.splitlines()
    assert lines[0] == "meshplan plan: llama3-70b on 8x8xH100"
    header = lines[1:lines.index("")]
    labels = [ln.split()[0] for ln in header if not ln.startswith(" ")]  # a wrapped fact is indented
    assert labels == ["model", "cluster", "budget", "step", "memory", "time"]
    assert "55.9 GiB per device = HBM 80 GB less 25% headroom (jax's GPU allocator takes 75%" in text
    assert "params/grads/optimizer exact; activations estimated, 0.76-1.47x on 63 XLA:GPU H200 compiles" in text
    best = result.best
    assert f"Chosen mesh: {best.text}" in text
    # The tied meshes are ordered by fewer bytes over the network: fsdp over the 8 nodes, tp inside each.
    assert best.dcn_shape == (1, 8, 1, 1) and best.axis_sizes[3] > 1
    assert f"meshplan.create_mesh(axis_dims={tuple(best.axis_sizes)}, axis_names=('dp', 'fsdp', 'sp', 'tp')," in text
    assert "dcn_mesh_dims=(1, 8, 1, 1))" in text
    flags = " ".join(text.split("MaxText:")[1].split("\n\n")[0].split())  # the flags break between lines, never inside
    ici = dict(zip(best.axis_names, best.ici_shape))
    assert flags.startswith(f"ici_fsdp_parallelism={ici['fsdp']} ici_tensor_parallelism={ici['tp']} "
                            "dcn_data_parallelism=1 dcn_fsdp_parallelism=8")
    # The workings wait behind --detail.
    assert "Parameter groups" not in text and "Step communication" not in text and "--detail adds:" in text
    detail = _plan(capsys, monkeypatch, 100, "--detail")
    assert "Parameter groups" in detail and "Step communication" in detail and "Left out" in detail


def test_the_create_mesh_lines_are_python_that_builds_the_chosen_mesh(capsys, monkeypatch, result) -> None:
    lines = _plan(capsys, monkeypatch, 80).splitlines()
    start = next(i for i, ln in enumerate(lines) if "meshplan.create_mesh(" in ln)
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("))"))
    assert end > start  # broken over lines at 80 columns
    call = ast.parse("\n".join(ln.strip() for ln in lines[start:end + 1]), mode="eval").body
    assert isinstance(call, ast.Call)
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    best = result.best
    assert kwargs == {"axis_dims": best.axis_sizes, "axis_names": best.axis_names, "dcn_mesh_dims": best.dcn_shape}


@pytest.mark.parametrize("command", ["plan", "check", "show-mesh", "demo", None])
def test_help_is_plain_text(capsys, command) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"] if command else ["--help"])
    text = capsys.readouterr().out
    assert "usage: meshplan" in text
    for markup in ("``", ":func:", ":class:", ":meth:", ":mod:", ":data:"):
        assert markup not in text, (command, markup)


def test_a_verified_mesh_reads_exact_with_its_compiler(result) -> None:
    import io

    from rich.console import Console

    from meshplan.cli._render import render_plan

    console = Console(width=100, file=io.StringIO(), color_system=None)
    best = result.best.text
    render_plan(report(result, {best: (45 * 2**30, "XLA:GPU, jax 0.10.2")}), console)
    text = console.file.getvalue()
    row = next(ln for ln in text.splitlines() if ln.startswith("1 ") and best in ln)
    assert "exact 45.0 GiB" in row and row.rstrip().endswith("best")
    assert "exact (#1): XLA's compiled peak, XLA:GPU, jax 0.10.2" in text
    assert "memory 45.0 GiB of the 55.9 GiB budget (exact, XLA:GPU, jax 0.10.2)" in text
    assert all(len(ln) <= 100 for ln in text.splitlines())


def test_a_mesh_compiled_over_the_budget_is_not_the_chosen_one(result) -> None:
    import io

    from rich.console import Console

    from meshplan.cli._render import render_plan

    console = Console(width=100, file=io.StringIO(), color_system=None)
    first, second = result.candidates[0], result.candidates[1]
    render_plan(report(result, {first.text: (first.memory.budget + 1, "XLA:GPU"),
                                second.text: (second.memory.total, "XLA:GPU")}), console)
    text = console.file.getvalue()
    assert f"Chosen mesh: {second.text} (compiled over the budget: {first.text})" in text
