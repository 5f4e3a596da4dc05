"""Verification records round-trip through JSON and refuse a hand-edited document with a typed error."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import MeshplanError
from meshplan.pure.verify import STATUSES, PlanVerification, VerifyRow
from meshplan.pure.xla import LiveBuffer

sizes = st.one_of(st.none(), st.integers(0, 2**45))
buffers = st.builds(LiveBuffer, name=st.text("abc.%", min_size=1, max_size=8), bytes=st.integers(0, 2**40),
                    shape=st.just("f32[2,3]"), dtype=st.just("f32"), kind=st.just("temp"))
rows = st.builds(
    VerifyRow, mesh=st.text("dpfsz=0123,", min_size=1, max_size=12), rank=st.one_of(st.none(), st.integers(1, 99)),
    analytic_bytes=sizes, budget_bytes=st.integers(0, 2**45), target=st.text(max_size=20), peak_bytes=sizes,
    status=st.sampled_from(STATUSES), largest=st.lists(buffers, max_size=2).map(tuple),
    compile_seconds=st.floats(0, 1e4), deviceless=st.booleans(), cached=st.booleans())


@given(st.lists(rows, max_size=3), st.lists(rows, max_size=2), st.floats(0, 1e4))
def test_a_verification_reads_back_equal_from_its_json(shown, removed, seconds):
    checked = PlanVerification(tuple(shown), tuple(removed), "XLA:CPU (jax 0.10.2)", "", seconds)
    assert PlanVerification.from_dict(json.loads(json.dumps(checked.to_dict()))) == checked


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["rows"][0].update(peak_bytes="lots"), "rows[0]"),
    (lambda d: d["rows"][0].update(status="fine"), "status"),
    (lambda d: d.update(seconds=-1.0), "seconds"),
    (lambda d: d.pop("compiler"), "compiler"),
    (lambda d: d["rows"][0].update(largest=[{"name": "x"}]), "largest"),
])
def test_a_hand_edited_verification_is_a_typed_error_naming_the_field(edit, field):
    data = PlanVerification((VerifyRow("dp=8", 1, 10, 20, "t"),), (), "c", "", 1.0).to_dict()
    edit(data)
    with pytest.raises(MeshplanError, match=re.escape(field)):
        PlanVerification.from_dict(data)
