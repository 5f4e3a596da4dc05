"""FLOPs of one training step, per device, for the preset families.

Counts matrix multiplies (``2 x m x n x k`` each), the way MFU is defined
(PaLM, Appendix B; Megatron's ``6 x params x tokens``), plus, as executed work
only, the elementwise ops XLA counts (last item). For ``T`` tokens:

- **weights**: ``2 x N x T`` forward and ``4 x N x T`` backward (input and
  weight gradients), ``N`` the *active* matmul weights of the layers plus the
  output head (``vocab x hidden``; a tied head counts once, as a matmul; the
  embedding lookup and position table cost none). An MoE layer counts its
  router, its shared experts and ``top_k`` routed experts, not all experts;
- **attention**: ``Q K^T`` and ``P V``: ``2 x T x s x heads x (qk_dim + v_dim)``
  forward, twice that backward. ``plain`` and ``dot_product`` attention compute
  the full masked ``s x s`` matrix (XLA's lowering: no causal skipping);
  ``flash`` kernels skip the blocks above the diagonal (``s / 2``);
- **recompute** (:data:`RECOMPUTE`): remat ``full`` and ``offload`` run each
  layer's forward again in the backward pass (the attention and about
  ``2 x N_layers x T``), except the layer's last matmul: its output only feeds
  the residual add, and its gradients need its input, not its output, so XLA
  drops it as dead code (the MLP's down projection; with MoE the combine einsum
  and the shared experts' down projection; measured); ``dots`` (``dots_saveable``, as the reference step
  writes it) keeps every matmul output, so nothing is recomputed; ``none``
  keeps everything. The head is outside the remat and never recomputed;
- **MoE execution overhead** (executed, not model FLOPs), as the recipe's
  dispatch runs it (:class:`~meshplan.pure.cost._moe_dispatch.MoeDispatch`):
  capacity-based dispatch (``"einsum"``: GShard / MaxText's ``sparse_matmul:
  False``, capacity factor ``cf``) runs every expert on ``capacity = ceil(top_k
  x s x cf / E)`` slots per sequence, i.e. ``E x capacity / (top_k x s)`` times
  the routed work, and its dispatch and combine einsums cost ``2 x T x E x
  capacity x hidden`` each (1 + 1 matmuls for dispatch, whose 0/1 tensor has
  no gradient; 1 + 2 for combine). A ``"dropless"`` dispatch (grouped GEMMs over
  the routed tokens) has neither: no overhead.

``model`` FLOPs (the MFU numerator) exclude recompute and the MoE overhead;
``executed`` includes them. **Per device**: the batch axes (``dp, fsdp, ep``)
and ``sp`` split the tokens, ``tp`` splits every matmul (heads, MLP width,
vocabulary), ``ep`` splits the experts (with their tokens exchanged, each
device runs ``1/n`` of the expert work). Replicated work: MLA's low-rank down projections (``q_a``, ``kv_a``) and the
router are replicated over ``tp``; so are the MoE dispatch/combine einsums (XLA
finds no tp-split dim in them: measured, a 4-way tp Mixtral step ran them whole
on each shard). K and V projections split ``gcd(tp, kv_heads)`` ways (whole
heads; measured with 2 KV heads and tp=4). A K/V matmul repeated on ``r`` tp shards
repeats in the forward, the recompute and the input gradient; its **weight
gradient** (both operands whole on each of those shards) XLA splits over
``gcd(r, shards)`` of them, ``shards`` being the weights' split over the batch
axes other than ``dp`` (``devices / (tp x dp)``; read from the compiled HLO's dots,
identical on XLA:CPU and XLA:TPU: Llama's K/V, 2 KV heads, tp=4, split 2 more ways
with fsdp=2, repeated with dp=2 and no fsdp). The **tp-replicated weights**
``W (out, hidden)`` (MLA's down projections, the router; :func:`tp_replicated_splits`)
follow XLA's SPMD dot partitioner (``xla/service/spmd/dot_handler.cc``), read off the
shardings it is given: the activation ``x (tokens, hidden)`` split over the ``G =
devices / tp`` batch shards and whole on each tp shard, ``W``'s hidden dim split ``f =
fsdp`` ways (where the default rule puts fsdp), the output like ``x``. It groups the
devices by batch shard (``tp`` devices each) and moves ``W``'s split into the group
where it can land on every device of it: ``tp % f == 0`` and either ``f == tp`` or
``f == G`` (fsdp the only batch axis: the split is re-laid over the tp devices, ``tp``
ways). Then, with the weight split along the contraction over the whole group and
``x`` whole, it **splits the forward** (slices ``x``, all-reduces the partial sums)
when the weight has more elements than the group's output, ``out x hidden > (T / G)
x out``, i.e. ``hidden > T / G`` tokens per batch shard; otherwise it all-gathers
``W`` and repeats the matmul on each tp shard. The recompute is the same dot; the
input gradient always repeats; the **weight gradient** (contracting the tokens)
splits ``f`` ways when ``tp % f == 0`` (the output's replicated dim groups by batch
shard) and repeats otherwise, except ``q_a``'s when its norm's weight is fsdp-split
and Shardy moves its output gradient off the batch (``out_norm``). Checked on XLA:CPU
compiles at widths 256-7168 on 8 and 16 devices and one XLA:TPU v5e-8 compile
(docs/design-notes.md, FLOPs). ``T`` is the whole batch's tokens: a step run as
micro-batches has fewer per matmul, which can flip the forward's choice (not
modelled: ``step_flops`` takes no micro-batch count).
**Elementwise work** (:data:`ELEMENTWISE`; executed, never model FLOPs): norms, residual adds, biases,
GELU/SiLU, rope, the softmax over the scores, the loss and the optimizer update, as XLA's
``cost_analysis()`` counts them (one FLOP per element per elementwise op, converts included). Counts per
element of four structural quantities, derived by differencing single-device compiles of the reference step
(base, 2x batch, 2x seq, +1 layer, 2x vocab, +512 MLP width, 2x hidden: seven compiles per family, the four
counts solved by least squares, each compile's elementwise FLOPs reproduced within 4.5%): per **parameter** (the AdamW update,
19 on its own, plus the gradients' converts and sums), per **token x hidden x layer** (residual stream: norms,
residual adds, biases, rope), per **token x MLP width x layer** (the activation and gating) and per **score**
(``batch x heads x seq x seq x layer``: mask, scale, softmax and its gradient). Per device the residual stream
splits over the batch axes and ``sp`` only (``tp`` shards repeat it: why GPT-2 with tp ran 3.5% under XLA
before this term), the MLP width and the scores over every axis, the optimizer over all but ``dp``. Remat
``full`` / ``offload`` rerun the layers' forward third of it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

from meshplan.pure._check import as_choice, as_count, as_flag
from meshplan.pure._fields import as_seconds, as_size, as_sizes, check_fields
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MoeDispatch
from meshplan.pure.cost._recipe import ATTENTION_KINDS
from meshplan.pure.errors import PlanError
from meshplan.pure.presets import build_params
from meshplan.pure.presets._spec import ModelSpec, as_model_spec
from meshplan.pure.rules import DEFAULT_MIN_SHARD_SIZE

__all__ = ["DEFAULT_EFFICIENCY", "ELEMENTWISE", "RECOMPUTE", "LayerFlops", "StepFlops", "default_efficiency", "layer_flops",
           "fsdp_read", "step_flops", "tp_replicated_splits"]

RECOMPUTE: dict[str, float] = {"none": 0.0, "dots": 0.0, "full": 1.0, "offload": 1.0}
"""Forward passes of each layer rerun in the backward pass, per remat policy."""

ELEMENTWISE: dict[str, tuple[float, float, float, float]] = {"gpt2": (32.0, 191.0, 88.0, 19.0),
                                                            "gated": (30.0, 133.0, 59.0, 17.0),
                                                            "gemma": (30.0, 179.0, 95.0, 17.0)}
"""XLA-counted elementwise FLOPs per (parameter, token x hidden x layer, token x MLP width x layer, score)
of a training step with AdamW (see the module docstring): ``"gpt2"`` (LayerNorm, biases, GELU) and
``"gated"`` (RMSNorm, rope, SiLU gate: Llama, Mixtral, DeepSeek, Qwen) and ``"gemma"``: ``"gated"`` plus
what Gemma adds, read from a pair of least-squares fits over seven single-device compiles each of the
reference step with Gemma's and with Llama's layer, all else equal (+46 per token x hidden x layer: the
two extra "sandwich" RMSNorms; +36 per token x MLP width x layer: tanh GELU in place of SiLU)."""

DEFAULT_EFFICIENCY: dict[str, tuple[float, float]] = {"gpu": (0.662, 2587.0), "tpu": (0.5, 0.0)}
"""``(e_max, w0)`` per device kind: a well-tuned step sustains ``e_max x h / (h + w0)`` of peak bf16 FLOP/s
on its matmuls, ``h`` the model's hidden size (:func:`default_efficiency`). Estimates.

GPU ``(0.662, 2587)``: least squares on ``log`` efficiency over the eight single-H200 steps of
``benchmarks/data/step_time_h200.jsonl`` (measured 2026-11-23: GPT-2, hidden 768, sustained 0.13-0.17;
Llama-3 8B and Mixtral, 4096, 0.36-0.51; Llama-3 70B, 8192, 0.46), fit by
``benchmarks/research/bench_efficiency_model.py`` and nothing else. Checked on published runs it never saw
(12 with a published layout: torchtitan, trainy, MaxText, Megatron-LM, Llama 3 405B, DeepSeek-V3; then
Megatron-LM's Table 1, 1.7B-1T): 15 of 20 steps within 25% against 10 of 20 with the flat 0.4 this
replaced (mean ``|ln(predicted / published)|`` 0.166 against 0.263); one curve for every GPU (A100s and
H800s included); too slow at the small end (Megatron's 1.7B, hidden 2304: 1.23x the published step).
It gives 0.15 at 768, 0.41 at 4096, 0.50 at 8192, 0.55 at 12288, 0.57 at 16384, 0.60 at 25600.
TPU ``(0.5, 0)``: flat 0.50 (``w0 = 0``), MaxText's published Llama-2/3 recipes on v5p / v6e (roughly 45-60%
MFU); no TPU step was measured, so there is no curve to fit. Override with ``efficiency=`` /
``--efficiency``."""


def default_efficiency(ici_scope: str, hidden: int) -> float:
    """The default efficiency of a model of hidden size ``hidden`` on a device whose fast link ends at a
    ``"node"`` (GPU) or ``"slice"`` (TPU): ``e_max x hidden / (hidden + w0)`` (:data:`DEFAULT_EFFICIENCY`).

    Raises:
      PlanError: ``hidden`` is not positive; MeshplanTypeError: not an integer.

    Example:
      >>> round(default_efficiency("node", 768), 3), round(default_efficiency("node", 8192), 3)
      (0.152, 0.503)
      >>> default_efficiency("slice", 8192)
      0.5
    """
    h = as_count(hidden, "hidden", error=PlanError)
    e_max, w0 = DEFAULT_EFFICIENCY["tpu" if ici_scope == "slice" else "gpu"]
    return e_max / (1 + w0 / h)  # = e_max x h / (h + w0), exactly e_max when w0 = 0


@dataclasses.dataclass(frozen=True, slots=True)
class LayerFlops:
    """Forward FLOPs of one layer for ``T`` tokens (the whole step, not per device).

    Attributes:
      weights: weight matmuls of the active parameters (``2 x N x T``).
      attention: ``Q K^T`` and ``P V``.
      padding: MoE experts run on empty capacity slots (executed, not model FLOPs).
      einsum: one MoE dispatch or combine einsum (the forward runs two, the backward three).
      replicated: extra forward ``weights`` FLOPs the tp shards repeat in the input gradient: each matmul
        split only ``k`` of the ``tp`` ways counts ``tp / k - 1`` times (divide by the devices for one
        device's extra).
      replicated_grad: the same for the weight gradients, which XLA splits further over the weights'
        batch-axis shards (the module docstring).
      replicated_forward: the same for the forward, which the recompute repeats: ``replicated`` less the
        tp-replicated weights whose forward XLA splits over tp (:func:`tp_replicated_splits`).
      tail: forward FLOPs of the layer's last matmuls, whose outputs the backward never needs
        (not recomputed under remat).
    """

    weights: float
    attention: float
    padding: float = 0.0
    einsum: float = 0.0
    replicated: float = 0.0
    tail: float = 0.0
    replicated_grad: float = 0.0
    replicated_forward: float = 0.0

    @property
    def forward_overhead(self) -> float:
        """Executed forward FLOPs beyond the model's: padding and the two einsums."""
        return self.padding + 2 * self.einsum

    @property
    def backward_overhead(self) -> float:
        """Executed backward FLOPs beyond the model's: padding twice and three einsums."""
        return 2 * self.padding + 3 * self.einsum


def _repeats(weights: int, split: int, tp: int, shards: int) -> tuple[int, int]:
    """Extra copies of K/V ``weights`` split ``split`` of the ``tp`` ways: (forward, weight gradient)."""
    r = tp // split  # tp shards holding the same part
    return weights * (r - 1), weights * (r // math.gcd(r, shards) - 1)


def tp_replicated_splits(out: int, hidden: int, *, tokens: int, tp: int, fsdp: int = 1, batch_shards: int = 1,
                         out_norm: bool = False) -> tuple[int, int]:
    """Devices among which XLA's SPMD partitioner divides the forward and the weight gradient of a matmul
    ``x (tokens, hidden) @ W (out, hidden).T`` whose weight is whole on each tp shard (MLA's down
    projections, the router): ``(forward, weight gradient)``; ``tp x batch_shards`` (all devices) is an
    even split, ``batch_shards`` a repeat on each tp shard (the module docstring says why).

    Args:
      out: the weight's output dim; hidden: its input dim, contracted in the forward.
      tokens: tokens of the step (all devices); batch_shards: the tokens' split (``devices / tp``).
      tp: the tp axis size.
      fsdp: the fsdp axis size: the default rule splits ``hidden`` over it when it divides the weight's
        largest dim, ``hidden``, and the leaf has ``DEFAULT_MIN_SHARD_SIZE`` elements.
      out_norm: a norm with a weight of ``out`` elements follows (MLA's ``q_a_layernorm``): when fsdp
        splits that weight, is the only batch axis and the step has fewer tokens than ``out``, the
        output's gradient arrives split along ``out``, not over the batch (Shardy's choice, measured, not
        read from its source) and the weight gradient runs over all the tokens, ``1 / fsdp`` of
        ``hidden`` on each device.

    Example:
      >>> tp_replicated_splits(576, 7168, tokens=1024, tp=4, fsdp=2, batch_shards=2)  # DeepSeek-V3's kv_a
      (8, 4)
      >>> tp_replicated_splits(96, 512, tokens=1024, tp=4, fsdp=2, batch_shards=2)  # 512 tokens a shard
      (2, 4)
    """
    f = fsdp if (hidden % fsdp == 0 and hidden > out and out * hidden >= DEFAULT_MIN_SHARD_SIZE) else 1
    if f == 1 or tp % f:  # the weight's split cannot land on a batch shard's tp devices: all repeat
        return batch_shards, batch_shards
    # The output's replicated dim groups by batch shard: the weight gradient splits f ways, unless q_a's
    # output gradient comes split along out (then each device runs all the tokens for 1/f of hidden,
    # f == batch_shards: a repeat's cost).
    norm_split = out_norm and f == batch_shards and out % f == 0 and out >= DEFAULT_MIN_SHARD_SIZE and tokens < out
    grad = batch_shards if norm_split else batch_shards * f
    # The weight's split lands on every device of a batch shard's group (f == tp, or fsdp the only batch
    # axis) and the weight outweighs the group's output: XLA slices x and all-reduces partial sums
    # instead of all-gathering W.
    split = (f == tp or f == batch_shards) and hidden * batch_shards > tokens
    return (tp * batch_shards if split else batch_shards), grad


def fsdp_read(model: ModelSpec, tp: int, fsdp: int) -> int:
    """The fsdp size as far as :func:`step_flops` of ``model`` depends on it: ``fsdp`` when it divides
    ``tp > 1`` and the model has tp-replicated weights (MLA, a router; their split can then land on a
    batch shard's tp devices, :func:`tp_replicated_splits`), else 1 (the same FLOPs as with fsdp's
    devices on another batch axis). The search keys its FLOPs cache with it.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> ds, llama = MODEL_SPECS["deepseek-v3"], MODEL_SPECS["llama3-8b"]
      >>> fsdp_read(ds, 4, 2), fsdp_read(ds, 2, 4), fsdp_read(ds, 1, 8), fsdp_read(llama, 4, 2)
      (2, 1, 1, 1)
    """
    replicated = model.mla is not None or model.is_moe
    return fsdp if replicated and tp > 1 and tp % fsdp == 0 else 1


def _replicated(out: int, hidden: int, tp: int, place: tuple[int, int, int], out_norm: bool = False
                ) -> tuple[int, int, int]:
    """Extra copies of a tp-replicated weight ``(out, hidden)``'s forward FLOPs over the even split, in (the
    forward, the input gradient, the weight gradient): a pass divided among ``k`` of ``n`` devices
    counts ``n / k - 1`` (the input gradient always repeats on the tp shards)."""
    tokens, fsdp, batch_shards = place
    forward, grad = tp_replicated_splits(out, hidden, tokens=tokens, tp=tp, fsdp=fsdp, batch_shards=batch_shards,
                                         out_norm=out_norm)
    n, w = tp * batch_shards, out * hidden
    return w * (n // forward - 1), w * (tp - 1), w * (n // grad - 1)


def _attention_weights(model: ModelSpec, tp: int, shards: int, place: tuple[int, int, int]
                       ) -> tuple[int, tuple[int, int, int], int, int]:
    """(matmul weights of one attention block, extra copies the tp shards repeat (forward, input gradient,
    weight gradient), qk dim, v dim per head); ``place`` = (tokens, fsdp, batch shards)."""
    h, n = model.hidden_size, model.num_heads
    if model.family == "gpt2":
        return 4 * h * h, (0, 0, 0), model.head_dim, model.head_dim
    mla = model.mla
    if mla is not None:
        downs = (mla.q_lora_rank, mla.kv_lora_rank + mla.qk_rope_head_dim)
        up = mla.q_lora_rank * n * mla.qk_head_dim + mla.kv_lora_rank * n * (mla.qk_nope_head_dim + mla.v_head_dim)
        if not mla.q_lora_rank:  # DeepSeek-V2-Lite: one q_proj, split over tp by heads like q_b_proj
            up += h * n * mla.qk_head_dim
        q_rep, kv_rep = _replicated(downs[0], h, tp, place, out_norm=True), _replicated(downs[1], h, tp, place)
        extra = (q_rep[0] + kv_rep[0], q_rep[1] + kv_rep[1], q_rep[2] + kv_rep[2])
        return h * sum(downs) + up + n * mla.v_head_dim * h, extra, mla.qk_head_dim, mla.v_head_dim
    # K and V split over tp only as far as whole KV heads go: gcd(tp, kv_heads) ways, each
    # part repeated on the tp / gcd shards of a head (measured: 2 KV heads, tp=4).
    kv = 2 * h * model.num_kv_heads * model.head_dim
    total = 2 * h * n * model.head_dim + kv
    copies, grad = _repeats(kv, math.gcd(tp, model.num_kv_heads), tp, shards)
    return total, (copies, copies, grad), model.head_dim, model.head_dim


def layer_flops(model: ModelSpec, *, moe_layer: bool, batch: int, seq: int, attention: str = "flash",
                capacity_factor: float = CAPACITY_FACTOR, tp: int = 1, shards: int = 1, fsdp: int = 1,
                dp: int = 1, moe_dispatch: str = "einsum") -> LayerFlops:
    """Forward FLOPs of one layer of ``model`` for ``batch`` sequences of ``seq`` tokens (see the module docstring).

    ``tp``, ``shards`` (the weights' split over the batch axes other than dp), ``fsdp`` and ``dp`` only
    place the replicated work (``replicated``, ``replicated_forward``, ``replicated_grad``). ``moe_dispatch``
    and ``capacity_factor`` say how an MoE layer reaches its experts (:class:`~meshplan.pure.cost.
    _moe_dispatch.MoeDispatch`): a ``"dropless"`` layer has no ``padding`` and no ``einsum``.

    Raises:
      MeshplanTypeError: ``model`` is not a ModelSpec, ``moe_layer`` not a bool, a count not an int.
      PlanError: a count below 1 or above 10**12, an unknown ``attention`` or MoE dispatch, a ``moe_layer``
        of a model without experts.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> f = layer_flops(MODEL_SPECS["llama3-8b"], moe_layer=False, batch=1, seq=4096)
      >>> round(f.weights / (2 * 4096) / 1e6)       # active matmul weights of one layer, in millions
      218
    """
    model = as_model_spec(model, "model")
    moe_layer = as_flag(moe_layer, "moe_layer")
    if moe_layer and not (model.num_experts and model.num_experts_per_tok):
        raise PlanError(f"moe_layer=True, but {model.name!r} has no routed experts (num_experts="
                        f"{model.num_experts}, num_experts_per_tok={model.num_experts_per_tok}); use moe_layer=False.")
    batch, seq, tp, shards, fsdp, dp = (as_size(v, name) for v, name in (
        (batch, "batch"), (seq, "seq"), (tp, "tp"), (shards, "shards"), (fsdp, "fsdp"), (dp, "dp")))
    attention = as_choice(attention, "attention", ATTENTION_KINDS, error=PlanError)
    dispatch = MoeDispatch(moe_dispatch, capacity_factor)  # refused by name here, for dense layers too
    tokens = batch * seq
    place = (tokens, fsdp, dp * shards)
    attn_w, (forward, replicated, grad), qk, v = _attention_weights(model, tp, shards, place)
    span = seq / 2 if attention == "flash" else seq
    attn = 2.0 * tokens * span * model.num_heads * (qk + v)
    h = model.hidden_size
    if not moe_layer:
        mlp = (2 if model.family == "gpt2" else 3) * h * model.intermediate_size
        # Gemma's post-feedforward norm reads the down projection's output, so remat recomputes it too.
        down = 0.0 if model.family == "gemma" else 2.0 * tokens * h * model.intermediate_size
        return LayerFlops(2.0 * tokens * (attn_w + mlp), attn, replicated=2.0 * tokens * replicated, tail=down,
                          replicated_grad=2.0 * tokens * grad, replicated_forward=2.0 * tokens * forward)
    e, k, f = model.num_experts, model.num_experts_per_tok, model.moe_intermediate_size
    expert = 3 * h * f
    active = attn_w + h * e + expert * (k + model.num_shared_experts)
    router = _replicated(e, h, tp, place)
    forward, replicated, grad = forward + router[0], replicated + router[1], grad + router[2]
    rows = dispatch.rows(top_k=k, seq=seq, experts=e)  # per sequence: E x capacity slots, or the routed tokens
    slots = batch * rows  # expert rows actually computed
    padding = 2.0 * expert * (slots - tokens * k)
    einsum = 2.0 * tokens * rows * h * dispatch.einsums  # one dispatch or combine einsum (none: dropless)
    shared_down = 2.0 * tokens * h * f * model.num_shared_experts
    return LayerFlops(2.0 * tokens * active, attn, padding, einsum, 2.0 * tokens * replicated, shared_down + einsum,
                      2.0 * tokens * grad, 2.0 * tokens * forward)


@dataclasses.dataclass(frozen=True, slots=True)
class StepFlops:
    """FLOPs of one training step (see the module docstring).

    Attributes:
      model: matmul FLOPs of forward + backward, no recompute, no MoE overhead (MFU's numerator), whole step.
      recompute: forward FLOPs rerun by the remat policy, whole step.
      overhead: MoE capacity padding and dispatch/combine einsums (forward + backward), whole step; 0 for a
        dropless dispatch.
      per_device: executed FLOPs on one device.
      layer_forward: executed forward FLOPs of one (average) layer on one device.
      layer_backward: executed backward FLOPs of one (average) layer on one device, recompute included.
      head: executed FLOPs of the output head on one device (forward + backward).
      elementwise: executed elementwise FLOPs on one device (norms, softmax, activations, the optimizer
        update; :data:`ELEMENTWISE`), included in ``per_device``, never in ``model``.
      weight_matmuls: of ``per_device``, the matmuls of the layers' weights: forward, both gradients, their
        recompute, their tp repeats and the MoE experts' empty capacity slots; not the attention core
        (``Q K^T``, ``P V``), the output head, the MoE dispatch/combine einsums or the elementwise work. An FP8
        recipe runs these in FP8 (:mod:`meshplan.pure.cost._matmul_dtype`).
      weight_forward, weight_backward: of ``layer_forward`` and ``layer_backward``, the weight matmuls.
    """

    model: float
    recompute: float
    overhead: float
    per_device: float
    layer_forward: float
    layer_backward: float
    head: float
    elementwise: float = 0.0
    weight_matmuls: float = 0.0
    weight_forward: float = 0.0
    weight_backward: float = 0.0

    def __post_init__(self) -> None:
        # Every field a finite number >= 0, so step_time can read a StepFlops it is given without checking it.
        check_fields(self, dict.fromkeys(_STEP_FLOPS_FIELDS, as_seconds))

    @property
    def executed(self) -> float:
        """Whole-step executed FLOPs: model + recompute + overhead."""
        return self.model + self.recompute + self.overhead


_STEP_FLOPS_FIELDS = tuple(f.name for f in dataclasses.fields(StepFlops))


def step_flops(model: ModelSpec, sizes: Mapping[str, int], *, batch: int, seq: int, remat: str = "full",
               attention: str = "flash", capacity_factor: float = CAPACITY_FACTOR,
               moe_dispatch: str = "einsum") -> StepFlops:
    """FLOPs of one training step of ``model`` on a mesh of ``sizes`` (see the module docstring).

    Args:
      model: a :class:`~meshplan.pure.ModelSpec`.
      sizes: mesh axis sizes (``dp, fsdp, ep, sp, tp``; missing axes count as 1).
      batch: global batch in sequences; seq: tokens per sequence.
      remat: ``"none"``, ``"dots"``, ``"full"`` or ``"offload"``.
      attention: ``"plain"``, ``"dot_product"`` or ``"flash"``.
      capacity_factor: MoE expert capacity over the even share of tokens (einsum dispatch).
      moe_dispatch: ``"einsum"`` (GShard's capacity dispatch) or ``"dropless"`` (grouped GEMMs over the
        routed tokens: no ``overhead``); :mod:`meshplan.pure.cost._moe_dispatch`.

    Returns:
      A :class:`StepFlops`.

    Raises:
      MeshplanTypeError: ``model`` is not a ModelSpec, ``sizes`` not a mapping of str to int, a count not
        an int.
      PlanError: an unknown remat policy, attention or MoE dispatch, a size or count below 1 or above 10**12
        (sizes: their product too).

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> f = step_flops(MODEL_SPECS["llama3-70b"], {"fsdp": 8, "tp": 8}, batch=64, seq=4096)
      >>> f"{f.model:.2e}", f"{f.per_device:.2e}"
      ('1.14e+17', '2.21e+15')
      >>> ds = MODEL_SPECS["deepseek-v3"]
      >>> [f"{step_flops(ds, {'dp': 2, 'ep': 64}, batch=960, seq=4096, remat='dots', moe_dispatch=d).overhead:.2e}"
      ...  for d in ("einsum", "dropless")]
      ['7.90e+17', '0.00e+00']
    """
    model = as_model_spec(model, "model")
    sizes = as_sizes(sizes, "sizes")
    remat = as_choice(remat, "remat", tuple(RECOMPUTE), error=PlanError)
    attention = as_choice(attention, "attention", ATTENTION_KINDS, error=PlanError)
    MoeDispatch(moe_dispatch, capacity_factor)  # refused by name here, for dense models too
    b, s = as_size(batch, "batch"), as_size(seq, "seq")
    n = math.prod(sizes.values())
    tp = sizes.get("tp", 1)
    # The weights' split over the batch axes other than dp (fsdp, ep, sp), and fsdp's own size: read
    # through the device count, tp, dp and fsdp only, the search's FLOPs cache key.
    dp, fsdp = sizes.get("dp", 1), sizes.get("fsdp", 1)
    shards = max(1, n // (tp * dp))
    dense_layers = model.num_layers - model.num_moe_layers
    parts = []
    if dense_layers:
        parts.append((dense_layers, layer_flops(model, moe_layer=False, batch=b, seq=s, attention=attention,
                                                tp=tp, shards=shards, fsdp=fsdp, dp=dp)))
    if model.num_moe_layers:
        parts.append((model.num_moe_layers, layer_flops(model, moe_layer=True, batch=b, seq=s,
                                                        attention=attention, capacity_factor=capacity_factor,
                                                        tp=tp, shards=shards, fsdp=fsdp, dp=dp,
                                                        moe_dispatch=moe_dispatch)))
    head = 6.0 * b * s * model.vocab_size * model.hidden_size
    r = RECOMPUTE[remat]
    fwd = sum(c * (f.weights + f.attention) for c, f in parts)
    model_flops = 3 * fwd + head
    # The combine einsum (overhead) is part of the tail; the rest of the tail is model FLOPs.
    recompute = r * sum(c * (f.weights + f.attention - (f.tail - f.einsum)) for c, f in parts)
    overhead = sum(c * (f.forward_overhead * (1 + r) - r * f.einsum + f.backward_overhead) for c, f in parts)
    # Replicated matmuls run whole on each of the tp shards that hold them, in the input gradient and,
    # unless XLA splits their forward, in the forward and the recompute; their weight gradients split
    # over the weights' shards too.
    replicated = sum(c * (f.replicated_forward * (1 + r) + f.replicated + f.replicated_grad) for c, f in parts)
    # The dispatch/combine einsums have no dim tp splits (the residual stream is whole): tp runs them whole.
    einsums = sum(c * f.einsum * (5 + r) for c, f in parts)
    matmuls = (model_flops + recompute + overhead) / n + (replicated + einsums * (tp - 1)) / n
    elementwise = _elementwise(model, sizes, n, b, s, r)
    per_device = matmuls + elementwise
    layers = max(model.num_layers, 1)
    layer_fwd = (fwd + sum(c * f.forward_overhead for c, f in parts)) / layers / n
    body = (per_device - head / n) / layers
    # The weight matmuls among those: forward and both gradients, the recompute less the layers' last matmuls
    # (the tail less its combine einsum), the experts' empty slots (forward, recompute, two gradients) and
    # the tp repeats; never the attention core, the head, the dispatch/combine einsums or the elementwise.
    weights = sum(c * (3 * f.weights + r * (f.weights - (f.tail - f.einsum)) + (3 + r) * f.padding)
                  for c, f in parts) / n + replicated / n
    weight_fwd = sum(c * (f.weights + f.padding) for c, f in parts) / layers / n
    return StepFlops(model_flops, recompute, overhead, per_device, layer_fwd, body - layer_fwd, head / n,
                     elementwise, weights, weight_fwd, weights / layers - weight_fwd)


def _elementwise(model: ModelSpec, sizes: Mapping[str, int], n: int, batch: int, seq: int, rerun: float) -> float:
    """Elementwise FLOPs of one step on one device (:data:`ELEMENTWISE`, the module docstring)."""
    per_param, per_hidden, per_width, per_score = ELEMENTWISE[model.family if model.family in ("gpt2", "gemma")
                                                              else "gated"]
    layers, moe = int(model.num_layers), int(model.num_moe_layers)
    width = ((layers - moe) * model.intermediate_size
             + moe * (model.moe_intermediate_size or 0) * (model.num_experts_per_tok + model.num_shared_experts))
    tokens = batch * seq
    stream = per_hidden * tokens * model.hidden_size * layers / (n // max(1, sizes.get("tp", 1)))
    split = (per_width * tokens * width + per_score * batch * model.num_heads * seq * seq * layers) / n
    params = float(model.num_params) if model.num_params else float(_param_count(model))
    optimizer = per_param * params / (n // max(1, sizes.get("dp", 1)))
    # The forward is about a third of the layers' elementwise work; remat reruns it.
    return float((stream + split) * (1 + rerun / 3) + optimizer)


@functools.lru_cache(maxsize=64)
def _param_count(model: ModelSpec) -> int:
    """Parameters of a spec without a published total (the shapes ``build_params`` gives)."""
    return sum(math.prod(leaf.shape) for leaf in _leaves(build_params(model)))


def _leaves(tree: Any) -> list[Any]:
    """The array-like leaves of a nested dict of shapes."""
    if isinstance(tree, Mapping):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    return [tree]
