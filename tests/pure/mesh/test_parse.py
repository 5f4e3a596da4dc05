"""Tests for meshplan.pure.mesh._parse: mesh strings, named and positional."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.mesh._parse import format_mesh_string, parse_mesh_string
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError, MeshStringError
from meshplan.testing import mesh_shapes

# Any identifier-like names (digits and '_' too): the parser must not care what they are.
names_st = st.lists(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=6),
    min_size=1,
    max_size=5,
    unique=True,
).map(tuple)
# (names, dims) with at most one -1; shrinks to one axis of size 1.
mesh_specs = names_st.flatmap(lambda names: mesh_shapes(axis_names=names, max_devices=64, allow_infer=True)).map(
    lambda m: (m.axis_names, m.axis_dims))


spaces = st.text(alphabet=" \t", max_size=2)


def _pad(text: str, data) -> str:
    """Inserts random whitespace around every ',' and ':' and at both ends."""
    out = data.draw(spaces)
    for ch in text:
        out += data.draw(spaces) + ch + data.draw(spaces) if ch in ",:" else ch
    return out + data.draw(spaces)


# --- properties -----------------------------------------------------------------------------------


@given(spec=mesh_specs, data=st.data())
def test_named_strings_round_trip_in_the_strings_own_order(spec, data):
    names, dims = spec
    order = data.draw(st.permutations(range(len(names))))
    s_names = tuple(names[i] for i in order)
    s_dims = tuple(dims[i] for i in order)
    text = _pad(format_mesh_string(s_names, s_dims), data)
    assert parse_mesh_string(text, list(names)) == (s_names, s_dims)


@given(spec=mesh_specs, data=st.data())
def test_positional_strings_round_trip_in_names_order(spec, data):
    names, dims = spec
    text = _pad(format_mesh_string(names, dims, named=False), data)
    assert parse_mesh_string(text, names) == (names, dims)


@given(spec=mesh_specs, data=st.data())
def test_dropping_a_named_entry_is_reported_as_a_missing_axis(spec, data):
    names, dims = spec
    drop = data.draw(st.integers(0, len(names) - 1))
    text = ",".join(f"{n}:{d}" for i, (n, d) in enumerate(zip(names, dims)) if i != drop)
    with pytest.raises(MeshStringError) as err:
        parse_mesh_string(text if text else f"{names[drop]}x:1", names)
    assert repr(names[drop]) in str(err.value)


@given(
    spec=mesh_specs,
    junk=st.sampled_from(["x", "2.5", "1e3", "0", "-2", "", "+", "٣"]),
    data=st.data(),
)
def test_a_bad_size_anywhere_is_named_in_the_error(spec, junk, data):
    names, dims = spec
    i = data.draw(st.integers(0, len(names) - 1))
    entries = [f"{n}:{d}" for n, d in zip(names, dims)]
    entries[i] = f"{names[i]}:{junk}"
    with pytest.raises(MeshStringError) as err:
        parse_mesh_string(",".join(entries), names)
    assert repr(entries[i]) in str(err.value)


# --- examples -------------------------------------------------------------------------------------


def test_reference_named_example():
    assert parse_mesh_string("dp:2,tp:4", ["dp", "tp"]) == (("dp", "tp"), (2, 4))


def test_reference_positional_example():
    assert parse_mesh_string("2,4", ["data", "model"]) == (("data", "model"), (2, 4))


def test_named_string_order_wins_over_names_order():
    assert parse_mesh_string("tp:4,dp:2", ["dp", "tp"]) == (("tp", "dp"), (4, 2))


def test_minus_one_is_returned_unresolved():
    assert parse_mesh_string("dp:1, fsdp:-1", ("dp", "fsdp")) == (("dp", "fsdp"), (1, -1))


# --- bad inputs -----------------------------------------------------------------------------------

NAMES = ("dp", "tp")
BAD_CALLS = [
    ("", MeshStringError, "''"),
    ("   ", MeshStringError, "'   '"),
    ("dp:2:3", MeshStringError, "'dp:2:3'"),
    ("dp:", MeshStringError, "'dp:'"),
    (":2", MeshStringError, "':2'"),
    ("dp:x,tp:4", MeshStringError, "'dp:x'"),
    ("2.5,4", MeshStringError, "'2.5'"),
    ("1_0,4", MeshStringError, "'1_0'"),
    ("dp:2,xx:4", MeshStringError, "'xx'"),
    ("dp:2,dp:4", MeshStringError, "axis 'dp' is given more than once"),
    ("dp:2,tp:4,", MeshStringError, "entry 2 is empty"),
    (",2,4", MeshStringError, "entry 0 is empty"),
    ("dp:2,4", MeshStringError, "mixes named"),
    ("2", MeshStringError, "1 positional size(s) for 2 axis names"),
    ("2,4,1", MeshStringError, "3 positional size(s)"),
    ("dp:2", MeshStringError, "['tp']"),
    ("0,4", MeshStringError, "size 0"),
    ("dp:-2,tp:4", MeshStringError, "size -2"),
    ("-1,-1", MeshStringError, "-1 appears 2 times"),
]


@pytest.mark.parametrize("text, exc, needle", BAD_CALLS)
def test_malformed_strings_raise_mesh_string_error_naming_the_token(text, exc, needle):
    with pytest.raises(exc) as err:
        parse_mesh_string(text, NAMES)
    message = str(err.value)
    assert needle in message
    assert "dp:<size>,tp:<size>" in message  # the valid form, in the caller's names
    assert isinstance(err.value, MeshShapeError) and isinstance(err.value, ValueError)


BAD_TYPES = [
    (lambda: parse_mesh_string(b"2,4", NAMES), MeshplanTypeError, "b'2,4'"),
    (lambda: parse_mesh_string(24, NAMES), MeshplanTypeError, "24"),
    (lambda: parse_mesh_string("2,4", "dptp"), MeshplanTypeError, "'dptp'"),
    (lambda: parse_mesh_string("2,4", ("dp", "dp")), MeshShapeError, "'dp'"),
    (lambda: format_mesh_string(("a,b",), (2,)), MeshStringError, "'a,b'"),
    (lambda: format_mesh_string(("dp",), (2, 4)), MeshStringError, "(2, 4)"),
    (lambda: format_mesh_string(("dp",), (0,)), MeshStringError, "size 0"),
]


@pytest.mark.parametrize("call, exc, needle", BAD_TYPES)
def test_bad_argument_types_raise_typed_errors(call, exc, needle):
    with pytest.raises(exc) as err:
        call()
    assert needle in str(err.value)
