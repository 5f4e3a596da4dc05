"""How each backend's XLA lowers a step's tensor-parallel collectives: a table of rows read from compiled programs.

:func:`~meshplan.pure.cost._activation_collectives.activation_terms` lists a step's activation collectives
from one :class:`StepLowering` row (per backend and attention kind) and its :class:`LayerLowering` rows (per
layer kind: dense, MoE, MoE with a shared expert): how many residual-stream sums and gathers a layer runs
forward, in the recompute and backward, which are reduce-scatters, and which extra collectives each compiler
adds. Each row names the compiled program its counts were read from (``read_from``); where none was read it
says so and keeps Megatron's schedule. The counts, as read:

- **XLA:CPU** (``backend="cpu"``, read from the compiled HLO of the reference steps): the backward sums each
  column-parallel projection's input gradient on its own (Llama 5: q, k, v, gate, up; GPT-2 2) and all-gathers 6
  buffers per layer (the output gradient twice per block, for its input and its weight gradient, and the block
  input again for the weight gradient), plus the LM head's input once more and, with GQA, the K and V gradients (K
  and V split over ``gcd(tp, kv_heads)`` and replicated beyond when ``tp`` does not divide the kv heads: then 3
  buffers in a layer's backward, not 6). In a MoE layer the experts' MLP works on the dispatched buffer ``E =
  b*E*capacity*h*a``: its block input is not gathered, the dispatched tokens are (fwd, recompute, bwd) and their
  sums are ``E``-sized (output fwd and recompute, 2 input gradients bwd).
- **XLA:TPU** (``backend="tpu"``, read from the compiled HLO of a TPU-sized Llama step, fsdp=2 x tp=4, windowed
  einsum off): Megatron's sums (2 forward, 1 recompute, 2 backward: the projections' input gradients are summed
  together) and the LM head's input gradient summed in fp32; a dense layer's backward gathers 6 buffers as on
  XLA:CPU (one fewer in the whole step), plus the K and V gradients, the LM head's input twice and the embedding's
  output gradient for its scatter-add. A MoE layer (read from Mixtral ep=4 x tp=2) sums its attention 2 + 1
  recompute times and gathers 1 + 1 recompute + 4 backward residual buffers and, as on XLA:CPU, the dispatched
  tokens; the experts' sums are ``E``-sized (fwd, recompute, 1 bwd; without ep, read from Mixtral fsdp=2 x tp=4,
  the forward's and the backward's are reduce-scatters). A residual shard narrower than 256 (hidden 1024 over tp=8)
  is summed with all-reduces, not reduce-scatters. K and V replicated over part of tp add sums over the replicas
  (their projections' input gradients, ``X``, and ``3*b*s*(kv/gcd)*head_dim*a`` of their gradients per layer); K
  and V gradients are gathered with as many kv heads as heads too. With the hidden dim split each norm's row
  statistics are summed over tp in fp32 (``b*s*4``): RMSNorm's as on XLA:GPU (below), GPT-2's LayerNorm 2 forward
  (mean, variance), 2 in the recompute and 3 backward; the loss's 3. The vocab-split embedding lookup is a
  reduce-scatter into the split stream when the table is not also split over fsdp; split over fsdp as wide as tp,
  XLA:TPU permutes the table's shard instead and the lookup needs no sum.
- **MLA on XLA:CPU** (read from DeepSeek dp=2 x tp=4): q_a and kv_a are whole over tp and run on the split stream,
  so attention's input is never gathered; their outputs are summed (``b*s*(q_lora + kv_lora + rope)*a``, fwd and
  recompute) and so are q_b's and kv_b's input gradients with the rope key's (bwd); sums of ``X``: o (fwd,
  recompute), the (shared expert's) MLP down and its gate / up input gradients; gathers: the MLP's input (fwd,
  recompute) and 5 backward; the router's logits are summed (fp32).
- **MLA on XLA:TPU** keeps Megatron's counts (not read).
- **GPT-2's fused c_attn** (XLA:CPU and XLA:TPU, derived from XLA's SPMD partitioner,
  :mod:`~meshplan.pure.cost._slice_reshard`): split over ``tp`` in ``3h/tp`` blocks that are not its heads, q, k
  and v are resharded by collective-permutes (forward, recompute) and their gradients by two all-to-alls (``6X/tp``
  per layer); XLA:CPU gathers the fused gradient (``3X``) for the weight gradient instead of the block input. On
  XLA:CPU a dense layer's backward gathers 3 buffers, not 6, also when tp is the mesh's only axis (the two uses of
  a buffer share one gather there; MLA's layer then gathers 2 in its backward, not 5: o's and the MLP's output
  gradients).
- **XLA:GPU** (``backend="gpu"``, read from HLO compiled ahead of time for 1x8xH200): XLA:TPU's counts, except that
  a narrow shard's sums stay reduce-scatters; a dense layer gathers 2 buffers forward, 5 in the recompute and 3
  backward (none fewer in the step under a recompute), 7 in all when tp is the mesh's only axis (and then not the
  embedding's output gradient); K and V gradients are gathered only with GQA; and each RMSNorm's and the loss's row
  statistics are summed over tp in fp32 (``b*s*4``, ``(4 + 2r)L + 5`` calls).
- **MLA on XLA:GPU**: XLA:CPU's MLA counts, an MLP's gate and up input gradients summed together, XLA:TPU's expert
  sums, lookup and fp32 LM-head input gradient.

Where a row's passes differ from the reading above, the totals are the same: XLA:GPU's dense layer, read as 2
forward, 5 in the recompute and 3 backward, is priced as 2 + 2 + 6 (its backward without a recompute gathers 6).

Example:
  >>> low = lowering("tpu", mla=False)
  >>> low.dense.sums, low.label
  (Passes(fwd=2, recompute=1, bwd=2), 'XLA:TPU')
"""

from __future__ import annotations

import dataclasses

from meshplan.pure._check import as_choice
from meshplan.pure.errors import PlanError

__all__ = ["ATTENTIONS", "LOWERINGS", "TP_BACKENDS", "LayerLowering", "Passes", "StepLowering", "lowering"]

TP_BACKENDS: tuple[str, ...] = ("cpu", "gpu", "tpu")
"""Backends :func:`~meshplan.pure.cost._activation_collectives.activation_terms` knows the tp collectives of,
each as its XLA emits them (read from compiled HLO; Megatron's schedule only where a lowering was not read:
MLA on XLA:TPU)."""

ATTENTIONS: tuple[str, ...] = ("mha", "mla")
"""Attention kinds a lowering is read for: ``"mha"`` (q, k and v projections, GQA and GPT-2's fused
``c_attn`` included) and ``"mla"`` (DeepSeek's latent attention, ``ModelSpec.mla``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Passes:
    """Calls of one collective in each pass of a step: forward, the backward's recompute, backward."""

    fwd: int = 0
    recompute: int = 0
    bwd: int = 0

    def calls(self, r: int) -> int:
        """Calls in a step with (``r=1``) or without (``r=0``) a recompute.

        Example:
          >>> Passes(2, 1, 2).calls(1), Passes(2, 1, 2).calls(0)
          (5, 4)
        """
        return self.fwd + r * self.recompute + self.bwd

    def scattered(self, passes: tuple[str, ...], r: int) -> int:
        """The calls of :meth:`calls` in the named ``passes`` (``"fwd"``, ``"recompute"``, ``"bwd"``)."""
        return sum((r if p == "recompute" else 1) * getattr(self, p) for p in passes)


@dataclasses.dataclass(frozen=True, slots=True)
class LayerLowering:
    """One backend's tp collectives in one kind of layer, per layer, as its compiled HLO shows them.

    ``X`` is the residual stream's buffer on a device (``b*s*h*a``), ``E`` the experts' dispatched buffer.
    """

    read_from: str
    """The compiled program(s) the counts were read from, or why none was."""
    sums: Passes
    """``X``-sized sums: the row-parallel outputs forward and in the recompute, and in the backward the
    column-parallel projections' input gradients summed together (as one sum per block)."""
    gathers: Passes
    """``X``-sized gathers with the stream stored split over tp (each block's input, output gradients)."""
    sums_each: tuple[str, ...] = ()
    """Blocks (``"attention"``, ``"mlp"``) whose column-parallel projections' input gradients are summed each
    on its own in the backward, one sum per projection that reads the block's input, on top of ``sums.bwd``."""
    gathers_bwd_alone: int | None = None
    """The backward's gathers when tp is the mesh's only axis (a buffer's two backward uses share one gather
    there); ``None``: ``gathers.bwd``."""
    gathers_bwd_kv_part: int | None = None
    """The backward's gathers when K and V are split over part of tp (``gcd(tp, kv_heads)`` devices, replicated
    beyond); ``None``: ``gathers.bwd``."""
    gathers_bwd_fused: int | None = None
    """The backward's gathers of GPT-2's layer with the stream split, where c_attn's weight gradient is taken
    against the split input and the gathered fused gradient (:attr:`StepLowering.fused_qkv_grad_gather`), so
    that input is not gathered for it; ``None``: ``gathers.bwd``."""
    fewer_gathers: tuple[int, int] = (0, 0)
    """Gathers a step makes fewer than its layers of this kind, without and with a recompute (the top layer's
    output gradient gathered once for its two uses), once per step that has such layers."""
    experts: Passes | None = None
    """``E``-sized sums of the experts' partial outputs (forward, recompute) and input gradients (backward),
    all-reduces unless :attr:`expert_scatters` says otherwise; ``None``: not priced."""
    expert_scatters: tuple[str, ...] = ()
    """The passes of :attr:`experts` summed by reduce-scatters (the rest all-reduced) where the experts are
    whole on every device (no ep) and the stream is split over tp, under a recompute."""
    expert_scatters_no_recompute: tuple[str, ...] = ()
    """The same without a recompute (remat ``none`` or ``dots``)."""
    expert_gathers: Passes | None = None
    """``E``-sized gathers of the dispatched tokens with the stream split; ``None``: not priced."""


@dataclasses.dataclass(frozen=True, slots=True)
class StepLowering:
    """How one backend's XLA lowers a step's activation collectives for one attention kind.

    Its layer rows count per layer; the rest of its fields are the step's collectives outside the layers'
    residual stream (the embedding, the LM head, the norms, K and V, GPT-2's fused c_attn, MLA's latents) and
    the two sp / MoE routing differences between the backends.
    """

    backend: str
    attention: str
    read_from: str
    dense: LayerLowering
    moe: LayerLowering
    shared_moe: LayerLowering | None = None
    """A MoE layer with a shared expert, where it is lowered apart; ``None``: as :attr:`moe`."""
    narrow_below: int = 0
    """A residual shard narrower than this (``h / tp`` elements) is summed with all-reduces (and slices), not
    reduce-scatters; 0: never. XLA:TPU: 256 (hidden 1024 over tp=8 all-reduced; 256 and wider reduce-scattered);
    XLA:GPU reduce-scatters there too (hidden 1024 over tp=8: 12 of 12 sums are reduce-scatters)."""
    head_grad_f32: bool = False
    """The LM head's input gradient is summed apart, in fp32 (the fp32 logits'); otherwise it is one more
    ``X``-sized sum among the layers'."""
    head_gathers: int = 0
    """Gathers with the vocabulary and the stream split over tp: the LM head's input (fwd) and again for its
    weight gradient (bwd) on XLA:CPU and XLA:TPU; XLA:TPU also gathers the embedding's output gradient for its
    scatter-add (XLA:GPU too)."""
    head_gathers_alone: int | None = None
    """:attr:`head_gathers` when tp is the mesh's only axis (XLA:GPU: not the embedding's output gradient, read
    from llama tp=8, which all-to-alls the lookup's gradient); ``None``: the same."""
    kv_replica_sums: bool = False
    """K and V replicated over ``tp / gcd(tp, kv)`` devices: their projections' input gradients and the
    attention's K and V gradients are summed over the replicas too (read from XLA:TPU's HLO)."""
    kv_grad_gathers: str = "none"
    """When the K and V gradients are gathered (stream split): ``"none"``; ``"gqa"``, with fewer kv heads than
    heads (XLA:CPU read with GQA only; XLA:GPU only with GQA: llama with 8 kv heads over tp=8 gathers 16.0 X,
    none of them K or V); ``"separate"``, also with as many, wherever K and V have projections of their own
    (XLA:TPU; not GPT-2's fused c_attn)."""
    row_stats: bool = False
    """With the hidden dim split over tp the norms' and the loss's row statistics are summed over tp (fp32)."""
    rms_norm_stats: Passes = Passes()
    """Sums per RMSNorm, one value per token: its mean of squares forward and in the recompute, its input
    gradient's row sum backward; 2 norms per layer and the final one, which is not recomputed. Read from XLA:GPU's
    HLO by op_name and source line (rms_norm:60, chunk_loss:316): 17 f32[b,s] per step in every Llama case with
    remat full (2 layers), 13 with remat none. XLA:TPU sums the same (read from Llama fsdp=2 x tp=4, tp=8 and
    dp=2 x tp=4 remat none, Mixtral fsdp=2 x tp=4 and ep=4 x tp=2: 17, 17, 13, 17, 17)."""
    layer_norm_stats: Passes = Passes()
    """Sums per LayerNorm (GPT-2's), the same way: its mean and its variance forward (and in the recompute), three
    row sums backward (the mean's two uses and the scale's), read from GPT-2 fsdp=2 x tp=4's HLO on XLA:TPU
    (layer_norm:67-69: 36 f32[b,s] with 2 layers). All zero where not read (GPT-2 on XLA:GPU)."""
    loss_stats: int = 0
    """Sums of the loss's logsumexp and gold logit over the vocab-split logits (max, then sum and gold combined:
    3 per token)."""
    fused_qkv: bool = False
    """GPT-2's c_attn split over tp in ``3h/tp`` blocks is resharded to q, k and v's heads (permutes forward and
    in the recompute, all-to-alls backward: :func:`~meshplan.pure.cost._activation_collectives.
    _fused_qkv_permutes`): the partitioner's slice and concatenate handling, the same on XLA:CPU and XLA:TPU
    (read on v5e-8, GPT-2 hidden 1024 dp=2 x tp=4: its 28 permutes and 8 all-to-alls exact); XLA:GPU not read.
    Set per backend, the MLA rows too (an MLA model has no c_attn)."""
    fused_qkv_grad_gather: bool = False
    """The fused qkv gradient is gathered whole over tp for c_attn's weight gradient (``3X`` per layer):
    XLA:CPU's only."""
    latent_sums: Passes | None = None
    """MLA's down-projections (q_a, kv_a) are whole over tp and run on the split stream: the latent outputs of
    q_a and kv_a (with kv_a's rope part) are summed forward and in the recompute, and in the backward q_b's and
    kv_b's input gradients with the shared rope key's (summed over the heads): the same
    ``b*s*(q_lora + kv_lora + rope)*a`` per call, per layer; ``None``: none."""
    router_logit_sums: Passes | None = None
    """MoE layers with MLA: the router is whole over tp and reads the split stream, so its logits are summed
    (fp32); ``None``: none."""
    lookup_scatters: bool = False
    """The vocab-split embedding lookup is reduce-scattered into the split residual stream when the table is not
    also stored split over fsdp (else all-reduced). XLA:GPU agrees with XLA:TPU: its Llama fsdp=4 x tp=2 step,
    held out, reduce-scatters the sum too."""
    lookup_reshards: bool = False
    """With the table split over fsdp exactly as wide as over tp (read from llama dp=2 x fsdp=2 x tp=2's HLO, the
    lookup's op_name) XLA:TPU reshards the table instead of the lookup's output, and the lookup needs no sum.
    Split over fsdp wider than over tp (by op_name: llama fsdp=4 x tp=2 at hidden 1024 and 4096) it looks the
    token ids up in its shard of the table and reduce-scatters the sum over tp, then an all-to-all over fsdp and
    a permute of 1/tp of it, not priced; narrower (fsdp=2 x tp=4) it all-reduces: the lookup's output summed (an
    all-reduce; all-to-all + permute of the same bytes)."""
    router_scores_gathered: bool = False
    """MoE layers: top_k is not partitioned over the batch; the fp32 router scores of every token are
    gathered over the batch axes (forward, recompute)."""
    sp_dk_f32: bool = False
    """Under sp, K's gradient is summed in fp32 (the scores' dtype) and V's in the activation dtype."""

    @property
    def label(self) -> str:
        """The compiler's name in the terms' texts (``"XLA:TPU"``)."""
        return f"XLA:{self.backend.upper()}"

    def layer(self, kind: str) -> LayerLowering:
        """The row of a ``"dense"``, ``"moe"`` or ``"shared_moe"`` layer."""
        if kind == "dense":
            return self.dense
        return self.shared_moe if kind == "shared_moe" and self.shared_moe is not None else self.moe


_MEGATRON = LayerLowering(
    "not read: Megatron's schedule (2 sums forward, 1 in the recompute as the layer's last one is dead code "
    "there, 2 input-gradient sums backward; each block's input gathered forward, in the recompute and backward)",
    sums=Passes(2, 1, 2), gathers=Passes(2, 2, 2))

_CPU = "XLA:CPU's compiled HLO of the reference steps"

LOWERINGS: dict[tuple[str, str], StepLowering] = {
    ("cpu", "mha"): StepLowering(
        "cpu", "mha", _CPU,
        dense=LayerLowering(
            f"{_CPU}: Llama (q, k, v, gate, up summed apart: 5) and GPT-2 (c_attn, c_fc: 2); with tp the mesh's "
            "only axis Llama tp=8 with 4 kv heads (K and V replicated over part of tp) and with 8 (not): 3 "
            "backward gathers, with dp / fsdp beside tp 6 (both conditions kept: with 8 devices the first never "
            "occurs without the second); GPT-2 dp=4 x tp=2, dp=2 x tp=4 and fsdp=2 x tp=4 for the fused c_attn "
            "(5; with tp alone 3, as for Llama)",
            sums=Passes(2, 1, 0), sums_each=("attention", "mlp"), gathers=Passes(2, 2, 6), gathers_bwd_alone=3,
            gathers_bwd_kv_part=3, gathers_bwd_fused=5),
        moe=LayerLowering(
            f"{_CPU} (a MoE layer: attention's sums and gathers; the experts' MLP on the dispatched buffer, its "
            "block input not gathered)",
            sums=Passes(1, 1, 0), sums_each=("attention",), gathers=Passes(1, 1, 4), experts=Passes(1, 1, 2),
            expert_gathers=Passes(1, 1, 1)),
        head_gathers=2, kv_grad_gathers="gqa", fused_qkv=True, fused_qkv_grad_gather=True,
        router_scores_gathered=True),
    ("cpu", "mla"): StepLowering(
        "cpu", "mla", f"{_CPU}: DeepSeek dp=2 x tp=4, and tp=8 for the mesh's only axis",
        dense=LayerLowering(
            "DeepSeek dp=2 x tp=4 (XLA:CPU): sums of o (fwd, recompute), the MLP's down (fwd) and its gate / up "
            "input gradients apart; gathers of the MLP's input (fwd, recompute) and 5 backward (o's output "
            "gradient twice, the MLP's twice and its input); DeepSeek tp=8: 2 backward (o's and the MLP's output "
            "gradients once each, the MLP's input for its weight gradient not at all)",
            sums=Passes(2, 1, 0), sums_each=("mlp",), gathers=Passes(1, 1, 5), gathers_bwd_alone=2),
        moe=LayerLowering(
            "a guess, not read: a MoE layer without a shared expert sums and gathers only attention's",
            sums=Passes(1, 1, 0), gathers=Passes(0, 0, 2), gathers_bwd_alone=1, experts=Passes(1, 1, 2),
            expert_gathers=Passes(1, 1, 1)),
        shared_moe=LayerLowering(
            "DeepSeek dp=2 x tp=4 and tp=8 (XLA:CPU): the MLP here is the shared expert's",
            sums=Passes(2, 1, 0), sums_each=("mlp",), gathers=Passes(1, 1, 5), gathers_bwd_alone=2,
            experts=Passes(1, 1, 2), expert_gathers=Passes(1, 1, 1)),
        head_gathers=2, fused_qkv=True, fused_qkv_grad_gather=True, latent_sums=Passes(1, 1, 1),
        router_logit_sums=Passes(1, 1, 0), router_scores_gathered=True),
    ("tpu", "mha"): StepLowering(
        "tpu", "mha", "XLA:TPU's compiled HLO of a TPU-sized Llama step, fsdp=2 x tp=4, windowed einsum off; held "
        "out on fsdp=4 x tp=2, dp x fsdp x tp, dp x tp without remat, Mixtral fsdp x tp, tp=8 and tp=4 over 2 kv "
        "heads",
        dense=LayerLowering(
            "Llama fsdp=2 x tp=4 (XLA:TPU): Megatron's sums, the projections' input gradients summed together; "
            "6 backward gathers, one fewer in the step (the top layer's output gradient gathered once for its "
            "two uses)",
            sums=Passes(2, 1, 2), gathers=Passes(2, 2, 6), fewer_gathers=(1, 1)),
        moe=LayerLowering(
            "Mixtral ep=4 x tp=2 (XLA:TPU): attention's o forward and in the recompute and q, k, v's input "
            "gradients together; attention's input gathered forward and in the recompute, 4 buffers backward (o's "
            "output gradient twice, q's input, the combine's); the experts' sums dispatched-buffer sized, and "
            "without ep (Mixtral fsdp=2 x tp=4) the forward's and the backward's reduce-scatters",
            sums=Passes(1, 1, 1), gathers=Passes(1, 1, 4), experts=Passes(1, 1, 1),
            expert_scatters=("fwd", "bwd"), expert_scatters_no_recompute=("fwd", "bwd"),
            expert_gathers=Passes(1, 1, 1)),
        narrow_below=256, head_grad_f32=True, head_gathers=3, kv_replica_sums=True, kv_grad_gathers="separate",
        row_stats=True, rms_norm_stats=Passes(1, 1, 1), layer_norm_stats=Passes(2, 2, 3), loss_stats=3,
        fused_qkv=True, lookup_scatters=True, lookup_reshards=True),
    ("tpu", "mla"): StepLowering(
        "tpu", "mla", "not read: MLA's lowering on XLA:TPU was never compiled; Megatron's counts",
        dense=_MEGATRON, moe=_MEGATRON, head_gathers=1, fused_qkv=True),
    ("gpu", "mha"): StepLowering(
        "gpu", "mha", "XLA:GPU's HLO compiled ahead of time for 1x8xH200: Llama (hidden 1024) fsdp=2 x tp=4 and "
        "tp=8, dp=2 x tp=4 without remat; XLA:TPU's counts elsewhere",
        dense=LayerLowering(
            "1x8xH200, by op_name and source line: Llama fsdp=2 x tp=4 (20 gathers per 2 layers: XLA:TPU's "
            "2 + 2 + 6 without its one fewer per step), tp=8 (14 per 2 layers: a buffer's two backward uses share "
            "one gather), dp=2 x tp=4 remat none (15 per 2 layers: 8 per layer less one per step)",
            sums=Passes(2, 1, 2), gathers=Passes(2, 2, 6), gathers_bwd_alone=3, fewer_gathers=(1, 0)),
        moe=LayerLowering(
            "XLA:TPU's MoE counts (Mixtral tp rows on 1x8xH200 held out; one without ep not read); without a "
            "recompute the forward's expert sum an all-reduce, as in DeepSeek dp=2 x tp=4's (remat none)",
            sums=Passes(1, 1, 1), gathers=Passes(1, 1, 4), experts=Passes(1, 1, 1),
            expert_scatters=("fwd", "bwd"), expert_scatters_no_recompute=("bwd",),
            expert_gathers=Passes(1, 1, 1)),
        head_grad_f32=True, head_gathers=3, head_gathers_alone=2, kv_replica_sums=True, kv_grad_gathers="gqa",
        row_stats=True, rms_norm_stats=Passes(1, 1, 1), loss_stats=3, lookup_scatters=True, lookup_reshards=True,
        sp_dk_f32=True),
    ("gpu", "mla"): StepLowering(
        "gpu", "mla", "DeepSeek dp=2 x tp=4's HLO on 1x8xH200, remat full, by op_name and source line; the "
        "remat-none expert rule from dp=2 x tp=4's totals; fsdp=2 x tp=4 and tp=8 held out",
        dense=LayerLowering(
            "DeepSeek dp=2 x tp=4 (1x8xH200): XLA:CPU's MLA counts, the MLP's gate and up input gradients summed "
            "together",
            sums=Passes(2, 1, 1), gathers=Passes(1, 1, 5), gathers_bwd_alone=2),
        moe=LayerLowering(
            "a guess, not read: a MoE layer without a shared expert sums and gathers only attention's",
            sums=Passes(1, 1, 0), gathers=Passes(0, 0, 2), gathers_bwd_alone=1, experts=Passes(1, 1, 1),
            expert_scatters=("fwd", "bwd"), expert_scatters_no_recompute=("bwd",), expert_gathers=Passes(1, 1, 1)),
        shared_moe=LayerLowering(
            "DeepSeek dp=2 x tp=4 (1x8xH200): the shared expert's MLP as the dense layer's; XLA:TPU's expert sums "
            "(remat none: 11.5 X reduce-scattered, 6.4 X all-reduced, the forward's sum an all-reduce)",
            sums=Passes(2, 1, 1), gathers=Passes(1, 1, 5), gathers_bwd_alone=2, experts=Passes(1, 1, 1),
            expert_scatters=("fwd", "bwd"), expert_scatters_no_recompute=("bwd",), expert_gathers=Passes(1, 1, 1)),
        head_grad_f32=True, head_gathers=2, row_stats=True, rms_norm_stats=Passes(1, 1, 1), loss_stats=3,
        latent_sums=Passes(1, 1, 1), router_logit_sums=Passes(1, 1, 0), lookup_scatters=True, sp_dk_f32=True),
}
"""The table: one row per (backend, attention kind) of :data:`TP_BACKENDS` x :data:`ATTENTIONS`."""


def lowering(backend: str, *, mla: bool) -> StepLowering:
    """The row of ``backend``'s XLA for a model with (``mla=True``) or without DeepSeek's latent attention.

    Raises:
      PlanError: a backend not in :data:`TP_BACKENDS`.

    Example:
      >>> lowering("gpu", mla=True).read_from.split(",")[0]
      "DeepSeek dp=2 x tp=4's HLO on 1x8xH200"
    """
    backend = as_choice(backend, "backend", TP_BACKENDS, error=PlanError)
    return LOWERINGS[backend, "mla" if mla else "mha"]
