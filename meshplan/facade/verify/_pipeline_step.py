"""A pipelined reference train step: stage-stacked weights over ``pp``, activations sent by ``ppermute``.

The unpipelined step (:func:`meshplan.facade.verify._reference.reference_step`) scans
one stack of ``L`` identical layers. Here the same layers are laid out as
MaxText's circular pipeline lays them out
(``src/maxtext/layers/pipeline.py``): the stack ``(L, ...)`` is stored as
``(repeats, stages, per_stage, ...)`` with the ``stages`` dim split over the
``pp`` mesh axis, so stage ``s`` holds layers
``(r * stages + s) * per_stage + j`` for every repeat ``r``: layer order runs
around the ring of stages ``repeats`` times ("circular", or "interleaved" with
``v = repeats`` virtual stages per device).

The schedule, written out (``m`` micro-batches, ``P`` stages, ``v`` repeats):
on iteration ``t`` (``0 <= t < v*m + P - 1``) stage ``s`` works on item
``w = t - s``: micro-batch ``w % m`` of repeat ``w // m`` (nothing when ``w`` is
outside ``[0, v*m)``: the bubble, ``(P-1)/(v*m+P-1)`` of the iterations). After
each iteration every stage sends its output to the next one with one
``jax.lax.ppermute`` over ``pp``, the last stage to the first (the ring). Stage
0 takes fresh micro-batches for the first ``m`` items and afterwards the last
stage's outputs, which it keeps in a circular store of ``m`` slots until they
are due (an item comes back after ``P`` iterations and is due after ``m``,
hence ``m >= P``). The last stage writes the final repeat's outputs into an
output buffer; the head and loss run after the pipeline, outside the
``shard_map``, as in MaxText. Only ``pp`` is manual inside the ``shard_map``;
the other mesh axes (``dp``, ``fsdp``, ``tp``) stay with the compiler, so the
weights inside a stage keep their planned shardings and are gathered per layer
as the unpipelined step gathers them. The activations are pinned, not left to
the compiler: every micro-batch-shaped value of the loop (stage input, the
ring's send, the store and output buffers) and the layers' residual stream are
laid out as the search lays out a stage's residual stream
(:func:`~meshplan.pure.specs.activation_layout`: the micro-batch over the batch
axes ``dp``, ``fsdp``, ``ep``, the hidden dim over ``tp``), and the heads and
MLP width over ``tp`` as ``reference_step`` pins them; without them XLA kept
each micro-batch whole on every device of a stage.
Micro-batch ``i`` is the sequences ``i, i + m, i + 2m, ...``, so the batch's
own split is each micro-batch's split, with no data moved either way.

Reverse-mode autodiff of this forward pass is the backward pipeline (the
transpose of a ``ppermute`` is the reverse ``ppermute``), so the gradients are
the unpipelined step's to rounding; ``tests/facade/test_pipeline_step.py``
checks that on 8 CPU devices. Dense models only (one group of identical
layers); the schedule is the GPipe order of fill, steady state and drain with
circular repeats, not 1F1B: autodiff runs every forward before any backward,
so the step keeps every iteration's stage inputs alive (``v*m + P - 1`` of
them, the bubble's too), and with ``repeats > 1`` the backward also keeps the
repeat's slice of the stage's weights for every iteration (the slice index is
traced); MaxText gathers per repeat instead (``pipeline_fsdp_ag_per_repeat``),
not done here. :func:`meshplan.pure.cost.schedule_memory` prices what this
loop keeps (``schedule="circular"``); ``tests/facade/test_pipeline_step.py``
checks it against jax's saved residuals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshplan.facade.verify import _reference as ref
from meshplan.facade.verify import _reference_model as rm
from meshplan.pure._types import make_spec, make_struct
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.mesh._pipeline_axis import pipeline_axis
from meshplan.pure.presets import ModelSpec, build_params
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.specs._activation import activation_layout, layer_activation_specs
from meshplan.pure.specs._training import optimizer_state_specs

__all__ = ["PipelineStep", "check_pipeline_layout", "from_stages", "pipeline_step", "to_stages"]

PP_AXIS = "pp"


@dataclasses.dataclass(frozen=True)
class PipelineStep:
    """A built pipelined step: the jitted function, its abstract arguments, and the schedule.

    Attributes:
      fn: ``fn(state, batch) -> (state, metrics)``, jitted with the shardings, ``state`` donated.
      args: ``(state, batch)`` as ``ShapeDtypeStruct`` trees with shardings.
      mesh: the mesh (it has a ``pp`` axis).
      param_specs: the stage-stacked parameters' PartitionSpecs.
      loss: ``loss(params, batch) -> scalar``, the pipelined forward pass and mean token loss (jitted).
      model, config, batch, seq: as :class:`~meshplan.facade.verify._reference.ReferenceStep`.
      stages, repeats, micro_batches: ``P``, ``v`` and ``m`` of the schedule.
      iterations: ``v*m + P - 1`` pipeline iterations per step.
    """

    fn: Any
    args: tuple[Any, Any]
    mesh: Mesh
    param_specs: Any
    loss: Any
    model: ModelSpec
    config: ref.ReferenceConfig
    batch: int
    seq: int
    stages: int
    repeats: int
    micro_batches: int

    @property
    def iterations(self) -> int:
        """Pipeline iterations per step: ``repeats * micro_batches + stages - 1``."""
        return self.repeats * self.micro_batches + self.stages - 1

    @property
    def bubble(self) -> float:
        """The idle share of a stage's iterations: ``(P-1)/(v*m+P-1)``."""
        return (self.stages - 1) / self.iterations

    def lower(self) -> Any:
        """``fn.lower(*args)``."""
        return self.fn.lower(*self.args)


def _layers(tree: dict[str, Any], spec: ModelSpec) -> Any:
    parent, key = ref._layers_parent(tree, spec)
    return parent[key]["dense"]


def _with_layers(tree: dict[str, Any], spec: ModelSpec, layers: Any) -> dict[str, Any]:
    out = ref._copy_top(tree, spec)
    parent, key = ref._layers_parent(out, spec)
    parent[key] = {"dense": layers}
    return out


def to_stages(params: Any, spec: ModelSpec, *, stages: int, repeats: int = 1) -> Any:
    """The reference step's stacked tree with its layer stack ``(L, ...)`` as ``(repeats, stages, L/(repeats*stages), ...)``.

    Works on arrays and on ``ShapeDtypeStruct`` trees; :func:`from_stages` undoes it.

    Example:
      >>> from meshplan.facade.verify._reference import stacked_params
      >>> from meshplan.pure.presets import get_preset
      >>> t = to_stages(stacked_params("gpt2"), get_preset("gpt2").spec, stages=2, repeats=3)
      >>> t["transformer"]["h"]["dense"]["attn"]["c_attn"]["weight"].shape
      (3, 2, 2, 768, 2304)
    """
    per = spec.num_layers // (stages * repeats)

    def split(a: Any) -> Any:
        shape = (repeats, stages, per, *a.shape[1:])
        return make_struct(shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a.reshape(shape)

    return _with_layers(params, spec, jax.tree.map(split, _layers(params, spec)))


def from_stages(params: Any, spec: ModelSpec) -> Any:
    """The inverse of :func:`to_stages`: the layer stack back as ``(L, ...)`` in layer order.

    Example:
      >>> from meshplan.facade.verify._reference import stacked_params
      >>> from meshplan.pure.presets import get_preset
      >>> s = get_preset("gpt2").spec
      >>> t = from_stages(to_stages(stacked_params("gpt2"), s, stages=4), s)
      >>> t["transformer"]["h"]["dense"]["mlp"]["c_fc"]["weight"].shape
      (12, 768, 3072)
    """
    def join(a: Any) -> Any:
        shape = (a.shape[0] * a.shape[1] * a.shape[2], *a.shape[3:])
        return make_struct(shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a.reshape(shape)

    return _with_layers(params, spec, jax.tree.map(join, _layers(params, spec)))


def check_pipeline_layout(spec: ModelSpec, sizes: dict[str, int], axis: str | None, batch: int, ways: int, m: int,
                          v: int, config: ref.ReferenceConfig) -> None:
    """Every reason the pipelined step cannot run this layout (``m`` micro-batches, ``v`` circular repeats, the
    batch split ``ways`` ways), collected and raised once as a :class:`~meshplan.errors.PlanError`."""
    stages = 0 if axis is None else sizes[axis]
    problems = []
    if axis is None:
        problems.append(f"the mesh {sizes} has no {PP_AXIS!r} axis (or loadax's 'pipeline', MaxText's 'stage'); "
                        "add one (its size is the stage count)")
    if spec.is_moe and spec.num_dense_layers < spec.num_layers:
        problems.append(f"{spec.name!r} mixes dense and MoE layers; the pipelined step stacks one group of "
                        "identical layers (dense models only)")
    if stages >= 1:
        if spec.num_layers % (stages * v):
            valid = [d for d in range(1, spec.num_layers + 1) if spec.num_layers % (stages * d) == 0]
            problems.append(f"num_layers={spec.num_layers} must divide by pp={stages} x repeats={v}; "
                            f"repeats that divide: {valid or 'none: choose a pp that divides the layers'}")
        if m < stages:
            problems.append(f"micro_batches={m} must be >= pp={stages} (a circular pipeline needs each item "
                            "back at the first stage before it is due)")
    if batch % (ways * m):
        problems.append(f"batch={batch} must divide by the batch axes ({ways}) x micro_batches={m}")
    if config.micro_batches != 1:
        problems.append(f"config.micro_batches={config.micro_batches}: the pipeline splits the batch itself; "
                        "pass micro_batches= to pipeline_step and leave the config's at 1")
    if config.vocab_tiles != 1 or config.attention == "flash" or config.remat == "offload":
        problems.append("the pipelined step supports vocab_tiles=1, attention 'plain'/'dot_product' and remat "
                        f"'none'/'full'/'dots'; got {config.text!r}")
    if problems:
        raise PlanError(f"pipelined step for {spec.name!r}: " + "; ".join(problems) + ".")


def _pin(spec: PartitionSpec) -> Callable[[jax.Array], jax.Array]:
    """A sharding constraint by a bare PartitionSpec, for use inside the ``shard_map``.

    jax resolves a bare spec against the mesh in context; inside the ``shard_map`` that is its mesh with
    ``pp`` manual, so the spec may name only the other (auto) axes, and does: the batch axes, ``tp``.
    """
    def apply(x: jax.Array) -> jax.Array:
        out: jax.Array = jax.lax.with_sharding_constraint(x, spec)  # type: ignore[no-untyped-call]
        return out

    return apply


def _pipeline(layer: Callable[[jax.Array, Any], jax.Array], mesh: Mesh, axis: str, stages: int, m: int, v: int,
              weight_specs: Any, residual: tuple[Any, ...]) -> Callable[[Any, jax.Array], jax.Array]:
    """``run(stage_weights, x) -> y``: ``x``/``y`` are ``(m, micro_batch, seq, d)``, the schedule of the docstring.

    Every micro-batch-shaped value (the input, the store and output buffers, each iteration's stage input and
    output) is kept as ``residual`` (the three entries of a ``(batch, seq, d)`` spec) lays out the residual
    stream: the micro-batch dim over the batch axes, as the unpipelined step keeps its batch. The loop's
    ``where``/``dynamic_update`` selects and the ``ppermute`` otherwise leave XLA free to hold a whole
    micro-batch on every device (it did: a stage's attention scores and its layer inputs were the
    micro-batch's whole on each device, split over ``fsdp`` on the hidden dim instead, if at all).
    """
    ring = [(i, (i + 1) % stages) for i in range(stages)]
    iterations = v * m + stages - 1
    one = _pin(make_spec(*residual))              # (micro_batch, seq, d)
    every = _pin(make_spec(None, *residual))      # (m, micro_batch, seq, d)

    def stage_layers(x: jax.Array, w: Any) -> jax.Array:
        y, _ = jax.lax.scan(lambda h, p: (layer(h, p), None), x, w)
        return y

    def this_repeat(w: Any, inp: jax.Array, repeat: jax.Array) -> jax.Array:
        if v == 1:
            # A static slice of the loop-invariant stack: jax hoists it out of the iterations' residuals
            # (one residual copy). A traced index makes the backward keep a slice per iteration; with
            # v > 1 it does (see the module docstring; schedule_memory prices both).
            return stage_layers(inp, jax.tree.map(lambda a: a[0], w))
        return stage_layers(inp, jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, repeat, 0, keepdims=False), w))

    def per_device(w: Any, x: jax.Array) -> jax.Array:
        # w: (v, 1, per_stage, ...) this stage's layers for every repeat; x: (1, m, ...) all m micro-batches.
        w = jax.tree.map(lambda a: a[:, 0], w)
        x = every(x[0])
        s = jax.lax.axis_index(axis)
        # x is this stage's own copy (varying over pp), so are the buffers made from it.
        zero = one(jnp.zeros_like(x[0]))
        store, out = every(jnp.zeros_like(x)), every(jnp.zeros_like(x))

        def body(carry: tuple[jax.Array, jax.Array, jax.Array], t: jax.Array) -> Any:
            incoming, store, out = carry
            incoming = one(incoming)
            # Stage 0 keeps what the last stage sent (item t - P) until it is due (item t - P + m).
            back = t - stages
            store = every(jnp.where((s == 0) & (back >= 0),
                                    jax.lax.dynamic_update_index_in_dim(store, incoming, back % m, 0), store))
            fresh = jax.lax.dynamic_index_in_dim(x, jnp.minimum(t, m - 1), 0, keepdims=False)
            again = jax.lax.dynamic_index_in_dim(store, t % m, 0, keepdims=False)
            first_in = jnp.where(t < m, fresh, again)
            inp = one(jnp.where(s == 0, first_in, incoming))
            w_item = t - s
            repeat = jnp.clip(w_item // m, 0, v - 1)
            y = one(this_repeat(w, inp, repeat))
            done = (s == stages - 1) & (w_item >= (v - 1) * m) & (w_item < v * m)
            out = every(jnp.where(done, jax.lax.dynamic_update_index_in_dim(out, y, w_item % m, 0), out))
            sent = one(jax.lax.ppermute(y, axis, ring))  # type: ignore[no-untyped-call]  # unannotated in jax
            return (sent, store, out), None

        (_, _, out), _ = jax.lax.scan(body, (zero, store, out), jnp.arange(iterations))
        stacked: jax.Array = out[None]  # (1, m, ...): the stage dim, only the last stage's is the answer
        return stacked

    by_stage = PartitionSpec(axis)  # type: ignore[no-untyped-call]
    run = jax.shard_map(per_device, mesh=mesh, in_specs=(weight_specs, by_stage),
                        out_specs=by_stage, axis_names=frozenset({axis}))

    def apply(w: Any, x: jax.Array) -> jax.Array:
        # Every stage gets the micro-batches as its own (varying) copy: a replicated input's gradient would be
        # a psum inside the shard_map, which XLA:CPU fails to compile in bf16 (its all-reduce promotion meets
        # the reducer's sharding constraint: "Invalid binary instruction opcode copy"). Per device it is the
        # same one copy of x either way; the sum of the copies' gradients is the partitioner's.
        copies = jnp.broadcast_to(x[None], (stages, *x.shape))
        copies = jax.lax.with_sharding_constraint(  # type: ignore[no-untyped-call]
            copies, NamedSharding(mesh, make_spec(axis, None, *residual)))
        return run(w, copies)[-1]

    return apply


def pipeline_step(
    model: str | ModelSpec,
    mesh: Mesh,
    *,
    batch: int,
    seq: int,
    micro_batches: int,
    repeats: int = 1,
    plan: MeshCandidate | Any = None,
    config: ref.ReferenceConfig | None = None,
) -> PipelineStep:
    """Build the pipelined train step of ``model`` on ``mesh`` (see the module docstring).

    Args:
      model: a preset name or a dense :class:`~meshplan.pure.ModelSpec`.
      mesh: a ``jax.sharding.Mesh`` with a ``pp`` axis (its size is the stage count; loadax's
        ``pipeline`` and MaxText's ``stage`` names are taken too, see
        :func:`~meshplan.pure.mesh.pipeline_axis`).
      batch, seq: global batch (sequences) and tokens per sequence.
      micro_batches: ``m``, at least the stage count; the batch divides by it times the batch axes.
      repeats: ``v``, circular repeats (virtual stages per device); ``pp * v`` divides the layers.
      plan: where each layer's weights go inside a stage (as ``reference_step``'s ``plan``,
        planned on the mesh without ``pp``); default ``AxisKindRule.for_model``.
      config: how the step is written (``micro_batches`` and ``vocab_tiles`` stay 1).

    Returns:
      A :class:`PipelineStep`.

    Raises:
      PlanError: a schedule the step cannot run (no ``pp`` axis, layers that do not
        divide, fewer micro-batches than stages, an MoE model), naming the values.
      MeshplanTypeError: wrong argument types.

    Example:
      >>> import dataclasses, jax
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> tiny = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=4, hidden_size=32,
      ...     num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64, vocab_size=128, num_params=None)
      >>> mesh = jax.make_mesh((4, 2), ("pp", "dp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
      >>> step = pipeline_step(tiny, mesh, batch=8, seq=8, micro_batches=4)
      >>> step.iterations, round(step.bubble, 3)
      (7, 0.429)
    """
    spec = ref._resolve(model)
    config = ref.ReferenceConfig() if config is None else config
    if not isinstance(config, ref.ReferenceConfig):
        raise MeshplanTypeError(f"config={config!r} must be a ReferenceConfig.")
    if not isinstance(mesh, Mesh):
        raise MeshplanTypeError(f"mesh={mesh!r} must be a jax.sharding.Mesh.")
    for name, value in (("batch", batch), ("seq", seq), ("micro_batches", micro_batches), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name}={value!r} must be an int >= 1.")
    sizes = dict(mesh.shape)
    axes = tuple(a for a in ref.BATCH_AXES if sizes.get(a, 1) > 1)
    ways = math.prod(sizes[a] for a in axes)
    axis = pipeline_axis(tuple(sizes))
    check_pipeline_layout(spec, sizes, axis, batch, ways, micro_batches, repeats, config)
    assert axis is not None  # _check refused a mesh without one
    stages, m, v = sizes[axis], micro_batches, repeats

    inner_sizes = {k: n for k, n in sizes.items() if k != axis}
    hf_tree = build_params(spec, dtype=config.param_dtype)
    hf_specs = ref._plan_specs(spec, hf_tree, plan, inner_sizes)
    stacked, stacked_specs = ref._stack(hf_tree, hf_specs, spec)
    params = to_stages(stacked, spec, stages=stages, repeats=v)
    is_spec = lambda x: isinstance(x, PartitionSpec)
    # The stacked layer spec is (None, *layer); the stage-stacked one (repeats, stages over pp, per stage, *layer).
    layer_specs = jax.tree.map(lambda p: make_spec(None, axis, None, *tuple(p)[1:]), _layers(stacked_specs, spec),
                               is_leaf=is_spec)
    param_specs = _with_layers(stacked_specs, spec, layer_specs)
    # Inside the shard_map only pp is manual: the weight specs name pp alone.
    manual_specs = jax.tree.map(lambda p: make_spec(None, axis), layer_specs, is_leaf=is_spec)

    def sharding(p: PartitionSpec) -> NamedSharding:
        return NamedSharding(mesh, p)

    tx = ref._optimizer(config)
    odt, pdt, cdt = (jnp.dtype(config.optimizer_dtype), jnp.dtype(config.param_dtype),
                     jnp.dtype(config.compute_dtype))
    opt_params = jax.tree.map(lambda s: make_struct(s.shape, odt), params)
    opt_state = jax.eval_shape(tx.init, opt_params)
    opt_specs = optimizer_state_specs(opt_params, param_specs, opt_state)
    state_shardings = jax.tree.map(sharding, (param_specs, opt_specs), is_leaf=is_spec)
    state_abstract = jax.tree.map(lambda s, sh: make_struct(s.shape, s.dtype, sharding=sh),
                                  (params, opt_state), state_shardings)
    seq_axis = "sp" if inner_sizes.get("sp", 1) > 1 else None
    bspec = make_spec(axes or None, seq_axis)  # the tokens: batch over its axes, the sequence over sp
    # The residual stream (batch, seq, d) as the search lays out a stage's (activation_layout, what its memory
    # model charges): the batch over its axes and the hidden dim over tp (else the sequence, where tp divides
    # it), so each iteration's saved stage inputs are split over tp too.
    layout = activation_layout(inner_sizes, batch=batch, seq=seq, hidden=spec.hidden_size, vocab=spec.vocab_size,
                               batch_axes=axes, seq_axes=(seq_axis,) if seq_axis else ())
    entries = (*tuple(layout.specs["residual"]), None, None, None)[:3]
    residual = make_spec(*entries)
    tokens = make_struct((batch, seq), jnp.int32, sharding=sharding(bspec))
    batch_abstract = {"inputs": tokens, "targets": tokens}

    # Inside a stage the layer is constrained as reference_step constrains a planned one: its residual stream as
    # above, its heads and MLP width over tp; bare specs, as the shard_map's mesh has pp manual.
    inner_specs = layer_activation_specs(inner_sizes, bspec, heads=spec.num_heads,
                                         kv_heads=spec.num_heads if spec.mla is not None else spec.num_kv_heads,
                                         mlp=spec.intermediate_size)
    layer = ref._remat(rm.layer_fn(spec, moe_layer=False, dtype=cdt, attention_kind=config.attention,
                                   capacity_factor=config.capacity_factor, constrain=_pin(residual),
                                   constrain_experts=rm.same,
                                   inner={name: _pin(p) for name, p in inner_specs.items()}), config.remat, scan=True)
    run = _pipeline(layer, mesh, axis, stages, m, v, manual_specs, entries)
    micro = make_spec(None, *entries)

    def forward_loss(p: Any, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        # The batch split first, then the hidden dim's (a local slice): straight from the embedding gather's
        # layout (hidden over fsdp) to the residual's, XLA:GPU's partitioner replicates the whole batch's
        # embeddings ("involuntary full rematerialization", bf16[64,4096,8192] for llama3-70b).
        x = rm.embed(p, inputs, spec, cdt)
        x = jax.lax.with_sharding_constraint(x, sharding(make_spec(*bspec, None)))  # type: ignore[no-untyped-call]
        x = jax.lax.with_sharding_constraint(x, sharding(residual))  # type: ignore[no-untyped-call]
        # Micro-batch i is the sequences i, i + m, i + 2m, ...: the batch split over its axes in blocks of
        # batch/ways sequences is then each micro-batch split the same way, with no data moved (a contiguous
        # split would give each device whole micro-batches, to be re-split by an all-to-all), and the
        # pipeline's output goes back to the batch's own split for the head and loss by the inverse reshape.
        # The loss is a sum over sequences, so which sequence runs in which micro-batch changes nothing else.
        x = x.reshape(batch // m, m, seq, x.shape[-1]).swapaxes(0, 1)
        x = jax.lax.with_sharding_constraint(x, sharding(micro))  # type: ignore[no-untyped-call]
        y = run(_layers(p, spec), x).swapaxes(0, 1).reshape(batch, seq, -1)
        y = jax.lax.with_sharding_constraint(y, sharding(residual))  # type: ignore[no-untyped-call]
        y = rm.final_norm(p, y, spec)
        total = rm.loss_from_hidden(y, targets, rm.head_weight(p, spec), cdt, vocab_tiles=1,
                                    constrain_chunk=rm.same)
        return total / (batch * seq)

    grad_fn = jax.value_and_grad(forward_loss)

    def step(state: Any, data: dict[str, jax.Array]) -> Any:
        p, o = state
        loss, grads = grad_fn(p, data["inputs"], data["targets"])
        p32 = jax.tree.map(lambda a: a.astype(odt), p)
        updates, o = tx.update(jax.tree.map(lambda g: g.astype(odt), grads), o, p32)
        new = jax.tree.map(lambda a, u: (a + u).astype(pdt), p32, updates)
        return (new, o), {"loss": loss}

    batch_shardings = jax.tree.map(lambda t: t.sharding, batch_abstract)
    fn = jax.jit(step, in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, {"loss": sharding(make_spec())}), donate_argnums=0)
    loss = jax.jit(lambda p, data: forward_loss(p, data["inputs"], data["targets"]),
                   in_shardings=(state_shardings[0], batch_shardings))
    return PipelineStep(fn, (state_abstract, batch_abstract), mesh, param_specs, loss, spec, config, batch, seq,
                        stages, v, m)
