"""Tests for meshplan.pure.mesh._axis_types: canonical AxisType tuples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AbstractMesh, AxisType

from meshplan.pure.mesh._axis_types import canonicalize_axis_types
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError

members = st.sampled_from(sorted(AxisType, key=lambda m: m.name))


def _spellings(member: AxisType):
    """Every way a user may name ``member``: the enum, or its name in random case."""
    name = member.name
    cased = st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda ups: "".join(c.upper() if u else c.lower() for c, u in zip(name, ups))
    )
    return st.one_of(st.just(member), cased)


@st.composite
def spelled(draw, n_min=0, n_max=5):
    """(members, spellings) of equal length; shrinks to no axes."""
    chosen = draw(st.lists(members, min_size=n_min, max_size=n_max))
    return tuple(chosen), [draw(_spellings(m)) for m in chosen]


@given(case=spelled())
def test_sequences_map_names_in_any_case_to_members_in_order(case):
    expected, given_ = case
    assert canonicalize_axis_types(given_, len(given_)) == expected
    assert canonicalize_axis_types(tuple(given_), len(given_)) == expected


@given(member=members, data=st.data(), n=st.integers(0, 6))
def test_a_single_value_is_broadcast_to_every_axis(member, data, n):
    value = data.draw(_spellings(member))
    assert canonicalize_axis_types(value, n) == (member,) * n


@given(case=spelled(n_min=1, n_max=4))
def test_result_is_accepted_by_jax_abstract_mesh_unchanged(case):
    expected, given_ = case
    types = canonicalize_axis_types(given_, len(given_))
    names = tuple(f"a{i}" for i in range(len(types)))
    mesh = AbstractMesh((1,) * len(types), names, axis_types=types)
    assert tuple(mesh.axis_types) == expected


@given(n=st.integers(0, 6))
def test_none_passes_through_for_the_facade_default(n):
    assert canonicalize_axis_types(None, n) is None


def test_reference_strings_auto_explicit_manual_are_accepted():
    assert canonicalize_axis_types(["auto", "explicit", "manual"], 3) == (
        AxisType.Auto,
        AxisType.Explicit,
        AxisType.Manual,
    )


BAD_CALLS = [
    (lambda: canonicalize_axis_types("fast", 2), MeshShapeError, "'fast'"),
    (lambda: canonicalize_axis_types("fast", 2), MeshShapeError, "'auto', 'explicit', 'manual'"),
    (
        lambda: canonicalize_axis_types(["auto", "bogus"], 2),
        MeshShapeError,
        "axis_types[1]='bogus'",
    ),
    (lambda: canonicalize_axis_types(["auto"], 2), MeshShapeError, "2 axes"),
    (lambda: canonicalize_axis_types(("auto", 1), 2), MeshplanTypeError, "axis_types[1]=1"),
    (lambda: canonicalize_axis_types(3, 2), MeshplanTypeError, "axis_types=3"),
    (lambda: canonicalize_axis_types({"auto"}, 1), MeshplanTypeError, "set"),
    (lambda: canonicalize_axis_types("auto", -1), MeshShapeError, "num_axes=-1"),
    (lambda: canonicalize_axis_types("auto", 2.0), MeshplanTypeError, "num_axes=2.0"),
]


@pytest.mark.parametrize("call, exc, needle", BAD_CALLS)
def test_bad_inputs_raise_typed_errors_naming_the_value(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    assert needle in str(err.value)
