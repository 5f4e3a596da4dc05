"""A hand-edited report file: garbage at every field of a saved plan report, and every renderer run on it.

``meshplan plan --json`` writes a :class:`~meshplan.pure.report.PlanReport` (the ranked meshes, their compiled
rows, the pipeline layouts and their compiled rows). Any one value of that document replaced by JSON garbage
must be refused by :meth:`PlanReport.from_json` with a typed error, or read back into a report that
:func:`~meshplan.pure.report.plan_markdown`, :func:`~meshplan.pure.report.plan_html` and
:func:`~meshplan.pure.report.show` render (a value the reader accepts must not make a renderer raise). Half the
edits go to the ``report`` part (the compiled rows, ``VerifyRow.from_dict`` and ``PlanVerification.from_dict``),
which a uniform pick over the whole document, mostly the search result, would reach too rarely.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.test_fuzz as fuzz

_DOC: dict[str, Any] | None = None


def _report() -> Any:
    """A report of every part: ranked meshes, exact / over budget / not verified rows, pipeline layouts."""
    from meshplan.pure import report, search, verify
    from meshplan.pure.xla import CompiledMemory, LiveBuffer

    found = search.search_meshes("gpt2", "2x4xH100", batch=8, seq=128, top_k=3)
    budget, recipe = found.request.budget, found.request.recipe
    rows = [verify.estimate_row(c, budget, recipe, target="8 x XLA:CPU") for c in found.candidates]
    big = LiveBuffer("fusion.7", 32768, "f32[2,32,32]", "f32", "temp", "jit(step)/dot")
    memory = CompiledMemory(argument_bytes=1 << 20, output_bytes=1 << 20, alias_bytes=1 << 20, temp_bytes=1 << 19,
                            peak_bytes=3 << 19, peak_source="peak_memory_in_bytes", reported_peak_bytes=3 << 19,
                            generated_code_bytes=0, host_temp_bytes=0, platform="cpu", device_kind="cpu",
                            num_devices=8, compile_seconds=1.5, largest=(big,), largest_note="buffer assignment")
    exact = verify.outcome_row(rows[0], verify.CompileOutcome("8 x XLA:CPU", memory, seconds=2.0),
                               compiler="XLA:CPU (jax 0.10.2)", cached=False)
    oom = verify.outcome_row(rows[1], verify.CompileOutcome("8 x XLA:CPU", None, oom=True,
                                                            oom_required_bytes=budget * 2,
                                                            error="does not fit"), compiler="XLA:CPU", cached=True)
    failed = verify.outcome_row(rows[2], verify.CompileOutcome("8 x XLA:CPU", None, error="timed out after 9 s"),
                                compiler="XLA:CPU", cached=False)
    checked = verify.PlanVerification((exact, failed), (oom,), "XLA:CPU", "", 3.5)
    pipelines = search.search_pipelines("gpt2", "2x4xH100", batch=8, seq=128, top_k=2)
    piped = tuple(verify.estimate_row(c, budget, recipe) for c in pipelines.candidates)
    return report.PlanReport(found, verification=checked, pipelines=pipelines,
                             pipeline_verification=verify.PlanVerification(piped, (), "XLA:CPU", "", 0.0),
                             notes=("gpt2 is priced with full attention.",))


def _document() -> dict[str, Any]:
    global _DOC
    if _DOC is None:
        _DOC = json.loads(_report().to_json())
    return _DOC


def _edits() -> st.SearchStrategy[tuple[tuple[Any, ...], Any]]:
    paths = fuzz._json_paths(_document())
    in_report = [p for p in paths if p[0] == "report"]
    return st.tuples(st.one_of(st.sampled_from(in_report), st.sampled_from(paths)), fuzz._json_values)


def test_the_report_document_holds_every_kind_of_row() -> None:
    """The edits reach what they are meant to: compiled rows with buffers, removed rows, pipeline rows."""
    part = _document()["report"]
    statuses = {r["status"] for r in part["verification"]["rows"] + part["verification"]["removed"]}
    assert statuses == {"exact", "over budget", "not verified"}
    assert part["verification"]["rows"][0]["largest"] and part["pipelines"]["candidates"]
    assert part["pipeline_verification"]["rows"]


def _read_and_render(text: str) -> None:
    from meshplan.pure import report

    read = report.PlanReport.from_json(text)
    report.plan_markdown(read)
    report.plan_html(read)
    report.show(read)._repr_html_()


@settings(max_examples=fuzz._EXAMPLES * 5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(_edits())
def test_a_hand_edited_report_file_gives_a_typed_error_or_a_report_that_renders(
        edit: tuple[tuple[Any, ...], Any]) -> None:
    path, value = edit
    data = copy.deepcopy(_document())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    fuzz._check_call(f"PlanReport.from_json + renderers (report with {path} = {value!r:.80})", _read_and_render,
                     [json.dumps(data)], {})
