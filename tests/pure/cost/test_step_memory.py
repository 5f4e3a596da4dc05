"""Tests for the phase model of a step's peak memory (meshplan.pure.cost._step_memory, _recipe)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import examples

from meshplan.pure import estimate_training_memory, search_meshes
from meshplan.pure.errors import PlanError
from meshplan.pure.presets import MODEL_SPECS, get_preset
from meshplan.pure.cluster._devices import DEVICE_SPECS
from meshplan.pure.cost._recipe import ATTENTION_KINDS, BACKENDS, MATMUL_DTYPES, REMAT_POLICIES, TrainingRecipe
from meshplan.pure.cost._step_memory import CALIBRATIONS, calibration_key, layer_dims, lower_bound, step_memory

MODELS = sorted(MODEL_SPECS)


@st.composite
def cases(draw) -> dict:
    """A preset, a mesh of the search's axis kinds, a batch the batch axes divide, a recipe."""
    model = MODEL_SPECS[draw(st.sampled_from(MODELS))]
    sizes = {a: draw(st.sampled_from([1, 2, 4, 8])) for a in ("dp", "fsdp", "sp", "tp")}
    ways = sizes["dp"] * sizes["fsdp"]
    recipe = TrainingRecipe(remat=draw(st.sampled_from(REMAT_POLICIES)),
                            attention=draw(st.sampled_from(ATTENTION_KINDS)),
                            backend=draw(st.sampled_from(BACKENDS)),
                            device=draw(st.sampled_from([None, *DEVICE_SPECS])),
                            micro_batches=draw(st.sampled_from([1, 2])),
                            vocab_tiles=draw(st.sampled_from([1, 4])))
    state = draw(st.integers(0, 10**10))
    return {"model": model, "sizes": sizes, "recipe": recipe, "batch": ways * draw(st.integers(1, 8)) * 2,
            "seq": sizes["sp"] * draw(st.sampled_from([128, 1024, 4096])), "params": state,
            "grads": state, "optimizer": 2 * state, "gathered": state * sizes["fsdp"]}


def _peak(case: dict, **change: object) -> int:
    c = {**case, **change}
    recipe = c["recipe"]
    fields = {f.name for f in dataclasses.fields(TrainingRecipe)}
    recipe = dataclasses.replace(recipe, **{k: v for k, v in change.items() if k in fields})
    return step_memory(layer_dims(c["model"]), c["sizes"], recipe, batch=c["batch"], seq=c["seq"],
                       params=c["params"], grads=c["grads"], optimizer=c["optimizer"],
                       gathered=c["gathered"]).peak


@given(cases())
def test_the_peak_is_the_fullest_phase_and_holds_the_state(case: dict) -> None:
    m = step_memory(layer_dims(case["model"]), case["sizes"], case["recipe"], batch=case["batch"],
                    seq=case["seq"], params=case["params"], grads=case["grads"], optimizer=case["optimizer"],
                    gathered=case["gathered"])
    assert m.peak == max(b for _, b in m.phases)
    assert dict(m.phases)[m.peak_phase] == m.peak
    assert [n for n, _ in m.phases] == ["forward", "backward", "update"]
    # Every phase holds the resident state; the gradients exist from the backward pass on.
    assert all(b >= case["params"] + case["optimizer"] for _, b in m.phases)
    assert dict(m.phases)["backward"] >= case["params"] + case["optimizer"] + case["grads"]


@given(cases(), st.sampled_from(["batch", "seq"]))
def test_the_peak_grows_with_the_batch_and_the_sequence(case: dict, what: str) -> None:
    assert _peak(case, **{what: case[what] * 2}) >= _peak(case)


@given(cases())
def test_the_peak_grows_with_the_layer_count(case: dict) -> None:
    deeper = dataclasses.replace(case["model"], num_layers=case["model"].num_layers * 2,
                                 num_dense_layers=case["model"].num_dense_layers * 2)
    # The same per-layer weights: twice the layers hold at most twice the state and gather twice the bytes.
    # (At a fixed state a deeper model's update phase may shrink: its largest leaf is a smaller share.)
    twice = {**case, **{k: 2 * case[k] for k in ("params", "grads", "optimizer", "gathered")}, "model": deeper}
    assert _peak(twice) >= _peak(case)


@given(cases())
def test_remat_none_keeps_at_least_dots_which_keeps_at_least_full_and_offload(case: dict) -> None:
    none, dots, full, offload = (_peak(case, remat=r) for r in ("none", "dots", "full", "offload"))
    assert none >= dots >= full >= offload


@given(cases())
def test_flash_attention_never_needs_more_than_plain_from_1k_tokens(case: dict) -> None:
    # Below ~1k tokens per device the flash kernel's own q/k/v copies and 128-lane fp32 row
    # statistics are as big as the fp32 s x s scores plain attention keeps, so it may need more.
    seq = case["sizes"]["sp"] * max(case["seq"] // case["sizes"]["sp"], 1024)
    assert _peak(case, attention="flash", seq=seq) <= _peak(case, attention="plain", seq=seq)


@given(cases())
def test_flash_prices_the_kernels_lane_statistics_and_its_own_qkv_copies(case: dict) -> None:
    # Each of the three fp32 (b, heads, s, 128) statistics doubles when the heads double, so the
    # flash working set grows with the heads even where nothing else of the layer does.
    recipe = dataclasses.replace(case["recipe"], attention="flash", remat="full")
    dims = layer_dims(case["model"])
    wider = dataclasses.replace(dims, heads=2 * dims.heads, q_width=2 * dims.q_width)

    def work(d: object) -> int:
        # tp=1: over tp the heads split only where it divides them, which doubling them may change.
        m = step_memory(d, {**case["sizes"], "tp": 1}, recipe, batch=case["batch"], seq=case["seq"], params=0,
                        grads=0, optimizer=0)
        return dict(m.parts)["work"]

    assert work(wider) > work(dims)


def _recipe_for(key: str, **fields: object) -> TrainingRecipe:
    """A recipe priced with ``CALIBRATIONS[key]`` (``"tpu-v5p"``: backend tpu, device v5p)."""
    backend, _, device = key.partition("-")
    recipe = TrainingRecipe(backend=backend, device=device or None, **fields)  # type: ignore[arg-type]
    assert calibration_key(recipe) == key
    return recipe


@pytest.mark.parametrize("key", sorted(CALIBRATIONS))
def test_tpu_pads_head_dims_up_to_128_lanes_other_backends_do_not(key: str) -> None:
    # XLA:TPU tiles arrays (8, 128): q/k/v with a head dim of 32 or 64 take the bytes of 128.
    recipe = _recipe_for(key, remat="none", attention="flash")

    def saved(head_dim: int) -> int:
        model = dataclasses.replace(MODEL_SPECS["gpt2"], head_dim=head_dim, num_params=None)
        m = step_memory(layer_dims(model), {"fsdp": 8}, recipe, batch=8, seq=1024, params=0, grads=0, optimizer=0)
        return dict(m.parts)["saved"]

    if CALIBRATIONS[key].lane_pad == 128:
        assert saved(32) == saved(64) == saved(128) < saved(192)
    else:
        assert saved(32) < saved(64) < saved(128) < saved(192)


@given(cases())
def test_vocab_tiles_never_add_memory(case: dict) -> None:
    assert _peak(case, vocab_tiles=8) <= _peak(case, vocab_tiles=1)


@given(cases())
def test_the_lower_bound_is_below_the_peak(case: dict) -> None:
    state = case["params"] + case["grads"] + case["optimizer"]
    bound = lower_bound(layer_dims(case["model"]), case["sizes"], case["recipe"], batch=case["batch"],
                        seq=case["seq"], state=state)
    assert bound <= _peak(case)


@given(cases())
def test_micro_batches_shrink_the_saved_activations(case: dict) -> None:
    def saved(m: int) -> int:
        recipe = dataclasses.replace(case["recipe"], micro_batches=m)
        out = step_memory(layer_dims(case["model"]), case["sizes"], recipe, batch=case["batch"], seq=case["seq"],
                          params=0, grads=0, optimizer=0)
        return dict(out.parts)["saved"]

    assert saved(2) <= saved(1)


def test_plain_attention_with_remat_none_keeps_score_buffers_per_layer() -> None:
    model = MODEL_SPECS["llama3-8b"]
    recipe = TrainingRecipe(remat="none", attention="plain")
    args = {"batch": 8, "seq": 2048, "params": 0, "grads": 0, "optimizer": 0}
    plain = dict(step_memory(layer_dims(model), {"fsdp": 8}, recipe, **args).parts)["saved"]
    flash = dict(step_memory(layer_dims(model), {"fsdp": 8}, dataclasses.replace(recipe, attention="flash"),
                             **args).parts)["saved"]
    scores = 1 * model.num_heads * 2048 * 2048 * 4  # b=1 sequence per device, fp32
    kernel_copies = 4 * 2048 * 2 * model.num_heads * model.head_dim  # flash's q, k, v, o in its layout, bf16
    assert plain - flash == pytest.approx(
        model.num_layers * (CALIBRATIONS["tpu"].score_buffers * scores - kernel_copies), rel=1e-9)


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b"])
def test_the_exact_parts_equal_estimate_training_memory(name: str) -> None:
    preset = get_preset(name)
    recipe = TrainingRecipe(optimizer="adamw", remat="full", attention="flash")
    best = search_meshes(preset.spec, "2x8xH100", params=preset.params, batch=16, seq=2048, recipe=recipe).best
    est = estimate_training_memory(preset.params, best.specs_for(preset.params), best.mesh_shape,
                                   optimizer_copies=2, optimizer_dtype=np.float32)
    d = est.to_dict()
    assert (best.memory.params, best.memory.grads, best.memory.optimizer) == (d["params"], d["grads"],
                                                                               d["opt_state"])


def test_the_search_prices_the_recipe_it_is_given() -> None:
    lean = TrainingRecipe(remat="offload", attention="flash")
    heavy = TrainingRecipe(remat="none", attention="plain")
    a = search_meshes("llama3-8b", "2x8xH100", batch=16, seq=512, recipe=lean)
    b = search_meshes("llama3-8b", "2x8xH100", batch=16, seq=512, recipe=heavy, top_k=100)
    # The search fills in what it knows: the weights' dtype, the cluster's device and its compiler.
    assert a.request.recipe == dataclasses.replace(lean, weight_dtype="bfloat16", device="H100", backend="gpu")
    assert b.num_fitting <= a.num_fitting
    assert a.best.memory.phase in ("forward", "backward", "update")


@pytest.mark.parametrize("cluster,compiler", [("2x8xH100", "gpu"), ("v5p-16", "tpu")])
def test_a_recipe_without_a_backend_is_priced_for_the_clusters_compiler(cluster: str, compiler: str) -> None:
    # A recipe written without naming the compiler prices exactly as one naming the cluster's (its collectives'
    # lowering and its memory calibration); one that names another compiler is honoured.
    kw = {"batch": 32, "seq": 1024, "top_k": 3}
    left = search_meshes("llama3-8b", cluster, recipe=TrainingRecipe(remat="none", micro_batches=2), **kw)
    named = search_meshes("llama3-8b", cluster, recipe=TrainingRecipe(remat="none", micro_batches=2,
                                                                      backend=compiler), **kw)
    assert left.to_json() == named.to_json() and left.request.recipe.compiler == compiler
    other = "tpu" if compiler == "gpu" else "gpu"
    forced = search_meshes("llama3-8b", cluster, recipe=TrainingRecipe(remat="none", micro_batches=2,
                                                                       backend=other), **kw)
    assert forced.request.recipe.backend == other and forced.to_json() != left.to_json()


def test_fp32_weights_double_the_exact_parameter_bytes() -> None:
    kw = {"batch": 16, "seq": 2048, "fixed": {"fsdp": 16}}
    bf16 = search_meshes("llama3-8b", "2x8xH100", recipe=TrainingRecipe(), **kw).best.memory
    fp32 = search_meshes("llama3-8b", "2x8xH100", recipe=TrainingRecipe(weight_dtype="float32"), **kw).best.memory
    assert fp32.params == 2 * bf16.params


@pytest.mark.parametrize("bad, word", [({"remat": "some"}, "remat"), ({"attention": "ring"}, "attention"),
                                       ({"optimizer": "adagrad"}, "optimizer"), ({"backend": "npu"}, "backend"),
                                       ({"micro_batches": 0}, "micro_batches"), ({"device": "v7x"}, "device"),
                                       ({"device": "V5P"}, "device"), ({"device": ["v5p"]}, "device"),
                                       ({"device": 5}, "device"), ({"matmul_dtype": "fp8"}, "matmul_dtype='fp8'"),
                                       ({"matmul_dtype": "float16"}, r"\['bfloat16', 'float8'\]")])
def test_a_bad_recipe_names_the_field_and_what_is_valid(bad: dict, word: str) -> None:
    with pytest.raises(PlanError, match=word):
        TrainingRecipe(**bad)


@settings(max_examples=examples(25))
@given(st.sampled_from(REMAT_POLICIES), st.sampled_from(ATTENTION_KINDS), st.sampled_from(["float32", "bfloat16"]),
       st.integers(1, 8), st.sampled_from([None, *DEVICE_SPECS]), st.sampled_from(MATMUL_DTYPES))
def test_a_recipe_round_trips_through_a_dict(remat: str, attention: str, weights: str, micro: int,
                                             device: str | None, matmul: str) -> None:
    r = TrainingRecipe(weight_dtype=weights, remat=remat, attention=attention, micro_batches=micro, device=device,
                       matmul_dtype=matmul)
    assert TrainingRecipe.from_dict(r.to_dict()) == r
    # A dict written before recipes named their device or their matmul dtype still loads (as none, as bf16).
    old = {k: v for k, v in r.to_dict().items() if k not in ("device", "matmul_dtype")}
    assert TrainingRecipe.from_dict(old) == dataclasses.replace(r, device=None, matmul_dtype="bfloat16")
    assert remat in r.describe() and attention in r.describe()
    # Only an FP8 recipe says so: a bf16 recipe's line is what it was before the field existed.
    assert ("fp8" in r.describe()) == (matmul == "float8")


@settings(max_examples=examples(10))
@given(st.sampled_from(REMAT_POLICIES), st.sampled_from(ATTENTION_KINDS), st.sampled_from(["4x8xH100", "v5p-32"]))
def test_fp8_matmuls_leave_the_memory_estimate_alone(remat: str, attention: str, cluster: str) -> None:
    # The memory model holds no saved matmul input apart (docs: _matmul_dtype's module docstring), so an FP8
    # recipe prices the same bytes; on a TPU the same recipe is refused (no FP8 peak) before any mesh.
    kw = dict(batch=32, seq=1024, top_k=3)
    bf16 = TrainingRecipe(remat=remat, attention=attention)
    if cluster.startswith("v5p"):
        with pytest.raises(PlanError, match="'v5p' has no peak_fp8_flops"):
            search_meshes("llama3-8b", cluster, recipe=dataclasses.replace(bf16, matmul_dtype="float8"), **kw)
        return
    want = {c.text: c.memory for c in search_meshes("llama3-8b", cluster, recipe=bf16, **kw).candidates}
    got = search_meshes("llama3-8b", cluster, recipe=dataclasses.replace(bf16, matmul_dtype="float8"), **kw)
    assert all(c.memory == want[c.text] for c in got.candidates if c.text in want)
    assert any(c.text in want for c in got.candidates)


def _stacked_groups(spec: object) -> list[int]:
    """Elements per stacked leaf of the preset's own tree: the per-layer leaves of one path and shape, summed
    over the layers (how a scanned step stacks them)."""
    import re

    import jax

    from meshplan.pure.presets import build_params

    groups: dict[tuple[str, tuple[int, ...]], int] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(build_params(spec))[0]:
        name = re.sub(r"\.\d+\.", ".*.", "." + ".".join(str(getattr(k, "key", k)) for k in path) + ".")
        key = (name, tuple(leaf.shape))
        groups[key] = groups.get(key, 0) + int(np.prod(leaf.shape))
    return list(groups.values())


@st.composite
def model_specs(draw) -> object:
    """A preset of each family with its sizes redrawn (layers, widths, vocabulary, experts)."""
    spec = MODEL_SPECS[draw(st.sampled_from(MODELS))]
    layers, heads = draw(st.integers(1, 6)), draw(st.sampled_from([2, 4, 8]))
    change = {"num_layers": layers, "num_heads": heads, "num_kv_heads": heads // draw(st.sampled_from([1, 2])),
              "intermediate_size": draw(st.integers(1, 1024)), "vocab_size": draw(st.integers(1, 5000)),
              "hidden_size": heads * spec.head_dim if spec.family == "gpt2" else draw(st.sampled_from([64, 256])),
              "num_params": None}
    if spec.is_moe:
        change |= {"num_experts": draw(st.integers(spec.num_experts_per_tok, 16)),
                   "moe_intermediate_size": draw(st.integers(1, 512)),
                   "num_dense_layers": draw(st.integers(0, layers - 1))}
    return dataclasses.replace(spec, **change)


@settings(max_examples=examples(25), deadline=None)
@given(model_specs())
def test_the_largest_leaf_share_agrees_with_the_presets_stacked_tree(spec: object) -> None:
    # The update phase prices fp32 copies of the largest stacked leaf; its share of the parameters
    # must be the one the model's own tree has (norms and biases left out: under 1% of these trees).
    groups = _stacked_groups(spec)
    assert layer_dims(spec).largest_share == pytest.approx(max(groups) / sum(groups), rel=0.02)


@given(cases(), st.floats(0.01, 0.5))
def test_the_update_phase_grows_with_the_largest_leaf_and_ignores_how_the_rest_is_split(case: dict,
                                                                                       share: float) -> None:
    dims = dataclasses.replace(layer_dims(case["model"]), largest_share=share)
    kw = {k: case[k] for k in ("batch", "seq", "params", "grads", "optimizer", "gathered")}

    def update(d: object) -> int:
        return dict(step_memory(d, case["sizes"], case["recipe"], **kw).phases)["update"]

    bigger = dataclasses.replace(dims, largest_share=min(1.0, 2 * share))
    assert update(bigger) >= update(dims)
    if CALIBRATIONS[calibration_key(case["recipe"])].update_leaf and case["params"] >= 10**6:
        assert update(bigger) > update(dims)
    # The same largest leaf and state in more, smaller layers: the update phase does not change.
    deeper = dataclasses.replace(dims, layers=dims.layers * 4)
    assert update(deeper) == update(dims)


def test_the_full_size_h200_llama_step_is_priced_within_the_band_at_its_update_peak() -> None:
    # Recorded: Llama-3-8B, 2 x 4096, remat full, AdamW, one H200: XLA's peak 104.16 GiB = real peak
    # (benchmarks/data/memory_calibration_gpu_fullsize.jsonl; in-sample for update_leaf). The phase model
    # priced 145.1 GiB before the update phase counted the largest leaf ("does not fit" on 141 GB).
    import meshplan.pure.cluster._devices as hw
    from meshplan.pure.cluster._cluster import parse_cluster

    big = parse_cluster("1x1xH200", devices={"H200": dataclasses.replace(hw.DEVICE_SPECS["H200"], hbm_bytes=2**50)})
    recipe = TrainingRecipe(backend="gpu", residual_split=False)
    best = search_meshes("llama3-8b", big, axes=("fsdp",), fixed={"fsdp": 1}, batch=2, seq=4096, recipe=recipe,
                         headroom=0.0, top_k=1, micro_batches=1).best
    assert best.memory.phase == "update"
    assert 0.95 <= best.memory.total / (104.16 * 2**30) <= 1.10
    assert search_meshes("llama3-8b", "1x1xH200", axes=("fsdp",), fixed={"fsdp": 1}, batch=2, seq=4096,
                         recipe=recipe, micro_batches=1, headroom=0.0).best.memory.fits


def test_a_device_selects_its_generations_coefficients_and_others_fall_back() -> None:
    assert calibration_key(TrainingRecipe(device="v5p")) == "tpu-v5p"
    assert calibration_key(TrainingRecipe(device="v6e")) == "tpu-v6e"
    # No compiled grid for v4 / v5e, nor a GPU calibration per device: the backend's coefficients.
    assert calibration_key(TrainingRecipe(device="v4")) == calibration_key(TrainingRecipe()) == "tpu"
    assert calibration_key(TrainingRecipe(backend="gpu", device="H100")) == "gpu"
    assert calibration_key(TrainingRecipe(backend="cpu", device="v5p")) == "cpu"
    # Every key names a backend the recipe accepts (and a device it accepts, if any).
    for key in CALIBRATIONS:
        _recipe_for(key)


@given(cases())
def test_a_device_without_coefficients_of_its_own_prices_as_no_device(case: dict) -> None:
    recipe = case["recipe"]
    if calibration_key(recipe) == recipe.backend:
        assert _peak(case) == _peak(case, device=None)
    else:  # the generation's own coefficients: the exact parts stay exact, whatever the calibration
        m = step_memory(layer_dims(case["model"]), case["sizes"], recipe, batch=case["batch"], seq=case["seq"],
                        params=case["params"], grads=case["grads"], optimizer=case["optimizer"])
        assert (m.params, m.grads, m.optimizer) == (case["params"], case["grads"], case["optimizer"])
        assert m.calibration == CALIBRATIONS[calibration_key(recipe)].source


def test_v5p_prices_the_flash_kernels_buffers_whole_and_v6e_half() -> None:
    # Read off XLA's buffers live at its peak (docs/design-notes.md, step memory): on v5p the kernel's q/k/v/o
    # copies and 128-lane row statistics are device buffers; on v6e half of them are priced.
    model, sizes = MODEL_SPECS["llama3-8b"], {"fsdp": 8}
    args = {"batch": 8, "seq": 2048, "params": 0, "grads": 0, "optimizer": 0}

    def work(device: str, attention: str) -> float:
        recipe = TrainingRecipe(remat="full", attention=attention, device=device)
        return dict(step_memory(layer_dims(model), sizes, recipe, **args).parts)["work"]

    cal = {d: CALIBRATIONS[f"tpu-{d}"] for d in ("v5p", "v6e")}
    assert (cal["v5p"].flash_buffers, cal["v6e"].flash_buffers) == (1.0, 0.5)
    # Flash's working set: work_layers x the layer's activations plus flash_buffers x the kernel's
    # buffers (q, k, v, o in bf16 at 128 lanes, three fp32 128-lane row statistics; b = 1 per device).
    t, q = 2048, model.num_heads * max(model.head_dim, 128)
    kernel = 4 * t * 2 * q + 3 * model.num_heads * t * 128 * 4
    layer = {d: (work(d, "flash") - cal[d].flash_buffers * kernel) / cal[d].work_layers for d in cal}
    assert layer["v5p"] == pytest.approx(layer["v6e"], rel=1e-6)


@pytest.mark.parametrize("model", ["mixtral-8x7b", "llama3-8b"])
def test_v5p_prices_moe_routing_apart_from_the_scores(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # work_routing None (v6e, CPU, GPU): the routing tensors are priced with the scores, work_scores x
    # top_k of them; a work_routing of exactly that many prices the same working set.
    spec = MODEL_SPECS[model]
    d = layer_dims(spec)
    args = {"batch": 8, "seq": 2048, "params": 0, "grads": 0, "optimizer": 0}
    recipe = TrainingRecipe(remat="full", attention="flash", device="v6e")
    v6e = CALIBRATIONS["tpu-v6e"]
    base = dict(step_memory(d, {"fsdp": 8}, recipe, **args).parts)["work"]
    monkeypatch.setitem(CALIBRATIONS, "tpu-v6e", dataclasses.replace(
        v6e, work_routing=v6e.work_scores * max(d.top_k, 1)))
    assert dict(step_memory(d, {"fsdp": 8}, recipe, **args).parts)["work"] == pytest.approx(base, rel=1e-12)
    # One routing tensor (v5p) is less than top_k x work_scores of them, and nothing without experts.
    monkeypatch.setitem(CALIBRATIONS, "tpu-v6e", dataclasses.replace(v6e, work_routing=1.0))
    one = dict(step_memory(d, {"fsdp": 8}, recipe, **args).parts)["work"]
    assert one < base if spec.is_moe else one == base


def test_the_search_prices_a_tpu_slice_with_its_generations_coefficients() -> None:
    # The cluster names the device; the search puts it in the recipe it prices.
    kw = {"batch": 8, "seq": 2048, "fixed": {"fsdp": 8}, "top_k": 1, "headroom": 0.0}
    recipe = TrainingRecipe(remat="none", attention="flash")  # peaks in the backward, where they differ
    v5p = search_meshes("llama3-8b", "v5p-16", recipe=recipe, **kw)
    v6e = search_meshes("llama3-8b", "v6e-8", recipe=recipe, **kw)
    assert (v5p.request.recipe.device, v6e.request.recipe.device) == ("v5p", "v6e")
    # A device named in the recipe is kept (pricing a v6e step on a v5p slice).
    as_v6e = search_meshes("llama3-8b", "v5p-16", recipe=dataclasses.replace(recipe, device="v6e"), **kw)
    assert as_v6e.request.recipe.device == "v6e"
    assert as_v6e.best.memory.total == v6e.best.memory.total != v5p.best.memory.total


# The loss phase (2026-11-23, session 5): what XLA gathers for the output head's matmul.

_AXES = ("dp", "fsdp", "ep", "tp")


@st.composite
def head_specs(draw) -> tuple:
    """A 2-D head spec over some of the mesh's axes (each axis at most once), its mesh and which dim is the
    vocabulary."""
    sizes = {a: draw(st.sampled_from([1, 2, 4, 8])) for a in _AXES}
    order = draw(st.permutations(_AXES))
    cut = sorted(draw(st.lists(st.integers(0, 4), min_size=2, max_size=2)))
    dims = (order[:cut[0]], order[cut[0]:cut[1]])
    spec = tuple(None if not d else d[0] if len(d) == 1 and draw(st.booleans()) else tuple(d) for d in dims)
    vocab_first = draw(st.booleans())
    return spec, sizes, vocab_first


@given(head_specs())
def test_a_head_layout_counts_every_way_the_spec_splits_the_head_once(case: tuple) -> None:
    from meshplan.pure.cost._step_memory import head_layout

    spec, sizes, vocab_first = case
    shape = (1000, 64) if vocab_first else (64, 1000)
    layout = head_layout(spec if vocab_first else spec[::-1], shape, sizes, vocab=1000)
    on = [(e,) if isinstance(e, str) else e or () for e in spec]
    assert layout.vocab_batch * layout.vocab_other * layout.hidden == np.prod([sizes[a] for d in on for a in d])
    assert layout.vocab_batch == np.prod([sizes[a] for a in on[0] if a in ("dp", "fsdp", "ep")])
    assert layout.hidden == np.prod([sizes[a] for a in on[1]])


def _loss(model: object, sizes: dict, head: object, backend: str = "tpu", device: str | None = "v5p",
          batch: int = 16, seq: int = 2048) -> dict:
    m = step_memory(layer_dims(model), sizes, TrainingRecipe(backend=backend, device=device, attention="flash"),
                    batch=batch, seq=seq, params=0, grads=0, optimizer=0, head=head)
    return {**dict(m.parts), "forward": dict(m.phases)["forward"]}


def test_fsdp_alone_on_a_large_vocabulary_prices_the_gathered_hidden_states_and_bf16_logit_gradient() -> None:
    # Full-size Llama-3-8B on v5p-16 fsdp=8 at 16 x 2048 (recorded: XLA's peak 5131 MiB for 2 layers; above the
    # state and saved inputs: fp32 logits 2004 MiB, bf16[16,2048,16032] 1002 MiB, bf16[16,2048,4096] 256 MiB).
    from meshplan.pure.cost._step_memory import HeadLayout

    model = dataclasses.replace(MODEL_SPECS["llama3-8b"], num_layers=2, num_params=None)
    parts = _loss(model, {"fsdp": 8}, HeadLayout(vocab_batch=8))
    t, mib = 2 * 2048, 2**20
    assert parts["logits"] == t * 128256 * (4 + 2)  # 3006 MiB: the fp32 logits and their bf16 gradient
    assert parts["head"] == 16 * 2048 * 4096 * 2 == 256 * mib  # the hidden states gathered over the batch
    # Unknown layout, or CPU / GPU (their grids do not identify it): the head gathered, as before.
    assert _loss(model, {"fsdp": 8}, None)["head"] == int(2.6 * 128256 * 4096 * 2)
    for backend, device in (("cpu", None), ("gpu", "H200")):
        assert _loss(model, {"fsdp": 8}, HeadLayout(vocab_batch=8), backend, device) == _loss(
            model, {"fsdp": 8}, None, backend, device)


@settings(max_examples=examples(40))
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "gpt2", "llama3-70b"]), st.sampled_from([1, 2, 4, 8, 16]),
       st.sampled_from([1, 2, 8, 32]), st.sampled_from([256, 1024, 4096]))
def test_the_loss_phase_gathers_the_smaller_operand_of_the_heads_matmul(name: str, fsdp: int, batch: int,
                                                                        seq: int) -> None:
    from meshplan.pure.cost._step_memory import HeadLayout

    model = MODEL_SPECS[name]
    if batch % fsdp:
        return
    d = layer_dims(model)
    split = _loss(model, {"fsdp": fsdp}, HeadLayout(vocab_batch=fsdp), batch=batch, seq=seq)
    whole = _loss(model, {"fsdp": fsdp}, None, batch=batch, seq=seq)
    tokens = batch // fsdp * seq
    hidden_gathered = tokens * fsdp * d.hidden * 2
    if fsdp > 1 and tokens * d.hidden < d.head / fsdp:  # the hidden states' shard is the smaller operand
        assert split["head"] == hidden_gathered < d.head * 2
        assert split["logits"] == tokens * d.vocab * 6
    else:
        assert split == whole


def test_the_search_reads_the_heads_layout_off_its_plan() -> None:
    # The recorded v5p-16 step (benchmarks/data/memory_calibration_tpu_fullsize.jsonl): XLA's peak 5131.1 MiB.
    from meshplan.pure.cost._step_memory import HeadLayout

    model = dataclasses.replace(MODEL_SPECS["llama3-8b"], num_layers=2, num_params=None)
    recipe = TrainingRecipe(remat="full", attention="flash", residual_split=False, device="v5p")
    best = search_meshes(model, "v5p-16", axes=("fsdp",), fixed={"fsdp": 8}, batch=16, seq=2048, recipe=recipe,
                         headroom=0.0, top_k=1).best
    m = best.memory
    kw = dict(batch=16, seq=2048, params=m.params, grads=m.grads, optimizer=m.optimizer)
    gathered = step_memory(layer_dims(model), {"fsdp": 8}, recipe, head=HeadLayout(vocab_batch=8), **kw)
    assert m.total == gathered.peak and m.phase == gathered.peak_phase == "forward"
    assert 0.95 <= m.total / (5131.1 * 2**20) <= 1.10
    assert step_memory(layer_dims(model), {"fsdp": 8}, recipe, **kw).peak / (5131.1 * 2**20) > 1.2


@pytest.mark.parametrize("bad", [(8, 1), "fsdp"])
def test_a_head_layout_that_is_not_one_is_refused_by_name(bad: object) -> None:
    from meshplan.pure.errors import MeshplanTypeError

    with pytest.raises(MeshplanTypeError, match="head=.*must be a HeadLayout"):
        step_memory(layer_dims(MODEL_SPECS["llama3-8b"]), {"fsdp": 8}, TrainingRecipe(), batch=8, seq=1024,
                    params=0, grads=0, optimizer=0, head=bad)  # type: ignore[arg-type]


def test_a_head_layout_with_a_way_below_one_names_the_field() -> None:
    from meshplan.pure.cost._step_memory import HeadLayout

    with pytest.raises(PlanError, match="head.vocab_batch"):
        step_memory(layer_dims(MODEL_SPECS["llama3-8b"]), {"fsdp": 8}, TrainingRecipe(), batch=8, seq=1024,
                    params=0, grads=0, optimizer=0, head=HeadLayout(vocab_batch=0))
