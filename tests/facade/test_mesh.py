"""create_mesh and friends on 8 real XLA CPU devices."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType

import meshplan
from meshplan import (
    DeviceLayoutError,
    MeshplanError,
    MeshplanTypeError,
    MeshShapeError,
    MeshStringError,
    cpu_context,
    create_cpu_mesh,
    create_mesh,
    force_cpu,
    parse_mesh_from_string,
)
from meshplan.facade._mesh import clear_mesh_cache, mesh_cache_info
from meshplan.pure import MeshShape
from meshplan.testing import mesh_shapes


def _ids(mesh: jax.sharding.Mesh) -> list[int]:
    return [d.id for d in mesh.devices.flat]


# --- the reference docs' examples, verbatim apart from the import ---------------------------------


def test_reference_example_create_mesh_with_data_and_model_axes() -> None:
    mesh = create_mesh(
        axis_dims=(2, 4),
        axis_names=('data', 'model')
    )
    with jax.set_mesh(mesh):  # the reference's `with mesh:` is deprecated in jax 0.10
        pass
    assert dict(mesh.shape) == {"data": 2, "model": 4}


def test_reference_example_parse_mesh_from_string_named_and_positional() -> None:
    mesh = parse_mesh_from_string("dp:2,tp:4", ["dp", "tp"])
    assert dict(mesh.shape) == {"dp": 2, "tp": 4}
    mesh = parse_mesh_from_string("2,4", ["data", "model"])
    assert dict(mesh.shape) == {"data": 2, "model": 4}


def test_reference_example_cpu_context_runs_jitted_code() -> None:
    with cpu_context() as mesh:

        @jax.jit
        def fn(x):
            return x * 2
        result = fn(jax.numpy.ones((4, 4)))
    assert mesh.devices.size == 8
    chex_result = np.asarray(result)
    np.testing.assert_array_equal(chex_result, np.full((4, 4), 2.0))


def test_reference_example_force_cpu_yields_the_cpu_device() -> None:
    array = jnp.arange(4.0)
    with force_cpu() as cpu_device:
        result = jax.numpy.sum(array)
    assert cpu_device.platform == "cpu"
    assert float(result) == 6.0


# --- agreement with jax ------------------------------------------------------------------------------


@given(mesh_shapes(num_devices=8), st.booleans())
def test_create_mesh_matches_jax_make_mesh_device_order(mesh: MeshShape, use_jax: bool) -> None:
    shape, names = mesh.sizes, mesh.names
    ours = create_mesh(shape, names, use_jax=use_jax)
    theirs = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
    assert ours.axis_names == theirs.axis_names
    assert ours.devices.shape == theirs.devices.shape
    assert _ids(ours) == _ids(theirs)


@given(mesh_shapes(num_devices=8), st.integers(0, 2))
def test_minus_one_takes_the_remaining_devices(mesh: MeshShape, hole: int) -> None:
    shape, names = mesh.sizes, mesh.names
    hole = hole % len(shape)
    dims = tuple(-1 if i == hole else d for i, d in enumerate(shape))
    assert create_mesh(dims, names).devices.shape == shape


@pytest.mark.parametrize("use_jax", [False, True])
def test_both_paths_give_auto_axis_types_by_default(use_jax: bool) -> None:
    mesh = create_mesh((2, 4), ("x", "y"), use_jax=use_jax)
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)


@pytest.mark.parametrize("use_jax", [False, True])
@pytest.mark.parametrize(
    "axis_types, expected",
    [
        ("explicit", (AxisType.Explicit,) * 2),
        (AxisType.Manual, (AxisType.Manual,) * 2),
        (("auto", "explicit"), (AxisType.Auto, AxisType.Explicit)),
    ],
)
def test_axis_types_accept_strings_and_enums_on_both_paths(use_jax, axis_types, expected) -> None:
    assert create_mesh((2, 4), ("x", "y"), axis_types=axis_types, use_jax=use_jax).axis_types == expected


def test_default_arguments_give_an_fsdp_mesh_over_all_devices() -> None:
    mesh = create_mesh()
    assert dict(mesh.shape) == {"dp": 1, "fsdp": 8, "ep": 1, "tp": 1, "sp": 1}
    assert dict(create_cpu_mesh().shape) == dict(mesh.shape)


def test_dcn_mesh_dims_of_ones_is_accepted_on_one_process() -> None:
    mesh = create_mesh((2, 4), ("x", "y"), dcn_mesh_dims=(1, 1))
    assert _ids(mesh) == list(range(8))


# --- the cache --------------------------------------------------------------------------------------


def test_cache_returns_the_same_mesh_for_the_same_resolved_request() -> None:
    clear_mesh_cache()
    first = create_mesh((2, -1), ("x", "y"))
    assert create_mesh((2, 4), ("x", "y")) is first
    assert create_mesh((2, -1), ("x", "y")) is first
    info = mesh_cache_info()
    assert info["hits"] >= 2 and info["size"] >= 2


def test_cache_keys_on_the_device_set() -> None:
    config = meshplan.MeshConfig(mesh_shape=(1, -1), mesh_axis_names=("x", "y"))
    four = config.create_device_mesh(devices=jax.devices()[:4])
    eight = config.create_device_mesh()
    assert four is not eight
    assert four.devices.size == 4 and eight.devices.size == 8


def test_cache_is_safe_under_concurrent_callers() -> None:
    clear_mesh_cache()
    results: list[jax.sharding.Mesh] = []
    lock = threading.Lock()

    def work() -> None:
        mesh = create_mesh((4, 2), ("p", "q"))
        with lock:
            results.append(mesh)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16
    assert len({id(m) for m in results}) <= 2  # racing first builders may each build once
    assert all(m == results[0] for m in results)


# --- CPU helpers ---------------------------------------------------------------------------------------


def test_force_cpu_restores_the_previous_default_device() -> None:
    third = jax.devices()[3]
    with jax.default_device(third):
        with force_cpu() as cpu:
            assert jnp.ones(2).devices() == {cpu}
        assert jnp.ones(2).devices() == {third}


def test_cpu_context_sets_and_restores_the_current_mesh() -> None:
    before = jax.sharding.get_abstract_mesh()
    with cpu_context((2, 4), ("a", "b")) as mesh:
        assert jax.sharding.get_mesh() == mesh
    assert jax.sharding.get_abstract_mesh() == before


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        (dict(axis_dims=(3, 3), axis_names=("a", "b")), MeshShapeError, "(3, 3)"),
        (dict(axis_dims=(-1, -1), axis_names=("a", "b")), MeshShapeError, "-1"),
        (dict(axis_dims=(3, -1), axis_names=("a", "b")), MeshShapeError, "3"),
        (dict(axis_dims=(0, 8), axis_names=("a", "b")), MeshShapeError, "0"),
        (dict(axis_dims=(2, 4), axis_names=("a", "a")), MeshShapeError, "'a'"),
        (dict(axis_dims=(2, 4), axis_names=("a",)), MeshShapeError, "axis"),
        (dict(axis_dims=(2, 4), axis_names="ab"), MeshplanTypeError, "ab"),
        (dict(axis_dims="2,4", axis_names=("a", "b")), MeshplanTypeError, "parse_mesh_from_string"),
        (dict(axis_dims=(2.0, 4), axis_names=("a", "b")), MeshplanTypeError, "2.0"),
        (dict(axis_dims=(2, 4), axis_names=("a", "b"), backend="nope"), DeviceLayoutError, "nope"),
        (dict(axis_dims=(2, 4), axis_names=("a", "b"), axis_types="fast"), MeshShapeError, "fast"),
        (dict(axis_dims=(2, 4), axis_names=("a", "b"), axis_types=("auto",)), MeshShapeError, "auto"),
        (dict(axis_dims=(2, 4), axis_names=("a", "b"), dcn_mesh_dims=(2, 1)), MeshplanError, "(2, 1)"),
        (dict(axis_dims=(2, 4), axis_names=("a", "b"), dcn_mesh_dims=(1,)), MeshShapeError, "(1,)"),
    ],
)
def test_bad_requests_raise_typed_errors_naming_the_value(kwargs, error, fragment) -> None:
    with pytest.raises(error) as info:
        create_mesh(**kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize("text", ["", "dp:2:3", "dp:2,dp:4", "xx:8", "dp:two", "2,4,1"])
def test_parse_mesh_from_string_rejects_malformed_strings(text: str) -> None:
    with pytest.raises(MeshStringError):
        parse_mesh_from_string(text, ["dp", "tp"])
