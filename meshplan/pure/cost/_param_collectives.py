"""What a training step's parameter collectives are: each leaf's gathers and gradient sums, from its spec.

**Parameter collectives** (per parameter leaf, from its spec; bytes are exact):

- *storage axes* ``S``: the leaf's spec axes among ``dp, fsdp, sp`` (weights
  split only to save memory). Forward and backward each all-gather the leaf
  over ``S`` (``B`` = the leaf's shard bytes times ``|S|``, i.e. the
  tp/ep-sharded leaf), and the gradient is reduce-scattered over ``S``
  (ZeRO-3 / FSDP: 2 all-gathers + 1 reduce-scatter per step; XLA:CPU with
  remat none keeps the forward's gathered weights, the matmuls' residuals, for
  the backward: 1 all-gather; XLA:TPU with remat none keeps only the last
  layer's non-attention weights, see :func:`param_tables`);
- *replica axes* ``R``: the batch/sequence axes (``dp, fsdp, ep, sp``) the
  leaf is NOT split over. Its gradient shard is all-reduced over ``R``.
  ``tp`` and ``ep`` in a spec split the compute itself: nothing is gathered.
- Collectives are fused per layer (as FSDP wraps each block), so each kind
  over each axis group runs ``L`` calls of ``1/L`` of its bytes: the latency
  term counts ``L`` times, the bandwidth term once.

:func:`param_tables` lists each kind of collective's bytes per axis group of a plan (once per plan: a search
lists ~190 meshes of ~70 plans), :func:`table_terms` reads a mesh's sizes and placement into
:class:`~meshplan.pure.cost._placement.Pending` records, and :func:`param_terms` is the two in one call. What
XLA:TPU gathers instead of a table or of the routed experts (the hidden states, the dispatched tokens) is
:mod:`~meshplan.pure.cost._tpu_terms`' to price.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeAlias

from meshplan.pure._check import as_choice
from meshplan.pure.errors import PlanError
from meshplan.pure.cost._activation_collectives import RECOMPUTING
from meshplan.pure.cost._collective_time import CollectiveKind
from meshplan.pure.cost._placement import AxisPlacement, Pending
from meshplan.pure.cost._tpu_terms import TOKEN_REMATS

__all__ = ["ParamTables", "ParamTraffic", "param_tables", "param_terms", "table_terms"]


@dataclasses.dataclass(frozen=True, slots=True)
class ParamTraffic:
    """Per-device parameter bytes each collective moves, keyed by the axis group.

    ``gather[S]``: gathered bytes of the leaves stored split over ``S`` (per
    all-gather); ``scatter[S]``: their gradient bytes; ``reduce[R]``: gradient
    shard bytes all-reduced over the replica axes ``R``. Two parts of ``gather``
    are named apart, because compiled steps gather them differently from the
    layers' weights: ``embed[S]``, the input embedding (its backward is a
    scatter-add that needs no weights: gathered once), and ``head[S]``, the
    output head (or the tied embedding; outside the layers' remat, XLA:TPU
    keeps it gathered from the forward to the backward and reduce-scatters its
    gradient in fp32, as the fp32 logits make it).
    """

    gather: tuple[tuple[tuple[str, ...], int], ...]
    scatter: tuple[tuple[tuple[str, ...], int], ...]
    reduce: tuple[tuple[tuple[str, ...], int], ...]
    embed: tuple[tuple[tuple[str, ...], int], ...] = ()
    head: tuple[tuple[tuple[str, ...], int], ...] = ()
    head_scatter: tuple[tuple[tuple[str, ...], int], ...] = ()
    head_grad_f32: tuple[tuple[tuple[str, ...], int], ...] = ()
    head_reduce_excess: tuple[tuple[tuple[str, ...], int], ...] = ()
    embed_whole: tuple[tuple[tuple[str, ...], tuple[str, ...], int, int], ...] = ()
    """Input embeddings stored split and also replicated: ``(storage, replicas, scatter bytes, reduce bytes)``.
    XLA:TPU all-reduces such an embedding's gradient (a scatter-add of every token) whole over both groups
    instead of reduce-scattering it and all-reducing the shard; a learned position table's (a sum over the
    batch) too (read from GPT-2 dp=2 x fsdp=4's HLO: ``wpe`` whole over all 8 devices)."""
    attn: tuple[tuple[tuple[str, ...], int], ...] = ()
    """The attention weights' share of ``gather``: under a recomputing remat XLA:TPU gathers them a
    third time, in the backward (see :func:`param_terms`)."""
    tied: bool = False
    """The output head is the input embedding (tied weights): XLA:CPU reduces its gradient's two parts,
    the lookup's scatter-add and the head's matmul, apart; XLA:TPU gathers the table for the lookup and
    again for the head's forward and backward, and the head's gradient for the lookup's scatter-add
    (see :func:`param_tables`)."""
    grad_whole: tuple[tuple[tuple[str, ...], tuple[str, ...], int, int], ...] = ()
    """Layer leaves whose gradient XLA:TPU sums whole, as ``embed_whole``: ``(storage, replicas, scatter bytes,
    reduce bytes)``. Its fusion pass turns the partitioner's all-reduce + dynamic-slice into a reduce-scatter
    except for matrices split on their last dim alone into shards an odd multiple of 128 elements wide: those
    are all-reduced whole over the storage group (their shard then over its replicas as before; read from
    XLA:TPU's HLOs, see :func:`param_tables`)."""
    head_whole: tuple[tuple[tuple[str, ...], tuple[str, ...], int, int], ...] = ()
    """The head stored split and also replicated, as ``embed_whole`` (``(storage, replicas, scatter bytes, 0)``):
    a tied table's lookup part is then summed whole over both groups on XLA:TPU (see :func:`param_tables`)."""
    embed_table: tuple[tuple[tuple[str, ...], tuple[str, ...], int, int], ...] = ()
    """The input embedding's own rows (not a position table's): ``(storage, replicas, gathered bytes, scatter
    bytes)``. When XLA:TPU gathers the hidden states instead of the table (``hidden_embed`` in
    :func:`param_tables`), these leave the gathers and the gradients' storage-group sums."""
    experts: tuple[tuple[tuple[str, ...], int, int], ...] = ()
    """The routed experts' leaves stored split: ``(storage, gathered bytes, scatter bytes)``. Where XLA:TPU gathers
    the dispatched tokens instead (``tokens_experts`` in :func:`param_tables`), these leave the layers' gathers
    and their gradients' storage-group sums."""
    head_tp: bool = False
    """The head's table is split over tp as well (its vocabulary; tied: XLA:TPU then looks up the gathered
    token ids in the table's shard instead of gathering the table, see :func:`param_tables`)."""
    """``head_scatter``: the head's share of ``scatter`` (its gradient dtype); ``head_grad_f32``: the same in
    fp32; ``head_reduce_excess``: what the head's gradient shard, all-reduced over its replica axes in fp32,
    moves beyond its share of ``reduce``."""


def param_terms(
    traffic: ParamTraffic, placement: AxisPlacement, sizes: Mapping[str, int], *, layers: int,
    backend: str = "gpu", remat: str = "full", hidden_head: bool = False, hidden_embed: bool = False,
    tokens_experts: bool = False, embed_on_shard: bool = False,
) -> list[Pending]:
    """The parameter collectives of one step, not yet priced (see the module docstring).

    Args:
      traffic: bytes per axis group, from the plan.
      placement: where the axes lie.
      sizes: mesh axis sizes.
      layers: calls per step of each fused collective (the layer count).
      backend: ``"tpu"`` gathers the output head once, elsewhere it is gathered forward and backward;
        ``"tpu"`` and ``"gpu"`` reduce the head's gradient in fp32 (read from their HLOs).
      remat: the remat policy. Under ``full`` / ``offload`` the layers' weights are gathered forward and
        in the recompute, whose gather the backward reuses; XLA:TPU gathers the attention weights
        (``traffic.attn``) a third time in the backward. Under ``none`` XLA:CPU keeps every layer's
        forward gather for the backward; XLA:TPU gathers the attention weights again and keeps only the
        last layer's other weights (see :func:`param_tables`).
      hidden_head, hidden_embed: XLA:TPU gathers the batch's hidden states for the output head (the input
        embedding) instead of its table (:func:`~meshplan.pure.cost._gathered_operand.gathers_hidden`; read only
        for ``"tpu"`` and an untied head): the table is not gathered and its gradient not summed over its
        storage group (:func:`~meshplan.pure.cost._tpu_terms.hidden_state_terms` prices what is moved instead).
      tokens_experts: XLA:TPU gathers the MoE layers' dispatched tokens instead of the routed experts'
        weights (:func:`~meshplan.pure.cost._gathered_operand.gathers_tokens`; read only for ``"tpu"``
        under the remat policies of :data:`~meshplan.pure.cost._tpu_terms.TOKEN_REMATS`): the experts are not gathered
        and their gradients not summed over their storage group
        (:func:`~meshplan.pure.cost._tpu_terms.expert_token_terms` prices what is moved instead).
      embed_on_shard: XLA:TPU looks the token ids up in the input embedding's shard (vocabulary over tp,
        hidden over fsdp, fsdp != tp): the table is not gathered; its gradient is summed as before.

    Returns:
      One pending collective per (kind, axis group) that spans more than one device.
    """
    return table_terms(param_tables(traffic, tuple(sizes), backend=backend, remat=remat, hidden_head=hidden_head,
                                    hidden_embed=hidden_embed, tokens_experts=tokens_experts,
                                    embed_on_shard=embed_on_shard),
                       placement, sizes, layers=layers)


ParamTables: TypeAlias = tuple[
    tuple[CollectiveKind, str, tuple[tuple[tuple[str, ...], int], ...], int, bool, int], ...]
""":func:`param_tables`: ``(kind, what, bytes per axis group, passes, fused per layer, passes the last layer
skips)`` per collective kind (the last field: only for fused rows; XLA:TPU's remat-none gathers)."""


_Table: TypeAlias = tuple[tuple[tuple[str, ...], int], ...]
"""Bytes per axis group: ``((axes, bytes), ...)``."""


def _minus(table: _Table, *parts: _Table) -> _Table:
    """``table`` less the bytes of ``parts``, group by group (in ``table``'s order, new groups after)."""
    left = dict(table)
    for part in parts:
        for axes, nbytes in part:
            left[axes] = left.get(axes, 0) - nbytes
    return tuple(left.items())


def _summed(rows: tuple[tuple[tuple[str, ...], tuple[str, ...], int, int], ...], order: Mapping[str, int]) -> _Table:
    """``(storage, replicas, scatter bytes, _)`` rows as the scatter bytes summed whole over both groups (the
    group's axes in mesh ``order``)."""
    return tuple((tuple(sorted(st + rep, key=lambda a: order.get(a, 99))), sb) for st, rep, sb, _ in rows)


def param_tables(traffic: ParamTraffic, axes: tuple[str, ...], *, backend: str = "gpu",
                 remat: str = "full", hidden_head: bool = False, hidden_embed: bool = False,
                 tokens_experts: bool = False, embed_on_shard: bool = False) -> ParamTables:
    """:func:`param_terms`' bytes per axis group of each kind of collective, before the mesh's sizes and
    placement are read: a search lists the collectives of ~190 meshes whose ~70 plans each make one
    (``axes``: the mesh's axis names, in mesh order).

    Example:
      >>> t = ParamTraffic(gather=((("fsdp",), 100),), scatter=((("fsdp",), 100),), reduce=((("dp",), 50),))
      >>> [(kind, table) for kind, _, table, _, _, _ in param_tables(t, ("dp", "fsdp")) if table]
      [('all-gather', ((('fsdp',), 100),)), ('reduce-scatter', ((('fsdp',), 100),)), ('all-reduce', ((('dp',), 50),))]
    """
    tpu = backend == "tpu"
    # The head's gradient leaves its matmul in fp32 (fp32 logits), and XLA:TPU and XLA:GPU reduce it before
    # converting it to its grad dtype (read from both HLOs: GPU fsdp=8's head reduce-scatter is f32[512,128]).
    # XLA:CPU computes 16-bit floats in f32 anyway (xla_collectives doubles every term there).
    f32_head = backend in ("tpu", "gpu")
    policy = as_choice(remat, "remat", ("none", "dots", "full", "offload"), error=PlanError)
    recompute = policy in RECOMPUTING
    regather = policy != "none" or backend != "cpu"  # XLA:GPU with remat none: not read (textbook 2 passes)
    # XLA:TPU with remat none (read from Llama fsdp=8's HLO before and after the pass
    # schedule-aware-collective-cse): its SPMD partitioner gathers each weight again for the backward and
    # that pass merges the backward's gather into the forward's only when their users lie within a
    # distance threshold (flag xla_tpu_spmd_threshold_for_allgather_cse) in the dataflow graph: the head's
    # (21 instructions apart) and the last layer's MLP (58-78) are merged, the layer before's MLP (227-247,
    # a layer's forward and backward further) is not; every earlier layer is further still. The attention
    # weights are never merged, at any threshold (a threshold of 1e6 still gathers them twice): the forward
    # gathers the per-head view of q/k/v/o and the backward the flat leaf, two different instructions.
    tpu_none = tpu and policy == "none"
    # A tied table split over tp (vocabulary) and over fsdp (hidden) on XLA:TPU (read from GPT-2 fsdp=2 x tp=4's
    # HLO, v5e-8): the lookup gathers the token ids, not the table, which is gathered once, for the head; the
    # head's fp32 gradient (vocab/tp, h) is all-reduced whole over its storage group, kept on one shard there
    # (a select), the lookup's scatter-add added, and the sum reduce-scattered in its grad dtype. Neither the
    # table nor its gradient is gathered again (the fsdp-only table's 4 gathers: see the rows below).
    tied_tp = tpu and traffic.tied and traffic.head_tp
    tied_lookup = tpu and traffic.tied and not traffic.head_tp
    # XLA:TPU gathers the batch's hidden states, not the table, where they are the smaller operand
    # (meshplan.pure.cost._gathered_operand): the table is then neither gathered nor its gradient summed over
    # its storage group (its shard still is over its replicas). Read on untied tables only.
    hidden_head = tpu and not traffic.tied and hidden_head
    hidden_embed = tpu and not traffic.tied and hidden_embed
    # An embedding split over tp (vocabulary) and fsdp (hidden, fsdp != tp): XLA:TPU gathers the token ids and
    # looks them up in the table's shard (read by op_name from llama fsdp=4 x tp=2 and fsdp=2 x tp=4, hidden
    # 1024 and 4096; activation_terms prices the lookup's sum): the table is not gathered, and its gradient is
    # still reduce-scattered over fsdp.
    embed_on_shard = tpu and not traffic.tied and embed_on_shard
    embed_gather = tuple((st, gb) for st, _, gb, _ in traffic.embed_table) if hidden_embed or embed_on_shard else ()
    embed_scatter = tuple((st, sb) for st, _, _, sb in traffic.embed_table) if hidden_embed else ()
    # XLA:TPU gathers the dispatched tokens, not the experts' weights, where they are the smaller operand: the
    # experts then leave the layers' gathers, and their gradients need no sum over storage (read under remat
    # full and none; its replicas' sum stays).
    tokens_experts = tpu and policy in TOKEN_REMATS and tokens_experts
    expert_gather = tuple((st, gb) for st, gb, _ in traffic.experts) if tokens_experts else ()
    expert_scatter = tuple((st, sb) for st, _, sb in traffic.experts) if tokens_experts else ()

    once = _minus(traffic.embed, embed_gather) + (traffic.head if tpu and not hidden_head else ())
    twice = () if tpu else traffic.head  # outside the layers: gathered forward and backward, not fused per layer
    # XLA:TPU sums some layer gradients whole over storage instead of reduce-scattering them: after
    # partitioning every weight gradient is an all-reduce + dynamic-slice, and its fusion pass (between the
    # Pre_main_fusion dumps) makes a reduce-scatter of the pair except for slices along a matrix's last dim an
    # odd multiple of 128 elements wide, summed whole over the storage group (then over dp as before) (read from v5e-8 HLOs at fsdp=8: whole at 128, 384
    # and 640, Llama's k/v, GPT-2's c_attn and c_fc at those widths, MLA's q_a / kv_a, DeepSeek's expert and
    # shared gate / up; reduce-scattered at 480 and 512 and along any other dim; with dp beside fsdp, 384 whole
    # over fsdp, 256 and 768 reduce-scattered). Fitted to those widths after a "< 512" rule
    # failed on 480 / 640; why odd multiples is not read. Vectors (biases, norm weights, a few KiB) are summed
    # whole too but not modelled: under tp their compiled sums differ.
    layer_whole = traffic.grad_whole if tpu else ()
    if tokens_experts:  # (an expert summed whole is not summed at all: one row per expert leaf group)
        left = list(layer_whole)
        for st, _, sb in traffic.experts:
            if (st, (), sb, 0) in left:
                left.remove((st, (), sb, 0))
        layer_whole = tuple(left)
    # (an embedding whose hidden states are gathered sums only its shard, over its replicas: "reduce")
    whole = tuple(r for r in traffic.embed_whole
                  if not any(r[:3] == (st, rep, sb) for st, rep, _, sb in traffic.embed_table)
                  ) if hidden_embed else traffic.embed_whole if tpu else ()
    order = {a: k for k, a in enumerate(axes)}

    embed_ar = _summed(whole, order)
    whole = whole + layer_whole
    layer_gather = _minus(traffic.gather, traffic.embed, traffic.head,  # (the same bytes as once + twice, whole)
                         expert_gather)
    # (kind, what, bytes per axis group, passes, fused per layer, passes the last layer skips)
    return (
             # Without a recompute (remat none) the weights gathered forward are the matmuls' residuals, which
             # the backward reads: one gather per layer, not two (read from XLA:CPU's Llama fsdp=8, GPT-2 fsdp=8
             # and Mixtral fsdp=2 x ep=4 steps with remat none; "dots" saves only dot outputs and gathers again).
             ("all-gather", "all-gather of params (fwd + bwd)" if regather else
              "all-gather of params (fwd, kept for the bwd)",
              traffic.attn if tpu_none else layer_gather, 1 + regather, True, 0),
             ("all-gather", "all-gather of params (fwd + bwd, the last layer's kept for its bwd: XLA:TPU)",
              _minus(layer_gather, traffic.attn) if tpu_none else (), 2, True, 1),
             ("all-gather", "all-gather of params (embedding, head: once)", once, 1, False, 0),
             ("all-gather", "all-gather of params (head: fwd + bwd)", twice, 2, False, 0),
             # A tied embedding on XLA:TPU: the pass merges a gather only into the first gather of the same
             # operand, here the lookup's, 236-259 instructions from the head's forward and backward uses: both
             # gather the table again; and the lookup's scatter-add gathers the head's gradient into which it
             # adds (read from GPT-2 fsdp=8's HLO, remat none and full: 4 table-sized gathers, not 1).
             ("all-gather", "all-gather of params (tied embedding, again for the head fwd + bwd: XLA:TPU)",
              traffic.head if tpu and traffic.tied and not tied_tp else (), 2, False, 0),
             ("all-gather", "all-gather of grads (the tied head's, for the lookup's scatter-add: XLA:TPU)",
              traffic.head_scatter if tpu and traffic.tied and not tied_tp else (), 1, False, 0),
             # XLA:TPU does not keep the attention weights the recompute gathered for the backward: it gathers
             # them again there (read from Mixtral fsdp=2 x ep=4's HLO by op_name and source line: q, k, v, o
             # in 3 passes, the experts' weights in 2; in Llama fsdp=8's, held out, only q and k: 1.04x).
             ("all-gather", "all-gather of params (attention, again in the bwd: XLA:TPU)",
              traffic.attn if tpu and recompute else (), 1, True, 0),
             ("reduce-scatter", "reduce-scatter of grads",
              _minus(traffic.scatter, traffic.head_scatter if f32_head and not tied_tp else (),
                    tuple((st, sb) for st, _, sb, _ in whole), embed_scatter, expert_scatter), 1, True, 0),
             ("reduce-scatter", "reduce-scatter of grads (head, f32)",
              traffic.head_grad_f32 if f32_head and not tied_tp and not hidden_head else (), 1, False, 0),
             # XLA:CPU sums a tied embedding's gradient in two parts, the lookup's scatter-add and the head's
             # matmul, each over the storage group (read from GPT-2 fsdp=8's HLO: two f32[512,128] operands
             # of one combined all-reduce).
             ("reduce-scatter", "reduce-scatter of grads (tied embedding's second part, XLA:CPU)",
              traffic.head_scatter if backend == "cpu" and traffic.tied else (), 1, False, 0),
             # A tied table not split over tp on XLA:TPU: the lookup's scatter-add is summed apart from the
             # head's f32 matmul part, as an input embedding's: reduce-scattered in its grad dtype over the
             # storage group (GPT-2 fsdp=8, remat none and full: a bf16 [8192,1024] reduce-scatter beside the f32
             # one), or with replicas all-reduced whole over both groups (GPT-2 dp=2 x fsdp=4: over all 8).
             ("reduce-scatter", "reduce-scatter of grads (tied embedding's lookup part: XLA:TPU)",
              _minus(traffic.head_scatter, tuple((st, sb) for st, _, sb, _ in traffic.head_whole))
              if tied_lookup else (), 1, False, 0),
             ("all-reduce", "all-reduce of grads (tied embedding's lookup part, whole: XLA:TPU)",
              _summed(traffic.head_whole, order) if tied_lookup else (), 1, False, 0),
             ("all-reduce", "all-reduce of grads", _minus(traffic.reduce, tuple((rep, rb) for _, rep, _, rb in whole)),
              1, True, 0),
             ("all-reduce", "all-reduce of grads (input embedding, whole)", embed_ar, 1, False, 0),
             ("all-reduce", "all-reduce of grads (narrow last-dim splits, whole: XLA:TPU)",
              _summed(layer_whole, order), 1, True, 0),
             # XLA:TPU and XLA:GPU all-reduce the head's gradient in fp32: the bytes beyond its grad-dtype share.
             ("all-reduce", "all-reduce of grads (head in f32, beyond its grad dtype)",
              traffic.head_reduce_excess if f32_head else (), 1, False, 0),
             ("all-reduce", "all-reduce of grads (the tied head's, f32, whole before the lookup's scatter-add: "
              "XLA:TPU)", traffic.head_grad_f32 if tied_tp else (), 1, False, 0))


def table_terms(tables: ParamTables, placement: AxisPlacement, sizes: Mapping[str, int], *,
                layers: int) -> list[Pending]:
    """:func:`param_terms` from its :func:`param_tables` (``layers``: calls per step of a fused collective).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> t = ParamTraffic(gather=((("fsdp",), 100),), scatter=(), reduce=())
      >>> p = AxisPlacement(("dp", "fsdp"), (1, 8), (2, 1), parse_cluster("2x8xH100"))
      >>> table_terms(param_tables(t, ("dp", "fsdp")), p, {"dp": 2, "fsdp": 8}, layers=4)
      [Pending(what='fsdp all-gather of params (fwd + bwd)', kind='all-gather', axes=('fsdp',), nbytes=25.0, \
calls=8, ici=8, dcn=1)]
    """
    out: list[Pending] = []
    for kind, what, table, passes, fused, skipped in tables:
        if not table:  # most kinds are empty for a given backend and plan
            continue
        # Groups that differ only in size-1 axes are the same devices: one collective.
        merged: dict[tuple[str, ...], int] = {}
        for axes, nbytes in table:
            shown = tuple([a for a in axes if sizes[a] > 1])  # a list, not a generator: cheaper to build
            if nbytes and shown:
                merged[shown] = merged.get(shown, 0) + nbytes
        for shown, nbytes in merged.items():
            i, d = placement.split(shown)
            per = layers if fused else 1
            out.append(Pending(f"{'+'.join(shown)} {what}", kind, shown, nbytes / per,
                               passes * per - (skipped if fused else 0), i, d))
    return out
