"""ShardingAnalyzer and create_monitored_function on real 8-CPU meshes."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan import MeshShapeError, MeshplanTypeError, SpecError
from meshplan.facade import ShardingAnalyzer, create_monitored_function


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


@pytest.fixture(scope="module")
def params():
    return {"embed": jnp.zeros((32, 16), jnp.bfloat16), "dense": {"kernel": jnp.zeros((16, 8)), "bias": jnp.zeros(8)}}


@pytest.fixture(scope="module")
def specs():
    return {"embed": P("tp", "dp"), "dense": {"kernel": P("dp", "tp"), "bias": P()}}


# --- the reference docs' examples, verbatim apart from the import ------------------------------


def test_reference_estimate_memory_usage_example(mesh, params, specs, capsys):
    analyzer = ShardingAnalyzer(mesh)
    usage = analyzer.estimate_memory_usage(params, specs)
    print(f"Memory per device: {usage['size_per_device'] / 1e9:.2f} GB")
    assert capsys.readouterr().out == "Memory per device: 0.00 GB\n"
    assert usage["size_per_device"] == 32 * 16 * 2 // 8 + 16 * 8 * 4 // 8 + 8 * 4
    assert usage["total_size"] == 32 * 16 * 2 + 16 * 8 * 4 + 8 * 4


def test_reference_validate_partition_specs_example(mesh, params, specs, capsys):
    analyzer = ShardingAnalyzer(mesh)
    issues = analyzer.validate_partition_specs(params, specs)
    if issues:
        print("Validation failed:", issues)
    assert capsys.readouterr().out == ""
    specs = {"embed": P("tp", "dp"), "dense": {"kernel": P("dp", "tp"), "bias": P("dp", "tp")}}
    issues = analyzer.validate_partition_specs(params, specs)
    if issues:
        print("Validation failed:", issues)
    assert "Validation failed:" in capsys.readouterr().out
    assert issues == [
        "leaf 'dense/bias' has shape (8,) (rank 1) but spec P('dp', 'tp') has 2 entries; drop the extra entries."
    ]


def test_reference_create_monitored_function_example(mesh, params, specs, capsys):
    partition_specs = specs
    batch = jnp.ones((4, 16))

    @jax.jit
    def train_step(params, batch):
        return jax.tree.map(lambda p: p * 0.5, params), (batch @ params["dense"]["kernel"]).sum()

    analyzer = ShardingAnalyzer(mesh)
    monitored_train_step = create_monitored_function(
        train_step, partition_specs, analyzer
    )
    result, metrics = monitored_train_step(params, batch)
    print(f"Execution time: {metrics['execution_time']:.2f}s")
    assert capsys.readouterr().out.startswith("Execution time: ")
    assert metrics["validation_issues"] == []
    assert metrics["memory_usage"] == analyzer.estimate_memory_usage(params, specs)
    assert metrics["execution_time"] > 0


# --- the analyzer -----------------------------------------------------------------------------


def test_bytes_by_device_equals_live_placement(mesh, params, specs):
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    placed = jax.device_put(params, shardings)
    live = {d: 0 for d in mesh.devices.flat}
    for x in jax.tree.leaves(placed):
        for shard in x.addressable_shards:
            live[shard.device] += shard.data.nbytes
    assert ShardingAnalyzer(mesh).bytes_by_device(params, specs) == live


def test_mesh_defaults_to_the_current_one(mesh, params, specs):
    with jax.set_mesh(mesh):
        analyzer = ShardingAnalyzer()
    assert analyzer.mesh is mesh and analyzer.axis_sizes == {"dp": 2, "tp": 4}
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        abstract = ShardingAnalyzer()
    assert abstract.estimate_memory_usage(params, specs) == analyzer.estimate_memory_usage(params, specs)
    with pytest.raises(MeshplanTypeError, match="concrete Mesh"):
        abstract.bytes_by_device(params, specs)


def test_no_mesh_is_a_clear_error():
    with pytest.raises(MeshShapeError, match="jax.set_mesh"):
        ShardingAnalyzer()
    with pytest.raises(MeshplanTypeError, match="mesh="):
        ShardingAnalyzer(mesh=(2, 4))


def test_jit_values_may_split_unevenly_but_stored_ones_may_not(mesh):
    analyzer = ShardingAnalyzer(mesh)
    x = {"w": np.zeros((6, 8))}
    assert len(analyzer.validate_partition_specs(x, {"w": P("tp")})) == 1
    (warning,) = analyzer.findings(x, {"w": P("tp")}, for_storage=False)
    assert warning.severity == "warning" and "pads it to 8" in str(warning)
    with pytest.raises(SpecError, match="'w'"):
        analyzer.check_partition_specs(x, {"w": P("tp")})
    assert analyzer.estimate_memory(x, {"w": P("tp")}).padded


def test_packed_subbyte_analyzer_counts_int4_packed(mesh):
    x = {"q": jnp.zeros((16, 8), jnp.int4)}
    assert ShardingAnalyzer(mesh).estimate_memory_usage(x, {"q": P("dp")})["size_per_device"] == 64
    assert ShardingAnalyzer(mesh, packed_subbyte=True).estimate_memory_usage(x, {"q": P("dp")})["size_per_device"] == 32


# --- create_monitored_function ------------------------------------------------------------------


def test_specs_describe_the_first_argument_even_when_passed_by_keyword(mesh):
    analyzer = ShardingAnalyzer(mesh)
    step = create_monitored_function(lambda params, lr=1.0: params * lr, P("dp"), analyzer)
    calls = (
        lambda: step(jnp.ones(8), 0.5),
        lambda: step(params=jnp.ones(8), lr=0.5),
        lambda: step(lr=0.5, params=jnp.ones(8)),
    )
    for call in calls:
        result, metrics = call()
        np.testing.assert_array_equal(result, np.full(8, 0.5))
        assert metrics["memory_usage"]["size_per_device"] == 16


def test_arg_picks_another_argument_by_name_or_position(mesh):
    analyzer = ShardingAnalyzer(mesh)
    fn = lambda step, params: params  # noqa: E731
    by_name = create_monitored_function(fn, P("tp"), analyzer, arg="params")
    by_position = create_monitored_function(fn, P("tp"), analyzer, arg=1)
    assert by_name(0, params=jnp.ones(8))[1]["memory_usage"]["size_per_device"] == 8
    assert by_position(0, jnp.ones(8))[1]["memory_usage"]["size_per_device"] == 8
    with pytest.raises(MeshplanTypeError, match="no argument"):
        create_monitored_function(lambda *a: a, P(), analyzer, arg=2)(1)


def test_issues_warn_and_the_call_still_runs(mesh):
    analyzer = ShardingAnalyzer(mesh)
    step = create_monitored_function(lambda params: jax.tree.map(lambda x: x + 1, params), {"w": P("tp")}, analyzer)
    with pytest.warns(UserWarning, match="'w'.*does not divide by 4"):
        result, metrics = step({"w": jnp.zeros(6)})
    np.testing.assert_array_equal(result["w"], np.ones(6))
    assert len(metrics["validation_issues"]) == 1 and metrics["memory_usage"]["padded"]
    with pytest.warns(UserWarning, match="no spec"):
        _, metrics = step({"v": jnp.zeros(6)})
    assert metrics["memory_usage"] is None


def test_clean_calls_do_not_warn(mesh):
    step = create_monitored_function(lambda params: params, P("dp"), ShardingAnalyzer(mesh))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(jnp.zeros(8))


def test_the_clock_stops_only_after_the_result_is_ready(mesh):
    class Pending:
        ready = False

        def block_until_ready(self):
            self.ready = True
            return self

    step = create_monitored_function(lambda params: Pending(), P(), ShardingAnalyzer(mesh))
    result, _ = step(jnp.zeros(2))
    assert result.ready


def test_bad_arguments_are_type_errors(mesh):
    with pytest.raises(MeshplanTypeError, match="callable"):
        create_monitored_function(3, P(), ShardingAnalyzer(mesh))
    with pytest.raises(MeshplanTypeError, match="ShardingAnalyzer"):
        create_monitored_function(lambda x: x, P(), object())
    with pytest.raises(MeshplanTypeError, match="arg="):
        create_monitored_function(lambda x: x, P(), ShardingAnalyzer(mesh), arg=-1)
