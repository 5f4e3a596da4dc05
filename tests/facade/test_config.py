"""MeshConfig on 8 real CPU devices."""

import jax
import pytest

from meshplan import HybridMeshShape, MeshConfig, MeshRuleError, MeshShapeError, MeshplanTypeError


def test_plain_shape_on_one_process_lays_out_all_devices() -> None:
    mesh = MeshConfig(mesh_shape=(2, 4), mesh_axis_names=("data", "model")).create_device_mesh()
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert [d.id for d in mesh.devices.flat] == list(range(8))


def test_hybrid_shape_is_honoured() -> None:
    config = MeshConfig(mesh_shape=HybridMeshShape((1, 8), (1, 1)), mesh_axis_names=("data", "model"))
    assert dict(config.create_device_mesh().shape) == {"data": 1, "model": 8}


def test_passed_devices_are_laid_out_not_used_as_given() -> None:
    config = MeshConfig(mesh_shape=(2, 4), mesh_axis_names=("data", "model"))
    shuffled = list(reversed(jax.devices()))
    mesh = config.create_device_mesh(devices=shuffled)
    assert mesh == config.create_device_mesh()
    import numpy as np

    as_array = config.create_device_mesh(devices=np.array(shuffled).reshape(4, 2))
    assert as_array == mesh


def test_mesh_rules_first_full_match_wins() -> None:
    config = MeshConfig(
        mesh_shape=(1, -1),
        mesh_axis_names=("data", "model"),
        mesh_rules=[("tpu-v4-.*", (4, -1)), ("cpu-.*", (2, -1)), ("cpu-8", (8, 1))],
    )
    assert dict(config.create_device_mesh(mesh_selector="cpu-8").shape) == {"data": 2, "model": 4}
    assert dict(config.create_device_mesh(mesh_selector="xcpu-8").shape) == {"data": 1, "model": 8}
    assert dict(config.create_device_mesh().shape) == {"data": 1, "model": 8}


def test_mesh_rule_selecting_none_is_a_clear_error() -> None:
    config = MeshConfig(mesh_shape=(1, -1), mesh_axis_names=("a", "b"), mesh_rules=[("gpu-.*", None)])
    with pytest.raises(MeshRuleError, match="gpu-h100"):
        config.create_device_mesh(mesh_selector="gpu-h100")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(mesh_shape=(2, 4), mesh_axis_names=("a",)), MeshShapeError),
        (dict(mesh_shape=(2, 4), mesh_axis_names=("a", "b"), batch_axis_names="c"), MeshShapeError),
        (dict(mesh_shape=(2, 4), mesh_axis_names=("a", "b"), batch_axis_names=("a", "c")), MeshShapeError),
        (dict(mesh_shape=8, mesh_axis_names=("a",)), MeshplanTypeError),
        (dict(mesh_shape=(2, 4), mesh_axis_names=("a", "b"), batch_axis_names="a",
              mesh_rules=[("x", (1, 2, 4))]), MeshShapeError),
        (dict(mesh_shape=(2, 4), mesh_axis_names=("a", "b"), batch_axis_names="a",
              mesh_rules=[("(", (2, 4))]), MeshRuleError),
    ],
)
def test_bad_configs_fail_when_built(kwargs, error) -> None:
    with pytest.raises(error):
        MeshConfig(**kwargs)


def test_default_batch_axis_needs_no_data_axis() -> None:
    assert MeshConfig(mesh_shape=(8,), mesh_axis_names=("fsdp",)).batch_axis_names == "data"


def test_hosts_and_host_id_come_from_jax() -> None:
    config = MeshConfig(mesh_shape=(8,), mesh_axis_names=("data",))
    assert (config.hosts, config.host_id) == (jax.process_count(), jax.process_index())
