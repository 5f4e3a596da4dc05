"""Reference train steps: a real, sharded, donated training step for any preset, built abstractly.

:func:`reference_step` builds the step a production trainer would compile for a
:class:`~meshplan.pure.ModelSpec` on a mesh (the forward pass is in
:mod:`meshplan.facade.verify._reference_model`): layers stacked and scanned (or
unrolled), a remat policy, an attention kind, fp32-logits cross-entropy
(optionally tiled), an optax optimizer whose state is kept in the optimizer
dtype, gradient accumulation over micro-batches, and every input sharded as the
plan says (parameters and optimizer state from the plan, the batch over the
mesh's batch axes). Its inputs are ``ShapeDtypeStruct``s with shardings, so
nothing is allocated and a 70B step compiles for a TPU topology on a laptop:
``meshplan.compiled_memory(ref.fn, *ref.args)``.

Parameters are the Hugging Face preset tree with each group of identical layers
stacked on a new leading dim (``model.layers`` becomes ``{"dense": ...}``,
``{"moe": ...}`` or both; GPT-2's ``transformer.h`` becomes ``{"dense": ...}``),
each stacked leaf taking its layer's spec with ``None`` in front, so per-device
bytes equal the planner's figure for the unstacked tree exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshplan.facade.verify import _reference_model as rm
from meshplan.pure._check import as_real, collect
from meshplan.pure._types import make_spec, make_struct
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.facade._model_file import resolve_model
from meshplan.pure.presets import ModelSpec, build_params
from meshplan.pure.rules._axis_kind import AxisKindRule
from meshplan.pure.rules._engine import plan_tree
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.specs._activation import layer_activation_specs
from meshplan.pure.specs._dtypes import canonical_dtype
from meshplan.pure.specs._training import optimizer_state_specs

__all__ = ["ReferenceConfig", "ReferenceStep", "reference_step", "BATCH_AXES"]

REMAT_POLICIES = ("none", "full", "dots", "offload")
ATTENTION_KINDS = ("plain", "dot_product", "flash")
OPTIMIZERS = ("adamw", "adafactor", "lion", "sgd")
BATCH_AXES = ("dp", "fsdp", "ep")
"""Mesh axes the batch is split over when the plan names none (the search's convention)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReferenceConfig:
    """How the reference step is written and what it keeps.

    Attributes:
      remat: ``"none"`` (the backward keeps every activation), ``"full"`` (only
        each layer's input, ``nothing_saveable``), ``"dots"`` (matmul outputs,
        ``dots_saveable``) or ``"offload"`` (layer inputs moved to pinned host
        memory; TPU/GPU targets only).
      attention: ``"plain"`` (fp32 ``s x s`` scores), ``"dot_product"``
        (``jax.nn.dot_product_attention``) or ``"flash"`` (under ``shard_map``, no ``sp``:
        the Pallas TPU flash kernel on TPU, cuDNN's fused attention,
        ``dot_product_attention(implementation="cudnn")``, on GPU).
      optimizer: ``"adamw"``, ``"adafactor"``, ``"lion"`` or ``"sgd"`` (with momentum), via optax.
      scan_layers: one ``lax.scan`` over stacked layers (compiles in seconds),
        else a Python loop (XLA sees every layer; slow to compile).
      micro_batches: gradient accumulation steps; the batch must divide by it
        times the batch-axis sizes.
      vocab_tiles: split the sequence into this many chunks for the loss, so
        only one chunk's fp32 logits live at a time.
      param_dtype: weights as stored (MaxText keeps fp32 weights, bf16 compute).
      compute_dtype: activations and matmul operands.
      optimizer_dtype: optimizer state (and the update arithmetic).
      capacity_factor: MoE expert capacity over the even share of tokens.
      learning_rate: the optimizer's step size (no effect on memory).

    Example:
      >>> ReferenceConfig(remat="dots").attention
      'dot_product'
    """

    remat: str = "full"
    attention: str = "dot_product"
    optimizer: str = "adamw"
    scan_layers: bool = True
    micro_batches: int = 1
    vocab_tiles: int = 1
    param_dtype: Any = "bfloat16"
    compute_dtype: Any = "bfloat16"
    optimizer_dtype: Any = "float32"
    capacity_factor: float = 1.25
    learning_rate: float = 1e-4

    def __post_init__(self) -> None:
        problems = []
        for name, allowed in (("remat", REMAT_POLICIES), ("attention", ATTENTION_KINDS),
                              ("optimizer", OPTIMIZERS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:  # `in` on an array compares element-wise
                problems.append(f"{name}={getattr(self, name)!r} must be one of {list(allowed)}")
        for name in ("micro_batches", "vocab_tiles"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"{name}={v!r} must be an int >= 1")
        if not isinstance(self.scan_layers, bool):
            problems.append(f"scan_layers={self.scan_layers!r} must be a bool")
        for name in ("capacity_factor", "learning_rate"):  # finite and > 0: nan, inf and 10**400 are refused
            collect(problems, problems, as_real, getattr(self, name), name, error=PlanError)
        if problems:
            raise PlanError("ReferenceConfig: " + "; ".join(problems) + ".")
        for name in ("param_dtype", "compute_dtype", "optimizer_dtype"):
            object.__setattr__(self, name, str(canonical_dtype(getattr(self, name))))

    @property
    def text(self) -> str:
        """One line: ``'remat=full attention=dot_product adamw bf16 params ...'``."""
        extra = [f"micro_batches={self.micro_batches}"] if self.micro_batches > 1 else []
        extra += [f"vocab_tiles={self.vocab_tiles}"] if self.vocab_tiles > 1 else []
        extra += [] if self.scan_layers else ["unrolled"]
        return " ".join([f"remat={self.remat}", f"attention={self.attention}", self.optimizer,
                         f"params={self.param_dtype}", f"compute={self.compute_dtype}",
                         f"optimizer_state={self.optimizer_dtype}", *extra])


@dataclasses.dataclass(frozen=True)
class ReferenceStep:
    """A built reference step: the jitted function, its abstract arguments and where they live.

    Attributes:
      fn: ``fn(state, batch) -> (state, metrics)``, jitted with the shardings,
        ``state`` donated.
      args: ``(state, batch)`` as ``ShapeDtypeStruct`` trees with shardings;
        ``state`` is ``(params, opt_state)``, ``batch`` ``{"inputs", "targets"}``
        of int32 ``(batch, seq)``.
      mesh: the mesh the shardings name.
      param_specs: the (stacked) parameters' PartitionSpecs.
      batch_spec: the PartitionSpec of the token arrays.
      model: the model.
      config: how the step is written.
      batch, seq: global batch (sequences) and tokens per sequence.
      layout_source: where the batch and residual-stream specs came from (the
        plan's, when a search candidate carrying them was given, else derived).
    """

    fn: Any
    args: tuple[Any, Any]
    mesh: Mesh
    param_specs: Any
    batch_spec: PartitionSpec
    model: ModelSpec
    config: ReferenceConfig
    batch: int
    seq: int
    layout_source: str = ""

    def lower(self) -> Any:
        """``fn.lower(*args)`` (the shardings name the mesh, so no mesh context is needed)."""
        return self.fn.lower(*self.args)


def _layer_groups(spec: ModelSpec) -> list[tuple[str, int, int]]:
    """``(name, first, stop)`` of each run of identical layers, in order."""
    if not spec.is_moe:
        return [("dense", 0, spec.num_layers)]
    # A spec may make every layer dense (num_dense_layers == num_layers): no empty group, which
    # would have no first layer to take its shapes from.
    groups = [("dense", 0, spec.num_dense_layers), ("moe", spec.num_dense_layers, spec.num_layers)]
    return [(name, first, stop) for name, first, stop in groups if stop > first]


def _layers_parent(tree: dict[str, Any], spec: ModelSpec) -> tuple[dict[str, Any], str]:
    return (tree["transformer"], "h") if spec.family == "gpt2" else (tree["model"], "layers")


def _stack(tree: dict[str, Any], specs: dict[str, Any], spec: ModelSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tree and its specs with each layer group stacked on a new leading dim."""
    tree, specs = _copy_top(tree, spec), _copy_top(specs, spec)
    parent, key = _layers_parent(tree, spec)
    sparent, _ = _layers_parent(specs, spec)
    layers, layer_specs = parent[key], sparent[key]
    stacked, stacked_specs = {}, {}
    for name, first, stop in _layer_groups(spec):
        n = stop - first
        ref_specs = layer_specs[str(first)]
        for i in range(first + 1, stop):
            if layer_specs[str(i)] != ref_specs:
                raise PlanError(f"layers {first} and {i} of {spec.name!r} got different specs; the reference "
                                "step stacks identical layers and needs one spec per leaf of a layer group.")
        stacked[name] = jax.tree.map(lambda s, n=n: make_struct((n, *s.shape), s.dtype),
                                     layers[str(first)])
        stacked_specs[name] = jax.tree.map(lambda p: make_spec(None, *p), ref_specs,
                                           is_leaf=lambda x: isinstance(x, PartitionSpec))
    parent[key], sparent[key] = stacked, stacked_specs
    return tree, specs


def _copy_top(tree: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    out = dict(tree)
    outer = "transformer" if spec.family == "gpt2" else "model"
    out[outer] = dict(tree[outer])
    return out


def _optimizer(config: ReferenceConfig) -> Any:
    import optax  # type: ignore[import-untyped]  # the reference steps are the one place the facade trains, so optax loads only here

    lr = config.learning_rate
    if config.optimizer == "adamw":
        return optax.adamw(lr, weight_decay=0.1)
    if config.optimizer == "adafactor":
        return optax.adafactor(lr)
    if config.optimizer == "lion":
        return optax.lion(lr, weight_decay=0.1)
    return optax.sgd(lr, momentum=0.9)


def _remat(fn: Callable[..., jax.Array], policy: str, *, scan: bool) -> Callable[..., jax.Array]:
    if policy == "none":
        return fn
    cp = jax.checkpoint_policies
    if policy == "full":
        chosen = cp.nothing_saveable
    elif policy == "dots":
        chosen = cp.dots_saveable
    else:
        chosen = cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=["layer_input"],
            offload_src="device", offload_dst="pinned_host")

        inner = fn

        def fn(x: jax.Array, p: Any) -> jax.Array:
            named: jax.Array = checkpoint_name(x, "layer_input")  # type: ignore[no-untyped-call]
            return inner(named, p)

    return jax.checkpoint(fn, policy=chosen, prevent_cse=not scan)


def _flash(mesh: Mesh, spec: PartitionSpec) -> Callable[..., jax.Array]:
    """Causal attention by the Pallas TPU flash kernel, per device under ``shard_map`` (batch and heads split)."""
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    def attend(q: jax.Array, k: jax.Array, v: jax.Array, kind: str) -> jax.Array:
        del kind
        n, h, hv = q.shape[2], q.shape[-1], v.shape[-1]
        if k.shape[2] != n:  # GQA: the kernel wants one key/value head per query head
            k, v = (jnp.repeat(t, n // k.shape[2], axis=2) for t in (k, v))
        if hv != h:  # MLA: value heads narrower than query/key heads
            v = jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, h - hv)))

        def kernel(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
            out: jax.Array = flash_attention(a, b, c, causal=True, sm_scale=1.0 / math.sqrt(h))
            return out

        run = jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
        out = run(*(t.transpose(0, 2, 1, 3) for t in (q, k, v)))
        return out.transpose(0, 2, 1, 3)[..., :hv]

    return attend


def _cudnn(mesh: Mesh, spec: PartitionSpec, heads_ways: int) -> Callable[..., jax.Array]:
    """Causal attention by cuDNN's fused (flash) kernel, per device under ``shard_map`` (batch and heads
    split): ``jax.nn.dot_product_attention(..., implementation="cudnn")``, which XLA:GPU compiles with no GPU."""

    def attend(q: jax.Array, k: jax.Array, v: jax.Array, kind: str) -> jax.Array:
        del kind
        n, h, hv = q.shape[2], q.shape[-1], v.shape[-1]
        if k.shape[2] % heads_ways:  # GQA with fewer key/value heads than tp ways: one per query head
            k, v = (jnp.repeat(t, n // k.shape[2], axis=2) for t in (k, v))
        if hv != h:  # MLA: value heads narrower than query/key heads
            v = jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, h - hv)))

        def kernel(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
            out: jax.Array = jax.nn.dot_product_attention(a, b, c, is_causal=True, implementation="cudnn")
            return out

        run = jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
        return run(q, k, v)[..., :hv]

    return attend


def _scan_body(fn: Callable[..., jax.Array]) -> Callable[[jax.Array, Any], tuple[jax.Array, None]]:
    def body(x: jax.Array, layer_params: Any) -> tuple[jax.Array, None]:
        return fn(x, layer_params), None

    return body


def _resolve(model: str | ModelSpec) -> ModelSpec:
    # A preset name, a model config file (HF config.json, MaxText yml) or a spec.
    return resolve_model(model)


def reference_step(
    model: str | ModelSpec,
    mesh: Mesh,
    *,
    batch: int,
    seq: int,
    plan: MeshCandidate | Any = None,
    config: ReferenceConfig | None = None,
    batch_axes: tuple[str, ...] | None = None,
) -> ReferenceStep:
    """Build the reference train step of ``model`` on ``mesh`` (see the module docstring).

    Args:
      model: a preset name, a model config file (a Hugging Face ``config.json`` or a MaxText
        model yml: :func:`~meshplan.load_model`) or a :class:`~meshplan.pure.ModelSpec` (e.g. a
        scaled-down copy: ``dataclasses.replace(spec, num_layers=2, num_params=None)``).
      mesh: a ``jax.sharding.Mesh`` (local devices, or a TPU topology's).
      batch: global batch in sequences.
      seq: tokens per sequence.
      plan: where the parameters go: a :class:`~meshplan.pure.MeshCandidate`
        from the search (planned for this model), a PartitionSpec tree for the
        Hugging Face preset tree, or ``None`` for ``AxisKindRule.for_model``.
      config: how the step is written (default :class:`ReferenceConfig`).
      batch_axes: mesh axes the batch is split over. Default: a search
        candidate's own batch and residual-stream specs when ``plan`` carries
        them, else the mesh's ``dp, fsdp, ep`` axes (and ``sp`` for the sequence).

    Returns:
      A :class:`ReferenceStep`; ``meshplan.compiled_memory(r.fn, *r.args)`` compiles it.

    Raises:
      PlanError: sizes that do not divide (batch over its axes and
        micro-batches, sequence over sp or vocab tiles), or a bad config.
      MeshplanTypeError: wrong argument types.

    Example:
      >>> import dataclasses, jax
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> tiny = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=2, hidden_size=64,
      ...     num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=256, num_params=None)
      >>> mesh = jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
      >>> ref = reference_step(tiny, mesh, batch=4, seq=32)
      >>> ref.batch_spec
      P('fsdp', None)
    """
    spec = _resolve(model)
    config = ReferenceConfig() if config is None else config
    if not isinstance(config, ReferenceConfig):
        raise MeshplanTypeError(f"config={config!r} must be a ReferenceConfig.")
    if not isinstance(mesh, Mesh):
        raise MeshplanTypeError(f"mesh={mesh!r} must be a jax.sharding.Mesh.")
    sizes = dict(mesh.shape)
    hf_tree = build_params(spec, dtype=config.param_dtype)
    hf_specs = _plan_specs(spec, hf_tree, plan, sizes)
    params, param_specs = _stack(hf_tree, hf_specs, spec)

    layout = _plan_layout(plan) if batch_axes is None else None
    if layout is not None:  # the search's own batch and residual-stream specs
        axes, sp, residual = layout
        source = "the plan's batch and activation specs"
    else:
        axes = tuple(a for a in BATCH_AXES if sizes.get(a, 1) > 1) if batch_axes is None else tuple(batch_axes)
        sp = "sp" if sizes.get("sp", 1) > 1 else None
        residual = make_spec(axes or None, sp, None)
        source = "derived from the mesh: the batch over its dp/fsdp/ep axes, the sequence over sp"
    unknown = [a for a in axes if a not in sizes]
    if unknown:
        raise PlanError(f"batch_axes {unknown} are not axes of the mesh {sizes}.")
    platform = mesh.devices.flat[0].platform
    problems = _request_problems(sizes, axes, sp, batch, seq, config, platform)
    if problems:
        raise PlanError(f"reference step for {spec.name!r}: " + "; ".join(problems) + ".")
    bspec = make_spec(axes or None, sp) if axes or sp else make_spec(None, None)
    baxes = axes or None

    def sharding(p: PartitionSpec) -> NamedSharding:
        return NamedSharding(mesh, p)

    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    tx = _optimizer(config)
    odt, pdt, cdt = (jnp.dtype(config.optimizer_dtype), jnp.dtype(config.param_dtype),
                     jnp.dtype(config.compute_dtype))
    opt_params = jax.tree.map(lambda s: make_struct(s.shape, odt), params)
    opt_state = jax.eval_shape(tx.init, opt_params)
    opt_specs = optimizer_state_specs(opt_params, param_specs, opt_state)
    state_specs = (param_specs, opt_specs)
    state_shardings = jax.tree.map(sharding, state_specs, is_leaf=is_spec)
    state_abstract = jax.tree.map(lambda s, sh: make_struct(s.shape, s.dtype, sharding=sh),
                                  (params, opt_state), state_shardings)
    tokens = make_struct((batch, seq), jnp.int32, sharding=sharding(bspec))
    batch_abstract = {"inputs": tokens, "targets": tokens}

    def constrain_to(p: PartitionSpec) -> Callable[[jax.Array], jax.Array]:
        def apply(x: jax.Array) -> jax.Array:
            out: jax.Array = jax.lax.with_sharding_constraint(x, sharding(p))  # type: ignore[no-untyped-call]
            return out

        return apply

    act = constrain_to(residual)
    # The layer's inner activations (heads, MLP widths, dispatched experts) as pure code places them:
    # only model and expert axes add constraints, so a step without tp or ep compiles as before.
    inner_specs = layer_activation_specs(
        sizes, bspec, heads=spec.num_heads,
        kv_heads=spec.num_heads if spec.mla is not None else spec.num_kv_heads, mlp=spec.intermediate_size,
        experts=spec.num_experts if spec.is_moe else 0, expert_mlp=spec.moe_intermediate_size if spec.is_moe else 0)
    inner = {name: constrain_to(p) for name, p in inner_specs.items() if name != "experts"}
    experts = constrain_to(inner_specs["experts"]) if "experts" in inner_specs else rm.same
    chunk = constrain_to(make_spec(None, baxes, sp, None))
    groups = _layer_groups(spec)
    heads = "tp" if sizes.get("tp", 1) > 1 and spec.num_heads % sizes["tp"] == 0 else None
    attend = rm.attention
    if config.attention == "flash" and platform == "gpu":  # cuDNN takes (batch, seq, heads, head_dim)
        attend = _cudnn(mesh, make_spec(baxes, None, heads, None), sizes["tp"] if heads else 1)
    elif config.attention == "flash":
        attend = _flash(mesh, make_spec(baxes, heads, None, None))
    layer_fns = {
        name: _remat(rm.layer_fn(spec, moe_layer=name == "moe", dtype=cdt, attention_kind=config.attention,
                                 capacity_factor=config.capacity_factor, constrain=act,
                                 constrain_experts=experts, attend=attend, inner=inner), config.remat,
                         scan=config.scan_layers)
        for name, _, _ in groups
    }

    def forward_loss(p: Any, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        x = act(rm.embed(p, inputs, spec, cdt))
        parent, key = _layers_parent(p, spec)
        for name, first, stop in groups:
            stack, fn = parent[key][name], layer_fns[name]
            if config.scan_layers:
                x, _ = jax.lax.scan(_scan_body(fn), x, stack)
            else:
                for i in range(stop - first):
                    x = fn(x, jax.tree.map(lambda a, i=i: a[i], stack))
        x = rm.final_norm(p, x, spec)
        total = rm.loss_from_hidden(x, targets, rm.head_weight(p, spec), cdt, vocab_tiles=config.vocab_tiles,
                                    constrain_chunk=chunk)
        return total / (inputs.shape[0] * inputs.shape[1])

    step = _train_step(jax.value_and_grad(forward_loss), tx, config.micro_batches,
                       constrain_to(make_spec(None, baxes, sp)), odt, pdt)
    fn = jax.jit(step, in_shardings=(state_shardings, jax.tree.map(lambda t: t.sharding, batch_abstract)),
                 out_shardings=(state_shardings, {"loss": sharding(make_spec())}), donate_argnums=0)
    return ReferenceStep(fn, (state_abstract, batch_abstract), mesh, param_specs, bspec, spec, config, batch, seq,
                         source)


def _request_problems(sizes: dict[str, int], axes: tuple[str, ...], sp: str | None, batch: int, seq: int,
                      config: ReferenceConfig, platform: str) -> list[str]:
    """What keeps the reference step from being built for this request on this platform (``[]``: nothing)."""
    ways = math.prod(sizes[a] for a in axes)
    problems = []
    if batch % (ways * config.micro_batches):
        problems.append(f"batch={batch} must divide by the batch axes {list(axes)} ({ways}) x "
                        f"micro_batches={config.micro_batches}")
    if seq % ((sizes[sp] if sp else 1) * config.vocab_tiles):
        problems.append(f"seq={seq} must divide by sp x vocab_tiles={config.vocab_tiles}")
    if config.attention == "flash" and (platform not in ("tpu", "gpu") or sp):
        problems.append("attention='flash' is the Pallas TPU kernel or cuDNN's fused attention on GPU: it needs "
                        "a TPU or GPU target and no sp axis (each device attends over the whole sequence)")
    if config.remat == "offload" and platform == "cpu":
        problems.append("remat='offload' moves activations to pinned host memory, which XLA:CPU does not "
                        "have; use a TPU or GPU target")
    return problems


def _train_step(grad_fn: Callable[..., Any], tx: Any, m: int, micro: Callable[[jax.Array], jax.Array],
                odt: Any, pdt: Any) -> Callable[[Any, dict[str, jax.Array]], Any]:
    """The step: the loss and gradients (summed over ``m`` micro-batches in a scan, each split as ``micro``
    places it), then the optimizer update in ``odt`` and the parameters written back in ``pdt``."""

    def step(state: Any, data: dict[str, jax.Array]) -> Any:
        p, o = state
        if m == 1:
            loss, grads = grad_fn(p, data["inputs"], data["targets"])
        else:
            def split(a: jax.Array) -> jax.Array:
                return micro(a.reshape(m, a.shape[0] // m, *a.shape[1:]))

            def accumulate(carry: Any, xs: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
                loss_i, g_i = grad_fn(p, *xs)
                return jax.tree.map(lambda a, b: a + b.astype(a.dtype), carry, (loss_i, g_i)), None

            zero = (jnp.zeros((), jnp.float32), jax.tree.map(lambda a: jnp.zeros(a.shape, odt), p))
            (loss, grads), _ = jax.lax.scan(accumulate, zero, (split(data["inputs"]), split(data["targets"])))
            loss, grads = loss / m, jax.tree.map(lambda g: g / m, grads)
        p32 = jax.tree.map(lambda a: a.astype(odt), p)
        updates, o = tx.update(jax.tree.map(lambda g: g.astype(odt), grads), o, p32)
        new = jax.tree.map(lambda a, u: (a + u).astype(pdt), p32, updates)
        return (new, o), {"loss": loss}

    return step


def _plan_layout(plan: Any) -> tuple[tuple[str, ...], str | None, PartitionSpec] | None:
    """(batch axes, sequence axis, residual-stream spec) from a search candidate that carries them."""
    if not isinstance(plan, MeshCandidate) or plan.activations is None:
        return None
    entries = tuple(plan.batch_spec) + (None, None)

    def names(entry: Any) -> tuple[str, ...]:
        return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)

    seq_axes = names(entries[1])
    if len(seq_axes) > 1:
        return None  # a sequence split over several axes: keep the derived layout
    return names(entries[0]), (seq_axes[0] if seq_axes else None), plan.activation_specs["residual"]


def _plan_specs(spec: ModelSpec, hf_tree: Any, plan: Any, sizes: dict[str, int]) -> Any:
    """PartitionSpecs for the unstacked Hugging Face tree."""
    if plan is None:
        return plan_tree(hf_tree, AxisKindRule.for_model(spec), sizes).specs
    if isinstance(plan, MeshCandidate):
        if plan.mesh_shape != {k: v for k, v in sizes.items()}:
            raise PlanError(f"plan mesh {plan.mesh_shape} differs from the mesh {sizes}.")
        # The candidate's groups name the dtype it planned; plan that tree, then use the specs for ours.
        dtypes = sorted({g.dtype for g in plan.groups}) or ["bfloat16"]
        planned_tree = build_params(spec, dtype=dtypes[0])
        return plan.specs_for(planned_tree)
    return plan


def stacked_params(model: str | ModelSpec, *, dtype: Any = jnp.bfloat16) -> Any:
    """The parameter tree the reference step trains (layers stacked), as ShapeDtypeStructs.

    Example:
      >>> stacked_params("gpt2")["transformer"]["h"]["dense"]["attn"]["c_attn"]["weight"].shape
      (12, 768, 2304)
    """
    spec = _resolve(model)
    tree = build_params(spec, dtype=dtype)
    specs = jax.tree.map(lambda s: make_spec(*([None] * len(s.shape))), tree)
    return _stack(tree, specs, spec)[0]

