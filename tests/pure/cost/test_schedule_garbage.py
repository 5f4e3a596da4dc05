"""Garbage into every public callable of the schedule reader and simulator: only typed meshplan errors come out."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import MeshplanError
from meshplan.pure.cluster import DEVICE_SPECS, Link, parse_cluster
from meshplan.pure.cost import (
    Roofline,
    ScheduleLinks,
    SizeEfficiency,
    default_roofline,
    roofline,
    schedule_links,
    simulate_schedule,
)
from meshplan.pure.xla import (
    ScheduledCollective,
    ScheduledComputation,
    ScheduledOp,
    ScheduledProgram,
    read_schedule,
    xla_floor,
)
from meshplan.pure.xla._xla_floor import unpriced_calls

GOOD_OP = ScheduledOp("c", "fusion", "matmul", flops=1e9)
GOOD = ScheduledProgram("main", (ScheduledComputation("main", (GOOD_OP,)),), 2)
ROOF = Roofline(1e12, 1e12)
LINKS = ScheduleLinks(Link(1e9, 0.0), Link(1e8, 0.0), (0, 1))

garbage = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.just(10**400), st.floats(allow_nan=True),
    st.text(max_size=20), st.binary(max_size=8), st.just(np.float32(2.0)), st.just(np.arange(3)),
    st.just(np.int64), st.lists(st.integers(-3, 3), max_size=3), st.tuples(st.integers(-1, 3), st.text(max_size=3)),
    st.just(((0, -1),)), st.just(((0, 1.5),)), st.just({"a": 1}), st.just(object()), st.just(GOOD),
    st.just(GOOD_OP), st.just(ROOF), st.just(LINKS), st.just(DEVICE_SPECS["H100"]), st.just(parse_cluster("v5e-4")),
    st.just(Link(1e9, 0.0)), st.just(math.inf), st.just(lambda x: 2.0), st.just(lambda x: "fast"),
)

CALLS = {
    "read_schedule": lambda a, b: read_schedule(a),
    "xla_floor": lambda a, b: xla_floor(a, b),
    "unpriced_calls": lambda a, b: unpriced_calls(a),
    "simulate_schedule": lambda a, b: simulate_schedule(a, ROOF, LINKS),
    "simulate_schedule roofline": lambda a, b: simulate_schedule(GOOD, a, LINKS),
    "simulate_schedule links": lambda a, b: simulate_schedule(GOOD, ROOF, a, top=b),
    "Roofline": lambda a, b: Roofline(a, 1e12, b),
    "Roofline rates": lambda a, b: Roofline(1e12, a, hbm_efficiency=b),
    "Roofline launch": lambda a, b: Roofline(1e12, 1e12, launch_s=a).seconds(b, b),
    "SizeEfficiency": lambda a, b: SizeEfficiency(a, b)(1e-3),
    "ScheduleLinks": lambda a, b: ScheduleLinks(a, Link(1e9, 0.0), b),
    "ScheduleLinks.link_of": lambda a, b: LINKS.link_of(a, network=b is True),
    "roofline": lambda a, b: roofline(a, b),
    "default_roofline": lambda a, b: default_roofline(a),
    "schedule_links": lambda a, b: schedule_links(a, b),
    "ScheduledOp": lambda a, b: ScheduledOp("x", "fusion", a, flops=b),
    "ScheduledOp fields": lambda a, b: ScheduledOp(a, "fusion", "memory", bytes_read=b, callees=a),
    "ScheduledCollective": lambda a, b: ScheduledCollective("all-gather", a, b, 1),
    "ScheduledComputation": lambda a, b: ScheduledComputation(a, b),
    "ScheduledProgram": lambda a, b: ScheduledProgram(a, b),
    "ScheduledProgram.computation": lambda a, b: GOOD.computation(a),
    "ScheduledProgram.totals": lambda a, b: GOOD.totals(loops_once=a),
}


@pytest.mark.parametrize("name", sorted(CALLS))
@given(a=garbage, b=garbage)
def test_garbage_gets_a_typed_error_or_an_answer(name: str, a: object, b: object) -> None:
    try:
        CALLS[name](a, b)
    except MeshplanError as err:
        assert isinstance(err, (ValueError, TypeError)), repr(err)
