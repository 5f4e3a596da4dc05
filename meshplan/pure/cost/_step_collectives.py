"""What one training step costs on a mesh: collectives (alpha-beta) and activation memory.

Axis kinds (the mesh search's axes, outermost first ``dp, fsdp, ep, sp, tp``):
``dp``, ``fsdp`` and ``ep`` split the batch, ``sp`` splits the sequence, ``tp``
splits the model's matmuls. Per device a step sees ``b = batch / (dp*fsdp*ep)``
sequences of ``s = seq / sp`` tokens. ``L`` is the number of layers, ``h`` the
hidden size, ``a`` the activation itemsize (2 for bf16).

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

**Activation collectives** (need the model's sizes):

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
  **XLA:CPU** (``backend="cpu"``, read from the compiled HLO of the reference
  steps): the backward sums each column-parallel projection's input gradient
  on its own (Llama 5: q, k, v, gate, up; GPT-2 2) and all-gathers 6 buffers
  per layer (the output gradient twice per block, for its input and its weight
  gradient, and the block input again for the weight gradient), plus the LM
  head's input once more and, with GQA, the K and V gradients (K and V split
  over ``gcd(tp, kv_heads)`` and replicated beyond when ``tp`` does not divide
  the kv heads: then 3 buffers in a layer's backward, not 6). In a MoE layer
  the experts' MLP works on the dispatched buffer ``E = b*E*capacity*h*a``:
  its block input is not gathered, the dispatched tokens are (fwd, recompute,
  bwd) and their sums are ``E``-sized (output fwd and recompute, 2 input
  gradients bwd). **XLA:TPU** (``backend="tpu"``, read from the compiled HLO of
  a TPU-sized Llama step, fsdp=2 x tp=4, windowed einsum off): Megatron's sums
  (2 forward, 1 recompute, 2 backward: the projections' input gradients are
  summed together) and the LM head's input gradient summed in fp32; a dense
  layer's backward gathers 6 buffers as on XLA:CPU (one fewer in the whole
  step), plus the K and V gradients, the LM head's input twice and the
  embedding's output gradient for its scatter-add. A MoE layer (read from
  Mixtral ep=4 x tp=2) sums its attention 2 + 1 recompute times and gathers 1
  + 1 recompute + 4 backward residual buffers and, as on XLA:CPU, the
  dispatched tokens; the experts' sums are ``E``-sized (fwd, recompute, 1
  bwd; without ep, read from Mixtral fsdp=2 x tp=4, the forward's and the
  backward's are reduce-scatters). A residual shard narrower than 256 (hidden
  1024 over tp=8) is summed with all-reduces, not reduce-scatters. K and V
  replicated over part of tp add sums over the replicas (their projections'
  input gradients, ``X``, and ``3*b*s*(kv/gcd)*head_dim*a`` of their
  gradients per layer); K and V gradients are gathered with as many kv heads
  as heads too. With the hidden dim split each norm's row statistics are
  summed over tp in fp32 (``b*s*4``): RMSNorm's as on XLA:GPU (below),
  GPT-2's LayerNorm 2 forward (mean, variance), 2 in the recompute and 3
  backward; the loss's 3. The vocab-split embedding lookup is a reduce-scatter into the split
  stream when the table is not also split over fsdp; split over fsdp as wide as tp,
  XLA:TPU permutes the table's shard instead and the lookup needs no sum. **MLA on XLA:CPU** (read
  from DeepSeek dp=2 x tp=4): q_a and kv_a are whole over tp and run on the
  split stream, so attention's input is never gathered; their outputs are summed
  (``b*s*(q_lora + kv_lora + rope)*a``, fwd and recompute) and so are q_b's and
  kv_b's input gradients with the rope key's (bwd); sums of ``X``: o (fwd,
  recompute), the (shared expert's) MLP down and its gate / up input gradients;
  gathers: the MLP's input (fwd, recompute) and 5 backward; the router's logits
  are summed (fp32). MLA on XLA:TPU keeps Megatron's counts (not read).
  **GPT-2's fused c_attn** (XLA:CPU and XLA:TPU, derived from XLA's SPMD
  partitioner, :mod:`~meshplan.pure.cost._slice_reshard`): split over ``tp``
  in ``3h/tp`` blocks that are not its heads, q, k and v are resharded by
  collective-permutes (forward, recompute) and their gradients by two
  all-to-alls (``6X/tp`` per layer); XLA:CPU gathers the fused gradient
  (``3X``) for the weight gradient instead of the block input. On
  XLA:CPU a dense layer's backward gathers 3 buffers, not 6, also when tp is the
  mesh's only axis (the two uses of a buffer share one gather there; MLA's
  layer then gathers 2 in its backward, not 5: o's and the MLP's output gradients).
  **XLA:GPU** (``backend="gpu"``, read from HLO compiled ahead of time for
  1x8xH200): XLA:TPU's counts, except that a narrow shard's sums stay
  reduce-scatters; a dense layer gathers 2 buffers forward, 5 in the recompute
  and 3 backward (none fewer in the step under a recompute), 7 in all when tp is
  the mesh's only axis (and then not the embedding's output gradient); K and V
  gradients are gathered only with GQA; and each RMSNorm's and the loss's row
  statistics are summed over tp in fp32 (``b*s*4``, ``(4 + 2r)L + 5`` calls).
  MLA on XLA:GPU: XLA:CPU's MLA counts, an MLP's gate and up input gradients
  summed together, XLA:TPU's expert sums, lookup and fp32 LM-head input gradient;
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

**Links.** A device group whose axes all lie inside ICI domains
(``dcn == 1`` for each) runs on the fast link; one that lies wholly across
domains (``ici == 1``) on the network; a group with ``i`` devices per domain
over ``d`` domains runs a two-level schedule, the way XLA runs multislice
collectives and NCCL's hierarchical algorithms do: all-gather /
reduce-scatter = ring of ``i`` on ICI (buffer ``B``) + ring of ``d`` on DCN
(buffer ``B/i``); all-reduce likewise; all-to-all = exchange of ``B`` within
the domain + exchange of ``B`` across domains. :func:`axis_domain_counts`
checks which groups cross domains on an actual device layout.

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

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np

from meshplan.pure._check import as_choice, as_count, as_flag, as_sequence, canonical_axis_sizes
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.cost._estimates import CommTerm
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cost._collective_time import CollectiveKind, collective_time
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MoeDispatch
from meshplan.pure.cost._slice_reshard import slice_reshard
from meshplan.pure.specs._activation import ActivationLayout, activation_layout

__all__ = ["AXIS_ORDER", "BATCH_AXES", "DATA_AXES", "RECOMPUTING", "STORAGE_AXES", "TOKEN_REMATS", "TP_BACKENDS",
           "AxisPlacement", "ParamTraffic", "activation_bytes", "activation_terms", "axis_domain_counts",
           "expert_token_terms", "group_time", "hidden_state_terms", "param_tables", "param_terms", "price",
           "step_activations", "table_terms", "to_terms", "whole_slice_sums",
           "xla_collectives"]

AXIS_ORDER: tuple[str, ...] = ("dp", "fsdp", "ep", "sp", "tp")
"""The axis kinds the search knows, outermost (least traffic) first."""

BATCH_AXES: tuple[str, ...] = ("dp", "fsdp", "ep")
"""Axes that split the global batch."""

DATA_AXES: tuple[str, ...] = ("dp", "fsdp", "ep", "sp")
"""Axes that split the tokens: gradients are summed over those a leaf is not split on."""

STORAGE_AXES: tuple[str, ...] = ("dp", "fsdp", "sp")
"""Axes that split weights only to store them: split weights are gathered before use."""


def axis_domain_counts(device_ids: np.ndarray, ici_domain_size: int) -> tuple[int, ...]:
    """For each mesh axis, the most ICI domains one of its device groups touches.

    Device ``i`` sits in domain ``i // ici_domain_size`` (ids numbered node by
    node, as :class:`~meshplan.pure.Cluster` lays them out). A count of 1 means
    every group along that axis stays on the fast link.

    Args:
      device_ids: the mesh as an array of device ids (one mesh axis per array axis).
      ici_domain_size: devices per ICI domain.

    Returns:
      One count per mesh axis.

    Example:
      >>> ids = np.arange(16).reshape(2, 8)            # dp=2 outer, tp=8 inner
      >>> axis_domain_counts(ids, 8)
      (2, 1)
      >>> axis_domain_counts(ids.reshape(8, 2), 8)     # the inner axis of size 2 stays in a node
      (2, 1)
    """
    size = as_count(ici_domain_size, "ici_domain_size", error=PlanError)
    try:
        ids = np.asarray(device_ids)
    except (ValueError, TypeError, OverflowError):
        ids = np.asarray(None)  # ragged: refused just below
    if ids.dtype.kind not in "iu":
        raise MeshplanTypeError(f"device_ids={device_ids!r:.80} must be an integer array (the mesh's device ids).")
    del ici_domain_size
    ici_domain_size = size
    if ici_domain_size > int(np.iinfo(ids.dtype).max):
        # Floor division by a divisor beyond every id the dtype holds (numpy cannot even convert it).
        domains = np.where(ids < 0, -1, 0)
    else:
        domains = ids // ici_domain_size
    out = []
    for axis in range(domains.ndim):
        rows = np.moveaxis(domains, axis, -1).reshape(-1, domains.shape[axis])
        ordered = np.sort(rows, axis=1)
        distinct = (np.diff(ordered, axis=1) != 0).sum(axis=1) + 1
        out.append(int(distinct.max()))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class AxisPlacement:
    """Each mesh axis's ICI and DCN parts on a cluster (``ici[k] * dcn[k]`` = its size)."""

    names: tuple[str, ...]
    ici: tuple[int, ...]
    dcn: tuple[int, ...]
    cluster: Cluster

    def split(self, axes: Sequence[str]) -> tuple[int, int]:
        """(devices per domain, domains) of the device group over ``axes``."""
        i = d = 1
        for a in axes:
            k = self.names.index(a)
            i *= self.ici[k]
            d *= self.dcn[k]
        return i, d


StepKind: TypeAlias = CollectiveKind | Literal["collective-permute"]
"""A collective of a step: the cost model's kinds and XLA's collective-permute (a slice resharded
between devices, :func:`_fused_qkv_permutes`), priced as one point-to-point send of its buffer."""

Pending: TypeAlias = tuple[str, StepKind, tuple[str, ...], float, int, int, int]
"""A collective not yet priced: ``(what, kind, axes, nbytes per call, calls, i, d)``, where the
group has ``i`` devices per ICI domain over ``d`` domains."""


def _link_name(i: int, d: int) -> str:
    if i * d == 1:
        return "none"
    return "intra" if d == 1 else "inter" if i == 1 else "intra+inter"


def _two_level(kind: StepKind, nbytes: Any, i: Any, d: Any, cluster: Cluster) -> Any:
    """Seconds of one call: ring of ``i`` on ICI + ring of ``d`` on DCN (either may be 1, costing 0)."""
    if kind == "collective-permute":
        # Each device sends its buffer once, to one peer of the group: over DCN when the group spans domains.
        i, d = np.asarray(i), np.asarray(d)
        intra, inter = cluster.intra_link, cluster.inter_link
        return np.where(d > 1, inter.latency + nbytes / inter.bandwidth,
                        np.where(i > 1, intra.latency + nbytes / intra.bandwidth, 0.0))
    outer = nbytes if kind == "all-to-all" else nbytes / i
    return (collective_time(kind, nbytes, i, cluster.intra_link)
            + collective_time(kind, outer, d, cluster.inter_link))


def group_time(kind: StepKind, nbytes: float, axes: Sequence[str], placement: AxisPlacement) -> tuple[float, str]:
    """Seconds of one collective over the device group ``axes``, and the link it uses.

    Args:
      kind: ``"all-gather"``, ``"reduce-scatter"``, ``"all-reduce"``, ``"all-to-all"`` or
        ``"collective-permute"`` (one send of ``nbytes`` per device).
      nbytes: the full buffer (as :mod:`meshplan.pure.cost._collective_time` defines it).
      axes: the mesh axes of the group.
      placement: where the axes lie.

    Returns:
      ``(seconds, link)`` with link ``"intra"``, ``"inter"``, ``"intra+inter"`` (two-level)
      or ``"none"`` (a group of one device).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> c = parse_cluster("2x8xH100")
      >>> p = AxisPlacement(("dp", "tp"), (1, 8), (2, 1), c)
      >>> group_time("all-reduce", 1e9, ("tp",), p)[1], group_time("all-reduce", 1e9, ("dp", "tp"), p)[1]
      ('intra', 'intra+inter')
    """
    i, d = placement.split(axes)
    return float(_two_level(kind, float(nbytes), i, d, placement.cluster)), _link_name(i, d)


def price(pending: Sequence[Pending], cluster: Cluster) -> np.ndarray:
    """Seconds of every pending collective (all its calls), priced in one numpy pass per kind.

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> price([("x", "all-reduce", ("tp",), 1e9, 2, 8, 1)], parse_cluster("H100")).round(6).tolist()
      [0.007862]
    """
    out = np.zeros(len(pending))
    by_kind: dict[StepKind, list[int]] = {}
    for k, item in enumerate(pending):
        by_kind.setdefault(item[1], []).append(k)
    for kind, rows in by_kind.items():
        cols = np.array([pending[k][3:] for k in rows], dtype=np.float64)
        nbytes, calls, i, d = cols[:, 0], cols[:, 1], cols[:, 2].astype(np.int64), cols[:, 3].astype(np.int64)
        out[rows] = calls * _two_level(kind, nbytes, i, d, cluster)
    return out


def to_terms(pending: Sequence[Pending], seconds: Sequence[float] | np.ndarray) -> tuple[CommTerm, ...]:
    """Priced collectives as :class:`CommTerm` records."""
    return tuple(CommTerm(what, kind, axes, int(nbytes), calls, _link_name(i, d), float(t))
                 for (what, kind, axes, nbytes, calls, i, d), t in zip(pending, seconds, strict=True))


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
        storage group (:func:`hidden_state_terms` prices what is moved instead).
      tokens_experts: XLA:TPU gathers the MoE layers' dispatched tokens instead of the routed experts'
        weights (:func:`~meshplan.pure.cost._gathered_operand.gathers_tokens`; read only for ``"tpu"``
        under the remat policies of :data:`TOKEN_REMATS`): the experts are not gathered and their gradients not summed over their
        storage group (:func:`expert_token_terms` prices what is moved instead).
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

    def minus(table: tuple[tuple[tuple[str, ...], int], ...], *parts: tuple[tuple[tuple[str, ...], int], ...]
              ) -> tuple[tuple[tuple[str, ...], int], ...]:
        left = dict(table)
        for part in parts:
            for axes, nbytes in part:
                left[axes] = left.get(axes, 0) - nbytes
        return tuple(left.items())

    once = minus(traffic.embed, embed_gather) + (traffic.head if tpu and not hidden_head else ())
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

    def summed(rows: tuple[tuple[tuple[str, ...], tuple[str, ...], int, int], ...]
               ) -> tuple[tuple[tuple[str, ...], int], ...]:
        return tuple((tuple(sorted(st + rep, key=lambda a: order.get(a, 99))), sb) for st, rep, sb, _ in rows)

    embed_ar = summed(whole)
    whole = whole + layer_whole
    layer_gather = minus(traffic.gather, traffic.embed, traffic.head,  # (the same bytes as once + twice, whole)
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
              minus(layer_gather, traffic.attn) if tpu_none else (), 2, True, 1),
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
              minus(traffic.scatter, traffic.head_scatter if f32_head and not tied_tp else (),
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
              minus(traffic.head_scatter, tuple((st, sb) for st, _, sb, _ in traffic.head_whole))
              if tied_lookup else (), 1, False, 0),
             ("all-reduce", "all-reduce of grads (tied embedding's lookup part, whole: XLA:TPU)",
              summed(traffic.head_whole) if tied_lookup else (), 1, False, 0),
             ("all-reduce", "all-reduce of grads", minus(traffic.reduce, tuple((rep, rb) for _, rep, _, rb in whole)),
              1, True, 0),
             ("all-reduce", "all-reduce of grads (input embedding, whole)", embed_ar, 1, False, 0),
             ("all-reduce", "all-reduce of grads (narrow last-dim splits, whole: XLA:TPU)",
              summed(layer_whole), 1, True, 0),
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
      [('fsdp all-gather of params (fwd + bwd)', 'all-gather', ('fsdp',), 25.0, 8, 8, 1)]
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
            out.append((f"{'+'.join(shown)} {what}", kind, shown, nbytes / per,
                        passes * per - (skipped if fused else 0), i, d))
    return out


def _local_batch(sizes: Mapping[str, int], batch: int, seq: int) -> tuple[int, int]:
    ways = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
    return batch // ways, seq // sizes.get("sp", 1)


def hidden_state_terms(
    model: Any, sizes: Mapping[str, int], placement: AxisPlacement, *, batch: int, seq: int, itemsize: int,
    head_axes: tuple[str, ...] = (), embed_axes: tuple[str, ...] = (),
) -> list[Pending]:
    """What XLA:TPU moves instead of a table whose hidden states it gathers, not yet priced.

    Where a plan splits the output head's (or the input embedding's) vocabulary over batch axes and the
    hidden states' shard is the smaller operand (:func:`~meshplan.pure.cost._gathered_operand.gathers_hidden`),
    XLA:TPU gathers the batch's hidden states over those axes instead of the table (read from the HLO of
    full-width Llama-3-8B/2L on v5e-8, fsdp=8 and dp=2 x fsdp=4; docs/design-notes.md, "Which operand XLA gathers"):

    - the head: the final hidden states gathered forward and again backward, and the head's input
      gradient (fp32, the fp32 logits') reduce-scattered back;
    - the embedding: the token ids gathered, the lookup's output (each device's table rows)
      reduce-scattered, and its gradient gathered for the scatter-add, which needs no sum.

    :func:`param_tables` (``hidden_head``, ``hidden_embed``) leaves out the tables' gathers and gradient
    sums in exchange.

    Args:
      model: a :class:`~meshplan.pure.ModelSpec`.
      sizes: mesh axis sizes (missing axes count as 1).
      placement: where the axes lie.
      batch: global batch in sequences; seq: tokens per sequence.
      itemsize: bytes per activation element.
      head_axes: the batch axes the head's vocabulary is split over, when XLA gathers the hidden states for
        it (:func:`~meshplan.pure.cost._gathered_operand.vocab_batch_axes`); ``()``: it gathers the table.
      embed_axes: the same for the input embedding.

    Returns:
      The pending collectives (none when neither table's hidden states are gathered).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> p = AxisPlacement(("fsdp",), (8,), (1,), parse_cluster("v5e-8"))
      >>> terms = hidden_state_terms(MODEL_SPECS["llama3-8b"], {"fsdp": 8}, p, batch=16, seq=2048, itemsize=2,
      ...                            head_axes=("fsdp",), embed_axes=("fsdp",))
      >>> [(t[1], t[3] // 2**20, t[4]) for t in terms]
      [('all-gather', 256, 2), ('reduce-scatter', 512, 1), ('all-gather', 0, 1), ('reduce-scatter', 256, 1), \
('all-gather', 256, 1)]
    """
    b, s = _local_batch(sizes, batch, seq)
    h = model.hidden_size
    out: list[Pending] = []

    def add(what: str, kind: StepKind, axes: tuple[str, ...], per_token: int, calls: int) -> None:
        shown = tuple([a for a in axes if sizes.get(a, 1) > 1])
        if shown:
            i, d = placement.split(shown)
            ways = math.prod(sizes[a] for a in shown)
            out.append((f"{'+'.join(shown)} {what}", kind, shown, b * s * ways * per_token, calls, i, d))

    add("all-gather of the hidden states for the LM head (fwd + bwd: XLA:TPU)", "all-gather", head_axes,
        h * itemsize, 2)
    add("reduce-scatter of the LM head's input gradient (hidden states gathered: XLA:TPU, f32)", "reduce-scatter",
        head_axes, h * 4, 1)
    add("all-gather of the token ids for the embedding lookup (XLA:TPU)", "all-gather", embed_axes, 4, 1)
    add("reduce-scatter of the embedding lookup's output (XLA:TPU)", "reduce-scatter", embed_axes, h * itemsize, 1)
    add("all-gather of the embedding lookup's output gradient (XLA:TPU)", "all-gather", embed_axes, h * itemsize, 1)
    return out


TOKEN_REMATS: tuple[str, ...] = ("none", "full", "offload")
"""Remat policies under which :func:`expert_token_terms` were read (``offload`` recomputes as ``full`` does)."""


def expert_token_terms(
    model: Any, sizes: Mapping[str, int], placement: AxisPlacement, *, batch: int, seq: int, itemsize: int,
    axes: tuple[str, ...], remat: str = "full", capacity_factor: float = CAPACITY_FACTOR,
    moe_dispatch: str = "einsum",
) -> list[Pending]:
    """What XLA:TPU moves instead of the routed experts' weights when it gathers the dispatched tokens, not yet
    priced (``axes``: the batch axes the experts are stored over; ``()``: it gathers the weights).

    Where a plan splits the experts' intermediate dim over batch axes and the dispatched tokens ``(experts,
    rows, capacity, hidden)`` are the smaller operand (:func:`~meshplan.pure.cost._gathered_operand.
    gathers_tokens`), XLA:TPU gathers the tokens and sums the experts' partial outputs, as under tp. Read by
    op_name from the HLO of full-width Mixtral-8x7B fsdp=8 at 16 x 2048, 2 and 4 layers. Remat full (or
    offload): per MoE layer the tokens are gathered 6 times (the forward's input; in the backward the
    recompute's inputs and dispatch, the output gradient for ``w2``'s input gradient and the tokens again for
    the weights' gradients) less 3 for the last layer, whose recompute's gathers are the forward's; the partial
    sums of ``w2``'s output (forward, recompute) and of the tokens' gradient (backward) are reduce-scattered: 3
    per MoE layer. Remat none: 5 gathers per MoE layer less 1, and per layer the forward's sum an all-reduce,
    the backward's a reduce-scatter. Each moves the whole dispatched buffer of the group, ``rows x ways x
    experts x capacity x hidden`` (a ``"dropless"`` ``moe_dispatch``: its routed tokens, ``rows x ways x seq x
    top_k x hidden``; not read from a compile). Other policies (``dots``) were not read: no terms.

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> p = AxisPlacement(("fsdp",), (8,), (1,), parse_cluster("v5e-8"))
      >>> import dataclasses
      >>> m = dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], num_layers=2, num_params=None)
      >>> [(t[1], t[3] // 2**20, t[4]) for t in expert_token_terms(m, {"fsdp": 8}, p, batch=16, seq=2048,
      ...                                                          itemsize=2, axes=("fsdp",))]
      [('all-gather', 640, 9), ('reduce-scatter', 640, 6)]
    """
    policy = as_choice(remat, "remat", ("none", "dots", "full", "offload"), error=PlanError)
    shown = tuple([a for a in axes if sizes.get(a, 1) > 1])
    moe = model.num_moe_layers
    if not shown or not moe or policy not in TOKEN_REMATS:
        return []
    b, s = _local_batch(sizes, batch, seq)
    rows = MoeDispatch(moe_dispatch, capacity_factor).rows(top_k=model.num_experts_per_tok, seq=s,
                                                          experts=model.num_experts)
    nbytes = b * math.prod(sizes[a] for a in shown) * rows * model.hidden_size * itemsize
    i, d = placement.split(shown)
    group = "+".join(shown)
    gathers = f"{group} all-gather of the dispatched tokens for the experts (XLA:TPU)"
    sums = f"{group} reduce-scatter of the experts' partial outputs and input grads (XLA:TPU)"
    if policy == "none":
        return [(gathers, "all-gather", shown, nbytes, 5 * moe - 1, i, d),
                (f"{group} all-reduce of the experts' partial outputs (fwd, XLA:TPU)", "all-reduce", shown, nbytes,
                 moe, i, d),
                (f"{group} reduce-scatter of the experts' partial input grads (bwd, XLA:TPU)", "reduce-scatter",
                 shown, nbytes, moe, i, d)]
    return [(gathers, "all-gather", shown, nbytes, 6 * moe - 3, i, d),
            (sums, "reduce-scatter", shown, nbytes, 3 * moe, i, d)]


def whole_slice_sums(pending: Sequence[Pending], sizes: Mapping[str, int], *, chips: int) -> list[Pending]:
    """XLA:TPU's gradient sums on v5p over a whole slice of ``chips`` chips: all-reduces, not reduce-scatters.

    On v5p a reduce-scatter whose group is every chip of a slice whose chip grid spans all three dims (2x2x2
    and up) is emitted as an all-reduce of the same buffer (and a slice): read from TPU-sized Llama fsdp=8 on
    v5p-16 and fsdp=16 on v5p-32, Mixtral fsdp=8 on v5p-16 and full-width Llama fsdp=8 on v5p-16 (its weight
    gradients, the head's input gradient and the lookup's sum alike); the same groups on v5e-8 (2x4), a whole
    2x2x1 v5p-8 slice and groups short of the slice (dp x fsdp, fsdp x tp on v5p-16 and v5p-32, also 2x2x2 blocks
    of a v5p-32) reduce-scatter (docs/design-notes.md, "v5p's whole-slice gradient sums"). Why the 3-D whole slice was
    not read. The search passes ``chips`` only for such a v5p slice.

    Example:
      >>> t = [("fsdp reduce-scatter of grads", "reduce-scatter", ("fsdp",), 100, 2, 8, 1)]
      >>> whole_slice_sums(t, {"fsdp": 8}, chips=8)
      [('fsdp all-reduce of grads (whole v5p slice: XLA:TPU)', 'all-reduce', ('fsdp',), 100, 2, 8, 1)]
      >>> whole_slice_sums(t, {"fsdp": 8}, chips=16) == t
      True
    """
    out: list[Pending] = []
    for what, kind, axes, nbytes, calls, i, d in pending:
        if kind == "reduce-scatter" and math.prod(sizes.get(a, 1) for a in axes) == chips:
            group, _, rest = what.partition(" reduce-scatter ")
            what, kind = f"{group} all-reduce {rest} (whole v5p slice: XLA:TPU)", "all-reduce"
        out.append((what, kind, axes, nbytes, calls, i, d))
    return out


TP_BACKENDS: tuple[str, ...] = ("cpu", "gpu", "tpu")
"""Backends :func:`activation_terms` knows the tp collectives of, each as its XLA emits them (read from
compiled HLO; Megatron's schedule only where a lowering was not read: MLA on XLA:TPU)."""

RECOMPUTING: tuple[str, ...] = ("full", "offload")
"""Remat policies whose backward reruns the layer's forward, collectives included."""


def _column_projections(model: Any, tp: int) -> tuple[int, int]:
    """Column-parallel projections per layer that read a block input, (attention, MLP): their input
    gradients are summed over tp. K and V count where tp splits their heads, also over a subgroup
    (``gcd(tp, kv_heads) > 1``: XLA splits them that far and replicates the rest)."""
    if model.family == "gpt2":
        return 1, 1  # c_attn, c_fc
    kv = 2 if math.gcd(model.num_kv_heads, tp) > 1 else 0
    return (0 if model.mla is not None else 1 + kv), 2  # MLA: its down projections are whole over tp


def _fused_qkv_permutes(model: Any, tp: int) -> tuple[int, ...] | None:
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


def _gpu_dense_gathers(dense: int, r: int, alone: bool) -> int:
    """The residual-stream gathers of ``dense`` dense layers under tp on XLA:GPU (``r``: 1 with a recompute).

    Read from XLA:GPU's HLO (1x8xH200, compiled ahead of time) by op_name and source line: per layer 2
    forward (attention's and the MLP's input), and, with remat ``full``, 5 in the recompute and 3 in the
    backward: XLA:TPU's 2 + 2 + 6, but without its one-fewer-per-step (the top layer's output gradient is
    gathered for each use apart: Llama fsdp=2 x tp=4, hidden 1024, 20 per 2 layers). With tp the mesh's only
    axis a buffer's two backward uses share one gather (as on XLA:CPU): 7 per layer, not 10 (Llama tp=8,
    14 per 2 layers). Without a recompute (remat ``none``) 8 per layer less one per step, as on XLA:TPU
    (Llama dp=2 x tp=4: 15 per 2 layers).

    Example:
      >>> _gpu_dense_gathers(2, 1, False), _gpu_dense_gathers(2, 1, True), _gpu_dense_gathers(2, 0, False)
      (20, 14, 15)
    """
    return dense * (2 + 2 * r + (3 if alone else 6)) - (0 if r or not dense else 1)


def activation_terms(
    model: Any, sizes: Mapping[str, int], placement: AxisPlacement, *, batch: int, seq: int, itemsize: int,
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
      backend: one of :data:`TP_BACKENDS`: whose XLA's tp, sp and ep collectives to count.
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
      >>> [(t[1], t[4]) for t in terms][:3]
      [('reduce-scatter', 160), ('reduce-scatter', 1), ('all-reduce', 197)]
      >>> [(t[1], t[4]) for t in terms][3:]
      [('all-gather', 322), ('all-gather', 64), ('reduce-scatter', 1)]
    """
    backend = as_choice(backend, "backend", TP_BACKENDS, error=PlanError)
    recompute = as_choice(remat, "remat", ("none", "dots", "full", "offload"), error=PlanError) in RECOMPUTING
    residual_split = as_flag(residual_split, "residual_split")
    dispatch = MoeDispatch(moe_dispatch, capacity_factor)
    b, s = _local_batch(sizes, batch, seq)
    tp, sp, ep = (sizes.get(a, 1) for a in ("tp", "sp", "ep"))
    h, layers = model.hidden_size, model.num_layers
    out: list[Pending] = []

    def add(what: str, kind: StepKind, axis: str | tuple[str, ...], nbytes: int, calls: int) -> None:
        axes = (axis,) if isinstance(axis, str) else axis
        if calls and axes:
            i, d = placement.split(axes)
            out.append((what, kind, axes, nbytes, calls, i, d))

    if tp > 1:
        x = b * s * h * itemsize
        split = residual_split and (h % tp == 0 or s % tp == 0)  # as step_activations lays the stream out
        vocab = model.vocab_size % tp == 0  # the embedding and LM head split over the vocabulary
        cpu = backend == "cpu"
        mla = model.mla is not None
        # XLA:GPU lowers tp as XLA:TPU does, except where `gpu` says otherwise (read from the 1x8xH200 HLOs,
        # compiled ahead of time; see _gpu_dense_gathers and docs/design-notes.md).
        gpu = backend == "gpu" and not mla
        # MLA on XLA:GPU: XLA:CPU's MLA counts (summed as XLA:GPU sums: reduce-scatters into the split stream),
        # but an MLP's gate and up input gradients summed together, with XLA:TPU's expert sums, lookup and fp32
        # LM-head input gradient (read from DeepSeek dp=2 x tp=4's HLO, remat full, by op_name and source line;
        # the remat-none expert rule from dp=2 x tp=4's totals; fsdp=2 x tp=4 and tp=8 held out).
        mla_gpu = backend == "gpu" and mla
        tpu = backend == "tpu" and not mla or gpu  # MLA's lowering on XLA:TPU was not read: Megatron's counts
        r = 1 if recompute else 0
        moe = model.num_moe_layers
        dense = layers - moe
        kv_heads = model.num_kv_heads
        # K/V heads that tp does not divide are split over gcd(tp, kv) and replicated beyond (XLA's choice).
        kv_part = kv_heads % tp != 0 and math.gcd(kv_heads, tp) > 1
        alone = all(n == 1 for a, n in sizes.items() if a != "tp")  # tp the mesh's only axis
        # GPT-2's c_attn resharded: the partitioner's slice and concatenate handling, the same on XLA:CPU and
        # XLA:TPU (read on v5e-8, GPT-2 hidden 1024 dp=2 x tp=4: its 28 permutes and 8 all-to-alls exact);
        # XLA:GPU not read. The fused gradient's gather for c_attn's weight gradient is XLA:CPU's only.
        fused = _fused_qkv_permutes(model, tp) if backend in ("cpu", "tpu") else None
        cpu_fused = fused if cpu else None
        if (cpu or mla_gpu) and mla:  # read from DeepSeek dp=2 x tp=4's HLO (see the module docstring)
            # MLA's down-projections (q_a, kv_a) are whole over tp: XLA:CPU runs them on the split stream and
            # sums their small outputs (the latent term below), so attention's input is never gathered and
            # its input gradients need no X-sized sum. Sums: o (fwd, recompute), the MLP's down (fwd) and
            # its gate / up input grads; gathers: the MLP's input (fwd, recompute) and 5 backward (o's
            # output gradient twice, the MLP's twice and its input). A MoE layer's MLP here is its shared
            # expert (without one: only attention's, a guess: not read).
            _, mlp = _column_projections(model, tp)
            mlp = 1 if mla_gpu else mlp  # XLA:GPU: gate's and up's input gradients in one sum
            shared = 1 if model.num_shared_experts else 0
            sums = dense * (2 + r + mlp) + moe * (1 + r + shared * (1 + mlp))
            gathers = dense * (1 + r + 5) + moe * (shared * (1 + r) + 2 + 3 * shared)
            if alone:
                # With tp the mesh's only axis (read from DeepSeek tp=8's HLO, by op_name and source line) the
                # backward gathers o's output gradient once and the MLP's once, and the MLP's input for its
                # weight gradient not at all: 2 per layer, not 5 (with dp / fsdp beside tp a buffer's two
                # uses carry different replica-group forms and are gathered apart, as for Llama below).
                gathers = dense * (1 + r + 2) + moe * (shared * (1 + r) + 1 + shared)
        elif cpu:  # per layer, as XLA:CPU's partitioner emits them (see the module docstring)
            attn, mlp = _column_projections(model, tp)
            sums = dense * (2 + r + attn + mlp) + moe * (1 + r + attn)
            # XLA:CPU gathers 3 buffers in a dense layer's backward, not 6, when tp is the mesh's only axis
            # (read from llama tp=8 with 4 kv heads, K/V replicated over part of tp, and with 8, where they
            # are not: a buffer's gathers for its two backward uses are one there; with dp / fsdp they are
            # two). Both conditions kept: with 8 devices the first never occurs without the second.
            # GPT-2's fused c_attn with the stream split: its weight gradient is taken against the split
            # input and the gathered fused gradient (below), so that input is not gathered for it: 5, not 6
            # (read from GPT-2 dp=4 x tp=2, dp=2 x tp=4, fsdp=2 x tp=4; with tp alone 3, as for Llama).
            fused_bwd = cpu_fused is not None and split
            gathers = dense * (2 + 2 * r + (3 if kv_part or alone else 5 if fused_bwd else 6)) + moe * (1 + r + 4)
        elif tpu:  # as XLA:TPU emits them (see the module docstring)
            # A MoE layer's row-parallel sum is the experts' (dispatched-buffer sized, below): attention's o
            # forward and in the recompute, and q, k, v's input gradients together.
            sums = dense * (4 + r) + moe * (2 + r)
            # The backward gathers 6 buffers per dense layer, one fewer in the step (the top layer's output
            # gradient is gathered once for its two uses); a MoE layer gathers its attention's input forward
            # and in the recompute, 4 buffers backward (o's output gradient twice, q's input, the combine's).
            gathers = dense * (2 + 2 * r + 6) - (1 if dense else 0) + moe * (1 + r + 4)
            if gpu:
                gathers = _gpu_dense_gathers(dense, r, alone) + moe * (1 + r + 4)
        else:
            sums, gathers = layers * (4 + r), layers * (4 + 2 * r)
        # A residual shard narrower than 256 (hidden 1024 over tp=8): XLA:TPU sums the whole buffer with
        # all-reduces (and slices), not reduce-scatters; 256 and wider it reduce-scatters.
        # XLA:GPU reduce-scatters there too (hidden 1024 over tp=8: 12 of 12 sums are reduce-scatters).
        narrow = tpu and not gpu and split and h % tp == 0 and h // tp < 256
        kind: CollectiveKind = "reduce-scatter" if split and not narrow else "all-reduce"
        # XLA:TPU sums the LM head's input gradient in fp32 (the fp32 logits'), apart from the others.
        head_sum = 1 if vocab and not (tpu or mla_gpu) else 0
        add(f"tp {kind} of activations (row-parallel outputs, column-parallel input grads"
            f"{', recompute' if recompute else ''})", kind, "tp", x, sums + head_sum)
        if (cpu or mla_gpu) and mla:
            # The latent outputs of q_a and kv_a (with kv_a's rope part), summed forward and in the recompute,
            # and in the backward q_b's and kv_b's input gradients with the shared rope key's (summed over
            # the heads): the same b*s*(q_lora + kv_lora + rope) per call.
            dims = model.mla
            latent = b * s * (dims.q_lora_rank + dims.kv_lora_rank + dims.qk_rope_head_dim) * itemsize
            add("tp all-reduce of MLA's latents (q_a / kv_a outputs fwd + recompute, input grads bwd)",
                "all-reduce", "tp", latent, layers * (2 + r))
            if moe:
                # The router is whole over tp and reads the split stream: its logits are summed (fp32).
                add("tp all-reduce of the router logits (MoE, MLA, XLA:CPU, f32)", "all-reduce", "tp",
                    b * s * model.num_experts * 4, moe * (1 + r))
        if vocab and (tpu or mla_gpu):
            head_kind: CollectiveKind = "reduce-scatter" if split else "all-reduce"
            add(f"tp {head_kind} of the LM head's input gradient (XLA:TPU, f32)", head_kind, "tp", b * s * h * 4, 1)
        if tpu and kv_part:
            # K and V replicated over tp / gcd(tp, kv) devices: their projections' input gradients and the
            # attention's K and V gradients are summed over the replicas too (read from XLA:TPU's HLO).
            local_kv = kv_heads // math.gcd(kv_heads, tp)  # kv heads on each device
            add("tp all-reduce of the K/V projections' input grads over the kv replicas (XLA:TPU)", "all-reduce",
                "tp", x, layers)
            add("tp all-reduce of the K and V grads over the kv replicas (XLA:TPU)", "all-reduce", "tp",
                3 * b * s * local_kv * model.head_dim * itemsize, layers)
        if (tpu or mla_gpu) and split and h % tp == 0:
            # The hidden dim split over tp: every RMSNorm's mean of squares is summed over tp (fp32, one value
            # per token), 2 per layer + the final norm forward, again in the recompute, and once more per norm
            # backward (its input gradient's row sum), and the loss's logsumexp and gold logit over the
            # vocab-split logits (max, then sum and gold combined: 3 per token). Read from XLA:GPU's HLO by
            # op_name and source line (rms_norm:60, chunk_loss:316): 17 f32[b,s] per step in every Llama
            # case with remat full (2 layers), 13 with remat none. XLA:TPU sums the same (read from Llama
            # fsdp=2 x tp=4, tp=8 and dp=2 x tp=4 remat none, Mixtral fsdp=2 x tp=4 and ep=4 x tp=2: 17, 17,
            # 13, 17, 17), and GPT-2's LayerNorm there: its mean and its variance forward (and in the
            # recompute), three row sums backward (the mean's two uses and the scale's), read from GPT-2
            # fsdp=2 x tp=4's HLO (layer_norm:67-69: 36 f32[b,s] with 2 layers). GPT-2 on XLA:GPU: not read.
            norms_per_pass = 2 * layers + 1  # two per layer and the final norm
            if model.family != "gpt2":
                norms = (2 + r) * norms_per_pass - r  # forward, backward, recompute (the layers' only)
            else:
                norms = 0 if backend == "gpu" else (2 + 3) * norms_per_pass + 2 * r * (norms_per_pass - 1)
            add(f"tp all-reduce of the norms' and the loss's row statistics (XLA:{backend.upper()}, f32)",
                "all-reduce", "tp", b * s * 4, norms + (3 if vocab else 0))
        if split:
            # The LM head's input (fwd) and again for its weight gradient (bwd) on XLA:CPU and XLA:TPU;
            # XLA:TPU also gathers the embedding's output gradient for its scatter-add (XLA:GPU too, except
            # with tp the mesh's only axis: read from llama tp=8, which all-to-alls the lookup's gradient).
            head_gathers = (2 if gpu and alone else 3 if tpu else 2 if cpu or mla_gpu else 1) if vocab else 0
            add("tp all-gather of activations (each block's input, fwd / recompute / bwd)", "all-gather", "tp", x,
                gathers + head_gathers)
            # XLA:CPU read with GQA only; XLA:TPU gathers them with as many kv heads as heads too.
            # XLA:GPU only with GQA (llama with 8 kv heads over tp=8 gathers 16.0 X, none of them K or V).
            attention_kv = kv_heads < model.num_heads or (tpu and not gpu and model.family != "gpt2")
            if (cpu or tpu) and not mla and attention_kv and (kv_heads % tp == 0 or kv_part):
                kv = b * s * kv_heads * model.head_dim * itemsize
                add(f"tp all-gather of the K and V gradients (XLA:{'CPU' if cpu else 'TPU'})", "all-gather",
                    "tp", kv, 2 * layers)
            if cpu_fused is not None:
                # c_attn's weight gradient (h, 3h) taken against its hidden-split input: the fused gradient
                # gathered whole over tp, 3X per layer (read from all four GPT-2 tp compiles, op_name the
                # dot's transpose; its (h/tp, 3h) result then moves to the weight's layout, a weight-sized
                # all-to-all, not priced).
                add("tp all-gather of the fused qkv gradient (c_attn's weight gradient, XLA:CPU)", "all-gather",
                    "tp", 3 * x, layers)
        if fused is not None:
            # Derived from XLA's partitioner (not fitted): each of q, k, v sliced out of the 3h/tp blocks is
            # resharded to its heads by halo-exchange permutes, forward and in the recompute; the backward's
            # concatenation of their gradients moves them off the split dim (to the batch or sequence, an
            # all-to-all of each), concatenates and moves the 3h-wide result back (HandleConcatenate ->
            # HandleElementwiseWithDimsToReplicate); with neither dim divisible it gathers them instead.
            row = b * s * itemsize  # bytes per element of the fused dim
            # Remat "dots" saves only dot outputs: the slices (and their permutes) are recomputed as under "full"
            # (read from GPT-2 dp=2 x tp=4 with dots on XLA:CPU: 28 permutes, as with full).
            again = recompute or remat == "dots"
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
        # XLA:TPU with the table split over fsdp exactly as wide as over tp (read from llama dp=2 x fsdp=2 x
        # tp=2's HLO, the lookup's op_name): it reshards the table instead of the lookup's output, a
        # collective-permute of the table's shard (vocab over tp, hidden over fsdp, swapped) and a gather of
        # the vocabulary (the fsdp gather's bytes, priced there), so the lookup lands in the split stream
        # with no activation collective. The permute (the table's shard, < 1% of the step's bytes there) is
        # not priced. fsdp = 2 x tp = 4 and fsdp = 4 x tp = 2 summed the lookup's output (an all-reduce;
        # all-to-all + permute of the same bytes).
        fsdp = sizes.get("fsdp", 1)
        reshard = tpu and split and not narrow and fsdp == tp
        if vocab and not reshard:
            # XLA:TPU sums the lookup into the split residual stream with a reduce-scatter when the table is
            # not also stored split over fsdp, or split over fsdp wider than over tp (session 7, by op_name:
            # llama fsdp=4 x tp=2 at hidden 1024 and 4096 looks the token ids up in its shard of the table and
            # reduce-scatters the sum over tp, then an all-to-all over fsdp and a permute of 1/tp of it, not
            # priced); narrower (fsdp=2 x tp=4) it all-reduces. XLA:GPU (``tpu`` here) agrees: its Llama
            # fsdp=4 x tp=2 step, held out, reduce-scatters the sum too.
            lookup: CollectiveKind = ("reduce-scatter" if (tpu or mla_gpu) and split and not narrow
                                      and (fsdp == 1 or (tpu and fsdp > tp)) else "all-reduce")
            add(f"tp {lookup} of the vocab-split embedding lookup", lookup, "tp", x, 1)
        if (cpu or tpu or mla_gpu) and moe:
            # The experts' MLP split over tp works on the dispatched buffer, not the residual stream.
            rows = dispatch.rows(top_k=model.num_experts_per_tok, seq=s, experts=model.num_experts)
            buffer = b * rows * h * itemsize
            name = "CPU" if cpu else "TPU"
            if (tpu or mla_gpu) and ep == 1 and split:
                # The experts whole on every device: XLA:TPU reduce-scatters the forward's and the backward's
                # sums; the recompute's stays an all-reduce.
                # XLA:GPU without a recompute all-reduces the forward's (DeepSeek dp=2 x tp=4, remat none:
                # 11.5 X reduce-scattered, 6.4 X all-reduced; the MoE ep=1 Mixtral on GPU: not read).
                keep = 1 if backend == "gpu" and not r else 0
                add("tp reduce-scatter of expert outputs and input grads (MoE, XLA:TPU)", "reduce-scatter", "tp",
                    buffer, moe * (2 - keep))
                add("tp all-reduce of expert outputs (MoE, XLA:TPU, recompute)", "all-reduce", "tp", buffer,
                    moe * (r + keep))
            else:
                add(f"tp all-reduce of expert outputs and input grads (MoE, XLA:{name})", "all-reduce", "tp", buffer,
                    moe * (1 + r + (2 if cpu else 1)))
            if split:
                add(f"tp all-gather of dispatched tokens (MoE, XLA:{name})", "all-gather", "tp", buffer,
                    moe * (2 + r))
    if sp > 1:
        kv = model.num_kv_heads * model.head_dim
        kv_local = kv // tp if model.num_kv_heads % tp == 0 else kv
        nbytes = b * seq * 2 * kv_local * itemsize
        add(f"sp all-gather of K,V (fwd{' + recompute' if recompute else ''})", "all-gather", "sp", nbytes,
            (2 if recompute else 1) * layers)
        if backend == "gpu":
            # XLA:GPU sums K's gradient over sp in fp32, the dtype of the fp32 scores it comes from, and V's in
            # the activation dtype (read from llama fsdp=2 x sp=4's HLO, attention's op_names: per layer
            # f32[b,kv,seq,hd] and bf16[b,kv,hd,seq] reduce-scatters; was 0.746 of its reduce-scatter bytes).
            add("sp reduce-scatter of dV (bwd)", "reduce-scatter", "sp", nbytes // 2, layers)
            add("sp reduce-scatter of dK (bwd, XLA:GPU, f32)", "reduce-scatter", "sp", b * seq * kv_local * 4, layers)
        else:
            add("sp reduce-scatter of dK,dV (bwd)", "reduce-scatter", "sp", nbytes, layers)
    if ep > 1 and model.num_moe_layers:
        rows = dispatch.rows(top_k=model.num_experts_per_tok, seq=s, experts=model.num_experts)
        add(f"ep all-to-all of dispatched tokens (dispatch + combine, fwd + bwd{' + recompute' if recompute else ''})",
            "all-to-all", "ep", b * rows * h * itemsize, (6 if recompute else 4) * model.num_moe_layers)
    if backend == "cpu" and model.num_moe_layers:
        # XLA:CPU does not partition top_k over the batch: it gathers the fp32 router scores of every token.
        ways = tuple(a for a in BATCH_AXES if sizes.get(a, 1) > 1)
        add("router scores gathered for top_k (XLA:CPU, f32)", "all-gather", ways,
            batch * s * model.num_experts * 4, (2 if recompute else 1) * model.num_moe_layers)
    if backend == "gpu":  # the XLA:TPU rules XLA:GPU shares: named for the backend that emits them here
        out = [(t[0].replace("XLA:TPU", "XLA:GPU").replace("XLA:CPU", "XLA:GPU"), *t[1:]) for t in out]
    return out


def step_activations(model: Any, sizes: Mapping[str, int], *, batch: int, seq: int, itemsize: int,
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
    model: Any, sizes: Mapping[str, int], *, batch: int, seq: int, itemsize: int, param_bytes: int
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


XLA_BACKENDS: tuple[str, ...] = ("cpu", "gpu", "tpu")
"""Backends :func:`xla_collectives` knows how XLA lowers collectives for."""


def xla_collectives(terms: Sequence[CommTerm], *, backend: str, itemsize: int, collective_matmul: bool = False,
                    sizes: Mapping[str, int] | None = None, micro_batches: int = 1) -> tuple[CommTerm, ...]:
    """The step's collectives as XLA emits them on ``backend``: the textbook terms, relowered.

    The textbook terms (:func:`param_terms`, :func:`activation_terms`) are what the step needs;
    a compiled program shows them as the backend lowers them, and the HLO check
    (``tests/facade/test_collectives_vs_xla.py``) compares against this:

    - ``"cpu"``: XLA:CPU has no reduce-scatter; the SPMD partitioner emits an all-reduce
      of the same buffer and a dynamic-slice, so reduce-scatters become all-reduces of
      ``B``. XLA:CPU also computes 16-bit floats in f32 and moves the convert ahead of
      the collective, so a term priced at ``itemsize == 2`` moves twice the bytes (except a term
      whose ``what`` ends in ``f32)``, already counted in f32). With gradient accumulation
      (``micro_batches > 1``, the terms already repeated per micro-batch by
      :func:`~meshplan.pure.cost._step_time.accumulate`) XLA:CPU hoists the loop-invariant
      parameter gathers out of the micro-batch loop: the layers' forward gathers, the
      embedding's and the head's run once per step (the backward's, under remat, stay in it).
      XLA:TPU does not (fsdp=8 with 2 micro-batches: every gather twice).
    - ``"tpu"`` with ``collective_matmul`` (XLA:TPU's windowed einsum, on by default for
      large enough matmuls): a tp all-gather or reduce-scatter that feeds a matmul runs as
      ``n - 1`` collective-permutes of ``B/n`` each, overlapped with the matmul's pieces;
      ``collective_matmul=False`` models ``--xla_tpu_enable_windowed_einsum_for_all_gather=false``
      (and ``..._reduce_scatter=false``), where they stay as they are.
    - ``"gpu"``: as the terms say (:func:`activation_terms` already counts XLA:GPU's tp, sp and MLA
      collectives, and :func:`~meshplan.pure.cost._step_time.accumulate` its gradients' all-reduce
      once per step with gradient accumulation, after the micro-batch loop).

    Bytes and calls are per device per step; ``seconds`` keep the textbook price (this says
    what the program contains, not a second cost model).

    Args:
      terms: the priced :class:`CommTerm` records of a candidate (``MeshCandidate.comm``).
      backend: one of :data:`XLA_BACKENDS`.
      itemsize: bytes per element the terms were priced at (2 for bf16 weights and activations).
      collective_matmul: whether XLA:TPU's windowed einsum is on (TPU only).
      sizes: mesh axis sizes (the permutes' chunk count); needed with ``collective_matmul``.
      micro_batches: gradient-accumulation steps the terms were priced with.

    Returns:
      The terms as emitted, in the same order.

    Example:
      >>> t = CommTerm("fsdp reduce-scatter of grads", "reduce-scatter", ("fsdp",), 1000, 2, "intra", 0.0)
      >>> [(x.kind, x.nbytes, x.calls) for x in xla_collectives([t], backend="cpu", itemsize=2)]
      [('all-reduce', 2000, 2)]
    """
    backend = as_choice(backend, "backend", tuple(XLA_BACKENDS), error=PlanError)
    size = as_count(itemsize, "itemsize", error=PlanError)
    collective_matmul = as_flag(collective_matmul, "collective_matmul")
    m = as_count(micro_batches, "micro_batches", error=PlanError)
    mesh = {} if sizes is None else dict(canonical_axis_sizes(sizes, "sizes"))
    if collective_matmul and backend == "tpu" and not mesh:
        raise PlanError("xla_collectives(collective_matmul=True) needs sizes= (the mesh axis sizes).")
    out = []
    for t in as_sequence(terms, "terms"):
        if not isinstance(t, CommTerm):
            raise MeshplanTypeError(f"terms must hold CommTerm records, got {t!r:.80}.")
        kind, nbytes, calls, what = t.kind, t.nbytes, t.calls, t.what
        if backend == "cpu":
            if m > 1 and kind == "all-gather" and "all-gather of params (" in what:
                # Hoisted out of the micro-batch loop: all of a term gathered once per pass, the forward
                # half of the layers' (their backward gathers stay in the loop).
                layers = "(fwd + bwd)" in what and "head" not in what
                calls = calls * (m + 1) // (2 * m) if layers else calls // m
            if kind == "reduce-scatter":
                kind, what = "all-reduce", f"{what} (XLA:CPU: all-reduce + dynamic-slice)"
            if size == 2 and "f32)" not in what:  # a term named '... f32)' is priced in f32 already
                nbytes *= 2
        elif backend == "tpu" and collective_matmul and "tp" in t.axes and kind in ("all-gather", "reduce-scatter"):
            # Windowed einsum: n - 1 permutes of one B/n chunk each per original call.
            n = math.prod(mesh.get(a, 1) for a in t.axes)
            kind, what = "collective-permute", f"{what} (XLA:TPU collective matmul)"
            nbytes, calls = nbytes // max(n, 1), calls * max(n - 1, 1)
        out.append(CommTerm(what, kind, t.axes, int(nbytes), calls, t.link, t.seconds))
    return tuple(out)
