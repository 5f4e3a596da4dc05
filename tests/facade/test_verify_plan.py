"""meshplan.verify_plan and its workers: the compiler decides, a failed compile is one row, the cache answers.

Real compiles in real worker subprocesses, kept small (GPT-2 cut to one layer, short sequences).
"""

from __future__ import annotations

import dataclasses
import io

import pytest

import meshplan
from meshplan.facade.verify._compilers import cuda_plugin_problem
from meshplan.facade.verify._reference import ReferenceConfig
from meshplan.facade.verify._jobs import CompileJob
from meshplan.facade.verify._worker import run_jobs
from meshplan.pure import get_preset, parse_cluster, search_meshes
from meshplan.pure.cluster import Cluster, DEVICE_SPECS

TINY = dataclasses.replace(get_preset("gpt2").spec, name="gpt2 (1 layer)", num_layers=1, num_params=None)


@pytest.fixture(autouse=True)
def _own_compile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "compile-cache"))


def _job(**changes):
    job = CompileJob(TINY, parse_cluster("1x8xH100"), ("dp",), (8,), None, None, batch=8, seq=32,
                     config=ReferenceConfig(), target="cpu")
    return dataclasses.replace(job, **changes)


def test_a_failing_or_overlong_compile_is_one_row_with_its_reason_and_the_rest_compile():
    flash_on_cpu = _job(config=ReferenceConfig(attention="flash"))  # the Pallas TPU kernel: refused on CPU
    outcomes = run_jobs([flash_on_cpu, _job()], parallel=2)
    assert outcomes[0].memory is None and outcomes[0].error.startswith("PlanError: ")
    assert "attention='flash'" in outcomes[0].error
    assert outcomes[1].ok and outcomes[1].memory.num_devices == 8
    slow = run_jobs([_job()], timeout_s=0.05)[0]
    assert slow.memory is None and slow.error == "timed out after 0.05 s"


def test_a_worker_over_its_memory_bound_is_a_reason_not_a_crash():
    starved = run_jobs([_job()], memory_limit=1 << 30)[0]  # jax alone reserves more address space than this
    assert starved.memory is None
    assert "1 GiB memory bound" in starved.error, starved.error


def test_a_compiled_peak_over_the_budget_removes_the_mesh_and_the_next_is_verified():
    found = search_meshes(TINY, "1x8xH100", axes=["dp", "fsdp"], batch=8, seq=32, top_k=3)
    first = meshplan.verify_plan(found, model=TINY, top=1, target="cpu", stream=io.StringIO())
    best = first.rows[0]
    assert best.status == "exact" and best.compiler.startswith("XLA:CPU (jax ")
    assert [r.status for r in first.rows[1:]] == ["estimate", "estimate"]
    # The same request with the budget just under rank 1's compiled peak (and over every estimate).
    budget = best.peak_bytes - 1
    if budget < max(c.memory.total for c in found.candidates):
        pytest.skip("rank 1's compiled peak is not above every estimate here")
    device = dataclasses.replace(DEVICE_SPECS["H100"], hbm_bytes=budget)
    tight = search_meshes(TINY, Cluster(device, 1, 8), axes=["dp", "fsdp"], batch=8, seq=32, top_k=3, headroom=0)
    stream = io.StringIO()
    second = meshplan.verify_plan(tight, model=TINY, top=1, target="cpu", stream=stream)
    assert [r.rank for r in second.removed] == [1] and second.removed[0].status == "over budget"
    assert "> the" in second.removed[0].error
    assert second.rows[0].rank == 2 and second.rows[0].status in ("exact", "over budget", "not verified") or \
        second.note == "every compiled mesh is over the budget"
    assert "compiling the reference step of gpt2 (1 layer) on " in stream.getvalue()


def test_verify_plan_refuses_bad_requests_with_typed_errors():
    found = search_meshes(TINY, "1x8xH100", batch=8, seq=32, top_k=1)
    for call, kind, words in [
        (lambda: meshplan.verify_plan(None), meshplan.MeshplanTypeError, "must be a SearchResult"),
        (lambda: meshplan.verify_plan(found, top=0), meshplan.PlanError, "top=0 must be an int >= 1"),
        (lambda: meshplan.verify_plan(found, target="gpu"), meshplan.PlanError, "'auto'"),
        (lambda: meshplan.verify_plan(found, time_budget_s=float("nan")), meshplan.PlanError, "seconds > 0"),
        (lambda: meshplan.verify_plan(found, parallel=[2]), meshplan.MeshplanTypeError, "parallel"),
        (lambda: meshplan.verify_plan(found, cache="yes"), meshplan.MeshplanTypeError, "cache="),
    ]:
        with pytest.raises(kind, match=words):
            call()


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.skipif(cuda_plugin_problem() is not None, reason=f"needs the jax CUDA plugin: {cuda_plugin_problem()}")
def test_the_verified_gpu_peak_is_the_independent_compiles_to_the_byte_and_a_replan_is_cached():
    found = search_meshes(TINY, "1x8xH100", batch=16, seq=64, top_k=1)
    row = meshplan.verify_plan(found, model=TINY, top=1, stream=io.StringIO()).rows[0]
    assert row.status == "exact" and not row.cached and "jax-cuda12-plugin" in row.compiler
    assert "shipped description" in row.target
    # Independently, in this process (the suite runs with JAX_PLATFORMS=cpu): the same step, jit's own compile.
    best = found.best
    mesh = meshplan.gpu_topology_mesh("1x8xH100", best.axis_names, best.axis_sizes)
    ref = meshplan.reference_step(TINY, mesh, batch=16, seq=64, plan=best, config=ReferenceConfig())
    assert row.peak_bytes == ref.fn.lower(*ref.args).compile().memory_analysis().peak_memory_in_bytes
    again = meshplan.verify_plan(found, model=TINY, top=1, stream=io.StringIO())
    assert again.rows[0].cached and again.rows[0].peak_bytes == row.peak_bytes and again.seconds < 2


def test_a_rejected_mesh_whose_range_reaches_the_budget_is_compiled_before_it_is_called_over_it():
    from meshplan.pure.verify import admit_compiled, estimate_row

    # A budget (800 MB of a notional GPU) under which the leanest rejected mesh (dp=8: 0.9 GB by the estimate)
    # has a stated range reaching down to it: the estimate cannot say it does not fit, so it is compiled.
    found = search_meshes(TINY, "1x8xH100", batch=8, seq=32, top_k=8, headroom=1 - 0.80e9 / 80e9)
    req = found.request
    lows = {c.text: estimate_row(c, req.budget, req.recipe).range_low_bytes for c in found.rejected}
    near = [t for t in lows if lows[t] is not None and lows[t] <= req.budget]
    assert near, lows
    stream = io.StringIO()
    checked = meshplan.verify_plan(found, model=TINY, top=1, target="cpu", stream=stream)
    row = next(r for r in (*checked.rows, *checked.removed) if r.mesh == near[0])
    assert row.rank is None and row.peak_bytes is not None and row.compiler.startswith("XLA:CPU")
    assert (row.status == "exact") == (row.peak_bytes <= req.budget)
    assert "over the budget by the estimate, its range reaching it" in stream.getvalue()
    ranked, _ = admit_compiled(found, checked)
    assert (near[0] in [c.text for c in ranked.candidates]) == (row.status == "exact")
    assert (near[0] in [c.text for c in ranked.rejected]) == (row.status == "over budget")
