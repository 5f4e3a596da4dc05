"""Drop-in behaviour (issue 9): code written for eformer / loadax / AXLearn runs after changing the import.

TPU topologies are plain device descriptions (tests/peers/tpu_devices.py, jax's own test devices);
everything else runs on the 8 real CPU devices from conftest.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax._src import mesh_utils
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import meshplan
from meshplan import (
    AutoShardingRule,
    CompositeShardingRule,
    DeviceLayoutError,
    HybridMeshShape,
    MeshConfig,
    MeshplanTypeError,
    MeshShapeError,
    NoMeshError,
    ShapeBasedShardingRule,
    ShardingRuleError,
    create_mesh,
)
from meshplan.facade import build_mesh, clear_mesh_cache, mesh_cache_info
from meshplan.pure.mesh import host_block_problems
from tests.peers.tpu_devices import tpu_devices, without_slice_index


def _ids(grid: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda d: d.id, otypes=[np.int64])(grid)


def _host_problems(mesh: jax.sharding.Mesh) -> tuple[str, ...]:
    return host_block_problems(_ids(mesh.devices), {d.id: d.process_index for d in mesh.devices.flat})


def _names(rank: int) -> tuple[str, ...]:
    return tuple(f"a{i}" for i in range(rank))


# --- multi-host TPU slices: every host one contiguous block ----------------------------------------

# (device_kind, x, y, z, slices): 2 to 16 hosts per slice (2x2 chips per host), single and multi-slice.
TOPOLOGIES = [
    ("TPU v4", 2, 2, 2, 1), ("TPU v4", 2, 2, 4, 1), ("TPU v4", 2, 4, 4, 1), ("TPU v4", 4, 4, 4, 1),
    ("TPU v5 lite", 2, 4, 1, 1), ("TPU v5 lite", 4, 4, 1, 1), ("TPU v5 lite", 4, 8, 1, 1),
    ("TPU v5p", 2, 2, 4, 1), ("TPU v5p", 2, 4, 4, 1),
    ("TPU v6 lite", 4, 4, 1, 1), ("TPU v6 lite", 8, 8, 1, 1),
    ("TPU v5 lite", 4, 4, 1, 2), ("TPU v4", 2, 2, 4, 2), ("TPU v6 lite", 2, 4, 1, 4),
]


def _mesh_shapes(n: int) -> list[tuple[int, ...]]:
    two = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    return two + [(2, n // 4, 2), (1, n, 1)] if n % 4 == 0 else two


@pytest.mark.parametrize("kind, x, y, z, slices", TOPOLOGIES)
def test_every_host_of_a_tpu_slice_is_one_contiguous_block(kind, x, y, z, slices):
    devices = tpu_devices(x, y, z, kind, num_slices=slices)
    for shape in _mesh_shapes(len(devices)):
        mesh = build_mesh(shape, _names(len(shape)), devices=devices)
        assert _host_problems(mesh) == (), (kind, (x, y, z), slices, shape)
        for p in {d.process_index for d in devices}:
            mesh._local_mesh(p)  # jax's own check: raises for a scattered host
        if slices > 1:  # each slice is still one block of the DCN grid (split on the first axis here)
            assert mesh.devices.shape == shape


@pytest.mark.parametrize("kind, x, y, z, slices", [t for t in TOPOLOGIES if t[4] == 1])
def test_single_slice_layout_is_jax_contiguous_submeshes_wherever_that_is_contiguous(kind, x, y, z, slices):
    devices = tpu_devices(x, y, z, kind)
    process_of = {d.id: d.process_index for d in devices}
    for shape in _mesh_shapes(len(devices)):
        try:
            expected = _ids(mesh_utils.create_device_mesh(
                shape, devices, contiguous_submeshes=True, allow_split_physical_axes=True))
        except (ValueError, AssertionError):
            continue  # jax has no contiguous layout for this case; meshplan plans its own
        if host_block_problems(expected, process_of):
            continue  # jax's v5e/v6e ring handlers ignore contiguous_submeshes; meshplan stays contiguous
        np.testing.assert_array_equal(_ids(build_mesh(shape, _names(len(shape)), devices=devices).devices), expected)


def test_jax_v4_4x4x4_mesh_16x4_was_scattered_before_and_is_jax_contiguous_now():
    devices = tpu_devices(4, 4, 4, "TPU v4")
    old = mesh_utils.create_device_mesh((16, 4), devices, allow_split_physical_axes=True)  # what meshplan did
    assert host_block_problems(_ids(old), {d.id: d.process_index for d in devices})
    mesh = build_mesh((16, 4), ("dp", "tp"), devices=devices)
    assert _host_problems(mesh) == ()
    np.testing.assert_array_equal(
        _ids(mesh.devices), _ids(mesh_utils.create_device_mesh((16, 4), devices, contiguous_submeshes=True)))


def test_opting_out_takes_jax_default_layout_even_if_hosts_scatter():
    devices = tpu_devices(4, 4, 4, "TPU v4")
    mesh = build_mesh((16, 4), ("dp", "tp"), devices=devices, contiguous_hosts=False)
    np.testing.assert_array_equal(
        _ids(mesh.devices), _ids(mesh_utils.create_device_mesh((16, 4), devices, allow_split_physical_axes=True)))
    assert _host_problems(mesh)


def _lopsided_hosts():
    # Host 0 owns one chip of a 2x2 slice, host 1 the other three.
    return [d if d.id == 0 else type(d)(d.id, d.platform, d.device_kind, 1, d.coords, d.core_on_chip)
            for d in tpu_devices(2, 2, 1, "TPU v4")]


def test_meshplans_own_host_blocks_split_physical_axes_so_they_need_that_allowed():
    devices = tpu_devices(4, 4, 4, "TPU v4")  # jax has no contiguous (64,) layout here
    assert _host_problems(build_mesh((64,), ("x",), devices=devices)) == ()
    with pytest.raises(DeviceLayoutError, match="allow_split_physical_axes=True"):
        build_mesh((64,), ("x",), devices=devices, allow_split_physical_axes=False)


def test_hosts_with_no_contiguous_layout_are_an_error_or_an_explicit_opt_out():
    devices = _lopsided_hosts()
    with pytest.raises(DeviceLayoutError, match="contiguous_hosts=False"):
        build_mesh((2, 2), ("x", "y"), devices=devices)  # three devices are never a box of a 2x2 grid
    assert build_mesh((2, 2), ("x", "y"), devices=devices, contiguous_hosts=False).devices.shape == (2, 2)
    assert _host_problems(build_mesh((4,), ("x",), devices=devices)) == ()  # 1 + 3 in a row: both contiguous


# --- TPU devices without slice_index: slice 0 --------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 8), (4, 4), (1, 2, 8), (16,)])
def test_tpu_devices_without_slice_index_over_several_hosts_are_one_slice(shape):
    devices = without_slice_index(tpu_devices(4, 4, 1, "TPU v4"))  # 4 hosts, no slice_index attribute
    assert not hasattr(devices[0], "slice_index")
    mesh = build_mesh(shape, _names(len(shape)), devices=devices)
    assert mesh.devices.shape == shape and _host_problems(mesh) == ()
    config = MeshConfig(mesh_shape=shape, mesh_axis_names=_names(len(shape)))
    assert config.create_device_mesh(devices=devices) == mesh
    with pytest.raises(MeshShapeError, match="Product of DCN mesh"):
        build_mesh(HybridMeshShape((-1, 4), (2, 1)), ("a", "b"), devices=devices)


# --- numpy integers and the caller's argument names -------------------------------------------------


def test_numpy_integers_are_dims_everywhere():
    i = np.int64
    mesh = create_mesh((i(2), i(4)), ("data", "model"))
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert create_mesh((i(2), np.int32(-1)), ("data", "model"), dcn_mesh_dims=(i(1), i(1))) is mesh
    assert meshplan.calculate_host_mesh_shape((i(2), i(4)), total_devices=i(4), num_processes=i(2)) == (1, 4)
    assert HybridMeshShape((i(1), i(8)), (np.uint8(1), i(1))).global_shape == (1, 8)
    config = MeshConfig(mesh_shape=(i(2), i(4)), mesh_axis_names=("data", "model"))
    assert config.mesh_shape == (2, 4) and type(config.mesh_shape[0]) is int
    assert config.create_device_mesh() is mesh


def test_messages_name_the_argument_as_the_caller_wrote_it():
    with pytest.raises(MeshShapeError, match=r"^axis_dims=\(2, 3\)") as err:
        create_mesh((2, 3), ("a", "b"))
    assert "mesh_shape" not in str(err.value)
    with pytest.raises(MeshShapeError, match=r"^mesh_shape=\(2, 3\)"):
        MeshConfig(mesh_shape=(2, 3), mesh_axis_names=("a", "b")).create_device_mesh()
    with pytest.raises(MeshplanTypeError, match=r"axis_dims\[0\]"):
        create_mesh((2.0, 4), ("a", "b"))


def test_messages_carry_the_words_peer_users_match_on():
    with pytest.raises(MeshShapeError, match="doesn't match"):  # eformer
        create_mesh((2, 3), ("a", "b"))
    with pytest.raises(MeshShapeError, match="The mesh shapes must have the same number of axes"):  # loadax
        HybridMeshShape((1, 4), (1, 1, 1))
    with pytest.raises(MeshShapeError, match="same length"):  # AXLearn
        HybridMeshShape((1, 2), (3,))
    with pytest.raises(MeshShapeError, match="Product of ICI mesh"):  # AXLearn
        create_mesh(HybridMeshShape((1, 4), (1, 1)), ("a", "b"))
    with pytest.raises(MeshShapeError, match="Product of DCN mesh"):  # AXLearn
        create_mesh(HybridMeshShape((1, 4), (2, 1)), ("a", "b"))


# --- MeshConfig: assignable, checked ------------------------------------------------------------------


def test_mesh_config_fields_are_assignable_like_loadax():
    config = MeshConfig(mesh_shape=(1, 8), mesh_axis_names=("data", "model"))
    config.mesh_shape = (4, 2)
    assert dict(config.create_device_mesh().shape) == {"data": 4, "model": 2}
    config.mesh_axis_names = ("a", "b", "c")  # fields may disagree for a moment ...
    config.mesh_shape = (2, 2, 2)  # ... and agree again before the mesh is made
    assert dict(config.create_device_mesh().shape) == {"a": 2, "b": 2, "c": 2}
    config.mesh_axis_names = ("x",)
    with pytest.raises(MeshShapeError, match="has 3 axes but mesh_axis_names"):
        config.create_device_mesh()


@pytest.mark.parametrize("field, value, error", [
    ("mesh_shape", (0, 8), MeshShapeError),
    ("mesh_shape", (2.0, 4), MeshplanTypeError),
    ("mesh_shape", (-1, -1), MeshShapeError),
    ("mesh_shape", "2,4", MeshplanTypeError),
    ("batch_axis_names", 3, MeshplanTypeError),
    ("batch_axis_names", None, MeshplanTypeError),
    ("batch_axis_names", ["data", 3], MeshplanTypeError),
    ("mesh_axis_names", ("a", "a"), MeshShapeError),  # (the message says axis_names=)
    ("mesh_rules", [("(", (2, 4))], meshplan.MeshRuleError),
])
def test_mesh_config_rejects_bad_fields_when_built_and_when_assigned(field, value, error):
    fields = {"mesh_shape": (2, 4), "mesh_axis_names": ("data", "model")}
    with pytest.raises(error, match=field.removeprefix("mesh_")):
        MeshConfig(**{**fields, field: value})
    config = MeshConfig(**fields)
    before = getattr(config, field)
    with pytest.raises(error, match=field.removeprefix("mesh_")):
        setattr(config, field, value)
    assert getattr(config, field) == before  # a refused value is not kept


# --- ShapeBasedShardingRule without a mesh ------------------------------------------------------------

PATTERNS = {(None, 1024): P("tp", None), (1024, 1024): P("tp", None)}
PARAMS = {"emb": np.zeros((64, 1024), np.float32), "w": np.zeros((1024, 1024), np.float32), "b": np.zeros(8)}


def _mesh(shape=(2, 4), names=("dp", "tp")):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


def test_shape_rule_applies_with_no_mesh_like_eformers_example():
    expected = {"b": P(), "emb": P("tp", None), "w": P("tp", None)}
    assert ShapeBasedShardingRule(PATTERNS).apply(PARAMS) == expected
    assert CompositeShardingRule(ShapeBasedShardingRule(PATTERNS)).apply(PARAMS) == expected
    assert "no mesh" in ShapeBasedShardingRule(PATTERNS).plan(PARAMS).explain("emb")


def test_shape_rule_checks_what_needs_no_mesh_when_built():
    with pytest.raises(ShardingRuleError, match="rank 2"):
        ShapeBasedShardingRule({(None, 1024): P("tp", None, None)})
    with pytest.raises(ShardingRuleError, match="more than once"):
        ShapeBasedShardingRule({(None, 1024): P("tp", "tp")})


def test_shape_rule_checks_against_any_mesh_that_is_known():
    bad = {(None, 1024): P("zz", None)}
    assert ShapeBasedShardingRule(bad).apply(PARAMS)["emb"] == P("zz", None)  # no mesh: nothing to check
    with pytest.raises(ShardingRuleError, match="not axes of the mesh"):  # given
        ShapeBasedShardingRule(bad, mesh=_mesh()).apply(PARAMS)
    with jax.set_mesh(_mesh()), pytest.raises(ShardingRuleError, match="not axes of the mesh"):  # current
        ShapeBasedShardingRule(bad).apply(PARAMS)
    with pytest.raises(ShardingRuleError, match="not axes of the mesh"):  # a composite sibling's
        CompositeShardingRule(ShapeBasedShardingRule(bad), AutoShardingRule(mesh=_mesh())).apply(PARAMS)
    with pytest.raises(ShardingRuleError, match="not divisible"):  # dim 0 (6) over tp=4
        ShapeBasedShardingRule({(None, 1024): P("tp", None)}, mesh=_mesh()).apply({"w": np.zeros((6, 1024))})


def test_rules_that_need_axis_sizes_still_need_a_mesh():
    with pytest.raises(NoMeshError):
        AutoShardingRule().apply(PARAMS)
    with pytest.raises(NoMeshError):
        meshplan.MemoryConstrainedShardingRule(1024).apply(PARAMS)
    with pytest.raises(NoMeshError):
        CompositeShardingRule(ShapeBasedShardingRule(PATTERNS), AutoShardingRule()).apply(PARAMS)


# --- the mesh cache builds each request once --------------------------------------------------------


def _hammer(call, threads=16):
    start = threading.Barrier(threads)
    results: list[object] = [None] * threads

    def run(k):
        start.wait()  # all threads ask at once
        try:
            results[k] = call()
        except Exception as err:  # noqa: BLE001 - collected and checked by the test
            results[k] = err

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results


def test_sixteen_concurrent_callers_share_one_build():
    clear_mesh_cache()
    devices = tpu_devices(8, 8, 1, "TPU v6 lite")
    results = _hammer(lambda: build_mesh((16, 4), ("dp", "tp"), devices=devices))
    assert mesh_cache_info()["builds"] == 1
    assert all(r is results[0] for r in results)


def test_a_failed_build_reaches_every_waiter_and_is_not_cached():
    clear_mesh_cache()
    devices = _lopsided_hosts()
    results = _hammer(lambda: build_mesh((2, 2), ("x", "y"), devices=devices))
    assert all(isinstance(r, DeviceLayoutError) for r in results)
    assert mesh_cache_info()["builds"] == 0 and mesh_cache_info()["size"] == 0
