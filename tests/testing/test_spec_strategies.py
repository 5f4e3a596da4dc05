"""Properties of the spec strategies, checked against jax itself."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding

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


def cases(divisible):
    """(mesh shape, array shape) pairs over at most 8 devices."""
    return mesh_shapes(max_devices=8).flatmap(
        lambda m: st.tuples(st.just(m), array_shapes_for(m.as_dict(), divisible=divisible, max_dims=3)))


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
