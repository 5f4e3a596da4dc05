"""Properties of the spec strategies, checked against jax itself."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.pure import check_specs, validate_specs
from meshplan.testing import (
    SPEC_FAULTS,
    array_shapes_for,
    invalid_partition_specs,
    mesh_shapes,
    partition_specs,
)

# How jax 0.10 words its refusal of each fault.
JAX_REFUSAL = {
    "unknown_axis": "not found in mesh",
    "repeated_axis": "at most one",
    "indivisible": "divid",
    "rank": "rank at least",
}


@functools.cache
def abstract_mesh(names, sizes):
    return jax.sharding.AbstractMesh(sizes, names)


def jax_shard_shape(mesh, shape, spec):
    """What jax checks before storing an array: rank compatibility, then the shard shape."""
    sharding = NamedSharding(abstract_mesh(mesh.names, mesh.sizes), spec)
    sharding.check_compatible_aval(shape)
    return sharding.shard_shape(shape)


def cases(divisible, allow_empty=False):
    """(mesh shape, array shape) pairs over at most 8 devices."""
    return mesh_shapes(max_devices=8).flatmap(
        lambda m: st.tuples(st.just(m), array_shapes_for(m.as_dict(), divisible=divisible, max_dims=3,
                                                         allow_empty=allow_empty)))


@given(cases(divisible=True))
def test_divisible_shapes_are_multiples_of_the_mesh_size(case):
    mesh, shape = case
    assert all(d % mesh.size == 0 for d in shape)


@given(cases(divisible=False).flatmap(lambda c: st.tuples(st.just(c), partition_specs(c[1], c[0].as_dict()))))
def test_every_valid_spec_is_accepted_by_jax_and_meshplan(case):
    (mesh, shape), spec = case
    expected = jax_shard_shape(mesh, shape, spec)
    assert len(expected) == len(shape)
    check_specs({"x": jax.ShapeDtypeStruct(shape, np.float32)}, {"x": spec}, mesh.as_dict())


@given(cases(divisible=False, allow_empty=True).flatmap(lambda c: st.tuples(
    st.just(c), partition_specs(c[1], c[0].as_dict(), allow_uneven=True, allow_unconstrained=True))))
def test_uneven_and_unconstrained_specs_are_refused_only_for_storage(case):
    (mesh, shape), spec = case
    sizes = mesh.as_dict()
    splits = [1] * len(shape)
    for i, entry in enumerate(spec):
        for axis in (entry,) if isinstance(entry, str) else entry if isinstance(entry, tuple) else ():
            splits[i] *= sizes[axis]
    even = all(d % n == 0 for d, n in zip(shape, splits))
    # an Auto mesh: the one kind where jax takes P.UNCONSTRAINED
    sharding = NamedSharding(abstract_mesh(mesh.names, mesh.sizes), spec)
    sharding.check_compatible_aval(shape)  # known axes, none repeated, no longer than the rank
    if even:
        assert len(sharding.shard_shape(shape)) == len(shape)
    else:
        with pytest.raises(ValueError, match="divid"):
            sharding.shard_shape(shape)
    leaf = [jax.ShapeDtypeStruct(shape, np.float32)]
    check_specs(leaf, [spec], sizes, for_storage=False)
    stored = {f.kind for f in validate_specs(leaf, [spec], sizes)}
    assert stored == {k for k, found in [("indivisible", not even), ("unconstrained", P.UNCONSTRAINED in spec)]
                      if found}


def _invalid_cases():
    def for_case(case):
        mesh, shape = case
        faults = [f for f in SPEC_FAULTS if _possible(shape, mesh.as_dict(), f)]
        return st.tuples(st.just(case), invalid_partition_specs(shape, mesh.as_dict(), fault=faults))
    return cases(divisible=False).filter(lambda c: len(c[1]) > 0).flatmap(for_case)


def _possible(shape, sizes, fault):
    if fault == "indivisible":
        return any(d % s for d in shape for s in sizes.values())
    return True


@given(_invalid_cases())
def test_every_invalid_spec_is_refused_by_jax_and_flagged_for_its_fault(case):
    (mesh, shape), (spec, fault) = case
    with pytest.raises(Exception, match=JAX_REFUSAL[fault]):
        jax_shard_shape(mesh, shape, spec)
    kinds = {f.kind for f in validate_specs([jax.ShapeDtypeStruct(shape, np.float32)], [spec], mesh.as_dict())}
    assert fault in kinds


@pytest.mark.parametrize("fault", ["unknown_axis", "repeated_axis", "indivisible"])
@given(data=st.data())
def test_single_faults_are_the_only_finding(fault, data):
    spec, drawn = data.draw(invalid_partition_specs((6, 8), {"a": 1, "b": 4}, fault=fault))
    kinds = [f.kind for f in validate_specs([jax.ShapeDtypeStruct((6, 8), np.float32)], [spec], {"a": 1, "b": 4})]
    assert drawn == fault
    if fault != "repeated_axis":  # a repeated axis of size 4 may also leave a dim indivisible
        assert kinds == [fault]
