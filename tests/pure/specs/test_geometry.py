"""Canonical spec entries and shard geometry, checked against jax's NamedSharding."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.pure import MeshplanTypeError, SpecError, shard_geometry, shard_shape
from meshplan.pure.specs import UNCONSTRAINED, canonical_entries, spec_axes, spec_from_entries
from meshplan.pure.specs._geometry import geometry_of_entries
from meshplan.testing import array_shapes_for, mesh_for, mesh_shapes, partition_specs


def well_formed_cases():
    """(mesh over the 8 test devices, shape, spec) with known, unrepeated axes and len(spec) <= rank.

    Splits may be uneven and dims 0. Shrinks to a one-axis mesh, rank 0 and ``P()``.
    """
    def for_mesh(m):
        sizes = m.as_dict()
        shapes = array_shapes_for(sizes, divisible=False, max_dims=3, allow_empty=True)
        return shapes.flatmap(lambda s: st.tuples(st.just(mesh_for(sizes)), st.just(s),
                                                  partition_specs(s, sizes, allow_uneven=True)))
    return mesh_shapes(num_devices=8).flatmap(for_mesh)


@given(well_formed_cases())
def test_shard_geometry_agrees_with_named_sharding_and_flags_padding_exactly_when_jax_refuses(case):
    mesh, shape, spec = case
    geometry = shard_geometry(shape, spec, dict(mesh.shape))
    try:
        jax_shape = NamedSharding(mesh, spec).shard_shape(shape)
    except ValueError:  # jax's IndivisibleError: an uneven split it cannot store
        assert geometry.padded
        return
    assert not geometry.padded
    assert geometry.shard_shape == jax_shape
    assert shard_shape(shape, spec, dict(mesh.shape)) == jax_shape


@given(well_formed_cases(), st.sampled_from([None, UNCONSTRAINED]))
def test_geometry_of_checked_entries_is_shard_geometry(case, extra):
    # The planner checks a spec once and reuses its canonical entries on other meshes.
    mesh, shape, spec = case
    if extra is not None and len(spec) < len(shape):
        spec = P(*spec, extra)
    sizes = dict(mesh.shape)
    entries = canonical_entries(spec, len(shape))
    assert geometry_of_entries(tuple(shape), entries, sizes) == shard_geometry(shape, spec, sizes)


@given(well_formed_cases())
def test_padded_shard_covers_the_dim_with_less_than_one_shard_of_padding(case):
    mesh, shape, spec = case
    g = shard_geometry(shape, spec, dict(mesh.shape))
    for d, s, n in zip(shape, g.shard_shape, g.splits, strict=True):
        assert s * n >= d > s * n - n or d == 0
    assert g.num_elements == int(np.prod(g.shard_shape))


entry_lists = st.lists(
    st.one_of(
        st.just(()),
        st.lists(st.sampled_from(["dp", "fsdp", "tp", "sp"]), min_size=1, max_size=3, unique=True).map(tuple),
        st.just(UNCONSTRAINED),
    ),
    max_size=4,
)


@given(entry_lists, st.integers(0, 2))
def test_canonical_entries_of_spec_from_entries_round_trips(entries, extra):
    rank = len(entries) + extra
    spec = spec_from_entries(entries)
    assert canonical_entries(spec, rank) == tuple(entries) + ((),) * extra
    # The spec is the shortest spelling: no trailing None.
    assert len(spec) == 0 or spec[-1] is not None


@given(entry_lists)
def test_spec_from_entries_is_a_canonical_form_of_equal_layouts(entries):
    spec = spec_from_entries(entries)
    spelled_long = P(*[list(e) if isinstance(e, tuple) and e else (None if e == () else e) for e in entries], None)
    assert spec_from_entries(canonical_entries(spelled_long)) == spec
    assert hash(spec_from_entries(canonical_entries(spelled_long))) == hash(spec)


def test_spec_axes_lists_axes_in_order_and_skips_unconstrained():
    assert spec_axes(P("dp", UNCONSTRAINED, ("fsdp", "tp"), None)) == ("dp", "fsdp", "tp")


def test_none_reads_as_replicated():
    assert canonical_entries(None, 2) == ((), ())


def test_spec_longer_than_rank_is_a_spec_error_naming_where():
    with pytest.raises(SpecError, match="layer/w.*rank 1"):
        canonical_entries(P("dp", None), 1, where="layer/w")


@pytest.mark.parametrize("bad", [P(3), P(("dp", 3))])
def test_malformed_entries_are_type_errors(bad):
    with pytest.raises(MeshplanTypeError, match="spec entry"):
        canonical_entries(bad)


def test_non_spec_is_a_type_error():
    with pytest.raises(MeshplanTypeError, match="expected a PartitionSpec"):
        canonical_entries(("dp", None))


def test_unknown_and_repeated_axes_are_reported_together():
    with pytest.raises(SpecError) as info:
        shard_geometry((4, 4, 4), P("dp", "zz", "dp"), {"dp": 2})
    assert "'zz'" in str(info.value) and "more than once" in str(info.value)


def test_unconstrained_counts_as_replicated():
    g = shard_geometry((8, 4), P(UNCONSTRAINED, "tp"), {"tp": 4})
    assert g.shard_shape == (8, 1) and g.splits == (1, 4) and not g.padded


def test_axis_sizes_must_be_a_mapping():
    with pytest.raises(MeshplanTypeError, match="axis_sizes"):
        shard_geometry((4,), P("dp"), [("dp", 2)])
