"""What a training step's activation collectives are (tp, sp, ep), and the activation memory their layout implies.

**Activation collectives** (need the model's sizes; the notation of :mod:`~meshplan.pure.cost._placement`):

- ``tp`` (per layer, ``X = b*s*h*a``, the residual stream's full buffer on a
  device): Megatron's row-parallel outputs (attention ``o``, MLP ``down``) are
  summed over ``tp``: 2 per layer forward, again in the recompute under remat
  ``full`` / ``offload`` (1: the layer's last one is dead code there), and in
  the backward the column-parallel projections' input gradients (Megatron: 2).
  With the residual stream stored split over ``tp`` (the plan's activation
  specs, ``residual_split``; MaxText's ``activation_embed``) the sums are
  reduce-scatters and each block's input is all-gathered first (2 forward,
  2 recompute, 2 backward); whole, they are all-reduces and nothing is
  gathered. A vocabulary split over ``tp`` adds the embedding lookup's
  all-reduce and the LM head's input gathers (forward) and gradient sum.
  Each backend's XLA lowers these its own way: how many sums and gathers
  forward, in the recompute and backward, which are reduce-scatters, and what
  it adds, per layer kind, is the table of :mod:`~meshplan.pure.cost._tp_lowering`,
  each row naming the compiled program it was read from;
- ``sp`` (context parallelism): each layer all-gathers K and V for the whole
  sequence forward (again in the recompute under remat ``full`` / ``offload``)
  and reduce-scatters their gradients backward:
  ``B = b * seq * 2 * kv * a`` with ``kv = kv_heads * head_dim`` (divided by
  ``tp`` when ``tp`` divides the kv heads), ``L`` calls each (XLA:GPU sums dK in
  fp32: ``b * seq * kv * (a + 4)`` backward);
- ``ep``: GShard's capacity-based dispatch moves each MoE layer's dispatched
  tokens ``(experts, b, capacity, h)`` to the experts' devices and back:
  2 all-to-alls forward, 2 backward, 2 more in the recompute under remat
  ``full`` / ``offload``, ``B = b * E * capacity * h * a`` with
  ``capacity = ceil(top_k * s * cf / E)`` (empty slots travel too). A
  ``"dropless"`` dispatch moves exactly the routed tokens, ``B = b * s * top_k
  * h * a`` (the mean load: :mod:`~meshplan.pure.cost._moe_dispatch` says what
  an imbalanced router adds and why it is not priced); so do the tp and
  XLA:TPU expert terms below, which move the same buffer. The counts are the
  einsum step's, read from its HLO; no dropless step was compiled.

What XLA:TPU moves where it gathers the other operand of a split table or of the routed experts, and its
gradient sums over a whole v5p slice, are :mod:`~meshplan.pure.cost._tpu_terms`'.

**Activation memory (approximate).** With full activation checkpointing and
flash attention: ``L * b*s*h*a / tp`` (saved layer inputs) ``+ 17 * b*s*h*a / tp``
(one layer recomputed: the ``34*s*b*h`` bytes of Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", 2022, without the
attention-score term) ``+ b*s*vocab*4 / tp`` (fp32 logits) ``+ 2 * P_fsdp / L``
(two layers of fsdp-gathered weights: the one in use and the prefetched one;
``P_fsdp`` = the parameter bytes per device times ``fsdp``). Real numbers
depend on the remat policy, fusion and the allocator; treat it as a guide.
The ``/ tp`` assumes the residual stream and the logits are *stored* split
over ``tp``: :func:`step_activations` gives those splits as PartitionSpecs (a
plan carries them as ``MeshCandidate.activations``) and the bytes are counted
from the same specs, so a step that applies them gets what was charged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeAlias

from meshplan.pure._check import as_choice, as_flag
from meshplan.pure.errors import PlanError
from meshplan.pure.cost._collective_time import CollectiveKind
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MoeDispatch
from meshplan.pure.cost._placement import BATCH_AXES, AxisPlacement, Pending, StepKind, local_batch
from meshplan.pure.cost._slice_reshard import slice_reshard
from meshplan.pure.cost._tp_lowering import TP_BACKENDS, LayerLowering, StepLowering, lowering
from meshplan.pure.presets._spec import ModelSpec
from meshplan.pure.specs._activation import ActivationLayout, activation_layout

__all__ = ["RECOMPUTING", "activation_bytes", "activation_terms", "step_activations"]

RECOMPUTING: tuple[str, ...] = ("full", "offload")
"""Remat policies whose backward reruns the layer's forward, collectives included."""

_Add: TypeAlias = Callable[[str, StepKind, str | tuple[str, ...], int, int], None]
"""``add(what, kind, axis or axes, nbytes, calls)``: one collective of the step, added unless it has no calls."""


def _column_projections(model: ModelSpec, tp: int) -> tuple[int, int]:
    """Column-parallel projections per layer that read a block input, (attention, MLP): their input
    gradients are summed over tp. K and V count where tp splits their heads, also over a subgroup
    (``gcd(tp, kv_heads) > 1``: XLA splits them that far and replicates the rest)."""
    if model.family == "gpt2":
        return 1, 1  # c_attn, c_fc
    kv = 2 if math.gcd(model.num_kv_heads, tp) > 1 else 0
    return (0 if model.mla is not None else 1 + kv), 2  # MLA: its down projections are whole over tp


def _fused_qkv_permutes(model: ModelSpec, tp: int) -> tuple[int, ...] | None:
    """The collective-permutes (widths along ``3h``) that reshard GPT-2's ``jnp.split(qkv, 3)`` per pass.

    The plan splits the fused ``c_attn`` weight ``(h, 3h)`` over tp on its outputs in contiguous blocks
    of ``3h/tp``, while q, k and v are each pinned to their heads over tp (blocks of ``h/tp``): a
    device's block of ``[q | k | v]`` is not its heads, and XLA's partitioner reshards each of the
    three slices by halo exchange (:func:`~meshplan.pure.cost._slice_reshard.slice_reshard`; at
    hidden 128: 2, 2.5 and 2 times ``h`` at tp = 2, 4, 8). None where nothing is resharded: another
    family, or heads tp does not split.

    Example:
      >>> from types import SimpleNamespace as M
      >>> _fused_qkv_permutes(M(family="gpt2", hidden_size=128, num_heads=8), 4)
      (64, 32, 64, 64, 32, 32, 32)
    """
    h = model.hidden_size
    if model.family != "gpt2" or tp == 1 or model.num_heads % tp or h % tp:
        return None
    # The thirds of 3h never take XLA's gather fallback (their halos stay under its limits for every tp
    # dividing h; tests/pure/cost/test_fused_reshard.py), so the permutes are the whole reshard.
    return tuple(w for k in range(3) for w in slice_reshard(3 * h, k * h, h, tp).permutes)


def _adder(out: list[Pending], placement: AxisPlacement) -> _Add:
    """An :data:`_Add` appending to ``out``, placed so (a collective with no calls or no axes is left out)."""
    def add(what: str, kind: StepKind, axis: str | tuple[str, ...], nbytes: int, calls: int) -> None:
        axes = (axis,) if isinstance(axis, str) else axis
        if calls and axes:
            i, d = placement.split(axes)
            out.append(Pending(what, kind, axes, nbytes, calls, i, d))
    return add


def _bwd_gathers(row: LayerLowering, *, alone: bool, kv_part: bool, fused: bool) -> int:
    """A layer's backward gathers: with tp the mesh's only axis or K and V over part of tp, else with GPT-2's
    fused gradient gathered instead of the block input, else the row's own."""
    if alone and row.gathers_bwd_alone is not None:
        return row.gathers_bwd_alone
    if kv_part and row.gathers_bwd_kv_part is not None:
        return row.gathers_bwd_kv_part
    if fused and row.gathers_bwd_fused is not None:
        return row.gathers_bwd_fused
    return row.gathers.bwd


def _layer_counts(low: StepLowering, model: ModelSpec, tp: int, r: int, *, alone: bool, kv_part: bool,
                  fused_bwd: bool) -> tuple[int, int]:
    """The ``X``-sized sums and gathers of every layer of one step, as ``low`` counts them."""
    moe = model.num_moe_layers
    dense = model.num_layers - moe
    attn, mlp = _column_projections(model, tp)
    each = {"attention": attn, "mlp": mlp}
    sums = gathers = 0
    for count, row in ((dense, low.dense), (moe, low.layer("shared_moe" if model.num_shared_experts else "moe"))):
        sums += count * (row.sums.calls(r) + sum(each[block] for block in row.sums_each))
        gathers += count * (row.gathers.fwd + r * row.gathers.recompute
                            + _bwd_gathers(row, alone=alone, kv_part=kv_part, fused=fused_bwd))
    if dense:
        gathers -= low.dense.fewer_gathers[r]
    return sums, gathers


def _tp_terms(add: _Add, low: StepLowering, model: ModelSpec, sizes: Mapping[str, int], *, b: int, s: int, itemsize: int,
              recompute: bool, again: bool, residual_split: bool, dispatch: MoeDispatch) -> None:
    """The tp collectives of one step, added in the order a plan lists them (see the module docstring)."""
    tp, ep, fsdp = (sizes.get(a, 1) for a in ("tp", "ep", "fsdp"))
    h, layers, moe, kv_heads = model.hidden_size, model.num_layers, model.num_moe_layers, model.num_kv_heads
    label = low.label
    x = b * s * h * itemsize
    r = 1 if recompute else 0
    split = residual_split and (h % tp == 0 or s % tp == 0)  # as step_activations lays the stream out
    vocab = model.vocab_size % tp == 0  # the embedding and LM head split over the vocabulary
    # K/V heads that tp does not divide are split over gcd(tp, kv) and replicated beyond (XLA's choice).
    kv_part = kv_heads % tp != 0 and math.gcd(kv_heads, tp) > 1
    alone = all(n == 1 for a, n in sizes.items() if a != "tp")  # tp the mesh's only axis
    fused = _fused_qkv_permutes(model, tp) if low.fused_qkv else None
    fused_grad = fused is not None and low.fused_qkv_grad_gather
    sums, gathers = _layer_counts(low, model, tp, r, alone=alone, kv_part=kv_part, fused_bwd=fused_grad and split)
    narrow = bool(low.narrow_below) and split and h % tp == 0 and h // tp < low.narrow_below
    kind: CollectiveKind = "reduce-scatter" if split and not narrow else "all-reduce"
    head_sum = 1 if vocab and not low.head_grad_f32 else 0
    add(f"tp {kind} of activations (row-parallel outputs, column-parallel input grads"
        f"{', recompute' if recompute else ''})", kind, "tp", x, sums + head_sum)
    if low.latent_sums is not None and model.mla is not None:  # MLA's latents: only a model with MLA has them
        dims = model.mla
        latent = b * s * (dims.q_lora_rank + dims.kv_lora_rank + dims.qk_rope_head_dim) * itemsize
        add("tp all-reduce of MLA's latents (q_a / kv_a outputs fwd + recompute, input grads bwd)",
            "all-reduce", "tp", latent, layers * low.latent_sums.calls(r))
    if low.router_logit_sums is not None and moe:
        add(f"tp all-reduce of the router logits (MoE, MLA, {label}, f32)", "all-reduce", "tp",
            b * s * model.num_experts * 4, moe * low.router_logit_sums.calls(r))
    if vocab and low.head_grad_f32:
        head_kind: CollectiveKind = "reduce-scatter" if split else "all-reduce"
        add(f"tp {head_kind} of the LM head's input gradient ({label}, f32)", head_kind, "tp", b * s * h * 4, 1)
    if low.kv_replica_sums and kv_part:
        local_kv = kv_heads // math.gcd(kv_heads, tp)  # kv heads on each device
        add(f"tp all-reduce of the K/V projections' input grads over the kv replicas ({label})", "all-reduce",
            "tp", x, layers)
        add(f"tp all-reduce of the K and V grads over the kv replicas ({label})", "all-reduce", "tp",
            3 * b * s * local_kv * model.head_dim * itemsize, layers)
    if low.row_stats and split and h % tp == 0:
        # Per pass every norm's statistics and, once, the loss's logsumexp and gold logit over the vocab-split
        # logits; the final norm is not recomputed.
        norm = low.layer_norm_stats if model.family == "gpt2" else low.rms_norm_stats
        norms_per_pass = 2 * layers + 1  # two per layer and the final norm
        norms = (norm.fwd + norm.bwd) * norms_per_pass + r * norm.recompute * (norms_per_pass - 1)
        add(f"tp all-reduce of the norms' and the loss's row statistics ({label}, f32)",
            "all-reduce", "tp", b * s * 4, norms + (low.loss_stats if vocab else 0))
    if split:
        head_gathers = low.head_gathers if low.head_gathers_alone is None or not alone else low.head_gathers_alone
        add("tp all-gather of activations (each block's input, fwd / recompute / bwd)", "all-gather", "tp", x,
            gathers + (head_gathers if vocab else 0))
        gqa = kv_heads < model.num_heads
        separate = low.kv_grad_gathers == "separate" and model.family != "gpt2"
        if low.kv_grad_gathers != "none" and (gqa or separate) and (kv_heads % tp == 0 or kv_part):
            kv = b * s * kv_heads * model.head_dim * itemsize
            add(f"tp all-gather of the K and V gradients ({label})", "all-gather", "tp", kv, 2 * layers)
        if fused_grad:
            # c_attn's weight gradient (h, 3h) taken against its hidden-split input: the fused gradient
            # gathered whole over tp, 3X per layer (read from all four GPT-2 tp compiles, op_name the
            # dot's transpose; its (h/tp, 3h) result then moves to the weight's layout, a weight-sized
            # all-to-all, not priced).
            add(f"tp all-gather of the fused qkv gradient (c_attn's weight gradient, {label})", "all-gather",
                "tp", 3 * x, layers)
    if fused is not None:
        _fused_qkv_terms(add, fused, b=b, s=s, tp=tp, x=x, row=b * s * itemsize, layers=layers, again=again)
    # With the table split over fsdp exactly as wide as over tp the table's shard is resharded instead of the
    # lookup's output (a collective-permute of the shard, vocab over tp, hidden over fsdp, swapped, and a
    # gather of the vocabulary: the fsdp gather's bytes, priced there), so the lookup lands in the split
    # stream with no activation collective; the permute (< 1% of the step's bytes there) is not priced.
    reshard = low.lookup_reshards and split and not narrow and fsdp == tp
    if vocab and not reshard:
        lookup: CollectiveKind = ("reduce-scatter" if low.lookup_scatters and split and not narrow
                                  and (fsdp == 1 or (low.lookup_reshards and fsdp > tp)) else "all-reduce")
        add(f"tp {lookup} of the vocab-split embedding lookup", lookup, "tp", x, 1)
    experts = low.layer("shared_moe" if model.num_shared_experts else "moe")
    if experts.experts is not None and moe:
        # The experts' MLP split over tp works on the dispatched buffer, not the residual stream.
        buffer = b * dispatch.rows(top_k=model.num_experts_per_tok, seq=s, experts=model.num_experts) * h * itemsize
        scatters = experts.expert_scatters if r else experts.expert_scatters_no_recompute
        if scatters and ep == 1 and split:
            scattered = experts.experts.scattered(scatters, r)
            add(f"tp reduce-scatter of expert outputs and input grads (MoE, {label})", "reduce-scatter", "tp",
                buffer, moe * scattered)
            add(f"tp all-reduce of expert outputs (MoE, {label}, recompute)", "all-reduce", "tp", buffer,
                moe * (experts.experts.calls(r) - scattered))
        else:
            add(f"tp all-reduce of expert outputs and input grads (MoE, {label})", "all-reduce", "tp", buffer,
                moe * experts.experts.calls(r))
        if split and experts.expert_gathers is not None:
            add(f"tp all-gather of dispatched tokens (MoE, {label})", "all-gather", "tp", buffer,
                moe * experts.expert_gathers.calls(r))


def _fused_qkv_terms(add: _Add, fused: tuple[int, ...], *, b: int, s: int, tp: int, x: int, row: int, layers: int,
                     again: bool) -> None:
    """GPT-2's fused c_attn resharded, per layer (``row``: bytes per element of the fused dim; ``again``: the
    slices are recomputed).

    Derived from XLA's partitioner (not fitted): each of q, k, v sliced out of the 3h/tp blocks is resharded
    to its heads by halo-exchange permutes, forward and in the recompute; the backward's concatenation of
    their gradients moves them off the split dim (to the batch or sequence, an all-to-all of each),
    concatenates and moves the 3h-wide result back (HandleConcatenate -> HandleElementwiseWithDimsToReplicate);
    with neither dim divisible it gathers them instead.
    """
    for width in sorted(set(fused)):
        add(f"tp collective-permute of the fused qkv's slices to their heads, {width} of 3h wide (fwd"
            f"{' + recompute' if again else ''})", "collective-permute", "tp", row * width,
            fused.count(width) * (2 if again else 1) * layers)
    if b % tp == 0 or s % tp == 0:
        add("tp all-to-all of the fused qkv's q, k, v gradients off the hidden dim (bwd)", "all-to-all", "tp",
            x // tp, 3 * layers)
        add("tp all-to-all of the fused qkv's concatenated gradient back to 3h/tp (bwd)", "all-to-all", "tp",
            3 * x // tp, layers)
    else:
        add("tp all-gather of the fused qkv's q, k, v gradients to concatenate them (bwd)", "all-gather",
            "tp", x, 3 * layers)


def activation_terms(
    model: ModelSpec, sizes: Mapping[str, int], placement: AxisPlacement, *, batch: int, seq: int, itemsize: int,
    remat: str = "full", residual_split: bool = True, backend: str = "tpu", capacity_factor: float = CAPACITY_FACTOR,
    moe_dispatch: str = "einsum",
) -> list[Pending]:
    """The tp, sp and ep activation collectives of one step, not yet priced (see the module docstring).

    Args:
      model: a :class:`~meshplan.pure.ModelSpec`.
      sizes: mesh axis sizes (missing axes count as 1).
      placement: where the axes lie.
      batch: global batch in sequences; seq: tokens per sequence.
      itemsize: bytes per activation element.
      remat: the remat policy (``full`` / ``offload`` rerun the forward's collectives).
      residual_split: the residual stream is stored split over ``tp`` (gathers + reduce-scatters)
        rather than whole (all-reduces).
      backend: one of :data:`~meshplan.pure.cost._tp_lowering.TP_BACKENDS`: whose XLA's tp, sp and ep
        collectives to count (its rows of :data:`~meshplan.pure.cost._tp_lowering.LOWERINGS`).
      capacity_factor: MoE expert capacity over the even share of tokens (einsum dispatch).
      moe_dispatch: how MoE layers reach their experts (:class:`~meshplan.pure.cost._moe_dispatch.
        MoeDispatch`): the expert buffers hold ``E x capacity`` slots per sequence (``"einsum"``) or the
        routed tokens (``"dropless"``).

    Returns:
      The pending collectives (none when tp, sp and ep are all 1).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> p = AxisPlacement(("dp", "tp"), (2, 4), (1, 1), parse_cluster("H100"))
      >>> terms = activation_terms(MODEL_SPECS["llama3-8b"], {"dp": 2, "tp": 4}, p, batch=8, seq=1024, itemsize=2)
      >>> [(t.kind, t.calls) for t in terms][:3]
      [('reduce-scatter', 160), ('reduce-scatter', 1), ('all-reduce', 197)]
      >>> [(t.kind, t.calls) for t in terms][3:]
      [('all-gather', 322), ('all-gather', 64), ('reduce-scatter', 1)]
    """
    backend = as_choice(backend, "backend", TP_BACKENDS, error=PlanError)
    recompute = as_choice(remat, "remat", ("none", "dots", "full", "offload"), error=PlanError) in RECOMPUTING
    residual_split = as_flag(residual_split, "residual_split")
    dispatch = MoeDispatch(moe_dispatch, capacity_factor)
    b, s = local_batch(sizes, batch, seq)
    tp, sp, ep = (sizes.get(a, 1) for a in ("tp", "sp", "ep"))
    low = lowering(backend, mla=model.mla is not None)
    out: list[Pending] = []
    add = _adder(out, placement)
    if tp > 1:
        # Remat "dots" saves only dot outputs: GPT-2's fused-qkv slices (and their permutes) are recomputed as
        # under "full" (read from GPT-2 dp=2 x tp=4 with dots on XLA:CPU: 28 permutes, as with full).
        _tp_terms(add, low, model, sizes, b=b, s=s, itemsize=itemsize, recompute=recompute,
                  again=recompute or remat == "dots", residual_split=residual_split, dispatch=dispatch)
    if sp > 1:
        kv = model.num_kv_heads * model.head_dim
        kv_local = kv // tp if model.num_kv_heads % tp == 0 else kv
        nbytes = b * seq * 2 * kv_local * itemsize
        add(f"sp all-gather of K,V (fwd{' + recompute' if recompute else ''})", "all-gather", "sp", nbytes,
            (2 if recompute else 1) * model.num_layers)
        if low.sp_dk_f32:
            # XLA:GPU sums K's gradient over sp in fp32, the dtype of the fp32 scores it comes from, and V's in
            # the activation dtype (read from llama fsdp=2 x sp=4's HLO, attention's op_names: per layer
            # f32[b,kv,seq,hd] and bf16[b,kv,hd,seq] reduce-scatters).
            add("sp reduce-scatter of dV (bwd)", "reduce-scatter", "sp", nbytes // 2, model.num_layers)
            add(f"sp reduce-scatter of dK (bwd, {low.label}, f32)", "reduce-scatter", "sp", b * seq * kv_local * 4,
                model.num_layers)
        else:
            add("sp reduce-scatter of dK,dV (bwd)", "reduce-scatter", "sp", nbytes, model.num_layers)
    if ep > 1 and model.num_moe_layers:
        rows = dispatch.rows(top_k=model.num_experts_per_tok, seq=s, experts=model.num_experts)
        add(f"ep all-to-all of dispatched tokens (dispatch + combine, fwd + bwd{' + recompute' if recompute else ''})",
            "all-to-all", "ep", b * rows * model.hidden_size * itemsize, (6 if recompute else 4) * model.num_moe_layers)
    if low.router_scores_gathered and model.num_moe_layers:
        # XLA:CPU does not partition top_k over the batch: it gathers the fp32 router scores of every token.
        ways = tuple(a for a in BATCH_AXES if sizes.get(a, 1) > 1)
        add(f"router scores gathered for top_k ({low.label}, f32)", "all-gather", ways,
            batch * s * model.num_experts * 4, (2 if recompute else 1) * model.num_moe_layers)
    return out


def step_activations(model: ModelSpec, sizes: Mapping[str, int], *, batch: int, seq: int, itemsize: int,
                     residual_split: bool = True) -> ActivationLayout:
    """The batch, residual-stream and logits specs the activation memory is charged for.

    The search's axis kinds: the batch over ``dp, fsdp, ep``, the sequence over
    ``sp``, the hidden and vocabulary dims over ``tp`` (see
    :func:`~meshplan.pure.specs.activation_layout`). A plan carries this layout, so a step applies
    exactly the split the memory model charged (the residual stream's split ``r`` and the
    logits' vocabulary split of :mod:`meshplan.pure.cost._step_memory`, and :func:`activation_bytes`).
    """
    return activation_layout(sizes, batch=batch, seq=seq, hidden=model.hidden_size, vocab=model.vocab_size,
                             itemsize=itemsize, batch_axes=BATCH_AXES, seq_axes=("sp",), model_axes=("tp",),
                             residual_split=residual_split)


def activation_bytes(
    model: ModelSpec, sizes: Mapping[str, int], *, batch: int, seq: int, itemsize: int, param_bytes: int
) -> int:
    """Approximate activation and workspace bytes per device (see the module docstring).

    The saved layer inputs and the recomputed layer are counted in shards of the
    residual stream, the logits in shards of the logits, as :func:`step_activations`
    lays them out: ``L * b*s*h*a / tp`` whenever ``tp`` divides the hidden size
    (or, failing that, the sequence).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> m = MODEL_SPECS["llama3-8b"]
      >>> activation_bytes(m, {"fsdp": 8}, batch=8, seq=4096, itemsize=2, param_bytes=0) // 2**20
      3572
    """
    layout = step_activations(model, sizes, batch=batch, seq=seq, itemsize=itemsize)
    fsdp = sizes.get("fsdp", 1)
    residual = layout["residual"].shard_bytes(sizes)
    saved = model.num_layers * residual
    working = 17 * residual
    logits = layout["logits"].shard_bytes(sizes)
    gathered = 2 * param_bytes * fsdp // max(model.num_layers, 1) if fsdp > 1 else 0
    return int(saved + working + logits + gathered)
