"""measure_plan on the suite's 8 real CPU devices: a real step per layout, timed, ranked by what it measured."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import meshplan
from meshplan.errors import DeviceMismatchError, MeshplanTypeError, PlanError
from meshplan.pure import get_preset, search_meshes
from meshplan.pure.cost import TrainingRecipe

TINY = dataclasses.replace(get_preset("gpt2").spec, name="tiny", num_layers=1, hidden_size=32, num_heads=2,
                           num_kv_heads=2, head_dim=16, intermediate_size=64, vocab_size=128, num_params=None)


@pytest.fixture(scope="module")
def plan():
    return search_meshes(TINY, meshplan.live_cluster(), batch=8, seq=16, top_k=4, recipe=TrainingRecipe(backend="cpu"))


@pytest.fixture(scope="module")
def measured(plan):
    return meshplan.measure_plan(plan, model=TINY, top=2, steps=3)


def test_the_live_cpu_devices_are_the_xla_cpu_cluster() -> None:
    c = meshplan.live_cluster()
    assert (c.device.name, c.num_devices, c.num_nodes) == ("XLA:CPU", 8, 1)


def test_every_layout_gets_a_row_with_its_measured_and_predicted_step(plan, measured) -> None:
    assert sorted(r.mesh for r in measured.rows) == sorted(c.text for c in plan.candidates[:2])
    by_mesh = {c.text: c for c in plan.candidates}
    for r in measured.rows:
        assert r.error == "" and r.steps == 3
        assert 0 < r.measured_min_s <= r.measured_step_s <= r.measured_max_s
        assert r.predicted_step_s == by_mesh[r.mesh].step.step_s
        assert r.predicted_memory_bytes == by_mesh[r.mesh].memory.total
        assert r.compiled_peak_bytes > 0  # XLA:CPU's compiled figure for this very program
        assert r.predicted_rank == by_mesh[r.mesh].rank


def test_the_measured_ranking_is_the_order_of_the_measured_medians(measured) -> None:
    medians = [r.measured_step_s for r in measured.rows]
    assert medians == sorted(medians)


def test_xla_cpu_reports_no_peak_so_the_row_says_so_and_json_has_null(measured) -> None:
    assert all(r.measured_peak_bytes is None and "XLA:CPU reports no memory_stats()" in r.peak_note
               for r in measured.rows)
    doc = measured.to_dict()
    assert all(row["measured_peak_bytes"] is None for row in doc["rows"])
    assert {"mesh", "measured_step_s", "predicted_step_s", "measured_peak_bytes", "error"} <= set(doc["rows"][0])
    assert any("exposed communication only" in n for n in measured.notes)


def _batch_ways(cand) -> int:
    sizes = cand.mesh_shape
    return sizes.get("dp", 1) * sizes.get("fsdp", 1) * sizes.get("ep", 1)


def test_a_layout_that_cannot_run_is_its_rows_error_and_the_others_still_run(plan) -> None:
    # Two micro-batches of 8 sequences: a layout splitting the batch 8 ways cannot take them; 4 ways can.
    config = meshplan.ReferenceConfig(micro_batches=2)
    eight = next(c for c in plan.candidates if _batch_ways(c) == 8)
    four = next(c for c in plan.candidates if _batch_ways(c) <= 4)
    m = meshplan.measure_plan(plan, model=TINY, layouts=[eight.text, four], steps=2, config=config)
    failed = [r for r in m.rows if r.error]
    ran = [r for r in m.rows if not r.error]
    assert [r.mesh for r in failed] == [eight.text]
    assert "cannot build or compile the step" in failed[0].error and "micro_batches=2" in failed[0].error
    assert [r.mesh for r in ran] == [four.text] and ran[0].measured_step_s > 0
    assert m.rows[-1].mesh == eight.text  # the failed rows rank after every measured one


def test_a_layout_over_its_timeout_is_abandoned_and_the_rest_say_why_they_did_not_run(plan) -> None:
    m = meshplan.measure_plan(plan, model=TINY, top=2, steps=2, timeout_s=1e-3)
    first, second = sorted(m.rows, key=lambda r: r.predicted_memory_bytes)[:2]
    assert first.error.startswith("timed out") and "abandoned" in first.error
    assert second.error.startswith("not run:") and first.mesh in second.error


def test_devices_that_are_not_the_plans_cluster_are_refused_saying_both(plan) -> None:
    other = search_meshes(TINY, "1x8xH100", batch=8, seq=16, top_k=2)
    with pytest.raises(DeviceMismatchError, match=r"found 8 x 'cpu' \(XLA:CPU.*the plan expects 8 x H100 \(1x8xH100\)"):
        meshplan.measure_plan(other, model=TINY)
    with pytest.raises(DeviceMismatchError, match="the plan expects 8 x XLA:CPU"):
        meshplan.measure_plan(plan, model=TINY, devices=jax.devices()[:4])


def test_your_own_step_is_timed_on_each_layout(plan) -> None:
    calls = []

    def step(cand, mesh):
        calls.append(cand.text)
        x = jax.device_put(jnp.ones((8, 128)), NamedSharding(mesh, PartitionSpec(mesh.axis_names[0])))
        return jax.jit(lambda s, y: (s + 1.0, (s * y).sum())), (x, x)

    m = meshplan.measure_plan(plan, model=TINY, top=2, steps=2, step=step)
    assert sorted(calls) == sorted(r.mesh for r in m.rows) and all(r.measured_step_s > 0 for r in m.rows)


def test_bad_arguments_are_typed_errors(plan) -> None:
    with pytest.raises(MeshplanTypeError):
        meshplan.measure_plan("plan")
    with pytest.raises(PlanError, match="is not a mesh of this plan"):
        meshplan.measure_plan(plan, model=TINY, layouts=["tp=8,dp=1"])
    with pytest.raises(PlanError):
        meshplan.measure_plan(plan, model=TINY, steps=0)


def test_a_plan_priced_for_another_step_than_the_reference_step_runs_nothing_and_says_why() -> None:
    fp8 = search_meshes(TINY, "1x8xH100", batch=8, seq=16, top_k=2, recipe=TrainingRecipe(matmul_dtype="float8"))
    cpu_fp8 = dataclasses.replace(fp8, request=dataclasses.replace(fp8.request, cluster=meshplan.live_cluster()))
    m = meshplan.measure_plan(cpu_fp8, model=TINY, top=2)
    assert all(r.error.startswith("not run: the plan priced FP8 weight matmuls") for r in m.rows)
