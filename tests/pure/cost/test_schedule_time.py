"""The schedule simulator: properties on generated programs, and agreement with the analytic step model."""

from __future__ import annotations

import dataclasses
import gzip
import math
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.cluster import DEVICE_SPECS, Link, parse_cluster
from meshplan.pure.cost._collective_time import all_gather_time, all_reduce_time
from meshplan.pure.cost._flops import StepFlops
from meshplan.pure.cost._roofline import Roofline, ScheduleLinks, SizeEfficiency, default_roofline, schedule_links
from meshplan.pure.cost._schedule_time import simulate_schedule
from meshplan.pure.cost._step_time import step_time
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.xla._schedule import read_schedule
from meshplan.pure.xla._schedule_records import ScheduledCollective, ScheduledComputation, ScheduledOp, ScheduledProgram

# One FLOP per picosecond and one byte per picosecond: an op of f FLOPs runs f * 1e-12 s.
ROOF = Roofline(1e12, 1e12, SizeEfficiency(1.0))
FAST, SLOW = Link(1e9, 1e-6), Link(1e8, 1e-5)
LINKS = ScheduleLinks(FAST, SLOW, (0, 0, 1, 1))
INSIDE, ACROSS = ((0, 1), (2, 3)), ((0, 2), (1, 3))


def compute(name: str, seconds: float, kind: str = "matmul") -> ScheduledOp:
    return ScheduledOp(name, "fusion", kind, flops=seconds * 1e12 if kind == "matmul" else 0.0,
                       bytes_written=0 if kind == "matmul" else round(seconds * 1e12))


def collective(name: str, nbytes: int, groups: tuple[tuple[int, ...], ...] = INSIDE, *, sync: bool = False,
               kind: str = "all-gather") -> list[ScheduledOp]:
    coll = ScheduledCollective(kind, groups, len(groups[0]), nbytes, ("bf16",), sync)
    start = ScheduledOp(name, f"{kind}-start", "collective" if sync else "collective-start", collective=coll,
                        pair=name)
    return [start] if sync else [start, ScheduledOp(name + ".done", f"{kind}-done", "collective-done", pair=name)]


def program(*ops: ScheduledOp, extra: tuple[ScheduledComputation, ...] = ()) -> ScheduledProgram:
    return ScheduledProgram("main", (ScheduledComputation("main", tuple(ops)),) + extra, 4)


def alone(nbytes: int, groups: tuple[tuple[int, ...], ...] = INSIDE) -> float:
    return float(all_gather_time(nbytes, len(groups[0]), LINKS.link(LINKS.link_of(groups))))


seconds = st.floats(1e-6, 1e-2)
sizes = st.integers(1, 10**7)


@st.composite
def streams(draw: st.DrawFn, *, collectives: bool = True) -> list[ScheduledOp]:
    """A stream of compute ops with async collectives started and waited for between them (shrinks to one op)."""
    ops = [compute(f"c{k}", draw(seconds), draw(st.sampled_from(["matmul", "memory"])))
           for k in range(draw(st.integers(1, 8)))]
    if collectives:
        for k in range(draw(st.integers(0, 4))):
            i = draw(st.integers(0, len(ops)))
            j = draw(st.integers(i + 1, len(ops) + 1))
            groups = draw(st.sampled_from([INSIDE, ACROSS]))
            start, done = collective(f"g{k}", draw(sizes), groups)
            ops = ops[:i] + [start] + ops[i:j - 1] + [done] + ops[j - 1:]
    return ops


@given(streams(collectives=False))
def test_a_program_without_collectives_costs_exactly_its_compute(ops: list[ScheduledOp]) -> None:
    t = simulate_schedule(program(*ops), ROOF, LINKS)
    expected = math.fsum(ROOF.seconds(op.flops, op.bytes_accessed) for op in ops)
    assert t.step_s == pytest.approx(expected, rel=1e-12)
    assert t.compute_s == pytest.approx(expected, rel=1e-12)
    assert t.exposed_s == 0.0 and t.collectives == ()


@given(streams(), st.data())
def test_adding_a_collective_never_makes_a_step_faster(ops: list[ScheduledOp], data: st.DataObject) -> None:
    before = simulate_schedule(program(*ops), ROOF, LINKS)
    i = data.draw(st.integers(0, len(ops)))
    j = data.draw(st.integers(i, len(ops)))
    start, done = collective("extra", data.draw(sizes), data.draw(st.sampled_from([INSIDE, ACROSS])))
    if data.draw(st.booleans()):
        more = ops[:i] + [start] + ops[i:j] + [done] + ops[j:]
    else:  # or a sync one
        more = ops[:i] + collective("extra", start.collective.nbytes, start.collective.groups, sync=True) + ops[i:]
    after = simulate_schedule(program(*more), ROOF, LINKS)
    assert after.step_s >= before.step_s * (1 - 1e-12)
    assert after.compute_s == pytest.approx(before.compute_s, rel=1e-12)


@given(sizes, st.floats(1.0, 10.0), st.sampled_from([INSIDE, ACROSS]))
def test_a_collective_inside_a_long_enough_compute_window_is_hidden(nbytes: int, margin: float,
                                                                    groups: tuple[tuple[int, ...], ...]) -> None:
    start, done = collective("g", nbytes, groups)
    window = alone(nbytes, groups) * margin
    t = simulate_schedule(program(start, compute("c", window), done), ROOF, LINKS)
    assert t.exposed_s == pytest.approx(0.0, abs=1e-15)
    assert t.step_s == pytest.approx(window, rel=1e-12)
    assert t.collectives[0].hidden_s == pytest.approx(alone(nbytes, groups), rel=1e-12)


@given(sizes, st.floats(0.0, 0.99), st.sampled_from([INSIDE, ACROSS]))
def test_what_a_window_cannot_hide_is_exposed_at_the_done(nbytes: int, share: float,
                                                          groups: tuple[tuple[int, ...], ...]) -> None:
    start, done = collective("g", nbytes, groups)
    window = alone(nbytes, groups) * share
    t = simulate_schedule(program(start, compute("c", window), done), ROOF, LINKS)
    assert t.step_s == pytest.approx(alone(nbytes, groups), rel=1e-9)
    assert t.exposed_s == pytest.approx(alone(nbytes, groups) - window, rel=1e-9, abs=1e-15)
    assert t.collectives[0].exposed_s == pytest.approx(t.exposed_s, rel=1e-12, abs=1e-18)


@given(streams(), st.integers(1, 50))
def test_the_trip_count_multiplies_the_body(ops: list[ScheduledOp], trips: int) -> None:
    body = ScheduledComputation("body", tuple(ops))
    cond = ScheduledComputation("cond", ())
    loop = ScheduledOp("w", "while", "loop", callees=("body", "cond"), trips=trips)
    once = simulate_schedule(program(*ops), ROOF, LINKS)
    looped = simulate_schedule(program(loop, extra=(body, cond)), ROOF, LINKS)
    assert looped.step_s == pytest.approx(trips * once.step_s, rel=1e-9)
    assert looped.exposed_s == pytest.approx(trips * once.exposed_s, rel=1e-9, abs=1e-15)
    assert sum(c.calls for c in looped.collectives) == trips * len(once.collectives)


@given(streams())
def test_step_is_compute_plus_exposed_and_each_wait_is_some_collectives(ops: list[ScheduledOp]) -> None:
    t = simulate_schedule(program(*ops), ROOF, LINKS)
    assert t.step_s == pytest.approx(t.compute_s + t.exposed_s, rel=1e-12)
    assert math.fsum(c.exposed_s for c in t.collectives) == pytest.approx(t.exposed_s, rel=1e-9, abs=1e-15)
    assert all(0 <= c.exposed_s <= c.seconds * len(ops) * 4 + 1e-15 for c in t.collectives)
    assert simulate_schedule(program(*ops), ROOF, LINKS) == t  # deterministic


def test_collectives_on_one_link_share_it_and_on_two_links_do_not() -> None:
    a, b = collective("a", 10**6), collective("b", 10**6)
    shared = simulate_schedule(program(a[0], b[0], a[1], b[1]), ROOF, LINKS)
    assert shared.step_s == pytest.approx(2 * alone(10**6), rel=1e-12)
    c = collective("c", 10**6, ACROSS)
    apart = simulate_schedule(program(a[0], c[0], a[1], c[1]), ROOF, LINKS)
    assert apart.step_s == pytest.approx(max(alone(10**6), alone(10**6, ACROSS)), rel=1e-12)
    assert {x.link for x in apart.collectives} == {"intra", "inter"}


def test_a_sync_collective_blocks_the_stream() -> None:
    t = simulate_schedule(program(compute("c", 1e-3), *collective("s", 10**6, sync=True), compute("d", 1e-3)),
                          ROOF, LINKS)
    assert t.step_s == pytest.approx(2e-3 + alone(10**6), rel=1e-12)
    assert t.exposed_s == pytest.approx(alone(10**6), rel=1e-12)


def test_collective_kinds_are_priced_by_the_collective_model() -> None:
    start, done = collective("r", 10**6, INSIDE, kind="all-reduce")
    t = simulate_schedule(program(start, done), ROOF, LINKS)
    assert t.step_s == pytest.approx(all_reduce_time(10**6, 2, FAST), rel=1e-12)
    permute = ScheduledCollective("collective-permute", ((0, 2), (2, 0)), 2, 10**6)
    t = simulate_schedule(program(ScheduledOp("p", "collective-permute", "collective", collective=permute,
                                              pair="p")), ROOF, LINKS)
    assert t.step_s == pytest.approx(SLOW.latency + 10**6 / SLOW.bandwidth, rel=1e-12)


@given(st.integers(2, 12), st.floats(1e-4, 1e-2), st.floats(1e-4, 1e-2), st.integers(10**4, 10**8))
def test_a_prefetched_layer_stack_agrees_with_the_analytic_step_model(layers: int, fwd: float, bwd: float,
                                                                      nbytes: int) -> None:
    # Each layer's weights are gathered (half their calls in the forward, half in the backward) one layer
    # ahead, under the previous layer's compute; the first gather of each pass has nothing to hide under.
    # The analytic model prices exactly that overlap: the two must agree.
    gather = alone(nbytes)
    ops: list[ScheduledOp] = []
    for name, window in (("f", fwd), ("b", bwd)):
        ops += collective(f"{name}0", nbytes)
        for k in range(layers):
            nxt = collective(f"{name}{k + 1}", nbytes) if k + 1 < layers else []
            ops += nxt[:1] + [compute(f"{name}c{k}", window)] + nxt[1:]
    t = simulate_schedule(program(*ops), ROOF, LINKS)
    peak = 1e12
    flops = StepFlops(model=0.0, recompute=0.0, overhead=0.0, per_device=layers * (fwd + bwd) * peak,
                      layer_forward=fwd * peak, layer_backward=bwd * peak, head=0.0)
    analytic = step_time(flops, [("fsdp all-gather of params (fwd + bwd)", "all-gather", 2 * layers * gather)],
                         layers=layers, tokens=1, devices=1, peak_flops=peak, efficiency=1.0)
    assert t.compute_s == pytest.approx(analytic.compute_s, rel=1e-9)
    assert t.exposed_s == pytest.approx(analytic.exposed_s, rel=1e-9, abs=1e-15)


def test_a_real_program_simulates_with_its_cluster() -> None:
    data = pathlib.Path(__file__).parents[1] / "xla" / "data" / "hlo" / "gpu_2x8_dp2_fsdp8.hlo.gz"
    prog = read_schedule(gzip.decompress(data.read_bytes()).decode())
    cluster = parse_cluster("2x8xH100")
    t = simulate_schedule(prog, default_roofline(cluster.device), schedule_links(cluster), top=3)
    assert t.step_s == pytest.approx(t.compute_s + t.exposed_s, rel=1e-12)
    assert len(t.top_ops) == 3 and t.approximations == ()
    links = {c.link for c in t.collectives if c.group_size == 2}
    assert links == {"inter"}  # the dp gradient all-reduces cross the two nodes
    assert {c.link for c in t.collectives if c.group_size == 8} == {"intra"}


def test_bad_inputs_are_typed_errors() -> None:
    good = program(compute("c", 1e-3))
    with pytest.raises(MeshplanTypeError, match="ScheduledProgram"):
        simulate_schedule("HloModule m", ROOF, LINKS)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError, match="Roofline"):
        simulate_schedule(good, DEVICE_SPECS["H100"], LINKS)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError, match="ScheduleLinks"):
        simulate_schedule(good, ROOF, parse_cluster("1x8xH100"))  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError, match="top"):
        simulate_schedule(good, ROOF, LINKS, top=-1)
    with pytest.raises(PlanError, match="e_max"):
        SizeEfficiency(1.5)
    with pytest.raises(PlanError, match="hbm_efficiency"):
        Roofline(1e12, 1e12, hbm_efficiency=2.0)
    with pytest.raises(MeshplanTypeError, match="efficiency"):
        Roofline(1e12, 1e12, efficiency=0.5)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="efficiency"):
        simulate_schedule(good, dataclasses.replace(ROOF, efficiency=lambda f: 2.0), LINKS)
    with pytest.raises(PlanError, match="outside"):
        LINKS.link_of(((0, 9),))


def test_a_conditional_runs_its_costliest_branch_and_a_call_its_callee_in_place() -> None:
    big = ScheduledComputation("big", (compute("b", 3e-3),))
    small = ScheduledComputation("small", (compute("s", 1e-3),))
    cond = ScheduledOp("c", "conditional", "conditional", callees=("small", "big"))
    call = ScheduledOp("k", "call", "call", callees=("small",))
    t = simulate_schedule(program(cond, call, extra=(big, small)), ROOF, LINKS)
    assert t.step_s == pytest.approx(4e-3, rel=1e-12)
    assert [o.name for o in t.top_ops] == ["big/b", "small/s"]


def test_a_collective_of_unknown_groups_is_priced_over_every_device_and_said() -> None:
    coll = ScheduledCollective("all-reduce", (), 0, 10**6)
    op = ScheduledOp("r", "all-reduce", "collective", collective=coll, pair="r")
    t = simulate_schedule(program(op), ROOF, LINKS)
    assert t.step_s == pytest.approx(all_reduce_time(10**6, 4, FAST), rel=1e-12)
    assert t.approximations == ("r: replica groups not read; priced over all 4 devices",)


@given(st.floats(1.0, 1e4), st.integers(2, 40), st.integers(1, 64))
def test_many_short_collectives_late_in_a_long_step_end_in_few_link_steps(clock, count, nbytes):
    # Flights whose remaining seconds fall below the clock's resolution late in a step used to be taken in
    # ever smaller pieces (a TPU program of 3k ops simulated for over ten minutes); each step now ends the
    # flights it finishes. Counted in the simulator's own link steps, not in wall time.
    from meshplan.pure.cost import _schedule_time as st_mod

    ops = [compute("long", clock)]
    for k in range(count):
        ops += collective(f"g{k}", nbytes)[:1]
    for k in range(count):
        ops.append(ScheduledOp(f"g{k}.done", "all-gather-done", "collective-done", pair=f"g{k}"))
    steps = 0
    original = st_mod._Sim._advance

    def counted(self, until):  # type: ignore[no-untyped-def]
        nonlocal steps
        steps += 1
        return original(self, until)

    st_mod._Sim._advance = counted
    try:
        t = simulate_schedule(program(*ops), ROOF, LINKS)
    finally:
        st_mod._Sim._advance = original
    assert steps <= 4 * count + 4
    assert t.step_s >= clock and t.step_s <= clock + count * alone(nbytes) + 1e-6
