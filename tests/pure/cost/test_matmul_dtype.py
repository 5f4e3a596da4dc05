"""FP8 weight matmuls (meshplan.pure.cost._matmul_dtype): the peak they run at, who refuses them, and what
they do to a search's and a pipeline's predicted steps."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from meshplan.pure import search_meshes
from meshplan.pure.cluster import DEVICE_SPECS, Cluster, DeviceSpec
from meshplan.pure.cost import FP8_EFFICIENCY_RATIO, MATMUL_DTYPES, TrainingRecipe, fp8_peak
from meshplan.pure.errors import MeshplanTypeError, NothingFitsError, PlanError
from meshplan.pure.search import price_pipeline, search_pipelines
from tests.profiles import examples

FP8 = sorted(name for name, spec in DEVICE_SPECS.items() if spec.peak_fp8_flops is not None)
NO_FP8 = sorted(set(DEVICE_SPECS) - set(FP8))


def test_the_ratio_is_a_fraction() -> None:
    assert 0 < FP8_EFFICIENCY_RATIO <= 1


@pytest.mark.parametrize("name", sorted(DEVICE_SPECS))
def test_bf16_matmuls_need_no_fp8_peak_and_fp8_ones_their_devices(name: str) -> None:
    spec = DEVICE_SPECS[name]
    assert fp8_peak(spec, "bfloat16") is None
    if name in FP8:
        assert fp8_peak(spec, "float8") == spec.peak_fp8_flops
    else:
        with pytest.raises(PlanError, match=f"{name!r} has no peak_fp8_flops. Devices with one: {FP8}".replace(
                "[", r"\[").replace("]", r"\]")):
            fp8_peak(spec, "float8")


@given(st.one_of(st.none(), st.floats(1e12, 1e16)), st.sampled_from(MATMUL_DTYPES))
def test_a_users_device_runs_fp8_exactly_when_it_states_an_fp8_peak(peak: float | None, dtype: str) -> None:
    device = DeviceSpec("mine", hbm_bytes=10**11, intra_bandwidth=1e11, inter_bandwidth=1e10, intra_latency_s=0.0,
                        inter_latency_s=0.0, peak_bf16_flops=1e15, peak_fp8_flops=peak)
    if dtype == "float8" and peak is None:
        with pytest.raises(PlanError, match="'mine' has no peak_fp8_flops"):
            fp8_peak(device, dtype)
    else:
        assert fp8_peak(device, dtype) == (peak if dtype == "float8" else None)


@pytest.mark.parametrize("bad", ["fp8", "float16", "", None, 8])
def test_an_unknown_matmul_dtype_names_the_valid_ones(bad: object) -> None:
    # A string out of the set is a wrong value, anything else a wrong type (the recipe lists both as values).
    with pytest.raises(PlanError if isinstance(bad, str) else MeshplanTypeError,
                       match=r"matmul_dtype=.*'bfloat16', 'float8'"):
        fp8_peak(DEVICE_SPECS["H100"], bad)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"matmul_dtype=.*'bfloat16', 'float8'"):
        TrainingRecipe(matmul_dtype=bad)  # type: ignore[arg-type]


def test_a_device_must_be_a_device_spec() -> None:
    with pytest.raises(MeshplanTypeError, match="device='H100'"):
        fp8_peak("H100", "float8")  # type: ignore[arg-type]


# --- the search and the pipelines -------------------------------------------------------------------------------

MODELS = ("gpt2", "llama3-8b", "mixtral-8x7b")


def _layout(model: str, cluster: str, recipe: TrainingRecipe, **kw: object) -> dict[str, int]:
    best = search_meshes(model, cluster, recipe=recipe, top_k=1, **kw).best  # type: ignore[arg-type]
    return dict(best.mesh_shape)


@settings(max_examples=examples(12), deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from([d for d in FP8 if DEVICE_SPECS[d].ici_scope != "slice"]),
       st.sampled_from((2, 4)), st.sampled_from(("none", "dots", "full")), st.sampled_from(("flash", "dot_product")))
def test_fp8_never_slows_a_mesh_on_a_device_with_fp8_units(model: str, device: str, nodes: int, remat: str,
                                                           attention: str) -> None:
    cluster = f"{nodes}x8x{device}"
    kw = dict(batch=8 * nodes, seq=1024)
    bf16 = TrainingRecipe(remat=remat, attention=attention)
    try:
        fixed = _layout(model, cluster, bf16, **kw)
    except NothingFitsError:  # Mixtral without remat on 16 GPUs at jax's 75%: no mesh to compare
        reject()
    a = search_meshes(model, cluster, recipe=bf16, fixed=fixed, top_k=1, **kw).best
    b = search_meshes(model, cluster, recipe=dataclasses.replace(bf16, matmul_dtype="float8"), fixed=fixed,
                      top_k=1, **kw).best
    assert a.step is not None and b.step is not None and a.text == b.text
    # Every model has weight matmuls: compute falls, the step never rises, the FLOPs counted do not move and
    # MFU (against the bf16 peak) rises with the speed.
    assert b.step.compute_s < a.step.compute_s
    assert b.step.step_s <= a.step.step_s * (1 + 1e-12)
    assert b.step.flops == a.step.flops and b.memory == a.memory
    assert b.step.mfu >= a.step.mfu


@settings(max_examples=examples(8), deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from(FP8), st.sampled_from(("dots", "full")))
def test_a_bf16_search_does_not_read_the_devices_fp8_peak(model: str, device: str, remat: str) -> None:
    # The same device without its FP8 peak prices a bf16 step to the bit: the new field moves nothing by default.
    spec = DEVICE_SPECS[device]
    bare = Cluster(dataclasses.replace(spec, peak_fp8_flops=None), num_nodes=2, devices_per_node=8)
    kw = dict(batch=16, seq=1024, recipe=TrainingRecipe(remat=remat), top_k=4)
    a = search_meshes(model, Cluster(spec, num_nodes=2, devices_per_node=8), **kw)  # type: ignore[arg-type]
    b = search_meshes(model, bare, **kw)  # type: ignore[arg-type]
    assert [(c.text, c.step, c.memory, c.comm) for c in a.candidates] == [
        (c.text, c.step, c.memory, c.comm) for c in b.candidates]


@pytest.mark.parametrize("device", NO_FP8)
def test_an_fp8_search_on_a_device_without_fp8_units_names_it_and_those_with_them(device: str) -> None:
    cluster = f"{device}-8" if DEVICE_SPECS[device].ici_scope == "slice" else f"1x8x{device}"
    with pytest.raises(PlanError, match=f"{device!r} has no peak_fp8_flops. Devices with one"):
        search_meshes("gpt2", cluster, batch=8, seq=256, recipe=TrainingRecipe(matmul_dtype="float8"))


def test_the_pipeline_searches_refuse_an_fp8_recipe_on_a100_instead_of_fitting_nothing() -> None:
    # Each stage's search raising PlanError would read as "no stage mesh fits"; the refusal comes first.
    recipe = TrainingRecipe(matmul_dtype="float8")
    with pytest.raises(PlanError, match="'A100-80GB' has no peak_fp8_flops"):
        search_pipelines("llama3-8b", "4x8xA100", batch=32, seq=1024, recipe=recipe)
    with pytest.raises(PlanError, match="'A100-80GB' has no peak_fp8_flops"):
        price_pipeline("llama3-8b", "4x8xA100", pp=2, stage_layout={"fsdp": 16}, batch=32, seq=1024, recipe=recipe)


def test_an_fp8_pipeline_stage_is_priced_faster() -> None:
    kw = dict(pp=2, stage_layout={"fsdp": 16}, batch=64, seq=1024, micro_batches=4)
    a = price_pipeline("llama3-8b", "4x8xH100", recipe=TrainingRecipe(), **kw)  # type: ignore[arg-type]
    b = price_pipeline("llama3-8b", "4x8xH100", recipe=TrainingRecipe(matmul_dtype="float8"),
                       **kw)  # type: ignore[arg-type]
    assert a.step is not None and b.step is not None
    assert b.step.compute_s < a.step.compute_s and b.step.step_s < a.step.step_s
    assert b.memory == a.memory and b.pipeline == a.pipeline


@settings(max_examples=examples(8), deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from(("2x8xH100", "4x8xH200")), st.integers(1, 4),
       st.sampled_from(("none", "full")))
def test_an_fp8_search_shows_the_head_of_its_full_ranking(model: str, cluster: str, k: int, remat: str) -> None:
    # The search prices only the meshes whose compute-only floor can still rank; with FP8 weight matmuls
    # the floor falls with the step, so the pruned search must still agree with pricing every mesh.
    # headroom 0.1 (a TPU's, not jax's GPU 25%): every model here fits both clusters with remat none too.
    kw = dict(batch=32, seq=1024, recipe=TrainingRecipe(remat=remat, matmul_dtype="float8"), headroom=0.1)
    full = search_meshes(model, cluster, top_k=10_000, **kw)  # type: ignore[arg-type]
    few = search_meshes(model, cluster, top_k=k, **kw)  # type: ignore[arg-type]
    assert few.candidates == full.candidates[:k]
