"""Peak memory of one training step per device: phases on top of the resident state.

XLA's peak is not a sum of everything a step ever holds: it is the fullest
moment, and different buffers are alive at different moments. The model
prices three phases, each on top of the **resident** state ``R`` (parameters
and optimizer state, exact from the plan), and takes the maximum:

- ``forward``: the end of the forward pass and the start of the loss backward:
  ``R + saved + logits + head``. ``saved = L x`` a layer's saved activations
  (by the remat policy); ``logits``: fp32 logits-sized buffers (the logits,
  their softmax and gradient), divided by the vocab tiles; ``head``: the
  output head gathered and its gradient before the reduce-scatter, or (XLA:TPU,
  a plan splitting the head's vocabulary over a batch axis) the hidden states
  gathered instead when they are the smaller operand (:func:`head_layout`);
- ``backward``: the first layer of the backward pass: ``R + G + saved +
  work + gathered``. ``G``: the gradients (exact bytes; scanned layers write
  them into one stacked buffer that lives through the whole backward pass),
  plus an fp32 accumulator with micro-batches; ``work``: one layer's
  recomputed intermediates and their gradients; ``gathered``: fsdp-gathered
  weights, ``gathered_layers`` x a layer's share of the gathered bytes (the
  embedding and head gathers are not a layer's: :attr:`LayerDims.layer_share`);
- ``update``: the optimizer update: ``R + G + update``. XLA updates the
  leaves one after another, and for the leaf being updated it writes the new
  fp32 moments before the donated old ones are released, so ``update`` is
  ``update_leaf`` fp32 copies of the **largest stacked leaf** (scanned layers
  stack each projection over the layers: Llama-3-8B's ``32 x 4096 x 14336``
  MLP weights, 7.0 GiB in fp32 on one device; its per-device size is taken as
  its share of the parameters, :attr:`LayerDims.largest_share`, times this
  device's parameters) plus ``update_state`` x ``R`` for what small leaves
  updated together add. Measured on an H200: full-size Llama-3-8B peaks at
  104.16 GiB = arguments 74.79 + gradients 14.96 + 14.41 (2.06 copies of
  that leaf); a fixed fraction of the state priced it at 145.1 GiB.

A layer's activations per device (``t`` = micro-batch x local sequence tokens,
``a`` = compute itemsize, ``r`` = the residual stream's split over tp) are
counted in named pieces: ``x`` = the layer input ``t*h*a/r``; ``proj`` = q, k,
v and the attention output; ``mlp`` = gate, up and their product (dense widths
split over tp; MoE expert widths ``top_k x capacity_factor`` split by token);
``scores`` = one fp32 ``b x heads/tp x s x s`` buffer (plain and XLA's
dot_product attention; none with flash) plus MoE's dispatch/combine tensors
``b x s x s x top_k x capacity_factor``, which grow like scores. The recipe's
MoE dispatch decides the last two (:class:`~meshplan.pure.cost._moe_dispatch.
MoeDispatch`): a ``"dropless"`` recipe (grouped GEMMs over the routed tokens)
prices the experts at exactly ``top_k`` rows per token and keeps no routing
tensor (the router's ``b x s x top_k`` indices and weights are not priced).
That figure is this model with the routing terms removed, **not calibrated on a
dropless compile**: the coefficients below were fitted to compiles of the
reference step, which runs the einsum dispatch only. Remat ``full``
saves ``x``; ``dots`` ``x``, the matmul outputs without batch dims; ``none``
everything (``none_scale`` x the pieces, plus ``score_buffers`` scores);
``offload`` nothing.

**Calibration.** :class:`Calibration` holds the coefficients, one set per
compiler (and per TPU generation where XLA:TPU's schedule differs:
:func:`calibration_key` picks ``"tpu-v5p"`` for a recipe whose ``device`` is a
v5p; v4 and v5e, with no compiled grid, take ``"tpu"``, the v6e fit), fitted
to the peaks XLA reports (``compiled.memory_analysis()``) for the reference
train steps of ``meshplan.facade.verify._reference`` (GPT-2, Llama, Mixtral; see
``benchmarks/bench_memory_calibration.py`` and the table in
``benchmarks/RESULTS.md``). Compilers lower the same step differently, so the
backend is part of the recipe: XLA:CPU upcasts bf16 matmul operands to fp32
(its gathered weights are fp32: ``gathered_itemsize=4``) and all-reduces
gradients whole before slicing them, so it has its own coefficients; an H200
(XLA:GPU) has its own too. XLA:TPU tiles arrays ``(8, 128)``, so a head dim of
64 takes 128 lanes (``lane_pad``); the Pallas flash kernel (TPU) keeps its own
q/k/v/o copies and broadcasts its row statistics to 128 lanes; GShard's fp32
one-hot slot tensor ``(b, s, top_k, experts, capacity)`` is kept for the
backward pass (``routing_per_choice``). The loss phase reads which operand
of the head's matmul XLA's SPMD partitioner gathers where the plan splits the
head's vocabulary over a batch axis (:class:`HeadLayout`, ``loss_gather``): the
hidden states, when their shard is the smaller operand, with the fp32 logits and
their gradient in the compute dtype. Parameters, gradients and optimizer
state are exact; everything else is calibrated, and only as good as the grid
it was fitted on."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from meshplan.pure._check import as_count, as_real, canonical_axis_sizes
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets._spec import ModelSpec
from meshplan.pure.cost._gathered_operand import (
    HeadLayout,
    gathers_hidden,
    head_layout,
)
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MoeDispatch
from meshplan.pure.cost._recipe import TrainingRecipe

__all__ = ["CALIBRATIONS", "ActivationParts", "Calibration", "HeadLayout", "LayerDims", "StepMemory",
           "activation_floor", "activation_parts", "calibration_key", "head_layout", "layer_dims", "lower_bound",
           "price_state", "price_step", "step_memory"]


@dataclasses.dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted coefficients of the phase model for one compiler (see the module docstring).

    Attributes:
      source: what the figures were fitted against.
      none_scale: a layer's saved activations with remat ``none``, in units of the named pieces
        (compilers keep upcasts, masks and transposes besides them).
      score_buffers: fp32 score buffers a layer saves with remat ``none`` and plain attention.
      work_layers: one layer's backward working set, in units of a layer's ``none`` activations.
      work_scores: fp32 score buffers in that working set (plain attention).
      logits_buffers: fp32 logits-sized buffers live at the start of the loss backward.
      head_buffers: output-head-sized buffers (compute dtype) live then: the gathered head and
        embedding, the head's gradient before it is reduce-scattered.
      gathered_layers: layers of fsdp-gathered weights held at once.
      gathered_itemsize: bytes per gathered weight element (0: the compute dtype).
      update_state: fraction of the resident state the update phase writes anew before
        the old buffers are released.
      lane_pad: the lanes a minor dimension is padded to (XLA:TPU tiles arrays ``(8, 128)``:
        a head dim of 64 takes 128); 0: no padding.
      flash_buffers: the Pallas flash kernel's backward buffers live at once (its q, k, v, o
        copies and 128-lane row statistics; 1 = all of them).
      routing_per_choice: whether the MoE routing priced is GShard's fp32 one-hot slot tensor
        (``top_k`` routing tensors, what XLA:TPU keeps for the backward pass) rather than one.
      update_leaf: fp32 copies of the largest stacked parameter leaf the update phase holds
        besides the state and the gradients (the new moments of the leaf being updated are
        written before its old ones are released); ``update_state`` then prices what the
        many small leaves add.
      work_routing: fp32 MoE routing tensors ``(b, s, experts, capacity)`` in the backward working
        set, priced apart from the attention scores; ``None``: priced with them (``work_scores`` x
        ``top_k`` of them when ``routing_per_choice``).
      loss_gather: whether the loss phase reads which operand of the head's matmul XLA's SPMD
        partitioner gathers (:class:`HeadLayout`): where the plan splits the head's vocabulary over a
        batch axis and the hidden states are the smaller operand, it gathers them and holds the fp32
        logits and their gradient in the compute dtype instead of a gathered head (structural, read off
        the full-size TPU rows); ``False``: the head is priced gathered (``logits_buffers``,
        ``head_buffers``) whatever the plan.
    """

    source: str
    none_scale: float
    score_buffers: float
    work_layers: float
    work_scores: float
    logits_buffers: float
    head_buffers: float
    gathered_layers: float
    gathered_itemsize: int
    update_state: float
    lane_pad: int = 0
    flash_buffers: float = 1.0
    routing_per_choice: bool = False
    update_leaf: float = 0.0
    work_routing: float | None = None
    loss_gather: bool = False


# Fitted (least squares on log(analytic / exact)) to the reference steps of
# benchmarks/bench_memory_calibration.py: GPT-2, Llama and Mixtral scaled down to 4 layers,
# meshes of 8 devices, remat full/none; CPU and GPU: plain and dot_product attention at
# 16 x 256 (2026-11-22; 16 x 512 held out); TPU as said below. Recorded rows in benchmarks/data/.
# XLA:TPU v6e (and the TPU fallback): fitted 2026-11-23 to the 12 v6e-8 rows at 32 x 1024 on fsdp=8 (3 families
# x remat x plain/flash); score_buffers (the fp32 scores and their bf16 probabilities), lane_pad, the flash
# kernel's buffers and the per-choice MoE slot tensor are structural, read off XLA's buffers live at the peak
# (at the step XLA's live-range report names, which is not always the fullest: docs/design-notes.md);
# head_buffers is the CPU/GPU grid's value (no row of the TPU grid peaks where it matters); gathered_layers is
# fitted to the same 12 rows, a layer's share of the gathered bytes excluding the embedding and head. The update:
# full-size Llama-3-8B on v5p-8 fsdp=4 (4 x 2048) and v6e-8 fsdp=8 (8 x 1024) peak at arguments +
# gradients + 0.6 / 0.4 GiB: XLA:TPU updates the moments in place, so update_leaf is bounded by those rows (at
# most 0.34 / 0.48 copies of the 1.75 / 0.88 GiB fp32 leaf), not identified by them (the backward phase is their
# peak); 0.96 x the state priced them at 1.75x.
_TPU_V6E = Calibration("XLA:TPU v6e-8 (libtpu 0.0.42.1 AOT) peak_memory_in_bytes of the reference steps at "
                       "32 x 1024, 2026-11-23",
                       none_scale=1.59, score_buffers=1.5, work_layers=0.27, work_scores=1.39, logits_buffers=1.09,
                       head_buffers=2.6, gathered_layers=0.84, gathered_itemsize=0, update_state=0.0,
                       lane_pad=128, flash_buffers=0.5, routing_per_choice=True, update_leaf=0.3,
                       loss_gather=True)

CALIBRATIONS: dict[str, Calibration] = {
    # XLA:TPU by generation (calibration_key): the compiler schedules the same step differently on v5p
    # and v6e. "tpu" is the v6e fit, also for generations with no compiled grid (v4, v5e).
    "tpu": _TPU_V6E,
    "tpu-v6e": _TPU_V6E,
    # v5p: structural, read off the buffers live at XLA's peak on the v5p-16
    # 32 x 1024 rows: the flash kernel's q/k/v/o copies and 128-lane row statistics are device buffers
    # there (flash_buffers 1, against v6e's 0.5), the remat-full backward holds the fp32 scores and bf16
    # probabilities (work_scores 1.5) and one fp32 routing tensor (b, s, experts, capacity) apart from
    # them (work_routing 1, where pricing it with the scores counted 1.39 x top_k); none_scale and
    # work_layers fitted (least squares on log ratio) to the 48 v5p-16 rows at 32 x 1024 (in-sample);
    # logits, head, gathered and update coefficients are v6e's (no v5p row identifies them). Held out:
    # v5p-16 at 32 x 2048 and the full-size v5p rows. (At 32 x 2048 XLA holds two fp32 routing tensors where
    # work_routing prices one; no plan fact found decides one vs two, see docs/design-notes.md.)
    "tpu-v5p": dataclasses.replace(
        _TPU_V6E, source="XLA:TPU v5p-16 (libtpu 0.0.42.1 AOT) peak_memory_in_bytes of the reference steps at "
                         "32 x 1024, 2026-11-23", none_scale=1.67, work_layers=0.29, work_scores=1.5,
        flash_buffers=1.0, work_routing=1.0),
    # CPU: gathered_layers fitted on the seq 256 rows, a layer's share of the gathered bytes excluding the
    # embedding and head (LayerDims.layer_share).
    "cpu": Calibration("XLA:CPU (jax 0.10.2, 8 devices) argument + output - alias + temp of the reference "
                       "steps, 2026-11-22",
                       none_scale=2.91, score_buffers=2.67, work_layers=3.37, work_scores=2.27, logits_buffers=2.0,
                       head_buffers=2.5, gathered_layers=2.47, gathered_itemsize=4, update_state=0.75),
    # GPU update: two fp32 copies of the largest stacked leaf (the new moments written before
    # the old are released), fitted to the full-size H200 rows (Llama-3-8B 2 x 4096: 2.06 copies at the
    # peak; Mixtral-8x7B/2L 4 x 2048 1.30x before); the 4-layer rows never peak in the update.
    "gpu": Calibration("XLA:GPU H200 (jax 0.11.2, one device) peak_memory_in_bytes of the reference steps, "
                       "2026-11-22",
                       none_scale=1.82, score_buffers=2.04, work_layers=1.22, work_scores=2.64, logits_buffers=2.0,
                       head_buffers=2.5, gathered_layers=2.0, gathered_itemsize=0, update_state=0.0,
                       update_leaf=2.0),
}


def calibration_key(recipe: TrainingRecipe) -> str:
    """The :data:`CALIBRATIONS` key a recipe is priced with: ``"<backend>-<device>"`` where that device has
    coefficients of its own (XLA:TPU's schedule differs by generation), else the backend.

    Example:
      >>> [calibration_key(TrainingRecipe(device=d)) for d in ("v5p", "v6e", "v4", None)]
      ['tpu-v5p', 'tpu-v6e', 'tpu', 'tpu']
      >>> calibration_key(TrainingRecipe(backend="gpu", device="H200"))
      'gpu'
    """
    if recipe.device is not None:
        key = f"{recipe.compiler}-{recipe.device}"
        if key in CALIBRATIONS:
            return key
    return recipe.compiler


@dataclasses.dataclass(frozen=True, slots=True)
class LayerDims:
    """A model's per-token widths, computed once per search (see :func:`layer_dims`).

    Attributes:
      layers: transformer layers.
      hidden: residual width ``h``.
      heads: query heads; ``kv_heads``: key/value heads.
      q_width: ``heads * q_head_dim``; ``kv_width``: ``kv_heads * head_dim`` (k and v each).
      mlp_width: dense MLP width averaged over layers (split over tp).
      vocab: vocabulary size.
      head: elements of the output head (``vocab x hidden``).
      top_k: routed experts per token (0 without MoE layers); GShard's one-hot slot tensor
        ``(b, s, top_k, experts, capacity)`` is ``top_k`` routing tensors.
      largest_share: the largest stacked parameter leaf's share of the parameter elements
        (``_stacked_leaves``: scanned layers stack a projection over the layers, so the
        largest leaf is e.g. Llama's ``layers x hidden x mlp`` MLP weight, or Mixtral's
        ``layers x experts x hidden x moe_width``); the update phase prices fp32 copies of it.
      layer_share: the transformer layers' share of the parameter elements (the rest: embedding,
        head, position table); a layer's share of the fsdp-gathered bytes is this over the layers.
      mlp_inputs: a dense MLP's projections into its width: 2 when gated (gate and up: Llama,
        Mixtral, DeepSeek), 1 for GPT-2. Remat ``dots`` saves their outputs. (The activations
        with remat ``none`` stay 3 pieces for both: GPT-2's tanh GELU keeps as many
        MLP-width intermediates as SiLU x up, 5 stacked bf16 buffers on the H200 16 x 256 row.)
      moe_layers: MoE layers (0 without); moe_width: a routed expert's intermediate width;
        shared_experts: shared experts per MoE layer.
      capacity_factor: the einsum dispatch's capacity factor (:meth:`moe_widths` reads it).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    q_width: int
    kv_width: int
    mlp_width: float
    vocab: int
    head: int
    top_k: int = 0
    largest_share: float = 0.0
    mlp_inputs: int = 2
    layer_share: float = 1.0
    moe_layers: int = 0
    moe_width: int = 0
    shared_experts: int = 0
    capacity_factor: float = CAPACITY_FACTOR

    def moe_widths(self, dispatch: MoeDispatch) -> tuple[float, float]:
        """``(expert_width, routing)`` per token, averaged over the layers, as ``dispatch`` runs the MoE layers.

        ``expert_width``: the experts' width per token (routed ``top_k x`` the dispatch's width factor, plus
        the shared experts); priced split over the expert axis by token and not over tp. (XLA:TPU does split
        them over tp, as the plan splits the experts' weights; the remat-none coefficients were fitted with
        the unsplit count, and the split alone moves eight scaled-down grid rows out of band:
        docs/design-notes.md, step memory.) ``routing``: fp32 dispatch/combine elements per token per token
        of its sequence (GShard's ``(b, s, experts, capacity)`` tensors: ``top_k x capacity_factor``; none
        for a dropless dispatch).

        Example:
          >>> from meshplan.pure.presets import MODEL_SPECS
          >>> d = layer_dims(MODEL_SPECS["mixtral-8x7b"])
          >>> d.moe_widths(MoeDispatch()), d.moe_widths(MoeDispatch("dropless"))
          ((35840.0, 2.5), (28672.0, 0.0))
        """
        if not self.moe_layers:
            return 0.0, 0.0
        width = (self.top_k * dispatch.width_factor + self.shared_experts) * self.moe_width
        return (self.moe_layers * width / self.layers,
                dispatch.routing(self.top_k) * self.moe_layers / self.layers)


def layer_dims(model: ModelSpec, *, capacity_factor: float = CAPACITY_FACTOR) -> LayerDims:
    """The widths :func:`step_memory` needs from a :class:`~meshplan.pure.ModelSpec` (``capacity_factor``:
    the einsum dispatch's; the recipe priced says which dispatch, :meth:`LayerDims.moe_widths`).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> d = layer_dims(MODEL_SPECS["llama3-8b"])
      >>> d.q_width, d.kv_width, d.mlp_width, d.moe_widths(MoeDispatch())
      (4096, 1024, 14336.0, (0.0, 0.0))
    """
    if not isinstance(model, ModelSpec):
        raise MeshplanTypeError(f"model={model!r:.80} must be a ModelSpec (MODEL_SPECS['llama3-8b']), "
                                f"not {type(model).__name__}.")
    capacity_factor = as_real(capacity_factor, "capacity_factor", error=PlanError)
    mla = getattr(model, "mla", None)
    q_head = mla.qk_head_dim if mla is not None else model.head_dim
    layers = max(model.num_layers, 1)
    dense = model.intermediate_size
    n_moe = model.num_moe_layers if model.num_experts else 0
    leaves = _stacked_leaves(model)
    return LayerDims(layers, model.hidden_size, model.num_heads, model.num_kv_heads, model.num_heads * q_head,
                     model.num_kv_heads * model.head_dim, (layers - n_moe) * dense / layers,
                     model.vocab_size,
                     model.vocab_size * model.hidden_size,
                     model.num_experts_per_tok if n_moe else 0,
                     max(leaves) / sum(leaves),
                     1 if model.family == "gpt2" else 2,
                     sum(leaves[_outside_layers(model):]) / sum(leaves),
                     n_moe, model.moe_intermediate_size if n_moe else 0,
                     model.num_shared_experts if n_moe else 0, capacity_factor)


def _outside_layers(model: ModelSpec) -> int:
    """How many of :func:`_stacked_leaves`' leading leaves are outside the layers (embedding, head, positions)."""
    return (1 if model.tied_embeddings else 2) + (1 if model.max_position_embeddings else 0)


def _stacked_leaves(model: ModelSpec) -> list[int]:
    """Elements of each weight matrix as a scanned step stacks it (one leaf per projection over the
    layers that share its shape; dense and MoE layers stacked apart). Norms and biases are left out:
    under a thousandth of any preset's parameters.
    """
    h, layers = model.hidden_size, max(model.num_layers, 1)
    n_moe = model.num_moe_layers if model.num_experts else 0
    leaves = [model.vocab_size * h] * (1 if model.tied_embeddings else 2)
    if model.max_position_embeddings:
        leaves.append(model.max_position_embeddings * h)
    mla = model.mla
    if mla is not None:
        heads = model.num_heads
        queries = mla.q_lora_rank or h  # no query compression (V2-Lite): q_proj is hidden x heads x qk
        attention = [h * mla.q_lora_rank, queries * heads * mla.qk_head_dim,
                     h * (mla.kv_lora_rank + mla.qk_rope_head_dim),
                     mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim), heads * mla.v_head_dim * h]
    elif model.family == "gpt2":  # one fused q/k/v projection
        attention = [h * 3 * h, h * h]
    else:
        q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
        attention = [h * q, h * kv, h * kv, q * h]
    leaves += [layers * a for a in attention]
    projections = 2 if model.family == "gpt2" else 3  # c_fc, c_proj; or gate, up, down
    leaves += [(layers - n_moe) * h * model.intermediate_size] * projections
    if n_moe:
        leaves += [n_moe * model.num_experts * h * model.moe_intermediate_size] * 3
        leaves += [n_moe * h * model.num_experts]
        if model.num_shared_experts:
            leaves += [n_moe * h * model.moe_intermediate_size * model.num_shared_experts] * 3
    return [n for n in leaves if n]


@dataclasses.dataclass(frozen=True, slots=True)
class StepMemory:
    """One step's memory per device, by phase (see the module docstring).

    ``params``, ``grads`` and ``optimizer`` are exact (what the state arrays
    hold); the phases' other parts are calibrated (``calibration`` says
    against what).

    Attributes:
      params, grads, optimizer: exact bytes.
      phases: ``(name, bytes)`` for ``forward``, ``backward``, ``update``.
      parts: ``(name, bytes)`` of the calibrated pieces (``saved``, ``logits``, ...).
      calibration: the :attr:`Calibration.source` of the coefficients.
    """

    params: int
    grads: int
    optimizer: int
    phases: tuple[tuple[str, int], ...]
    parts: tuple[tuple[str, int], ...]
    calibration: str

    @property
    def peak(self) -> int:
        """The fullest phase."""
        return max(b for _, b in self.phases)

    @property
    def peak_phase(self) -> str:
        """The name of the fullest phase (the first, on ties: ``max`` keeps the first of equal keys)."""
        return max(self.phases, key=lambda phase: phase[1])[0]


# jax.experimental.pallas.ops.tpu.flash_attention.MIN_BLOCK_SIZE: the lanes its row statistics fill.
_FLASH_LANES = 128


def _padded(width: float, lanes: int) -> float:
    """``width`` rounded up to a multiple of ``lanes`` (unchanged when ``lanes`` is 0)."""
    return -(-width // lanes) * lanes if lanes else width


def _split(n: int, k: int) -> int:
    """How far a dim of ``n`` splits over an axis of ``k`` (``k`` when it divides, else 1)."""
    return k if k > 1 and n % k == 0 else 1


def step_memory(
    dims: LayerDims, sizes: dict[str, int], recipe: TrainingRecipe, *, batch: int, seq: int,
    params: int, grads: int, optimizer: int, gathered: int = 0, head: HeadLayout | None = None,
    update_ways: int = 1,
) -> StepMemory:
    """The phase model of one step on one mesh (see the module docstring).

    Args:
      dims: the model's widths, :func:`layer_dims`.
      sizes: mesh axis kind -> size (``dp, fsdp, ep, sp, tp``; missing axes are 1).
      recipe: the training recipe.
      batch: global batch in sequences; seq: tokens per sequence.
      params, grads, optimizer: exact per-device bytes of the state (the plan's).
      gathered: bytes all-gathered per step for the weights stored split over
        storage axes (the plan's traffic, in the weight dtype); one layer's share is held.
      head: how the plan splits the output head (:func:`head_layout`); ``None``: not known, the head
        is priced gathered.
      update_ways: the replicas the optimizer update is split over (ZeRO-1/2: each ``dp`` replica updates
        ``1 / update_ways`` of the parameters, so the largest leaf's fp32 temporaries are that share; pass the
        ``optimizer`` bytes already split); 1: each device updates all it holds.

    Returns:
      A :class:`StepMemory`.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> d = layer_dims(MODEL_SPECS["llama3-8b"])
      >>> m = step_memory(d, {"fsdp": 8}, TrainingRecipe(), batch=8, seq=4096,
      ...                 params=2 * 10**9, grads=2 * 10**9, optimizer=8 * 10**9)
      >>> [name for name, _ in m.phases], m.peak == max(b for _, b in m.phases) >= 12 * 10**9
      (['forward', 'backward', 'update'], True)
    """
    if not isinstance(dims, LayerDims):
        raise MeshplanTypeError(f"dims={dims!r:.80} must be a LayerDims (layer_dims(model)), not {type(dims).__name__}.")
    if not isinstance(recipe, TrainingRecipe):
        raise MeshplanTypeError(f"recipe={recipe!r:.80} must be a TrainingRecipe, not {type(recipe).__name__}.")
    sizes = canonical_axis_sizes(sizes, "sizes")
    batch, seq = as_count(batch, "batch", error=PlanError), as_count(seq, "seq", error=PlanError)
    params, grads, optimizer, gathered = (as_count(v, n, minimum=0, error=PlanError) for v, n in (
        (params, "params"), (grads, "grads"), (optimizer, "optimizer"), (gathered, "gathered")))
    update_ways = as_count(update_ways, "update_ways", error=PlanError)
    if head is not None and not isinstance(head, HeadLayout):
        raise MeshplanTypeError(f"head={head!r:.80} must be a HeadLayout (head_layout(...)) or None, not "
                                f"{type(head).__name__}.")
    if head is not None:
        head = HeadLayout(*(as_count(v, f"head.{n}", error=PlanError) for n, v in zip(HeadLayout._fields, head,
                                                                                     strict=True)))
    return price_step(dims, recipe, tp=sizes.get("tp", 1), sp=sizes.get("sp", 1),
                      ways=sizes.get("dp", 1) * sizes.get("fsdp", 1) * sizes.get("ep", 1), batch=batch, seq=seq,
                      params=params, grads=grads, optimizer=optimizer, gathered=gathered, head=head,
                      update_ways=update_ways)


def price_step(
    dims: LayerDims, recipe: TrainingRecipe, *, tp: int, sp: int, ways: int, batch: int, seq: int,
    params: int, grads: int, optimizer: int, gathered: int, head: HeadLayout | None = None, update_ways: int = 1,
) -> StepMemory:
    """:func:`step_memory` without its argument checks, for callers that built the arguments themselves.

    The search prices thousands of meshes with values it already validated; checking them
    again on every call cost a quarter of a search. The mesh is read only through ``tp``,
    ``sp`` and ``ways`` (``dp * fsdp * ep``, the batch split), so a caller may cache by them:
    :func:`activation_parts` is what they give, :func:`price_state` the rest.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> d = layer_dims(MODEL_SPECS["llama3-8b"])
      >>> kw = dict(batch=8, seq=4096, params=2 * 10**9, grads=2 * 10**9, optimizer=8 * 10**9)
      >>> price_step(d, TrainingRecipe(), tp=1, sp=1, ways=8, gathered=0, **kw) == step_memory(
      ...     d, {"fsdp": 8}, TrainingRecipe(), **kw)
      True
    """
    parts = activation_parts(dims, recipe, tp=tp, sp=sp, ways=ways, batch=batch, seq=seq, head=head)
    return price_state(dims, recipe, parts, params=params, grads=grads, optimizer=optimizer, gathered=gathered,
                       update_ways=update_ways)


class ActivationParts(NamedTuple):
    """What :func:`price_step` reads of the mesh and the batch, before the state: the calibration, the
    compute itemsize and the calibrated pieces (bytes per device; see the module docstring)."""

    cal: Calibration
    itemsize: int
    saved: float
    logits: float
    head: float
    work: float


def activation_parts(dims: LayerDims, recipe: TrainingRecipe, *, tp: int, sp: int, ways: int, batch: int,
                     seq: int, head: HeadLayout | None = None) -> ActivationParts:
    """The part of :func:`price_step` that reads the mesh (``tp``, ``sp``, ``ways``) and not the state:
    a search prices ~1000 (mesh, micro-batch) peaks with ~100 distinct values of it.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> p = activation_parts(layer_dims(MODEL_SPECS["llama3-8b"]), TrainingRecipe(), tp=1, sp=1, ways=8,
      ...                      batch=8, seq=4096)
      >>> p.itemsize, p.saved > 0
      (2, True)
    """
    cal = CALIBRATIONS[calibration_key(recipe)]
    a = recipe.compute_itemsize
    expert_width, routing_width = dims.moe_widths(MoeDispatch(recipe.moe_dispatch, dims.capacity_factor))
    b = max(batch // ways, 1) / recipe.micro_batches
    s = seq // sp
    t = b * s
    # The residual stream is stored split over tp (hidden, else sequence), as the plan's
    # activation specs lay it out; q/k/v heads and the MLP split where tp divides them.
    r = (_split(dims.hidden, tp) if dims.hidden % tp == 0 else _split(s, tp)) if recipe.residual_split else 1
    x = t * dims.hidden * a / r
    # Per-head widths as the device lays them out: XLA:TPU pads a minor head dim to its lanes.
    heads = dims.heads / _split(dims.heads, tp)
    q_head = _padded(dims.q_width / dims.heads, cal.lane_pad)
    q = heads * q_head
    kv = dims.kv_heads / _split(dims.kv_heads, tp) * _padded(dims.kv_width / dims.kv_heads, cal.lane_pad)
    proj = t * a * (2 * q + 2 * kv)
    mlp = 3 * t * a * (dims.mlp_width / tp + expert_width)
    scores = 0.0
    if recipe.attention != "flash":
        # XLA's jax.nn.dot_product_attention materialises fp32 scores like the plain form
        # (measured on CPU, TPU and H200: the same peak).
        scores = b * heads * s * seq * 4
    # MoE routing tensors grow with the sequence like scores, whatever the attention (none when dropless).
    routing = b * s * s * routing_width * 4  # one fp32 dispatch/combine tensor
    scores += routing * (max(dims.top_k, 1) if cal.routing_per_choice else 1)
    none_layer = 5 * x + proj + mlp
    flash = lanes = 0.0
    if recipe.attention == "flash":
        # The Pallas flash kernel keeps its own q, k, v (one head per query head) and output in
        # its (b, heads, s, head dim) layout for the backward pass (their gradients take as much
        # there), and the backward broadcasts its row statistics (max, sum, sum(o * do)) to 128
        # lanes: three fp32 (b, heads, s, 128).
        flash = 4 * t * a * q
        lanes = 3 * b * heads * s * _FLASH_LANES * 4
    saved_layer = {"none": cal.none_scale * none_layer + cal.score_buffers * scores + flash,
                   "dots": 3 * x + proj - t * a * q + t * a * (dims.mlp_inputs * dims.mlp_width / tp
                                                               + 2 * expert_width),
                   "full": x, "offload": 0.0}[recipe.remat]
    saved = dims.layers * saved_layer
    logits, gathered_head = _loss_phase(dims, cal, head, tp=tp, t=t, itemsize=a, vocab_tiles=recipe.vocab_tiles,
                                        batch_tokens=batch / recipe.micro_batches * seq)
    work = cal.work_layers * none_layer + cal.work_scores * scores + cal.flash_buffers * (flash + lanes)
    if cal.work_routing is not None:  # the routing tensors priced apart from the scores
        work += (cal.work_routing - cal.work_scores * (max(dims.top_k, 1) if cal.routing_per_choice else 1)) * routing
    return ActivationParts(cal, a, saved, logits, gathered_head, work)


def _loss_phase(dims: LayerDims, cal: Calibration, head: HeadLayout | None, *, tp: int, t: float, itemsize: int,
                vocab_tiles: int, batch_tokens: float) -> tuple[float, float]:
    """The loss phase's logits-sized buffers and its gathered operand (bytes per device): ``(logits, head)``.

    A plan that splits the head's vocabulary over a batch axis (``head.vocab_batch``; fsdp alone stores
    Llama-3-8B's ``lm_head`` ``(vocab / fsdp, hidden)``) splits both operands of the head's matmul over it,
    and XLA gathers the smaller one, by their whole sizes (the batch's ``batch_tokens`` hidden states against
    the ``vocab`` rows: :func:`~meshplan.pure.cost._gathered_operand.gathers_hidden`). When it gathers the
    hidden states it holds them
    (``t x vocab_batch x hidden``), the fp32 logits in the gathered layout ``(t x vocab_batch, vocab /
    vocab_batch)`` and their gradient in the compute dtype, resharded for the matmul's transpose
    (full-size Llama-3-8B on v5p-16 fsdp=8, 16 x 2048: ``bf16[16,2048,16032]`` and ``bf16[16,2048,4096]``
    next to 2004 MiB of fp32 logits). Otherwise the head is gathered: ``head_buffers`` head-sized buffers
    and ``logits_buffers`` fp32 logits (fitted). With vocab tiling one chunk of the sequence is live.
    """
    tokens = t / vocab_tiles
    if cal.loss_gather and gathers_hidden(head, tokens=batch_tokens / vocab_tiles, vocab=dims.vocab):
        assert head is not None  # (gathers_hidden says so)
        return (tokens * dims.vocab / head.vocab_other * (4 + itemsize),
                tokens * head.vocab_batch * dims.hidden * itemsize)
    vocab_split = _split(dims.vocab, tp)
    # (the old expression's order, so that plans priced before this term are byte-identical)
    return (cal.logits_buffers * t * dims.vocab * 4 / vocab_split / vocab_tiles,
            cal.head_buffers * dims.head * itemsize / vocab_split)


def price_state(dims: LayerDims, recipe: TrainingRecipe, activations: ActivationParts, *, params: int,
                grads: int, optimizer: int, gathered: int, update_ways: int = 1) -> StepMemory:
    """:func:`price_step` from its :func:`activation_parts` (of the same dims and recipe) and the state
    (``update_ways`` as :func:`step_memory`'s).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> d, r = layer_dims(MODEL_SPECS["llama3-8b"]), TrainingRecipe()
      >>> kw = dict(params=2 * 10**9, grads=2 * 10**9, optimizer=8 * 10**9, gathered=0)
      >>> parts = activation_parts(d, r, tp=1, sp=1, ways=8, batch=8, seq=4096)
      >>> price_state(d, r, parts, **kw) == price_step(d, r, tp=1, sp=1, ways=8, batch=8, seq=4096, **kw)
      True
    """
    cal, a, saved, logits, head, work = activations
    itemsize = cal.gathered_itemsize or a
    # One layer's share of the gathered bytes: the embedding and head gathers are not a layer's.
    gathered_now = (cal.gathered_layers * gathered * dims.layer_share / dims.layers * itemsize
                    / recipe.weight_itemsize)
    accum = grads * 4 / recipe.grad_itemsize if recipe.micro_batches > 1 else 0
    resident = params + optimizer
    live_grads = grads + accum
    # The update writes the new moments of the largest stacked leaf (fp32) before releasing the old
    # ones; its per-device size is its share of this device's parameters (exact when the plan splits
    # it like the average leaf; a leaf split over more axes than the rest is over-priced).
    largest = dims.largest_share * params / recipe.weight_itemsize * 4 / update_ways
    update = cal.update_leaf * largest + cal.update_state * resident
    phases = (("forward", int(resident + saved + logits + head)),
              ("backward", int(resident + live_grads + saved + work + gathered_now)),
              ("update", int(resident + live_grads + update)))
    parts = (("saved", int(saved)), ("logits", int(logits)), ("head", int(head)), ("work", int(work)), ("gathered", int(gathered_now)),
             ("accumulator", int(accum)), ("update", int(update)))
    return StepMemory(params, grads, optimizer, phases, parts, cal.source)


def lower_bound(dims: LayerDims, sizes: dict[str, int], recipe: TrainingRecipe, *, batch: int, seq: int,
                state: float) -> float:
    """A bound no mesh's peak goes below: ``state`` (a lower bound of params + grads + optimizer)
    plus the backward phase's activations without gathered weights.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> d = layer_dims(MODEL_SPECS["llama3-8b"])
      >>> lower_bound(d, {"fsdp": 8}, TrainingRecipe(), batch=8, seq=4096, state=0) > 0
      True
    """
    return state + activation_floor(step_memory(dims, sizes, recipe, batch=batch, seq=seq, params=0, grads=0,
                                                optimizer=0))


def activation_floor(m: StepMemory) -> int:
    """The part of :func:`lower_bound` above the state: the backward phase's saved activations and
    working set, without gathered weights (``m`` priced with any state; these parts ignore it).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> d = layer_dims(MODEL_SPECS["llama3-8b"])
      >>> m = step_memory(d, {"fsdp": 8}, TrainingRecipe(), batch=8, seq=4096, params=0, grads=0, optimizer=0)
      >>> activation_floor(m) == lower_bound(d, {"fsdp": 8}, TrainingRecipe(), batch=8, seq=4096, state=0)
      True
    """
    parts = dict(m.parts)
    return parts["saved"] + parts["work"]
