"""``--format markdown`` and the notebook reprs: the same summary as the terminal, as markdown or HTML."""

from __future__ import annotations

import pytest

from meshplan import cli
from meshplan.pure import search_meshes
from meshplan.pure.search import plan_html, plan_markdown
from meshplan.pure.search._summary import RANK_COLUMNS, header_facts


@pytest.fixture(scope="module")
def result():
    return search_meshes("llama3-70b", "8x8xH100", top_k=5)


def test_format_markdown_prints_the_summary_ready_for_a_pull_request(capsys, result) -> None:
    assert cli.main(["plan", "--model", "llama3-70b", "--cluster", "8x8xH100", "--format", "markdown"]) == 0
    out, err = capsys.readouterr()
    assert out == plan_markdown(result) and err == ""
    lines = out.splitlines()
    assert lines[0] == "### meshplan plan: llama3-70b on 8x8xH100"
    for label, fact in header_facts(result):
        assert f"- **{label}**: {fact}" in lines
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) == 2 + len(result.candidates)  # header, alignment, one row per mesh
    assert all(ln.count("|") == len(RANK_COLUMNS) + 1 for ln in table)
    assert table[2].startswith("| 1 | dp=2,fsdp=32 | 44.7 GiB |")
    code = out.split("```python\n")[1].split("```")[0]
    assert "meshplan.create_mesh(axis_dims=(2, 32, 1, 1)" in code
    compile(code, "markdown", "eval")  # the block is Python


def test_the_notebook_reprs_are_the_markdown_and_an_html_fragment(result) -> None:
    assert result._repr_markdown_() == plan_markdown(result)
    fragment = result._repr_html_()
    assert fragment.startswith('<div class="meshplan"><style>') and fragment.endswith("</div>")
    assert "<html" not in fragment and "<script" not in fragment
    assert fragment.count('class="memory-bar"') == len(result.candidates)
    assert fragment.count('class="step-bar"') == len(result.candidates)


def test_a_verified_mesh_is_drawn_with_its_compiled_peak_as_exact(result) -> None:
    best = result.best.text
    page = plan_html(result, compiled={best: (45 * 2**30, "XLA:GPU, jax 0.10.2")})
    assert page.count('class="compiled"') == 1
    assert f"#1 {best}: 44.7 GiB per device (compiled peak 45.0 GiB (exact, XLA:GPU, jax 0.10.2))" in page
    assert "#2 fsdp=64: 32.4 GiB per device (estimate, range 27.6-41.9 GiB)" in page
    assert plan_html(result).count('class="compiled"') == 0


@pytest.mark.parametrize("bad", [None, "plan", 3])
def test_the_renderers_refuse_what_is_not_a_result(bad) -> None:
    from meshplan.errors import MeshplanTypeError

    with pytest.raises(MeshplanTypeError, match="must be a SearchResult"):
        plan_markdown(bad)
    with pytest.raises(MeshplanTypeError, match="must be a SearchResult"):
        plan_html(bad)
