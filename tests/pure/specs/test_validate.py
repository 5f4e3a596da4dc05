"""validate_specs / check_specs: findings name the leaf, and agree with jax.device_put."""

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax._src.named_sharding import DuplicateSpecError  # only to name jax's refusal in the oracle
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.pure import Finding, MeshplanTypeError, SpecError, check_specs, tree_facts, validate_specs
from meshplan.pure.specs import UNCONSTRAINED
from meshplan.testing import array_shapes_for, invalid_partition_specs, mesh_for, mesh_shapes, partition_specs


def jax_stores(mesh, shape, spec) -> bool:
    """Does jax.device_put accept an array of ``shape`` under ``spec``?"""
    try:
        jax.device_put(np.zeros(shape, np.int8), NamedSharding(mesh, spec))
    # jax 0.10 refuses with ValueError, and in corners with other types:
    # DuplicateSpecError (an Exception, not a ValueError) for a repeated axis,
    # KeyError for UNCONSTRAINED on Auto meshes, AssertionError for a too-long
    # spec on a rank-0 array on Explicit meshes.
    except (ValueError, KeyError, AssertionError, DuplicateSpecError):
        return False
    return True


def any_spec_cases():
    """(mesh over the 8 test devices, shape, spec) where the spec stores, is fine only inside jit
    (uneven, UNCONSTRAINED), or carries one of the faults jax refuses everywhere.

    Shrinks to a one-axis Auto mesh, rank 0 and ``P()``.
    """
    def for_shape(sizes, axis_types, shape):
        specs = st.one_of(partition_specs(shape, sizes, allow_uneven=True, allow_unconstrained=True),
                          invalid_partition_specs(shape, sizes).map(lambda bad: bad.spec))
        return st.tuples(st.just(mesh_for(sizes, axis_types=axis_types)), st.just(shape), specs)

    def for_mesh(sizes, axis_types):
        shapes = array_shapes_for(sizes, divisible=False, max_dims=3, allow_empty=True)
        return shapes.flatmap(lambda shape: for_shape(sizes, axis_types, shape))

    return st.tuples(mesh_shapes(num_devices=8), st.sampled_from(["auto", "explicit"])).flatmap(
        lambda t: for_mesh(t[0].as_dict(), t[1]))


@given(any_spec_cases())
def test_storage_validation_accepts_exactly_what_device_put_accepts(case):
    mesh, shape, spec = case
    tree = {"layer": {"w": jax.ShapeDtypeStruct(shape, np.int8)}}
    findings = validate_specs(tree, {"layer": {"w": spec}}, dict(mesh.shape))
    errors = [f for f in findings if f.severity == "error"]
    assert (not errors) == jax_stores(mesh, shape, spec), findings
    for f in findings:
        assert f.path == "layer/w" and "'layer/w'" in str(f)


@given(any_spec_cases())
def test_inside_jit_uneven_dims_and_unconstrained_stop_being_errors(case):
    mesh, shape, spec = case
    sizes = dict(mesh.shape)
    stored = validate_specs([jax.ShapeDtypeStruct(shape, np.float32)], [spec], sizes)
    in_jit = validate_specs([jax.ShapeDtypeStruct(shape, np.float32)], [spec], sizes, for_storage=False)
    relaxed = {"indivisible", "unconstrained"}
    assert [(f.kind, f.severity) for f in in_jit if f.kind not in relaxed] == [
        (f.kind, f.severity) for f in stored if f.kind not in relaxed
    ]
    assert [f.kind for f in in_jit if f.kind == "indivisible"] == [f.kind for f in stored if f.kind == "indivisible"]
    assert all(f.severity == "warning" for f in in_jit if f.kind == "indivisible")
    assert not [f for f in in_jit if f.kind == "unconstrained"]


SIZES = {"dp": 2, "tp": 4}


@pytest.mark.parametrize(
    ("spec", "kind", "words"),
    [
        (P("mp"), "unknown_axis", ["'mp'", "['dp', 'tp']"]),
        (P("dp", "dp"), "repeated_axis", ["'dp'", "more than once"]),
        (P(("dp", "tp"), None, None), "rank", ["rank 2", "3 entries"]),
        (P("tp", "dp"), "indivisible", ["size 6", "divide by 4"]),
        (P(UNCONSTRAINED), "unconstrained", ["UNCONSTRAINED"]),
        (P(3), "bad_entry", ["spec entry 3"]),
    ],
)
def test_each_problem_kind_is_reported_with_the_leaf_path(spec, kind, words):
    params = {"block": [{"kernel": np.zeros((6, 8), np.float32)}]}
    (finding,) = validate_specs(params, {"block": [{"kernel": spec}]}, SIZES)
    assert finding.kind == kind and finding.path == "block/0/kernel"
    assert str(finding).startswith("leaf 'block/0/kernel'")
    for word in words:
        assert word in str(finding)


def test_structure_mismatch_names_missing_and_extra_paths():
    params = {"a": np.zeros(4), "b": {"c": np.zeros(4)}}
    findings = validate_specs(params, {"a": P(), "x": P()}, SIZES)
    assert [(f.kind, f.path) for f in findings] == [("structure", "b/c"), ("structure", "x")]
    assert "no spec" in str(findings[0]) and "matches no leaf" in str(findings[1])


def test_a_spec_may_cover_a_whole_subtree():
    params = {"a": np.zeros(4), "b": {"c": np.zeros((4, 4)), "d": np.zeros(8)}}
    assert validate_specs(params, {"a": P("dp"), "b": P("tp")}, SIZES) == []
    (finding,) = validate_specs(params, {"a": P(), "b": P("tp", "dp")}, SIZES)
    assert (finding.path, finding.kind) == ("b/d", "rank")


def test_none_values_are_skipped_and_none_specs_mean_replicated():
    params = {"a": None, "b": np.zeros(3), "c": [None, np.zeros(5)]}
    assert validate_specs(params, {"a": P("dp"), "b": None, "c": [P("tp"), P()]}, SIZES) == []


def test_non_spec_leaves_and_sharded_non_arrays_are_findings():
    tree = {"w": np.zeros(4), "name": "layer0", "act": "relu"}
    findings = validate_specs(tree, {"w": ("dp",), "name": P(), "act": P("dp")}, SIZES)
    kinds = {(f.path, f.kind) for f in findings}
    assert ("act", "non_array") in kinds
    assert any(f.kind == "structure" for f in findings)  # a tuple spec is a subtree, not a leaf
    findings = validate_specs(tree, {"w": "dp", "name": P(), "act": None}, SIZES)
    assert [(f.path, f.kind) for f in findings] == [("w", "not_a_spec")]


def test_check_specs_raises_once_with_every_error_and_returns_warnings():
    params = {"a": np.zeros((5, 8)), "b": np.zeros((8,)), "c": np.zeros(3)}
    specs = {"a": P("dp"), "b": P("zz"), "c": P("tp")}
    with pytest.raises(SpecError) as info:
        check_specs(params, specs, SIZES)
    assert info.value.findings == validate_specs(params, specs, SIZES)
    assert "3 partition spec problem(s)" in str(info.value)
    for path in ("'a'", "'b'", "'c'"):
        assert path in str(info.value)
    warnings = check_specs(params, {"a": P("dp"), "b": P(), "c": P("tp")}, SIZES, for_storage=False)
    assert [(f.path, f.severity) for f in warnings] == [("a", "warning"), ("c", "warning")]


def test_paths_are_not_computed_when_every_spec_fits():
    facts = tree_facts({f"l{i}": np.zeros((8, 8)) for i in range(100)})
    assert validate_specs(facts, {f"l{i}": P("dp", "tp") for i in range(100)}, SIZES) == []
    assert facts._memo == []  # key paths are formatted only for findings


@pytest.mark.parametrize("bad", [[("dp", 2)], {"dp": 0}, {"dp": 2.0}, {1: 2}, {"dp": True}])
def test_bad_axis_sizes_are_type_errors(bad):
    with pytest.raises(MeshplanTypeError, match="axis_sizes"):
        validate_specs([np.zeros(2)], [P()], bad)


def test_finding_rejects_unknown_kinds():
    with pytest.raises(SpecError, match="nonsense"):
        Finding("a", "nonsense", "msg")
    with pytest.raises(MeshplanTypeError):
        Finding("a", 3, "msg")  # type: ignore[arg-type]
    assert str(Finding("a", "rank", "the message")) == "the message"
