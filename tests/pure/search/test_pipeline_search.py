"""Pipeline layouts in the search (meshplan.pure.search._pipeline_search) and their MaxText export."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure.cost._pipeline import bubble_fraction, in_flight, stage_layers
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.report._export import maxtext_settings
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


# --- Published schedules: ZeRO over dp, DualPipe ------------------------------------------------------------------

from meshplan.pure.cost._estimates import MemoryBreakdown  # noqa: E402
from meshplan.pure.search._pipeline_search import _zero_memory  # noqa: E402

_sizes = st.integers(0, 10**12)


@pytest.fixture(scope="module")
def stage_request():
    from meshplan.pure.presets import MODEL_SPECS
    from meshplan.pure.search import search_meshes

    return MODEL_SPECS["llama3-8b"], search_meshes("llama3-8b", "1x8xH100", batch=8, seq=1024, top_k=1).request


@given(p=_sizes, g=_sizes, o=_sizes, a=_sizes, dp=st.sampled_from([1, 2, 3, 64]), zero=st.sampled_from([0, 1, 2]))
def test_zero_splits_the_optimizer_then_the_gradients_over_dp_and_the_peak_only_falls(stage_request, p, g, o, a,
                                                                                       dp, zero):
    stage, req = stage_request
    mem = MemoryBreakdown(p, g, o, a, 10**13, "backward")
    got = _zero_memory(mem, stage, {"dp": dp, "tp": 8}, req, zero, budget=10**12)
    assert got.params == p and got.budget == 10**12
    assert got.optimizer == (-(-o // dp) if zero and dp > 1 else o)
    assert got.grads == (-(-g // dp) if zero == 2 and dp > 1 else g)
    assert got.total <= mem.total
    if zero == 0 or dp == 1:
        assert got == dataclasses.replace(mem, budget=10**12)


def test_a_zero1_pipeline_the_stage_search_would_refuse_unsplit_is_priced():
    # llama3.1-405b, pp=8 of dp=8 x tp=8 on 64 H100s: the unsplit stage needs 112 GiB (its optimizer state 49.5
    # GiB, the update's fp32 temporaries 37.7 GiB); ZeRO-1 splits both over dp=8 and it fits. Before, the stage
    # search refused the unsplit state before the split was priced.
    kw = dict(pp=8, stage_layout={"dp": 8, "tp": 8}, batch=64, seq=4096, schedule="1f1b")
    with pytest.raises(PlanError, match="does not fit"):
        price_pipeline("llama3.1-405b", "64x8xH100", zero=0, **kw)
    one = price_pipeline("llama3.1-405b", "64x8xH100", zero=1, **kw)
    assert one.memory.fits and one.memory.budget == int(80e9 * 0.9)
    assert one.memory.phase != "update"  # the split update is no longer the fullest phase
    two = price_pipeline("llama3.1-405b", "64x8xH100", zero=2, **kw)
    assert two.memory.total < one.memory.total and two.step.step_s == one.step.step_s


@pytest.fixture(scope="module")
def mixtral_pair():
    kw = dict(pp=2, stage_layout={"dp": 4, "ep": 8}, batch=128, seq=1024, micro_batches=4, zero=1, activations=False)
    return (price_pipeline("mixtral-8x7b", "8x8xH100", schedule="1f1b", **kw),
            price_pipeline("mixtral-8x7b", "8x8xH100", schedule="dualpipe", **kw))


def test_dualpipe_holds_two_stages_and_hides_the_expert_all_to_alls(mixtral_pair):
    one, dual = mixtral_pair
    assert dual.memory.params == 2 * one.memory.params and dual.memory.optimizer == 2 * one.memory.optimizer
    a2a = [t for t in dual.comm if t.kind == "all-to-all"]
    assert a2a and all(t.exposed == 0.0 for t in a2a)  # this stage's all-to-alls are shorter than its compute
    assert dual.pipeline is not None and dual.pipeline.bubble == 0.0  # pp=2: (pp/2 - 1) = 0
    assert dual.step is not None and one.step is not None and dual.step.step_s < one.step.step_s
    assert dual.step.compute_s == one.step.compute_s  # the same FLOPs; only the bubble and the hiding differ


def test_zero_changes_the_memory_and_not_the_time():
    kw = dict(pp=2, stage_layout={"dp": 16}, batch=64, seq=1024, micro_batches=4, activations=False)
    plain, z1, z2 = (price_pipeline("llama3-8b", "4x8xH100", zero=z, **kw) for z in (0, 1, 2))
    assert z1.memory.optimizer == -(-plain.memory.optimizer // 16) and z1.memory.grads == plain.memory.grads
    assert z2.memory.grads == -(-plain.memory.grads // 16)
    assert plain.step is not None and z1.step is not None and z2.step is not None
    assert plain.step.step_s == z1.step.step_s == z2.step.step_s


@pytest.mark.parametrize("kw, words", [
    (dict(zero=3), "zero=3 must be 0 (replicated), 1"),
    (dict(schedule="dualpipe", micro_batches=2), "micro_batches=2 must be even and >= 2 x pp=4"),
])
def test_price_pipeline_refuses_a_zero_level_or_a_dualpipe_m_it_cannot_run(kw, words):
    base = dict(pp=2, stage_layout={"dp": 16}, batch=64, seq=1024)
    with pytest.raises(PlanError, match=re.escape(words)):
        price_pipeline("llama3-8b", "4x8xH100", **{**base, **kw})
    with pytest.raises(MeshplanTypeError, match="zero=True must be the int"):
        price_pipeline("llama3-8b", "4x8xH100", zero=True, **base)


def test_a_dualpipe_candidate_has_no_maxtext_export(mixtral_pair):
    _, dual = mixtral_pair
    with pytest.raises(PlanError, match="schedule 'dualpipe' has no MaxText setting"):
        maxtext_settings(dual)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([0.0, 0.1, 0.25, 0.5]))
def test_every_stage_fits_the_budget_the_headroom_leaves(headroom):
    # meshplan plan passes its own headroom (0.25 on a default jax GPU process): a pipeline layout it
    # shows must fit the budget the plan states, not the search's default 10%.
    found = search_pipelines("llama3-70b", "8x8xH100", batch=64, seq=4096, top_k=10, headroom=headroom)
    budget = round(80e9 * (1 - headroom))
    for c in found.candidates:
        assert c.memory.budget == budget and c.memory.total <= budget


def test_more_headroom_never_admits_a_placement_less_headroom_refuses_nor_a_faster_layout():
    # Per pp and placement the search keeps the fastest that fits: a tighter budget can only take layouts
    # away, so a placement's best gets no faster and no placement appears that the looser budget lacked.
    def best(headroom):
        found = search_pipelines("llama3-70b", "8x8xH100", batch=64, seq=4096, top_k=50, headroom=headroom)
        return {(c.axis_sizes[0], c.dcn_shape[0] == c.axis_sizes[0]): c.step.step_s for c in found.candidates}

    loose, tight = best(0.1), best(0.4)
    assert tight and set(tight) <= set(loose)
    assert all(tight[k] >= loose[k] for k in tight)


@pytest.mark.parametrize("bad, error", [(1.0, PlanError), (-0.1, PlanError), ("0.2", MeshplanTypeError)])
def test_a_bad_headroom_is_a_typed_error_naming_it(bad, error):
    with pytest.raises(error, match="headroom"):
        search_pipelines("llama3-8b", "4x8xH100", batch=64, seq=4096, headroom=bad)


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



@settings(max_examples=5, deadline=None)
@given(st.sets(st.sampled_from(["1f1b", "interleaved", "circular"]), min_size=1))
def test_only_the_schedules_asked_for_are_priced(wanted):
    found = search_pipelines("llama3-70b", "8x8xH100", batch=64, seq=4096, top_k=20, schedules=sorted(wanted))
    assert found.candidates
    assert {c.pipeline.schedule for c in found.candidates} <= wanted
    every = search_pipelines("llama3-70b", "8x8xH100", batch=64, seq=4096, top_k=20)
    # Fewer schedules never find a faster layout for a pp and placement.
    best = {(c.axis_sizes[0], c.dcn_shape[0]): c.step.step_s for c in every.candidates}
    assert all(c.step.step_s >= best[(c.axis_sizes[0], c.dcn_shape[0])] for c in found.candidates)


@pytest.mark.parametrize("bad, error", [(("dualpipe",), PlanError), ((), PlanError), (("gpipe",), PlanError),
                                        ("circular", MeshplanTypeError), (3, MeshplanTypeError)])
def test_schedules_the_search_does_not_price_are_typed_errors(bad, error):
    with pytest.raises(error, match="schedules"):
        search_pipelines("llama3-8b", "4x8xH100", batch=64, seq=4096, schedules=bad)

