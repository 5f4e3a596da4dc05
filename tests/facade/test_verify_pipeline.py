"""Pipeline layouts verified like every other row: the pipelined step compiled in a worker, XLA's peak beside
the estimate, and a reason for each row that cannot compile.

One real compile on the suite's 8 XLA:CPU devices (a tiny 8-layer Llama, about 5 s), one deviceless XLA:GPU
compile where the jax CUDA plugin is installed; the rows that cannot compile are refused before any worker
starts.
"""

from __future__ import annotations

import dataclasses
import io
import math

import jax
import pytest

from meshplan.facade.verify import _driver
from meshplan.facade.verify._compiled import compiled_memory
from meshplan.facade.verify._pipeline_step import pipeline_step
from meshplan.facade.verify._reference import ReferenceConfig
from meshplan.facade.verify._pipelines import compiled_schedule, verify_pipelines
from meshplan.pure import search_meshes
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.search import search_pipelines

TINY = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny-llama", num_layers=8, hidden_size=32,
                           num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64, vocab_size=128,
                           num_params=None)
BATCH, SEQ = 8, 8


@pytest.fixture(autouse=True)
def _own_compile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "compile-cache"))


def _plan(spec, cluster="1x8xH100"):
    return (search_meshes(spec, cluster, batch=BATCH, seq=SEQ, top_k=1),
            search_pipelines(spec, cluster, batch=BATCH, seq=SEQ, top_k=5))


def _shard_bytes(tree) -> int:
    """Bytes of one device's shards of an abstract tree (device 0's: the first stage)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        total += math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    return total


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_a_pipeline_row_compiles_on_cpu_devices_with_its_micro_batches_and_repeats():
    plan, found = _plan(TINY)
    cand = found.candidates[0]
    checked = verify_pipelines(found, plan, model=TINY, top=1, target="cpu", cache=False, stream=io.StringIO())
    assert checked.removed == () and checked.compiler.startswith("XLA:CPU")
    (row,) = checked.rows
    assert row.status == "exact", row.error
    assert (row.mesh, row.rank, row.target) == (cand.text, 1, "8 x XLA:CPU")
    assert row.analytic_bytes == cand.memory.total and row.peak_bytes >= row.argument_bytes > 0
    v, text, note = compiled_schedule(cand.pipeline)
    assert row.compiled_schedule == text == f"circular v={v} m={cand.pipeline.micro_batches}"
    assert row.schedule.startswith(cand.pipeline.schedule) and row.micro_batches == cand.pipeline.micro_batches
    # What was compiled is the pipelined step of this layout: XLA's argument bytes are the state and batch of
    # pipeline_step(m, v) on the candidate's mesh, built here on the same 8 CPU devices.
    mesh = jax.make_mesh(cand.axis_sizes, cand.axis_names, axis_types=(jax.sharding.AxisType.Auto,) * len(cand.axis_sizes))
    step = pipeline_step(TINY, mesh, batch=BATCH, seq=SEQ, micro_batches=cand.pipeline.micro_batches, repeats=v,
                         config=ReferenceConfig())
    assert row.argument_bytes == _shard_bytes(step.args)
    # ... and its peak is that step's, compiled here the same way (another m or v is another program).
    mem = compiled_memory(step.fn, *step.args, compiler_options={"xla_backend_optimization_level": 0},
                          top_buffers=0)
    assert row.peak_bytes == mem.peak_bytes
    # A 1F1B row is not checked as if the compiled step ran 1F1B.
    if cand.pipeline.schedule in ("1f1b", "interleaved"):
        assert row.note.startswith("compiled as the circular schedule (GPipe memory); the row's ")
        assert "estimate is for Megatron's schedule" in row.note
    assert row.to_dict()["compiled_schedule"] == text


def test_compiled_schedules_keep_repeats_only_for_circular_orders():
    from types import SimpleNamespace as NS

    assert compiled_schedule(NS(schedule="1f1b", virtual=1, micro_batches=8))[:2] == (1, "circular v=1 m=8")
    assert compiled_schedule(NS(schedule="interleaved", virtual=2, micro_batches=8))[:2] == (2, "circular v=2 m=8")
    assert compiled_schedule(NS(schedule="circular", virtual=4, micro_batches=8)) == (4, "circular v=4 m=8", "")
    assert compiled_schedule(NS(schedule="gpipe", virtual=1, micro_batches=4)) == (1, "circular v=1 m=4", "")
    assert "1F1B estimate" in compiled_schedule(NS(schedule="1f1b", virtual=1, micro_batches=8))[2]


def test_rows_the_step_cannot_compile_say_why_and_start_no_worker(monkeypatch):
    def no_worker(jobs, **_):
        assert not jobs, "a row the step cannot run started a worker"
        return []

    monkeypatch.setattr(_driver, "run_jobs", no_worker)
    moe = dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], num_layers=4, num_params=None)
    plan, found = _plan(moe)
    (row,) = verify_pipelines(found, plan, model=moe, target="cpu", cache=False, stream=io.StringIO()).rows
    assert row.status == "not verified" and "dense models only" in row.error and row.peak_bytes is None
    assert row.summary().startswith("not verified: estimate ")

    six = dataclasses.replace(TINY, num_layers=6)  # pp=4 stages of 2/2/1/1 layers: the stacked step can't
    plan, found = _plan(six)
    uneven = [c for c in found.candidates if c.axis_sizes[0] == 4]
    assert uneven, [c.text for c in found.candidates]
    (row,) = verify_pipelines(uneven, plan, model=six, target="cpu", cache=False, stream=io.StringIO()).rows
    assert row.status == "not verified" and "num_layers=6 must divide by pp=4" in row.error

    plan, found = _plan(TINY)
    flash = ReferenceConfig(attention="flash", remat="offload")
    (row,) = verify_pipelines(found, plan, model=TINY, target="cpu", config=flash, cache=False,
                              stream=io.StringIO()).rows
    assert row.status == "not verified" and "attention 'plain'/'dot_product'" in row.error


def test_no_time_left_leaves_the_rows_estimates():
    plan, found = _plan(TINY)
    checked = verify_pipelines(found, plan, model=TINY, top=2, target="cpu", time_budget_s=0, cache=False,
                               stream=io.StringIO())
    assert [r.status for r in checked.rows] == ["estimate", "estimate"] and "ran out" in checked.note


def test_a_pipeline_row_compiles_for_h100s_with_no_gpu():
    from meshplan.facade.verify._compilers import cuda_plugin_problem

    problem = cuda_plugin_problem()
    if problem is not None:
        pytest.skip(f"no deviceless XLA:GPU: {problem}")
    plan, found = _plan(TINY)
    (row,) = verify_pipelines(found, plan, model=TINY, top=1, cache=False, stream=io.StringIO()).rows
    assert row.status == "exact", row.error
    assert row.target == "8 x NVIDIA H100 80GB HBM3 (no GPU: meshplan's shipped description)"
    assert row.compiler.startswith("XLA:GPU") and row.peak_bytes >= row.argument_bytes > 0
