"""XLA:TPU's gradient sums over a whole 3-D v5p slice (``whole_slice_sums``): all-reduces, not reduce-scatters.

The compiled checks are in test_tpu_full_width_collectives.py (v5p-16 and v5p-64 rows); these are the rule's
properties and which clusters it applies to.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import parse_cluster
from meshplan.pure.search._pricing import v5p_slice_chips
from meshplan.pure.cost._placement import Pending
from meshplan.pure.cost._tpu_terms import whole_slice_sums

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")
terms = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from([("fsdp",), ("dp", "fsdp"), ("tp",)]),
                           st.integers(0, 10**9), st.integers(1, 64)), max_size=8)


@given(terms, st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 8]),
       st.sampled_from([4, 8, 16, 32]))
def test_only_reduce_scatters_over_the_whole_slice_become_all_reduces_of_the_same_buffer(
        rows: list, dp: int, fsdp: int, tp: int, chips: int) -> None:
    sizes = {"dp": dp, "fsdp": fsdp, "tp": tp}
    pending = [Pending(f"{'+'.join(axes)} {kind} of grads", kind, axes, nbytes, calls, 1, 1)
               for kind, axes, nbytes, calls in rows]
    out = whole_slice_sums(pending, sizes, chips=chips)
    assert len(out) == len(pending)
    for before, after in zip(pending, out, strict=True):
        group = 1
        for a in before.axes:
            group *= sizes[a]
        if before.kind == "reduce-scatter" and group == chips:
            assert after.kind == "all-reduce" and "of grads" in after.what and "whole v5p slice" in after.what
            assert after._replace(what=before.what, kind=before.kind) == before
        else:
            assert after == before
    assert whole_slice_sums(out, sizes, chips=chips) == out  # nothing left to convert


def test_the_rule_applies_to_v5p_slices_that_span_three_dims_only() -> None:
    chips = {name: v5p_slice_chips(parse_cluster(name))
             for name in ("v5p-8", "v5p-16", "v5p-64", "v5p-256", "2xv5p-16", "v5e-8", "v6e-256", "8xH100")}
    assert chips == {"v5p-8": None, "v5p-16": 8, "v5p-64": 32, "v5p-256": 128, "2xv5p-16": 8, "v5e-8": None,
                     "v6e-256": None, "8xH100": None}
