"""``--format markdown`` and the notebook reprs: the same summary as the terminal, as markdown or HTML."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan import cli
from meshplan.pure import search_meshes
from meshplan.pure.report import PlanReport, plan_html, plan_markdown, show
from meshplan.pure.search import search_pipelines
from meshplan.pure.cost import FP8_EFFICIENCY_RATIO, MATMUL_DTYPES
from meshplan.pure.report._summary import RANK_COLUMNS, compute_rate, header_facts
from tests.cli.reports import report


@pytest.fixture(scope="module")
def result():
    return search_meshes("llama3-70b", "8x8xH100", top_k=5)


def test_format_markdown_prints_the_summary_ready_for_a_pull_request(capsys, result) -> None:
    # The library's default budget is the command line's (jax's GPU allocator takes 75% of HBM).
    assert cli.main(["plan", "--model", "llama3-70b", "--cluster", "8x8xH100", "--format", "markdown"]) == 0
    out, err = capsys.readouterr()
    # The pipeline layouts of the same request follow the ranked table, as in the terminal.
    found = search_pipelines("llama3-70b", "8x8xH100", batch=result.request.batch, seq=result.request.seq,
                             top_k=5)
    assert out == plan_markdown(report(result, pipelines=found)) and err == ""
    assert "**Pipeline layouts**" in out
    assert cli.main(["plan", "--model", "llama3-70b", "--cluster", "8x8xH100", "--format", "markdown",
                     "--no-pipeline"]) == 0
    assert capsys.readouterr().out == plan_markdown(result)
    lines = plan_markdown(result).splitlines()
    assert lines[0] == "### meshplan plan: llama3-70b on 8x8xH100"
    for label, fact in header_facts(result):
        assert f"- **{label}**: {fact}" in lines
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) == 2 + len(result.candidates)  # header, alignment, one row per mesh
    shown = [c for c in RANK_COLUMNS if c.key != "compiled"]  # nothing compiled: no compiled-step column
    assert all(ln.count("|") == len(shown) + 1 for ln in table)
    assert table[2].startswith(f"| 1 | {result.best.text} | ")
    code = out.split("```python\n")[1].split("```")[0]
    assert f"meshplan.create_mesh(axis_dims={result.best.axis_sizes}" in code
    compile(code, "markdown", "eval")  # the block is Python


def test_the_notebook_reprs_are_the_markdown_and_an_html_fragment(result) -> None:
    shown = show(result)
    assert shown._repr_markdown_() == plan_markdown(result) == plan_markdown(PlanReport(result))
    fragment = shown._repr_html_()
    assert fragment.startswith('<div class="meshplan"><style>') and fragment.endswith("</div>")
    assert "<html" not in fragment and "<script" not in fragment
    assert fragment.count('class="memory-bar"') == len(result.candidates)
    assert fragment.count('class="step-bar"') == len(result.candidates)


def test_a_verified_mesh_is_drawn_with_its_compiled_peak_as_exact(result) -> None:
    from meshplan.pure._format import fmt_bytes
    from meshplan.pure.report._summary import memory_range, range_text

    best, second = result.candidates[:2]
    page = plan_html(report(result, {best.text: (45 * 2**30, "XLA:GPU, jax 0.10.2")}))
    assert page.count('class="compiled"') == 1
    assert (f"#1 {best.text}: {fmt_bytes(best.memory.total)} per device (compiled peak 45.0 GiB (exact, XLA:GPU, "
            "jax 0.10.2))") in page
    assert (f"#2 {second.text}: {fmt_bytes(second.memory.total)} per device (estimate, range "
            f"{range_text(memory_range(result, second))})") in page
    assert plan_html(result).count('class="compiled"') == 0


@pytest.mark.parametrize("bad", [None, "plan", 3])
def test_the_renderers_refuse_what_is_not_a_result(bad) -> None:
    from meshplan.errors import MeshplanTypeError

    with pytest.raises(MeshplanTypeError, match="must be a PlanReport or a SearchResult"):
        plan_markdown(bad)
    with pytest.raises(MeshplanTypeError, match="must be a PlanReport or a SearchResult"):
        plan_html(bad)
    with pytest.raises(MeshplanTypeError, match="must be a PlanReport or a SearchResult"):
        show(bad)


# --- the pipeline layouts (pp outermost) in the reports ------------------------------------------------------------

@pytest.fixture(scope="module")
def pp_result():
    return search_meshes("llama3-70b", "16x8xH100", batch=16, seq=4096, top_k=5)


@pytest.fixture(scope="module")
def pp_found():
    from meshplan.pure.search import search_pipelines

    found = search_pipelines("llama3-70b", "16x8xH100", batch=16, seq=4096)
    # batch=16 leaves pp=8 inside each node out (it does not fit), so the left-out lines are shown too.
    assert len(found.candidates) == 5 and found.left_out
    return found


def _section(text: str, start: str, end: str) -> tuple[str, str]:
    """The pipeline section of a report, and the report with it cut out."""
    i, j = text.index(start), text.index(end)
    assert i < j
    return text[i:j], text[:i] + text[j:]


def _md_rows(section: str) -> list[list[str]]:
    return [[cell.strip() for cell in ln.strip("|").split(" | ")] for ln in section.splitlines()
            if ln.startswith("| ") and not ln.startswith("| # ")]


def test_the_markdown_shows_each_pipeline_layouts_stages_schedule_and_bubble(pp_result, pp_found) -> None:
    from meshplan.pure._format import fmt_bytes

    text = plan_markdown(report(pp_result, pipelines=pp_found))
    section, _ = _section(text, "\n**Pipeline layouts**", "\n**Chosen mesh**")
    # After the ranked table, before the chosen mesh.
    assert text.index("**Ranked meshes**") < text.index("**Pipeline layouts**") < text.index("**Chosen mesh**")
    assert "| # | mesh | pp over | schedule | micro-batches | bubble | layers/stage | memory/device | step time | " \
           "vs best unpipelined |" in section
    rows = _md_rows(section)
    assert len(rows) == len(pp_found.candidates)
    best = pp_result.best.step.step_s
    for row, c in zip(rows, pp_found.candidates, strict=True):
        pipe = c.pipeline
        assert row[1] == c.text and row[1].startswith(f"pp={pipe.stages},")  # the mesh, pp first
        assert row[3] == pipe.schedule + (f" v={pipe.virtual}" if pipe.virtual > 1 else "")
        assert row[4] == str(pipe.micro_batches) and row[5] == f"{pipe.bubble:.1%}"
        assert row[6] == "/".join(map(str, sorted(set(pipe.layers))))
        assert row[7] == fmt_bytes(c.memory.total)
        assert row[9] == f"{c.step.step_s / best:.2f}x"
    assert {r[3] for r in rows} == {"interleaved v=2", "1f1b"}
    top = pp_found.candidates[0]
    assert f"{top.step.step_s / best:.2f}x the best unpipelined mesh's" in section
    ahead = sum(1 for c in pp_result.candidates if c.step.step_s < top.step.step_s)
    assert f"Best pipeline layout {top.text} (" in section
    assert (f"would rank #{ahead + 1} among the unpipelined" in section if ahead < len(pp_result.candidates)
            else f"is slower than all {ahead} of" in section)
    assert f"Left out ({len(pp_found.left_out)}):" in section
    for line in pp_found.left_out:
        assert f"- {line}" in section


def test_the_terminal_and_the_markdown_show_the_same_pipeline_cells(pp_result, pp_found) -> None:
    import io

    from rich.console import Console

    from meshplan.cli._pipeline import render_pipelines
    from meshplan.pure.report._pipeline_summary import PIPELINE_COLUMNS, pipeline_rows

    rows = pipeline_rows(pp_found, pp_result)
    section, _ = _section(plan_markdown(report(pp_result, pipelines=pp_found)), "\n**Pipeline layouts**",
                          "\n**Chosen mesh**")
    assert _md_rows(section) == [[row[c.key] for c in PIPELINE_COLUMNS] for row in rows]
    console = Console(width=250, record=True, file=io.StringIO())
    render_pipelines(pp_found, pp_result, console)
    table = [ln for ln in console.export_text().splitlines() if ln.startswith("│")]
    assert [[cell.strip() for cell in ln.strip("│").split("│")] for ln in table] == _md_rows(section)


def test_without_pipelines_the_reports_are_unchanged(pp_result, pp_found) -> None:
    # The section is the only difference: cut out, the report is byte-equal to one rendered without pipelines
    # (and pipelines=None is that report).
    plain = plan_markdown(pp_result)
    assert plan_markdown(report(pp_result, pipelines=None)) == plain and "Pipeline" not in plain
    _, rest = _section(plan_markdown(report(pp_result, pipelines=pp_found)), "\n**Pipeline layouts**",
                       "\n**Chosen mesh**")
    assert rest == plain
    for fragment in (False, True):
        page = plan_html(pp_result, fragment=fragment)
        assert plan_html(report(pp_result), fragment=fragment) == page and "Pipeline" not in page
        _, rest = _section(plan_html(report(pp_result, pipelines=pp_found), fragment=fragment),
                           '<h2 id="pipelines">', "<h2>Memory and step time per mesh</h2>")
        assert rest == page


def test_the_html_shows_each_pipeline_layout_with_a_bubble_bar(pp_result, pp_found) -> None:
    page = plan_html(report(pp_result, pipelines=pp_found))
    section, _ = _section(page, '<h2 id="pipelines">', "<h2>Memory and step time per mesh</h2>")
    n = len(pp_found.candidates)
    assert section.count('<tr class="pipeline">') == n
    assert section.count('class="bubble-bar"') == n and section.count('class="part-bubble"') == n
    assert section.count('class="reference"') == n  # the best unpipelined step drawn on every bar
    for c in pp_found.candidates:
        assert f"<td class=\"\">{c.text}</td>" in section
        assert f"<td class=\"num\">{c.pipeline.bubble:.1%}</td>" in section
    assert section.count('<details class="left-out">') == 1 and "<details open" not in section
    assert f"{len(pp_found.left_out)} pp placement left out, and why" in section


def test_no_fitting_pipeline_layout_says_so_with_the_reasons(pp_result) -> None:
    from meshplan.pure.search import PipelineSearch

    found = PipelineSearch((), ("pp=2 over the network: no stage mesh fits",))
    text = plan_markdown(report(pp_result, pipelines=found))
    assert "**Pipeline layouts**: No pipeline layout (pp outermost) fits; the left-out lines say why." in text
    assert "- pp=2 over the network: no stage mesh fits" in text and "| pp over |" not in text
    page = plan_html(report(pp_result, pipelines=found))
    assert "No pipeline layout (pp outermost) fits" in page and 'class="bubble-bar"' not in page
    assert "<li>pp=2 over the network: no stage mesh fits</li>" in page


def test_hostile_text_in_the_pipeline_section_stays_text(pp_result, pp_found) -> None:
    import dataclasses

    from meshplan.pure.search import PipelineSearch

    top = pp_found.candidates[0]
    names = list(top.axis_names)
    names[next(i for i, n in enumerate(top.axis_sizes) if i and n > 1)] = "<b>x|y</b>"  # an axis the text shows
    evil = dataclasses.replace(top, axis_names=tuple(names), verdict="<script>alert(1)</script> | cell\n# heading")
    found = PipelineSearch((evil,), ("<img src=x onerror=alert(1)>\n| a | b |",))
    text = plan_markdown(report(pp_result, pipelines=found))
    section, _ = _section(text, "\n**Pipeline layouts**", "\n**Chosen mesh**")
    for raw in ("<script", "<img", "<b>", "\n# heading", "\n| a | b |"):
        assert raw not in section, raw
    assert "&lt;b&gt;x\\|y&lt;/b&gt;" in section  # the pipe escaped inside the cell, so the row keeps its cells
    assert len(_md_rows(section)) == 1 and len(_md_rows(section)[0]) == 10
    assert "&lt;script&gt;alert(1)&lt;/script&gt; \\| cell # heading" in section
    assert "- &lt;img src=x onerror=alert(1)&gt; \\| a \\| b \\|" in section
    page = plan_html(report(pp_result, pipelines=found))
    assert "<script" not in page and "<img" not in page
    section, _ = _section(page, '<h2 id="pipelines">', "<h2>Memory and step time per mesh</h2>")
    assert "<b>" not in section  # the device grid's captions bold axis names; this section has none of its own
    assert "&lt;b&gt;x|y&lt;/b&gt;" in section and "&lt;img src=x onerror=alert(1)&gt;" in section
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section


@pytest.mark.parametrize("bad", ["pipelines", 3, ()])
def test_a_report_refuses_pipelines_that_are_not_a_pipeline_search(result, bad) -> None:
    from meshplan.errors import MeshplanTypeError

    with pytest.raises(MeshplanTypeError, match="PlanReport.pipelines"):
        PlanReport(result, pipelines=bad)


@given(st.floats(0.01, 1.0), st.sampled_from(MATMUL_DTYPES))
def test_the_time_fact_states_the_bf16_efficiency_and_only_an_fp8_recipe_its_fp8_share(eff: float,
                                                                                      dtype: str) -> None:
    text = compute_rate(eff, dtype)
    assert text.startswith(f" at {eff:.0%} of peak bf16")
    assert ("fp8" in text) == (dtype == "float8")
    if dtype == "float8":
        assert text.endswith(f", weight matmuls at {eff * FP8_EFFICIENCY_RATIO:.0%} of peak fp8")
    assert ("fp8" in compute_rate(None, dtype)) == (dtype == "float8")


def test_an_fp8_plan_says_so_in_every_report() -> None:
    from meshplan.pure.cost import TrainingRecipe

    r = search_meshes("llama3-8b", "2x8xH100", batch=16, seq=2048, top_k=2,
                      recipe=TrainingRecipe(matmul_dtype="float8"))
    facts = dict(header_facts(r))
    assert "weight matmuls at" in facts["time"] and facts["step"].endswith("fp8 weight matmuls")
    assert f"- **time**: {facts['time']}" in plan_markdown(r)
    assert "of peak fp8" in plan_html(r)


@pytest.mark.parametrize("model, moe", [("mixtral-8x7b", True), ("llama3-8b", False)])
@pytest.mark.parametrize("dispatch", ["einsum", "dropless"])
def test_an_moe_plan_states_its_dispatch_in_every_report_and_a_dense_one_none(model: str, moe: bool,
                                                                            dispatch: str) -> None:
    from meshplan.pure.cost import TrainingRecipe
    from meshplan.pure.search import SearchResult

    r = search_meshes(model, "4x8xH100", batch=32, seq=2048, top_k=2, recipe=TrainingRecipe(moe_dispatch=dispatch))
    assert (r.request.moe_layers > 0) == moe
    step = dict(header_facts(r))["step"]
    said = {"einsum": "MoE einsum dispatch (capacity factor 1.25, as the reference step)",
            "dropless": "MoE dropless dispatch (grouped GEMMs over the routed tokens)"}[dispatch]
    assert step.endswith(said) if moe else "dispatch" not in step
    assert (said in plan_markdown(r)) == moe and (said in plan_html(r)) == moe
    # A result read back from JSON still knows it searched an MoE model.
    assert dict(header_facts(SearchResult.from_json(r.to_json())))["step"] == step


def test_a_master_weights_plan_states_its_moments_and_its_fp32_master_apart() -> None:
    import io

    from rich.console import Console

    from meshplan.cli._detail import render_detail
    from meshplan.pure.cost import TrainingRecipe

    r = search_meshes("llama3-8b", "2x8xH100", batch=16, seq=2048, top_k=2,
                      recipe=TrainingRecipe(optimizer_dtype="bfloat16", master_weights=True))
    assert r.request.optimizer_copies == 3  # the request counts the master among the copies
    step = dict(header_facts(r))["step"]
    assert "adamw (2 x bfloat16)" in step and "fp32 master weights" in step and "3 x" not in step
    out = io.StringIO()
    render_detail(r, Console(file=out, width=400))
    assert "2 bfloat16 optimizer copies + fp32 master weights" in out.getvalue()
