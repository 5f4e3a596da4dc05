"""collective_shares: a kind's share of a step's collective bytes reads the compiled and the priced side."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.xla import HLO_COLLECTIVE_KINDS, collective_shares, ratio_table

_totals = st.dictionaries(st.sampled_from(HLO_COLLECTIVE_KINDS),
                          st.tuples(st.integers(0, 10**12), st.integers(0, 10**4)), max_size=5)


@given(_totals, _totals)
def test_a_share_is_the_larger_of_the_compiled_and_the_priced_share(analytic, compiled) -> None:
    table = ratio_table(analytic, compiled)
    shares = collective_shares(table)
    assert list(shares) == [kind for kind, *_ in table]
    priced_total = sum(a for _, a, _, _ in table)
    compiled_total = sum(c for _, _, c, _ in table)
    for kind, a, c, _ in table:
        assert 0.0 <= shares[kind] <= 1.0
        assert shares[kind] == max(a / (priced_total or 1), c / (compiled_total or 1))
    # The two sides are read alike: swapping them leaves every share as it was.
    assert collective_shares(ratio_table(compiled, analytic)) == shares


@given(st.integers(1, 10**9), st.integers(1, 10**9), st.integers(1, 10**9))
def test_a_kind_priced_but_never_emitted_keeps_its_priced_share(gathered, compiled_gather, priced_only) -> None:
    # The defect this replaced: by the compiled share alone, a kind XLA never emits read 0 ("minor").
    table = ratio_table({"all-gather": (gathered, 1), "reduce-scatter": (priced_only, 1)},
                        {"all-gather": (compiled_gather, 1)})
    assert collective_shares(table)["reduce-scatter"] == priced_only / (gathered + priced_only)


@pytest.mark.parametrize("bad", [None, [("all-gather", 1, 2)], [("all-gather", -1, 2, 0.5)],
                                 [(3, 1, 2, 0.5)], [("all-gather", 1.5, 2, 0.75)], [("all-gather", True, 2, 0.5)]])
def test_a_table_not_from_ratio_table_is_a_typed_error(bad) -> None:
    with pytest.raises(MeshplanTypeError, match="ratio_table") as err:
        collective_shares(bad)
    assert isinstance(err.value, TypeError)
