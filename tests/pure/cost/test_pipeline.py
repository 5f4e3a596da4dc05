"""Tests for the pipeline model (meshplan.pure.cost._pipeline): stage splits, bubbles against a simulated schedule,
what each stage holds, the sends and the refusals."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.cluster._link import Link
from meshplan.pure.cost._collective_time import all_reduce_time
from meshplan.pure.cost._pipeline import (
    SCHEDULES,
    WHOLE_BATCH_BUFFERS,
    bubble_fraction,
    in_flight,
    pipeline_time,
    plan_stages,
    schedule_memory,
    send_bytes,
    send_time,
    stage_layers,
)
from meshplan.pure.errors import MeshplanTypeError, PlanError

layers_and_stages = st.integers(1, 128).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n)))
schedules = st.integers(1, 16).flatmap(
    lambda pp: st.tuples(st.just(pp), st.integers(pp, 4 * pp + 3)))  # (pp, m >= pp)
links = st.builds(Link, bandwidth=st.floats(1e6, 1e13), latency=st.floats(0.0, 1e-3))


def _simulate(pp: int, m: int, schedule: str, forward: float = 1.0, backward: float = 2.0) -> tuple[float, list[int]]:
    """Run GPipe or 1F1B as a dependency graph: (step time, peak micro-batches in flight per stage).

    Each stage runs its ops in the schedule's order, one at a time; a forward waits for the previous stage's
    forward of the same micro-batch, a backward for the next stage's backward (the last stage's for its own
    forward). Independent of the closed forms under test.
    """
    orders = []
    for s in range(pp):
        fwd = [("F", i) for i in range(m)]
        bwd = [("B", i) for i in range(m)]
        if schedule == "gpipe":
            orders.append(fwd + bwd)
            continue
        warm = min(pp - s - 1, m)
        order = fwd[:warm]
        for i in range(m - warm):
            order += [fwd[warm + i], bwd[i]]
        orders.append(order + bwd[m - warm:])
    end: dict[tuple[str, int, int], float] = {}
    clock, pos = [0.0] * pp, [0] * pp
    peak, live = [0] * pp, [0] * pp
    while any(pos[s] < len(orders[s]) for s in range(pp)):
        progressed = False
        for s in range(pp):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else (
                ("B", s + 1, i) if s < pp - 1 else ("F", s, i))
            if dep is not None and dep not in end:
                continue
            start = max(clock[s], end[dep] if dep else 0.0)
            clock[s] = end[(kind, s, i)] = start + (forward if kind == "F" else backward)
            live[s] += 1 if kind == "F" else -1
            peak[s] = max(peak[s], live[s])
            pos[s] += 1
            progressed = True
        assert progressed, "the schedule deadlocked"
    return max(clock), peak


@given(layers_and_stages)
def test_stage_layers_split_every_layer_evenly(case):
    n, pp = case
    layers = stage_layers(n, pp)
    assert len(layers) == pp and sum(layers) == n and max(layers) - min(layers) <= 1
    # The first stage (which also embeds) gets an extra layer only when every other stage has one.
    if layers[0] > min(layers):
        assert all(k == layers[0] for k in layers)


@given(schedules, st.sampled_from(["gpipe", "1f1b"]))
def test_the_bubble_is_the_idle_share_of_a_simulated_schedule(case, schedule):
    pp, m = case
    total, _ = _simulate(pp, m, schedule)
    busy = m * 3.0  # every stage does m forwards (1) and m backwards (2)
    assert bubble_fraction(pp, m, schedule=schedule) == pytest.approx(1 - busy / total, abs=1e-12)


@given(schedules)
def test_1f1b_keeps_at_most_pp_micro_batches_and_gpipe_all(case):
    pp, m = case
    assert list(in_flight(pp, m, schedule="1f1b")) == _simulate(pp, m, "1f1b")[1]
    assert list(in_flight(pp, m, schedule="gpipe")) == _simulate(pp, m, "gpipe")[1] == [m] * pp


@given(schedules, st.integers(1, 8))
def test_virtual_stages_shrink_the_bubble_and_one_virtual_stage_is_plain_1f1b(case, v):
    pp, m = case
    plain = bubble_fraction(pp, m)
    for sched in ("interleaved", "circular"):
        assert bubble_fraction(pp, m, schedule=sched, virtual=v) <= plain
        assert bubble_fraction(pp, m, schedule=sched, virtual=1) == plain
    assert in_flight(pp, m, schedule="interleaved", virtual=1) == in_flight(pp, m, schedule="1f1b")
    assert 0.0 <= plain < 1.0 and (plain == 0.0) == (pp == 1)
    if m > pp > 1:
        assert bubble_fraction(pp, m) < bubble_fraction(pp, m - 1)


@given(schedules, st.integers(1, 4))
def test_interleaving_keeps_more_than_1f1b_but_never_more_than_gpipe(case, v):
    pp, m = case
    inter = in_flight(pp, m, schedule="interleaved", virtual=v)
    one = in_flight(pp, m, schedule="1f1b")
    assert all(a >= b - 1e-12 for a, b in zip(inter, one))
    assert all(a <= m + 1e-12 for a in inter)
    assert list(inter) == sorted(inter, reverse=True)  # the first stage is the fullest


def _run_circular_loop(pp: int, m: int, v: int) -> list[dict[str, float]]:
    """Walk the circular step's loop (meshplan.facade.verify._pipeline_step) and tally what autodiff keeps per stage.

    Each iteration ``t`` of stage ``s`` runs ``1/v`` of its layers on item ``t - s`` (a placeholder in the
    bubble); autodiff keeps that iteration's stage input (in units of one micro-batch through all the stage's
    layers: ``1/v``), and with ``v > 1`` the slice of the weights the traced repeat index picked (``1/v`` of
    the stage's layers). The loop reads ``x`` and carries ``store`` and ``out`` whole, ``m`` slots each.
    Written from the step's loop, not from the closed forms under test.
    """
    stages = []
    for s in range(pp):
        kept = {"saved": 0.0, "weights": 0.0, "real": 0, "bubble": 0}
        for t in range(v * m + pp - 1):
            item = t - s
            kept["real" if 0 <= item < v * m else "bubble"] += 1
            kept["saved"] += 1 / v
            if v > 1:  # the repeat is clip((t - s) // m, 0, v - 1): traced, so the slice is a residual
                kept["weights"] += 1 / v
        if v == 1:  # a[0]: static, loop-invariant, hoisted out of the loop as one residual
            kept["weights"] = 1.0
        kept["buffers"] = len(("x", "store", "out")) * m + len(("ct incoming", "ct sent"))
        kept["current"] = 1 / v  # the backward slices one iteration's residuals out of the stack
        stages.append(kept)
    return stages


circular = st.integers(1, 12).flatmap(
    lambda pp: st.tuples(st.just(pp), st.integers(pp, 4 * pp + 3), st.integers(1, 4)))  # (pp, m >= pp, v)


@given(circular, st.integers(1, 10**6), st.integers(1, 10**6), st.integers(1, 10**6))
def test_the_circular_charge_is_what_a_walk_of_the_steps_loop_keeps(case, saved, inp, weights):
    pp, m, v = case
    got = schedule_memory(pp, m, saved_bytes=saved, input_bytes=inp, weight_bytes=weights, schedule="circular",
                          virtual=v)
    for s, (k, walk) in enumerate(zip(got, _run_circular_loop(pp, m, v), strict=True)):
        assert walk["real"] == v * m and walk["bubble"] == pp - 1  # every stage idles pp - 1 iterations
        assert k.saved == pytest.approx(walk["saved"] * saved, abs=1)
        assert k.weights == pytest.approx(walk["weights"] * weights, abs=1)
        assert k.current == pytest.approx(walk["current"] * (saved + (weights if v > 1 else 0)), abs=1)
        assert k.buffers == walk["buffers"] * inp and k.total == k.saved + k.buffers + k.weights + k.current
    # The bubble's inputs are kept too: (pp - 1) / v micro-batches more than GPipe's m.
    gpipe = schedule_memory(pp, m, saved_bytes=saved, input_bytes=inp, weight_bytes=weights, schedule="gpipe")
    assert got[0].saved - gpipe[0].saved == pytest.approx((pp - 1) / v * saved, abs=1)
    assert got[0].weights >= weights  # v = 1 keeps the hoisted slice, v > 1 a slice per iteration


@given(schedules, st.sampled_from(SCHEDULES), st.integers(1, 3), st.integers(0, 10**6), st.integers(0, 10**6),
       st.integers(0, 10**6))
def test_what_a_schedule_keeps_never_shrinks_with_more_micro_batches(case, schedule, v, saved, inp, weights):
    pp, m = case
    v = v if schedule in ("interleaved", "circular") else 1
    step = 1
    if schedule == "dualpipe":  # pp even, m even and >= 2 pp: the nearest such case, and the next even m
        pp, step = pp + pp % 2, 2
        m = max(2 * pp, m + m % 2)
    kw = dict(saved_bytes=saved, input_bytes=inp, weight_bytes=weights, schedule=schedule, virtual=v)
    now, more = schedule_memory(pp, m, **kw), schedule_memory(pp, m + step, **kw)
    for a, b in zip(now, more, strict=True):
        assert b.saved >= a.saved and b.buffers >= a.buffers and b.weights >= a.weights
    # Megatron's schedules send one micro-batch at a time and keep no weight copies.
    if WHOLE_BATCH_BUFFERS[schedule] == 0:
        assert all(k.buffers == 0 == k.weights == k.current for k in now)
        assert [k.saved for k in now] == [round(f * saved) for f in in_flight(pp, m, schedule=schedule, virtual=v)]
    # Twice the bytes, twice the charge (to rounding).
    double = schedule_memory(pp, m, **{**kw, "saved_bytes": 2 * saved, "input_bytes": 2 * inp,
                                       "weight_bytes": 2 * weights})
    assert all(abs(d.total - 2 * k.total) <= 4 for d, k in zip(double, now, strict=True))


def test_the_circular_step_keeps_the_bubble_whole_batch_buffers_and_weight_slices():
    # pp=4, m=4, v=2 as the TPU benchmark's third row, in MiB: 11 iterations of half the stage's layers.
    k = schedule_memory(4, 4, saved_bytes=32, input_bytes=16, weight_bytes=64, schedule="circular", virtual=2)[0]
    assert (k.saved, k.buffers, k.weights, k.current) == (176, 192 + 32, 352, 16 + 32)
    one = schedule_memory(4, 4, saved_bytes=32, input_bytes=16, weight_bytes=64, schedule="circular")[0]
    assert (one.saved, one.buffers, one.weights, one.current) == (224, 224, 64, 32)  # 7 iterations, one copy
    with pytest.raises(PlanError, match="saved_bytes=-1 must be >= 0"):
        schedule_memory(4, 4, saved_bytes=-1, input_bytes=1, weight_bytes=1)


@given(layers_and_stages, st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9),
       st.integers(0, 10**8), st.sampled_from(["gpipe", "1f1b"]), st.integers(0, 3), st.sampled_from([1.0, 6.0]))
def test_plan_stages_puts_every_byte_somewhere_once(case, layer_b, embed_b, head_b, act_b, schedule, extra_m, factor):
    n, pp = case
    m = pp + extra_m
    p = plan_stages(n, pp, micro_batches=m, layer_param_bytes=layer_b, embed_param_bytes=embed_b,
                    head_param_bytes=head_b, layer_activation_bytes=act_b, state_factor=factor, schedule=schedule)
    assert sum(p.param_bytes) == n * layer_b + embed_b + head_b
    assert p.layers == stage_layers(n, pp) and p.stages == pp
    assert p.state_bytes == tuple(round(x * factor) for x in p.param_bytes)
    assert p.total_bytes(p.fullest) == max(p.total_bytes(s) for s in range(pp))
    assert all(p.total_bytes(s) < p.total_bytes(p.fullest) for s in range(p.fullest))  # the first of the fullest
    if pp == 1:  # one stage is the unpipelined step: everything, and every micro-batch's activations
        assert p.param_bytes == (n * layer_b + embed_b + head_b,) and p.bubble == 0.0
        assert p.activation_bytes == (n * act_b * (m if schedule == "gpipe" else 1),)


def test_plan_names_the_fullest_stage_from_the_bytes():
    # A huge head (a 128k vocabulary) makes the last stage the fullest under GPipe.
    p = plan_stages(8, 4, micro_batches=4, layer_param_bytes=100, embed_param_bytes=10, head_param_bytes=500,
                    layer_activation_bytes=1, schedule="gpipe")
    assert p.fullest == 3 and p.layers == (2, 2, 2, 2)
    # 1F1B keeps pp micro-batches on the first stage: with big activations it is the fullest.
    p = plan_stages(8, 4, micro_batches=8, layer_param_bytes=100, embed_param_bytes=10, head_param_bytes=10,
                    layer_activation_bytes=1000)
    assert p.fullest == 0 and p.activation_bytes == (8000, 6000, 4000, 2000)


@given(schedules, st.integers(0, 10**10), links, links, st.integers(1, 64), st.integers(0, 10**11))
def test_pipeline_time_adds_its_parts_and_a_faster_link_never_costs_more(case, nbytes, link, data_link, ways, grads):
    pp, m = case
    t = pipeline_time(2.0, pp, m, boundary_bytes=nbytes, boundary_link=link, stage_grad_bytes=grads,
                      data_ways=ways, data_link=data_link)
    assert t.total == pytest.approx(t.compute + t.bubble + t.sends + t.grad_sync)
    # The bubble is its fraction of the whole step's time with the compute.
    assert t.bubble / (t.compute + t.bubble) == pytest.approx(bubble_fraction(pp, m))
    assert t.sends == pytest.approx(2 * (pp - 1) * send_time(nbytes, link))
    assert t.sends <= t.sends_total + 1e-12 or pp == 1
    assert t.grad_sync == pytest.approx(all_reduce_time(grads, ways, data_link))
    faster = Link(link.bandwidth * 2, link.latency)
    assert pipeline_time(2.0, pp, m, boundary_bytes=nbytes, boundary_link=faster, stage_grad_bytes=grads,
                         data_ways=ways, data_link=data_link).total <= t.total


def test_send_bytes_is_micro_batch_times_seq_times_hidden_times_itemsize():
    assert send_bytes(2, 4096, 8192, 2) == 2 * 4096 * 8192 * 2
    assert send_time(0, Link(1e9, 5e-6)) == 5e-6


@pytest.mark.parametrize("call, words", [
    (lambda: stage_layers(4, 8), "pp=8 stages for num_layers=4: pp must be in [1, 4]"),
    (lambda: bubble_fraction(8, 4), "micro_batches=4 must be >= pp=8"),
    (lambda: bubble_fraction(4, 8, schedule="zero-bubble"), "schedule='zero-bubble' must be one of"),
    (lambda: bubble_fraction(4, 8, schedule="gpipe", virtual=2), "virtual=2 needs schedule 'interleaved'"),
    (lambda: plan_stages(10, 4, micro_batches=8, layer_param_bytes=1, embed_param_bytes=1, head_param_bytes=1,
                         layer_activation_bytes=1, schedule="circular", virtual=2),
     "num_layers=10 must divide by pp=4 x virtual=2"),
    (lambda: plan_stages(2, 4, micro_batches=2, layer_param_bytes=1, embed_param_bytes=1, head_param_bytes=1,
                         layer_activation_bytes=1), ("pp=4 stages for num_layers=2: pp must be in [1, 2]; "
                                                    "micro_batches=2 must be >= pp=4")),
    (lambda: in_flight(0, 4), "pp=0 must be >= 1"),
    (lambda: send_bytes(1, 0, 1, 2), "seq=0 must be >= 1"),
    (lambda: plan_stages(4, 2, micro_batches=2, layer_param_bytes=-1, embed_param_bytes=1, head_param_bytes=1,
                         layer_activation_bytes=1), "layer_param_bytes=-1 must be >= 0"),
])
def test_bad_pipelines_are_refused_with_the_value_and_the_valid_range(call, words):
    with pytest.raises(PlanError, match=re.escape(words)):
        call()


@pytest.mark.parametrize("call", [
    lambda: stage_layers(4.0, 2),
    lambda: bubble_fraction(4, 8, schedule=None),
    lambda: send_time(1.0, "ib"),
    lambda: in_flight(4, "8"),
])
def test_wrong_types_are_type_errors(call):
    with pytest.raises(MeshplanTypeError):
        call()


def test_every_schedule_is_priced():
    for sched in SCHEDULES:
        assert math.isfinite(bubble_fraction(4, 8, schedule=sched))
        assert len(in_flight(4, 8, schedule=sched)) == 4


# --- DualPipe and the interleaved schedule over an uneven split -------------------------------------------------

dualpipes = st.integers(1, 16).flatmap(
    lambda half: st.tuples(st.just(2 * half), st.integers(2 * half, 16 * half).map(lambda k: 2 * k)))  # (pp even, m even >= 2 pp)


@given(dualpipes)
def test_the_dualpipe_bubble_is_its_published_formula_in_units_of_a_forward(case):
    pp, m = case
    f, b, w = 1.0, 2.0, 1.0  # a forward, a full backward, its weight half; an overlapped pair F&B = F + B
    idle = (pp / 2 - 1) * ((f + b) + b - 3 * w)
    assert bubble_fraction(pp, m, schedule="dualpipe") == pytest.approx(idle / (m * (f + b) + idle), abs=1e-12)
    assert bubble_fraction(pp, m, schedule="dualpipe") < bubble_fraction(pp, m) or pp == 2
    assert (bubble_fraction(pp, m, schedule="dualpipe") == 0.0) == (pp == 2)


@given(dualpipes, st.integers(1, 10**6), st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 8))
def test_a_dualpipe_device_holds_its_two_stages_and_pp_plus_one_micro_batches(case, layer_b, embed_b, head_b, extra):
    pp, m = case
    n = pp * extra
    p = plan_stages(n, pp, micro_batches=m, layer_param_bytes=layer_b, embed_param_bytes=embed_b,
                    head_param_bytes=head_b, layer_activation_bytes=1, schedule="dualpipe")
    one = plan_stages(n, pp, micro_batches=m, layer_param_bytes=layer_b, embed_param_bytes=embed_b,
                      head_param_bytes=head_b, layer_activation_bytes=1)
    assert sum(p.param_bytes) == 2 * sum(one.param_bytes)  # two copies of the model
    assert all(p.param_bytes[s] == one.param_bytes[s] + one.param_bytes[pp - 1 - s] for s in range(pp))
    assert in_flight(pp, m, schedule="dualpipe") == tuple(float(pp + 1) for _ in range(pp))
    assert max(in_flight(pp, m, schedule="dualpipe")) == max(in_flight(pp, m)) + 1


@pytest.mark.parametrize("pp, m, words", [
    (3, 6, "pp=3 must be even for 'dualpipe'"),
    (4, 9, "micro_batches=9 must be even and >= 2 x pp=8"),
    (4, 6, "micro_batches=6 must be even and >= 2 x pp=8"),
])
def test_dualpipe_refuses_what_its_code_asserts(pp, m, words):
    with pytest.raises(PlanError, match=re.escape(words)):
        bubble_fraction(pp, m, schedule="dualpipe")
    with pytest.raises(PlanError, match=re.escape(words)):
        plan_stages(12, pp, micro_batches=m, layer_param_bytes=1, embed_param_bytes=1, head_param_bytes=1,
                    layer_activation_bytes=1, schedule="dualpipe")


@given(layers_and_stages, st.integers(1, 8), st.integers(0, 3))
def test_interleaving_an_uneven_split_runs_when_v_divides_the_fullest_stage(case, v, extra_m):
    n, pp = case
    fullest = max(stage_layers(n, pp))
    m = pp * (1 + extra_m)
    call = lambda: plan_stages(n, pp, micro_batches=m, layer_param_bytes=1, embed_param_bytes=0,  # noqa: E731
                               head_param_bytes=0, layer_activation_bytes=1, schedule="interleaved", virtual=v)
    if fullest % v:
        with pytest.raises(PlanError, match=re.escape(f"virtual={v} must divide the fullest stage's {fullest}")):
            call()
    else:
        p = call()
        assert p.layers == stage_layers(n, pp)  # the lighter stages hold a layer less, not a chunk less
        assert p.bubble == bubble_fraction(pp, m, schedule="interleaved", virtual=v)


def test_llama3_405b_split_interleaves_but_circular_still_needs_pp_times_v_to_divide():
    p = plan_stages(126, 16, micro_batches=32, layer_param_bytes=1, embed_param_bytes=0, head_param_bytes=0,
                    layer_activation_bytes=1, schedule="interleaved", virtual=2)
    assert p.layers == (7,) + (8,) * 14 + (7,)  # one layer fewer on the first and last stage (Llama 3, sec. 3.3.2)
    with pytest.raises(PlanError, match=re.escape("num_layers=126 must divide by pp=16 x virtual=2")):
        plan_stages(126, 16, micro_batches=32, layer_param_bytes=1, embed_param_bytes=0, head_param_bytes=0,
                    layer_activation_bytes=1, schedule="circular", virtual=2)


@given(dualpipes, st.floats(0.0, 1.0), st.floats(0.01, 100.0), links)
def test_dualpipe_overlap_hides_communication_and_nothing_else_does(case, share, compute, link):
    pp, m = case
    kw = dict(boundary_bytes=10**6, boundary_link=link, stage_grad_bytes=0, data_ways=1, data_link=link)
    hidden = share * compute / 2
    plain = pipeline_time(compute, pp, m, schedule="dualpipe", **kw)
    t = pipeline_time(compute, pp, m, schedule="dualpipe", overlap=hidden, **kw)
    frac = bubble_fraction(pp, m, schedule="dualpipe")
    assert t.compute == pytest.approx(compute - hidden)
    assert plain.total - t.total == pytest.approx(hidden / (1 - frac), rel=1e-9, abs=1e-12)
    assert t.sends == plain.sends and t.grad_sync == plain.grad_sync
    with pytest.raises(PlanError, match="needs schedule 'dualpipe'"):
        pipeline_time(compute, pp, m, overlap=compute / 4, **kw)
    with pytest.raises(PlanError, match="more than half of stage_compute"):
        pipeline_time(compute, pp, m, schedule="dualpipe", overlap=compute * 0.51, **kw)
