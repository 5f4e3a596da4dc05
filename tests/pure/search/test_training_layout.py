"""A plan is everything a training step needs: MeshCandidate's batch, activation and optimizer specs.

The central property: the memory model charges the shards of the very specs
a candidate emits. Its per-layer input ``x = t*h*a/r`` (``r``: the residual
stream's split) is one residual-stream shard, and each logits buffer
``t*vocab*4/vocab_split`` is one logits shard. Those specs store on the
candidate's mesh, so a step that applies them gets the memory the verdict
assumed.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import examples
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.errors import PlanError
from meshplan.pure import DeviceInfo, SearchResult, get_preset, layout_device_ids, search_meshes
from meshplan.pure.search import MeshCandidate
from meshplan.pure.cost._recipe import TrainingRecipe
from meshplan.pure.cost._activation_collectives import step_activations
from meshplan.pure.cost._step_memory import CALIBRATIONS, layer_dims, step_memory
from meshplan.pure.specs import check_specs, host_batch_slices, optimizer_state_specs

SEARCHES = [("llama3-70b", "8x8xH100", 64, 4096), ("llama3-8b", "2x8xH100", 16, 4096),
            ("mixtral-8x7b", "4x8xH100", 32, 4096), ("gpt2", "8xH100", 8, 1024), ("gpt2", "2xH100", 16, 512)]


def _assert_charged_as_emitted(c: MeshCandidate, model: str, *, batch: int, seq: int,
                               recipe: TrainingRecipe) -> None:
    """The phase model's saved inputs and logits, on c's mesh, are shards of c's own specs."""
    assert c.activations is not None
    dims, sizes = layer_dims(get_preset(model).spec), c.mesh_shape
    full = dataclasses.replace(recipe, remat="full", micro_batches=1, vocab_tiles=1)  # saved = L * x
    parts = dict(step_memory(dims, sizes, full, batch=batch, seq=seq, params=0, grads=0, optimizer=0).parts)
    assert parts["saved"] == dims.layers * c.activations["residual"].shard_bytes(sizes), c.text
    logits = CALIBRATIONS[recipe.backend].logits_buffers * c.activations["logits"].shard_bytes(sizes)
    assert parts["logits"] == int(logits), c.text
    tensors = {t.name: jax.ShapeDtypeStruct(t.shape, jnp.float32) for t in c.activations.tensors}
    check_specs(tensors, c.activations.specs, sizes)  # each split divides its dim
    assert c.activations["batch"].shape == (batch, seq)


@pytest.mark.parametrize(("model", "cluster", "batch", "seq"), SEARCHES)
def test_every_candidate_is_charged_the_shards_of_the_specs_it_emits(model: str, cluster: str, batch: int,
                                                                      seq: int) -> None:
    result = search_meshes(model, cluster, batch=batch, seq=seq, top_k=5)
    for c in (*result.candidates, *result.rejected):
        _assert_charged_as_emitted(c, model, batch=batch, seq=seq, recipe=result.request.recipe)


def test_a_step_that_does_not_split_the_residual_stream_gets_no_tp_constraint() -> None:
    recipe = TrainingRecipe(residual_split=False)
    result = search_meshes("llama3-8b", "2x8xH100", batch=16, fixed={"tp": 4}, recipe=recipe)
    for c in result.candidates:
        assert "tp" not in str(c.activation_specs["residual"]) and "tp" in str(c.activation_specs["logits"])
        _assert_charged_as_emitted(c, "llama3-8b", batch=16, seq=4096, recipe=result.request.recipe)


@settings(max_examples=examples(15), deadline=None)
@given(st.sampled_from([("llama3-8b", 8), ("mixtral-8x7b", 16), ("gpt2", 8)]),
       st.sampled_from(["8xH100", "2x8xH100", "v5p-32"]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([512, 1000, 2048]))
def test_the_charge_and_the_specs_agree_for_any_request(model_batch: tuple[str, int], cluster: str, per: int,
                                                        seq: int) -> None:
    model, unit = model_batch
    try:
        result = search_meshes(model, cluster, batch=unit * per, seq=seq, top_k=2)
    except PlanError:
        return  # nothing fits: nothing emitted
    recipe = result.request.recipe
    for c in result.candidates:
        _assert_charged_as_emitted(c, model, batch=unit * per, seq=seq, recipe=recipe)
        assert c.activations == step_activations(get_preset(model).spec, c.mesh_shape, batch=unit * per, seq=seq,
                                                 itemsize=recipe.compute_itemsize)


def test_the_readme_plan_applies_the_split_it_assumed() -> None:
    # The README's kind of plan (tp inside a node, data axes outside); which one ranks first is the
    # memory and cost models' business, so tp and the axes are fixed here.
    best = search_meshes("llama3-70b", "8x8xH100", batch=64, axes=("dp", "fsdp", "tp"), fixed={"tp": 4}).best
    sizes = best.mesh_shape
    batch_axes = tuple(a for a in ("dp", "fsdp") if sizes[a] > 1)
    ways = sizes["dp"] * sizes["fsdp"]
    axes = batch_axes[0] if len(batch_axes) == 1 else batch_axes
    assert best.batch_spec == P(axes)
    assert best.activation_specs == {"residual": P(axes, None, "tp"), "logits": P(axes, None, "tp")}
    # 64/ways sequences of 4096 tokens per device, hidden 8192 split tp ways, bf16.
    assert best.activations["residual"].shard_bytes(sizes) == 64 // ways * 4096 * 8192 * 2 // sizes["tp"]


def test_the_batch_spec_feeds_one_contiguous_slice_per_host() -> None:
    best = search_meshes("llama3-8b", "2x8xH100", batch=16, axes=("dp", "fsdp", "tp")).best
    devices = [DeviceInfo(i, process_index=i // 8) for i in range(16)]
    ids = layout_device_ids(devices, best.hybrid)  # the layout create_mesh builds
    slices = host_batch_slices((16, 4096), best.axis_names, ids // 8, best.batch_spec)
    assert [s.shape for s in slices] == [(8, 4096), (8, 4096)]


def test_a_training_layout_has_every_spec_a_step_needs() -> None:
    preset = get_preset("gpt2")
    best = search_meshes("gpt2", "8xH100", batch=8, seq=1024).best
    opt = optax.adamw(1e-3)
    state = jax.eval_shape(opt.init, preset.params)
    layout = best.training_layout(preset.params, state)
    assert layout.params == best.specs_for(preset.params)
    assert layout.opt_state == optimizer_state_specs(preset.params, layout.params, state)
    assert layout.batch == best.batch_spec and dict(layout.activations) == best.activation_specs
    assert layout.state == (layout.params, layout.opt_state)
    assert best.training_layout(preset.params).opt_state is None


def test_shardings_wrap_every_spec_for_the_planned_mesh_only() -> None:
    best = search_meshes("gpt2", "H100", batch=8, seq=1024).best
    layout = best.training_layout(get_preset("gpt2").params)
    mesh = AbstractMesh(best.axis_sizes, best.axis_names)
    sh = layout.shardings(mesh)
    specs = jax.tree.leaves(layout.params, is_leaf=lambda x: isinstance(x, P))
    shardings = jax.tree.leaves(sh.params, is_leaf=lambda x: isinstance(x, NamedSharding))
    assert [s.spec for s in shardings] == specs and all(s.mesh == mesh for s in shardings)
    assert sh.batch.spec == layout.batch and sh.activations["logits"].spec == layout.activations["logits"]
    wrong = AbstractMesh((best.num_devices,), ("dp",))
    with pytest.raises(PlanError, match="planned for the mesh"):
        layout.shardings(wrong)


def test_activations_survive_json_and_an_older_plan_says_to_search_again() -> None:
    result = search_meshes("llama3-8b", "2x8xH100", batch=16)
    again = SearchResult.from_json(result.to_json())
    assert again == result and again.best.activations == result.best.activations
    old = json.loads(result.to_json())
    for cand in old["candidates"]:
        del cand["activations"]
    best = SearchResult.from_dict(old).best
    assert best.activations is None and best.specs_for(get_preset("llama3-8b").params)
    with pytest.raises(PlanError, match="run the search again"):
        best.batch_spec  # noqa: B018
    with pytest.raises(PlanError, match="run the search again"):
        best.training_layout(get_preset("llama3-8b").params)
