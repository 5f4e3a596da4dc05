"""Pipeline layouts in the search (meshplan.pure.search._pipeline_search) and their MaxText export."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure.cost._pipeline import bubble_fraction, in_flight, stage_layers
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.search._export import maxtext_settings
from meshplan.pure.search._pipeline_search import price_pipeline, search_pipelines


@pytest.fixture(scope="module")
def llama8b():
    return search_pipelines("llama3-8b", "4x8xH100", batch=64, seq=4096, top_k=10)


@pytest.fixture(scope="module")
def llama70b():
    return search_pipelines("llama3-70b", "64x8xH100", batch=512, seq=4096, top_k=20)


def test_every_layout_has_pp_outermost_and_its_schedule(llama8b, llama70b):
    for result, layers, devices in ((llama8b, 32, 32), (llama70b, 80, 512)):
        assert result.candidates
        for rank, c in enumerate(result.candidates, 1):
            pipe = c.pipeline
            assert c.axis_names[0] == "pp" and c.axis_sizes[0] == pipe.stages >= 2 and c.rank == rank
            assert math.prod(c.axis_sizes) == devices and c.memory.fits
            assert all(i * d == s for i, d, s in zip(c.ici_shape, c.dcn_shape, c.axis_sizes))
            assert pipe.micro_batches >= pipe.stages and sum(pipe.layers) == layers
            assert pipe.layers == stage_layers(layers, pipe.stages)
            assert pipe.bubble == bubble_fraction(pipe.stages, pipe.micro_batches, schedule=pipe.schedule,
                                                  virtual=pipe.virtual)
            assert f"{pipe.schedule}" in c.verdict and "bubble" in c.verdict and f"m={pipe.micro_batches}" in c.verdict
            # The pipeline never beats its own stage's compute, and the bubble is in the step.
            assert c.step.step_s >= c.step.compute_s / (1 - pipe.bubble) - 1e-9
        steps = [c.step.step_s for c in result.candidates]
        assert steps == sorted(steps)


def test_the_send_term_crosses_the_link_of_the_placement(llama70b):
    for c in llama70b.candidates:
        send = [t for t in c.comm if t.kind == "send"]
        assert len(send) == 1 and send[0].axes == ("pp",)
        over_network = c.dcn_shape[0] == c.axis_sizes[0]
        assert send[0].link == ("inter" if over_network else "intra")
        assert send[0].calls == 2 * c.pipeline.virtual * c.pipeline.micro_batches


def test_the_first_stage_keeps_the_schedules_micro_batches_in_flight(llama70b):
    for c in llama70b.candidates:
        p = c.pipeline
        flight = in_flight(p.stages, p.micro_batches, schedule=p.schedule, virtual=p.virtual)
        # Every stage keeps its schedule's micro-batches of its own layers' saved inputs: one figure per
        # (micro-batch, layer) across the stages.
        per = [a / (f * k) for a, f, k in zip(p.activation_bytes, flight, p.layers)]
        assert max(per) - min(per) <= 1 + 1e-9 * max(per)


def test_pipelined_candidates_round_trip_through_json(llama8b):
    for c in llama8b.candidates:
        assert MeshCandidate.from_dict(c.to_dict()) == c
    bad = llama8b.candidates[0].to_dict()
    bad["pipeline"] = {"schedule": "zero-bubble"}
    with pytest.raises(PlanError, match="pipeline"):
        MeshCandidate.from_dict(bad)


def test_the_search_is_deterministic(llama8b):
    again = search_pipelines("llama3-8b", "4x8xH100", batch=64, seq=4096, top_k=10)
    assert again == llama8b


def test_maxtext_export_writes_the_stage_axis_and_the_pipeline_settings(llama70b):
    for c in llama70b.candidates:
        s = maxtext_settings(c)
        p = c.pipeline
        assert s["ici_pipeline_parallelism"] * s["dcn_pipeline_parallelism"] == p.stages
        assert s["num_pipeline_microbatches"] == p.micro_batches and s["num_pipeline_repeats"] == p.virtual
        per = s["num_layers_per_pipeline_stage"]
        pipelined = 80 if s["pipeline_parallel_layers"] == -1 else s["pipeline_parallel_layers"]
        assert per * p.stages * p.virtual == pipelined <= 80 and 80 - pipelined < p.stages * p.virtual
        ici = [v for k, v in s.items() if k.startswith("ici_")]
        dcn = [v for k, v in s.items() if k.startswith("dcn_")]
        assert math.prod(ici) * math.prod(dcn) == 512


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([("gpt2", "2x8xH100", 32), ("llama3-8b", "2x8xH100", 32), ("llama3-8b", "4xv5p-8", 16)]))
def test_small_clusters_give_layouts_or_say_why_not(case):
    model, cluster, batch = case
    r = search_pipelines(model, cluster, batch=batch, seq=1024)
    assert r.candidates or r.left_out
    assert all(line.startswith("pp=") for line in r.left_out)


def test_bad_options_are_typed_errors():
    with pytest.raises(MeshplanTypeError):
        search_pipelines(42, "8xH100")  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError):
        search_pipelines("gpt2", 8)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="top_k=0"):
        search_pipelines("gpt2", "8xH100", top_k=0)
    with pytest.raises(PlanError, match="batch=0"):
        search_pipelines("gpt2", "8xH100", batch=0)


def test_a_model_with_fewer_layers_than_devices_per_node_gets_no_deeper_pipeline():
    from meshplan.pure.presets import MODEL_SPECS
    two = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="two-layer", num_layers=2, num_params=None)
    r = search_pipelines(two, "1x8xH100", batch=16, seq=1024)
    assert all(c.axis_sizes[0] <= 2 for c in r.candidates)


def test_the_circular_schedule_is_charged_its_bubble_buffers_and_weight_slices():
    kw = dict(pp=4, stage_layout={"fsdp": 8}, batch=64, seq=4096, micro_batches=8)
    gpipe = price_pipeline("llama3-8b", "4x8xH100", schedule="gpipe", **kw)
    one = price_pipeline("llama3-8b", "4x8xH100", schedule="circular", **kw)
    two = price_pipeline("llama3-8b", "4x8xH100", schedule="circular", virtual=2, **kw)
    # Same state; GPipe order under autodiff plus the bubble's inputs and three whole-batch buffers (less the
    # fp32 accumulator the circular loop does not keep), and with v=2 a weight slice per iteration.
    assert gpipe.memory.params == one.memory.params == two.memory.params
    assert one.memory.activations > gpipe.memory.activations
    stage_weights = one.memory.params * 8 // 9  # 8 layers of the stage's 8 plus one of embedding / head, roughly
    assert two.memory.activations - one.memory.activations >= stage_weights * 8 // 2
    assert "(MaxText" in one.verdict and "(Megatron-LM)" in price_pipeline(
        "llama3-8b", "4x8xH100", schedule="1f1b", **kw).verdict

