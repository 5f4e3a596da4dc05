"""The pipelined reference step on the 8 real CPU devices: the unpipelined step's loss and gradients.

One tiny 8-layer Llama is stepped by the existing (unpipelined) reference step
and by the pipelined step over ``pp=4`` with two circular repeats and four
micro-batches; with fp32 weights and SGD at learning rate 1 the first update is
minus the gradient, so equal updates are equal gradients. Each step compiles
once per module (about 15 s on 2 cores for the pipelined one).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType

from meshplan.errors import MeshplanTypeError, PlanError
from meshplan.facade.verify._compiled import compiled_memory
from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import tpu_topology_mesh
from meshplan.facade.verify._pipeline_step import from_stages, pipeline_step, to_stages
from meshplan.facade.verify._reference import ReferenceConfig, reference_step, stacked_params
from meshplan.pure.cost import bubble_fraction, plan_stages, schedule_memory
from meshplan.pure.presets import MODEL_SPECS

TINY = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny-llama", num_layers=8, hidden_size=32,
                           num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64, vocab_size=128,
                           num_params=None)
FP32_SGD = ReferenceConfig(param_dtype="float32", compute_dtype="float32", optimizer="sgd", learning_rate=1.0)
BATCH, SEQ = 8, 8


def _mesh(sizes: dict[str, int]) -> jax.sharding.Mesh:
    return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes))


def _params(seed: int) -> dict:
    leaves, tdef = jax.tree.flatten(stacked_params(TINY, dtype=jnp.float32))
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(tdef, [0.1 * jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)])


def _batch(seed: int) -> dict[str, jax.Array]:
    tokens = jax.random.randint(jax.random.PRNGKey(seed), (BATCH, SEQ), 0, TINY.vocab_size)
    return {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1)}


def _sgd_state(params: dict) -> tuple:
    # Copies: the steps donate their state, and to_stages' tree shares the non-layer arrays.
    return jax.tree.map(jnp.copy, (params, optax.sgd(1.0, momentum=0.9).init(params)))


@pytest.fixture(scope="module")
def pipelined():
    return pipeline_step(TINY, _mesh({"pp": 4, "dp": 2}), batch=BATCH, seq=SEQ, micro_batches=4, repeats=2,
                         config=FP32_SGD)


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
def test_pipelined_step_gives_the_unpipelined_loss_and_gradients(pipelined):
    params, data = _params(0), _batch(1)
    plain = reference_step(TINY, _mesh({"dp": 2, "tp": 4}), batch=BATCH, seq=SEQ, config=FP32_SGD)
    (want, _), want_metrics = plain.fn(_sgd_state(params), data)
    (got, _), got_metrics = pipelined.fn(_sgd_state(to_stages(params, TINY, stages=4, repeats=2)), data)
    np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"], rtol=1e-5)
    # SGD at learning rate 1, first step: new = old - grad, so the updates are the gradients.
    got = from_stages(got, TINY)
    for path, a in jax.tree_util.tree_leaves_with_path(want):
        b = jax.tree_util.tree_leaves_with_path(got)
        b = dict(b)[path]
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))
    # The step really moved the weights: a stage that dropped its gradient would pass only if it were zero.
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params)))
    assert moved > 1e-3


def test_pipelined_step_trains(pipelined):
    state = _sgd_state(to_stages(_params(2), TINY, stages=4, repeats=2))
    data, losses = _batch(3), []
    for _ in range(4):
        state, metrics = pipelined.fn(state, data)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.05, losses


def test_the_stage_weights_live_on_their_stage(pipelined):
    spec = pipelined.param_specs["model"]["layers"]["dense"]["mlp"]["up_proj"]["weight"]
    assert tuple(spec)[:3] == (None, "pp", None)
    state, _ = pipelined.args
    leaf = state[0]["model"]["layers"]["dense"]["mlp"]["up_proj"]["weight"]
    assert leaf.shape == (2, 4, 1, 64, 32)
    assert leaf.sharding.shard_shape(leaf.shape)[:3] == (2, 1, 1)
    assert pipelined.iterations == 2 * 4 + 4 - 1 and pipelined.bubble == pytest.approx(3 / 11)


def test_stage_round_trip_keeps_layer_order():
    params = _params(4)
    for stages, repeats in ((1, 1), (2, 1), (4, 2), (2, 4), (8, 1)):
        back = from_stages(to_stages(params, TINY, stages=stages, repeats=repeats), TINY)
        assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)))
    # Stage s of repeat r holds layers (r * stages + s) * per_stage + j: the circular order.
    staged = to_stages(params, TINY, stages=2, repeats=2)
    w = params["model"]["layers"]["dense"]["input_layernorm"]["weight"]
    ws = staged["model"]["layers"]["dense"]["input_layernorm"]["weight"]
    assert bool(jnp.array_equal(ws[1, 0, 1], w[(1 * 2 + 0) * 2 + 1]))


@pytest.mark.parametrize("kwargs, words", [
    ({"mesh": {"dp": 8}, "micro_batches": 4}, "no 'pp' axis"),
    ({"mesh": {"pp": 4, "dp": 2}, "micro_batches": 2}, "micro_batches=2 must be >= pp=4"),
    ({"mesh": {"pp": 4, "dp": 2}, "micro_batches": 4, "repeats": 3}, "num_layers=8 must divide by pp=4 x repeats=3"),
    ({"mesh": {"pp": 8}, "micro_batches": 8, "batch": 4}, "batch=4 must divide"),
    ({"mesh": {"pp": 2, "dp": 4}, "micro_batches": 0}, "micro_batches=0 must be an int >= 1"),
])
def test_schedules_the_step_cannot_run_are_refused_with_the_values(kwargs, words):
    kwargs = dict(kwargs)
    mesh = _mesh(kwargs.pop("mesh"))
    batch = kwargs.pop("batch", BATCH)
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        pipeline_step(TINY, mesh, batch=batch, seq=SEQ, **kwargs)


def test_moe_models_and_bad_types_are_refused():
    mixtral = dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], num_layers=4, num_params=None)
    with pytest.raises(PlanError, match="dense models only"):
        pipeline_step(mixtral, _mesh({"pp": 4, "dp": 2}), batch=8, seq=8, micro_batches=4)
    with pytest.raises(MeshplanTypeError, match="jax.sharding.Mesh"):
        pipeline_step(TINY, "pp=4", batch=8, seq=8, micro_batches=4)  # type: ignore[arg-type]


@pytest.mark.skipif(not libtpu_available(), reason="libtpu is not installed: no TPU AOT")
def test_pipelined_step_compiles_for_a_tpu_topology():
    big = dataclasses.replace(TINY, num_layers=8, hidden_size=256, num_heads=8, num_kv_heads=8, head_dim=32,
                              intermediate_size=512, vocab_size=1024)
    mesh = tpu_topology_mesh("v5e-8", ("pp", "dp"), (4, 2))
    step = pipeline_step(big, mesh, batch=16, seq=64, micro_batches=4)
    mem = compiled_memory(step.fn, *step.args, top_buffers=0)
    assert mem.platform == "tpu" and mem.num_devices == 8
    # The stage model's state (meshplan.pure.cost.plan_stages): the fullest stage's layers with bf16 weights and
    # two fp32 Adam moments (5 bytes per weight byte), plus the embedding, norm and head the step keeps on every
    # stage, plus the tokens and Adam's step count. XLA agrees up to TPU tile padding of the small leaves.
    params = step.args[0][0]
    layers = params["model"]["layers"]["dense"]
    nbytes = lambda t: sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(t))
    plan = plan_stages(8, 4, micro_batches=4, layer_param_bytes=nbytes(layers) // 8, embed_param_bytes=0,
                       head_param_bytes=0, layer_activation_bytes=0, state_factor=5.0, schedule="circular")
    state = plan.state_bytes[plan.fullest] + 5 * (nbytes(params) - nbytes(layers)) + 2 * (16 // 2) * 64 * 4 + 4
    assert state <= mem.argument_bytes <= 1.01 * state
    leaf = layers["mlp"]["up_proj"]["weight"]
    assert leaf.sharding.shard_shape(leaf.shape) == (1, 1, 2, 512, 256)


def test_the_steps_bubble_is_the_circular_schedules(pipelined):
    assert pipelined.bubble == bubble_fraction(4, 4, schedule="circular", virtual=2)
    assert pipelined.iterations == 2 * 4 + 4 - 1


def test_a_loadax_config_naming_the_axis_pipeline_runs_the_one_repeat_schedule(pipelined):
    from meshplan import MeshConfig

    config = MeshConfig(mesh_shape=(4, -1), mesh_axis_names=("pipeline", "data"), batch_axis_names="data")
    step = pipeline_step(TINY, config.create_device_mesh(), batch=BATCH, seq=SEQ, micro_batches=4,
                         config=FP32_SGD)
    leaf = step.param_specs["model"]["layers"]["dense"]["mlp"]["up_proj"]["weight"]
    assert tuple(leaf)[:3] == (None, "pipeline", None) and step.stages == 4 and step.repeats == 1
    # One repeat (the static-slice path) and two repeats (checked against the unpipelined step) agree.
    params, data = _params(5), _batch(6)
    one = step.loss(to_stages(params, TINY, stages=4, repeats=1), data)
    two = pipelined.loss(to_stages(params, TINY, stages=4, repeats=2), data)
    np.testing.assert_allclose(one, two, rtol=1e-5)


@pytest.mark.parametrize("repeats", [1, 2])
def test_autodiff_keeps_what_the_circular_schedule_model_charges(repeats):
    # jax's own list of what the backward pass keeps (traced, nothing compiled): the residuals the pipeline
    # loop stacks per iteration (its stage inputs and, with repeats > 1, its weight slices) and, with one repeat,
    # the static slice of the stage's weights hoisted out of the loop; schedule_memory must name them to the
    # byte. Global shapes, the leading dim stage x iteration (stage x layer for the hoisted slice).
    from jax._src.ad_checkpoint import saved_residuals  # jax.ad_checkpoint only prints them

    step = pipeline_step(TINY, _mesh({"pp": 4, "dp": 2}), batch=BATCH, seq=SEQ, micro_batches=4, repeats=repeats,
                         config=ReferenceConfig(remat="full"))
    params, data = step.args[0][0], step.args[1]
    layers = params["model"]["layers"]["dense"]
    per, loop = 8 // (4 * repeats), step.stages * step.iterations
    micro = (BATCH // 4, SEQ, TINY.hidden_size)
    weight_shapes = {(loop, per, *a.shape[3:]) if repeats > 1 else (4 * per, *a.shape[3:])
                     for a in jax.tree.leaves(layers)}
    kept = {"saved": 0, "weights": 0}
    for aval, _ in saved_residuals(lambda p: step.loss(p, data), params):
        if not jnp.issubdtype(aval.dtype, jnp.floating):
            continue
        if aval.shape[:1] == (loop,) and aval.shape[-3:] == micro:
            kept["saved"] += aval.size * aval.dtype.itemsize
        elif aval.shape in weight_shapes:
            kept["weights"] += aval.size * aval.dtype.itemsize
    nbytes = lambda t: sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(t))
    one_input = int(np.prod(micro)) * 2  # bf16
    k = schedule_memory(4, 4, saved_bytes=(8 // 4) * one_input, input_bytes=one_input,
                        weight_bytes=nbytes(layers) // 4, schedule="circular", virtual=repeats)[0]
    assert (kept["saved"] // 4, kept["weights"] // 4) == (k.saved, k.weights)
    assert k.saved > 4 * (8 // 4) * one_input  # the bubble's iterations are kept too, not only m micro-batches


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.parametrize("sizes, m", [({"pp": 2, "fsdp": 4}, 2), ({"pp": 2, "dp": 2, "tp": 2}, 4)])
def test_a_stage_keeps_the_micro_batch_split_over_the_batch_axes(sizes, m):
    # The compiled step's every buffer with a sequence dim (activations, attention scores, logits: the per-device
    # HLO shapes) holds micro_batch / ways sequences in the stage, batch / ways outside it: none the whole
    # micro-batch or the whole batch. Before the stage pinned its batch split, XLA kept the micro-batch whole in
    # the stage and split the hidden dim over fsdp instead (f32[2,2,12,40,8] layer inputs) or nothing over dp
    # (f32[2,2,6,40,32]), as it did at full size with the whole batch's logits for the loss (llama3-70b on
    # pp=4 x fsdp=8 x tp=2: f32[64,4096,64128] per device). Sizes are picked so that the micro-batch, the batch
    # and the sequence are no other dim (m differs from the batch ways, so batch / ways is not the micro-batch).
    import re

    batch, seq = 24, 40
    ways = sizes.get("fsdp", 1) * sizes.get("dp", 1)
    step = pipeline_step(TINY, _mesh(sizes), batch=batch, seq=seq, micro_batches=m, repeats=2)
    hlo = step.lower().compile().as_text()
    shapes = {tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"\b[a-z]+\d*\[([\d,]+)\]", hlo)}
    with_seq = {s for s in shapes if seq in s}
    whole = sorted(s for s in with_seq if batch // m in s or batch in s)
    assert not whole, f"buffers with the whole micro-batch ({batch // m}) or batch ({batch}): {whole[:8]}"
    assert any(batch // m // ways in s[:s.index(seq)] for s in with_seq)  # the stage's split micro-batch is there


def test_stages_split_over_fsdp_or_dp_and_tp_give_the_same_loss(pipelined):
    # The batch and residual constraints inside the stage move data, never change it: the forward loss on
    # pp=2 stages split over fsdp=4, over dp=2 x tp=2 (the hidden dim of the stage inputs over tp), or over
    # sp=2 x tp=2 (the sequence over sp), is the pp=4 x dp=2 step's (itself checked against the unpipelined
    # step above).
    params, data = _params(7), _batch(8)
    want = pipelined.loss(to_stages(params, TINY, stages=4, repeats=2), data)
    for sizes in ({"pp": 2, "fsdp": 4}, {"pp": 2, "dp": 2, "tp": 2}, {"pp": 2, "sp": 2, "tp": 2}):
        step = pipeline_step(TINY, _mesh(sizes), batch=BATCH, seq=SEQ, micro_batches=2, repeats=2, config=FP32_SGD)
        got = step.loss(to_stages(params, TINY, stages=2, repeats=2), data)
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=str(sizes))
