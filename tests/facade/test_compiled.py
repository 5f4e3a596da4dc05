"""compiled_memory and the reference train steps: XLA's own figures, on CPU and for a TPU topology.

The CPU step is compiled once per module (a few seconds); the TPU cases need
libtpu (``pip install 'meshplan[tpu]'``) and are skipped with that reason
without it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import meshplan
from meshplan.errors import CompiledOutOfMemoryError, MeshplanTypeError, PlanError
from meshplan.facade.verify._compilers import libtpu_available
from meshplan.pure import AxisKindRule, estimate_training_memory, plan_tree
from meshplan.pure.presets import MODEL_SPECS, build_params

FAST = {"xla_backend_optimization_level": 0}  # LLVM effort only: buffer assignment comes before it
needs_libtpu = pytest.mark.skipif(not libtpu_available(),
                                  reason="libtpu is not installed (pip install 'meshplan[tpu]'): no TPU AOT")

TINY = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny-llama", num_layers=2, hidden_size=64,
                           num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=256,
                           num_params=None)


def _mesh(sizes: dict[str, int]) -> jax.sharding.Mesh:
    return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes))


@pytest.fixture(scope="module")
def cpu_llama() -> tuple[meshplan.ReferenceStep, meshplan.CompiledMemory]:
    ref = meshplan.reference_step(TINY, _mesh({"fsdp": 2, "tp": 4}), batch=4, seq=32)
    return ref, meshplan.compiled_memory(ref.fn, *ref.args, compiler_options=FAST)


def test_argument_bytes_are_the_planners_params_and_optimizer_exactly(cpu_llama):
    ref, mem = cpu_llama
    sizes = {"fsdp": 2, "tp": 4}
    tree = build_params(TINY)
    est = estimate_training_memory(tree, plan_tree(tree, AxisKindRule.for_model(TINY), sizes).specs, sizes,
                                   optimizer_copies=2, optimizer_dtype="float32").to_dict()
    adam_count = 4  # optax's int32 step counter, replicated
    tokens = 2 * (4 // 2) * 32 * 4  # inputs + targets, int32, batch split over fsdp
    assert mem.argument_bytes == est["params"] + est["opt_state"] + adam_count + tokens
    # The donated state comes back in place: every state byte is aliased, the tokens are not.
    assert mem.alias_bytes == est["params"] + est["opt_state"] + adam_count
    assert mem.platform == "cpu" and mem.num_devices == 8
    assert mem.peak_bytes == mem.argument_bytes + mem.output_bytes - mem.alias_bytes + mem.temp_bytes
    assert "XLA:CPU" in mem.peak_source


def test_the_largest_live_buffers_at_the_peak_come_from_xlas_buffer_assignment(cpu_llama):
    _, mem = cpu_llama
    top = mem.largest
    assert len(top) == 10 and "fullest step" in mem.largest_note
    sizes = [b.bytes for b in top]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 0
    assert sum(sizes) <= mem.peak_bytes
    # The donated train state is live at the peak; a parameter's source is its path in the step's arguments.
    params = [b for b in top if b.kind == "parameter"]
    assert all(b.source.startswith("state[") for b in params)
    assert sum(b.bytes for b in params) <= mem.argument_bytes
    # Temporaries name the jax operation that made them (remat and the backward pass of the scanned layers).
    assert any(b.kind == "temp" and "jit(step)/" in b.source for b in top)
    assert all(b.memory_space == "default" and b.shape.startswith(b.dtype + "[") for b in top)


def test_every_buffer_listed_adds_up_to_xlas_peak(cpu_llama):
    # Listed whole, the buffers live at the fullest step are the peak memory_analysis() reports: on
    # XLA:CPU to the byte but for alignment (on XLA:TPU v6e-8 / v5p-16 train steps, 2026-11-23: 186.2 of
    # 186.2 MiB, 6035.5 of 6035.5, 8382.2 of 8382.2; docs/design-notes.md, "The buffers at the peak").
    ref, _ = cpu_llama
    mem = meshplan.compiled_memory(ref.fn, *ref.args, compiler_options=FAST, top_buffers=10_000)
    listed = sum(b.bytes for b in mem.largest)
    assert 0.99 * mem.peak_bytes <= listed <= mem.peak_bytes


def test_a_dump_with_neither_live_ranges_nor_a_peak_lists_nothing_and_says_so(tmp_path):
    from meshplan.facade.verify._compiled import _largest

    (tmp_path / "module.jit_step-live-range.txt").write_text("HloLiveRange (max 0):\n")
    (tmp_path / "module.jit_step-buffer-assignment.txt").write_text("BufferAssignment:\n")
    note = "not available: XLA's live-range report has no live ranges and states no peak"
    assert _largest(str(tmp_path), 10, {}) == ((), note)


def test_the_dump_lives_in_a_temporary_directory_removed_afterwards(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where TemporaryDirectory puts it, for this test
    x = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    mem = meshplan.compiled_memory(jax.jit(lambda a, b: jnp.tanh(a @ b) * 2, donate_argnums=0), x, x,
                                   compiler_options=FAST, top_buffers=2)
    assert list(tmp_path.iterdir()) == []
    assert [b.shape for b in mem.largest] == ["f32[512,512]"] * 2
    assert {b.source for b in mem.largest} <= {"a", "b", "jit(<lambda>)/mul", "jit(<lambda>)/dot_general"}
    none = meshplan.compiled_memory(jax.jit(lambda a: a), x, top_buffers=0)
    assert none.largest == () and "top_buffers=0" in none.largest_note
    with pytest.raises(PlanError, match="top_buffers=-1"):
        meshplan.compiled_memory(jax.jit(lambda a: a), x, top_buffers=-1)


def test_reference_step_shardings_follow_the_plan(cpu_llama):
    ref, _ = cpu_llama
    params, opt_state = ref.args[0]
    q = params["model"]["layers"]["dense"]["self_attn"]["q_proj"]["weight"]
    assert q.shape == (2, 64, 64)  # two layers stacked
    assert q.sharding.spec[0] is None and ref.batch_spec == P("fsdp", None)
    mu = opt_state[0].mu["model"]["layers"]["dense"]["self_attn"]["q_proj"]["weight"]
    assert mu.dtype == jnp.float32 and mu.sharding.spec == q.sharding.spec


def test_a_users_own_step_on_eight_devices():
    mesh = _mesh({"dp": 8})
    x = jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=NamedSharding(mesh, P("dp")))
    mem = meshplan.compiled_memory(jax.jit(lambda a: jnp.tanh(a) * 2, donate_argnums=0), x, mesh=mesh,
                                   compiler_options=FAST)
    assert mem.argument_bytes == mem.output_bytes == mem.alias_bytes == 1024 * 256 * 4 // 8
    assert mem.num_devices == 8 and mem.compile_seconds > 0


def test_bad_arguments_are_typed_errors():
    with pytest.raises(MeshplanTypeError, match="step="):
        meshplan.compiled_memory(42)
    with pytest.raises(MeshplanTypeError, match="mesh="):
        meshplan.compiled_memory(jax.jit(lambda a: a), jnp.zeros(2), mesh="dp=2")
    with pytest.raises(PlanError, match="remat='sometimes'"):
        meshplan.ReferenceConfig(remat="sometimes")
    with pytest.raises(PlanError, match="batch=3 must divide"):
        meshplan.reference_step(TINY, _mesh({"fsdp": 2, "tp": 4}), batch=3, seq=32)
    with pytest.raises(PlanError, match="needs a TPU or GPU target"):
        meshplan.reference_step(TINY, _mesh({"fsdp": 2, "tp": 4}), batch=4, seq=32,
                                config=meshplan.ReferenceConfig(attention="flash"))
    with pytest.raises(PlanError, match="pinned host"):
        meshplan.reference_step(TINY, _mesh({"fsdp": 2, "tp": 4}), batch=4, seq=32,
                                config=meshplan.ReferenceConfig(remat="offload"))


@needs_libtpu
def test_tpu_topology_devices_match_the_cluster():
    from meshplan.pure.cluster import parse_cluster, tpu_topology

    for text in ("v5e-4", "v5p-8", "2xv5e-4"):
        mesh = meshplan.tpu_topology_mesh(text, ("dp",), (parse_cluster(text).num_devices,))
        topo = tpu_topology(parse_cluster(text))
        assert mesh.devices.size == topo.num_devices == parse_cluster(text).num_devices
        assert {d.platform for d in mesh.devices.flat} == {"tpu"}
        # Single-slice topology devices carry no slice_index.
        assert {getattr(d, "slice_index", 0) for d in mesh.devices.flat} == set(range(topo.num_slices))


@needs_libtpu
def test_tpu_aot_argument_bytes_match_the_planner_up_to_tile_padding():
    spec = dataclasses.replace(TINY, hidden_size=256, head_dim=64, intermediate_size=512, vocab_size=1024)
    sizes = {"fsdp": 2, "tp": 2}
    # Pallas flash attention under shard_map: the TPU-only attention kind compiles ahead of time too.
    ref = meshplan.reference_step(spec, meshplan.tpu_topology_mesh("v5e-4", tuple(sizes), tuple(sizes.values())),
                                  batch=4, seq=128, config=meshplan.ReferenceConfig(attention="flash"))
    mem = meshplan.compiled_memory(ref.fn, *ref.args)
    tree = build_params(spec)
    est = estimate_training_memory(tree, plan_tree(tree, AxisKindRule.for_model(spec), sizes).specs, sizes,
                                   optimizer_copies=2, optimizer_dtype="float32").to_dict()
    planned = est["params"] + est["opt_state"]
    assert mem.platform == "tpu" and mem.device_kind == "TPU v5 lite" and mem.num_devices == 4
    assert mem.peak_source == "peak_memory_in_bytes" and mem.peak_bytes == mem.reported_peak_bytes
    # TPU stores arrays in (8|16, 128) tiles: the stacked (2, 256) norm weights and the counter pad up.
    assert planned <= mem.argument_bytes <= 1.02 * planned
    assert mem.peak_bytes >= mem.argument_bytes
    # The largest buffers live at the peak, in HBM, at their tiled (padded) device sizes.
    assert len(mem.largest) == 10 and "fullest step" in mem.largest_note
    assert [b.bytes for b in mem.largest] == sorted((b.bytes for b in mem.largest), reverse=True)
    assert sum(b.bytes for b in mem.largest) <= mem.peak_bytes
    assert all(b.bytes >= b.logical_bytes > 0 and b.memory_space == "default" for b in mem.largest)
    assert any(b.source.startswith("state[") for b in mem.largest)


@needs_libtpu
def test_a_step_that_does_not_fit_is_a_typed_error_with_xlas_text():
    mesh = meshplan.tpu_topology_mesh("v5e-4", ("dp",), (4,))
    ref = meshplan.reference_step("llama3-8b", mesh, batch=4, seq=2048)  # 8B replicated: 16 GB of bf16 alone
    with pytest.raises(CompiledOutOfMemoryError, match="does not fit on 4 x TPU v5 lite") as info:
        meshplan.compiled_memory(ref.fn, *ref.args)
    err = info.value
    assert "Ran out of memory" in err.xla_message
    assert err.required_bytes is not None and err.available_bytes is not None
    assert err.required_bytes > err.available_bytes > 15 * 2**30
    assert isinstance(err, ValueError)  # a MemoryBudgetError, catchable without meshplan


def test_tpu_mesh_needs_a_tpu_cluster_and_a_matching_shape():
    with pytest.raises(meshplan.ClusterError, match="not a TPU cluster"):
        meshplan.tpu_topology_mesh("8xH100", ("dp",), (8,))
    if libtpu_available():
        with pytest.raises(PlanError, match="multiplying to the 4 devices"):
            meshplan.tpu_topology_mesh("v5e-4", ("dp",), (8,))


def test_gpu_mesh_without_the_cuda_plugin_says_what_to_install():
    # With no GPU, the shipped target description stands in for one; that needs the CUDA plugin
    # (tests/facade/test_compiled_gpu.py compiles with it).
    from meshplan.facade.verify._compilers import cuda_plugin_problem

    problem = cuda_plugin_problem()
    if problem is None:
        pytest.skip("the jax CUDA plugin is installed: test_compiled_gpu.py covers the deviceless mesh")
    with pytest.raises(meshplan.ClusterError, match=r"no local H100: .*pip install"):
        meshplan.gpu_topology_mesh("1x8xH100", ("fsdp",), (8,))


def test_numpy_devices_stay_cpu():
    # Installing libtpu must not move the suite's default backend off the 8 CPU devices.
    assert jax.default_backend() == "cpu" and len(jax.devices()) == 8
    assert np.asarray(jnp.ones(2)).sum() == 2


def test_a_search_candidate_brings_its_specs_and_layout():
    from meshplan.pure import search_meshes
    from meshplan.pure.cluster import Cluster, DEVICE_SPECS

    cluster = Cluster(DEVICE_SPECS["H100"], num_nodes=1, devices_per_node=8)
    for cand in search_meshes(TINY, cluster, batch=8, seq=32, top_k=3).candidates:
        mesh = _mesh(cand.mesh_shape)
        ref = meshplan.reference_step(TINY, mesh, batch=8, seq=32, plan=cand)
        assert "plan's batch" in ref.layout_source
        assert ref.args[1]["inputs"].sharding.spec == ref.batch_spec
        assert tuple(ref.batch_spec)[0] == tuple(cand.batch_spec)[0]
        q = ref.args[0][0]["model"]["layers"]["dense"]["self_attn"]["q_proj"]["weight"]
        planned = cand.specs_for(build_params(TINY))["model"]["layers"]["0"]["self_attn"]["q_proj"]["weight"]
        assert tuple(q.sharding.spec) == (None, *planned)


@pytest.mark.parametrize("dense_layers", [0, 1, 2])
def test_an_moe_spec_stacks_only_the_layer_groups_it_has(dense_layers):
    # An MoE spec may make every layer dense (num_dense_layers == num_layers) or none: the step then
    # has one stacked group, not an empty one (which raised a raw KeyError looking for its first layer).
    spec = dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], name="tiny-mixtral", num_layers=2, hidden_size=64,
                               num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=256,
                               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                               num_dense_layers=dense_layers, num_params=None)
    ref = meshplan.reference_step(spec, _mesh({"fsdp": 2, "ep": 2}), batch=4, seq=16)
    groups = ref.args[0][0]["model"]["layers"]
    want = {name: n for name, n in (("dense", dense_layers), ("moe", 2 - dense_layers)) if n}
    assert {name: jax.tree.leaves(g)[0].shape[0] for name, g in groups.items()} == want
    ref.lower()  # the step traces with the groups it has


@pytest.mark.parametrize("installed", [{}, {"jax-cuda12-plugin": "J"}, {"jax-cuda13-plugin": "J"},
                                       {"jax-cuda13-plugin": "0.0.1"}, {"jax-cuda12-plugin": "J",
                                                                        "jax-cuda13-plugin": "0.0.1"}])
def test_either_cuda_plugin_is_the_compiler_and_a_mismatch_names_its_own_extra(monkeypatch, installed):
    # A CUDA 13 machine has jax[cuda13]'s plugin, not meshplan[gpu]'s cuda12 one: both compile for a
    # described GPU. "J" stands for this jax's own version; the cuda12 plugin is preferred when both are there.
    from meshplan.facade.verify import _compilers

    real = _compilers._version
    jax_version = real("jax")
    versions = {name: (jax_version if v == "J" else v) for name, v in installed.items()}
    monkeypatch.setattr(_compilers, "_version",
                        lambda dist: versions.get(dist) if dist.startswith("jax-cuda") else real(dist))
    problem = _compilers.cuda_plugin_problem()
    used = next((n for n in ("jax-cuda12-plugin", "jax-cuda13-plugin") if n in versions), None)
    if used is None:
        assert problem is not None and "not installed" in problem and "pip install 'meshplan[gpu]'" in problem
        assert "no CUDA plugin" in _compilers.compiler_version("gpu")
    elif versions[used] == jax_version:
        assert problem is None
        assert _compilers.compiler_version("gpu").startswith(f"XLA:GPU ({used} {jax_version}, jax ")
    else:
        cuda = used.split("-")[1]
        assert problem == (f"{used} 0.0.1 does not match jax {jax_version}; "
                           f"pip install 'jax[{cuda}]=={jax_version}'")
