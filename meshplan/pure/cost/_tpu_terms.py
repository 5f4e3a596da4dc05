"""The collectives XLA:TPU runs in place of the textbook's: the operand it gathers instead of a weight, and a v5p
slice's gradient sums.

Where a plan splits a table's vocabulary (the output head, the input embedding) or the routed experts'
intermediate dim over batch axes, XLA:TPU gathers whichever operand is smaller
(:mod:`~meshplan.pure.cost._gathered_operand` decides which): the weight, as
:func:`~meshplan.pure.cost._param_collectives.param_tables` prices it, or the batch's hidden states
(:func:`hidden_state_terms`) or the dispatched tokens (:func:`expert_token_terms`), whose collectives are
priced here instead (``param_tables``' ``hidden_head``, ``hidden_embed`` and ``tokens_experts`` leave the
weight's out in exchange). On v5p, a gradient sum over every chip of a slice whose chip grid spans all three
dims is an all-reduce (:func:`whole_slice_sums`). Each rule was read from XLA:TPU's compiled HLO and is applied by
the search only for ``compiler="tpu"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from meshplan.pure._check import as_choice
from meshplan.pure.errors import PlanError
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MoeDispatch
from meshplan.pure.cost._placement import AxisPlacement, Pending, StepKind, local_batch
from meshplan.pure.presets._spec import ModelSpec

__all__ = ["TOKEN_REMATS", "expert_token_terms", "hidden_state_terms", "whole_slice_sums"]

TOKEN_REMATS: tuple[str, ...] = ("none", "full", "offload")
"""Remat policies under which :func:`expert_token_terms` were read (``offload`` recomputes as ``full`` does)."""


def hidden_state_terms(
    model: ModelSpec, sizes: Mapping[str, int], placement: AxisPlacement, *, batch: int, seq: int, itemsize: int,
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

    :func:`~meshplan.pure.cost._param_collectives.param_tables` (``hidden_head``, ``hidden_embed``) leaves out the tables' gathers and gradient
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
      >>> [(t.kind, t.nbytes // 2**20, t.calls) for t in terms]
      [('all-gather', 256, 2), ('reduce-scatter', 512, 1), ('all-gather', 0, 1), ('reduce-scatter', 256, 1), \
('all-gather', 256, 1)]
    """
    b, s = local_batch(sizes, batch, seq)
    h = model.hidden_size
    out: list[Pending] = []

    def add(what: str, kind: StepKind, axes: tuple[str, ...], per_token: int, calls: int) -> None:
        shown = tuple([a for a in axes if sizes.get(a, 1) > 1])
        if shown:
            i, d = placement.split(shown)
            ways = math.prod(sizes[a] for a in shown)
            out.append(Pending(f"{'+'.join(shown)} {what}", kind, shown, b * s * ways * per_token, calls, i, d))

    add("all-gather of the hidden states for the LM head (fwd + bwd: XLA:TPU)", "all-gather", head_axes,
        h * itemsize, 2)
    add("reduce-scatter of the LM head's input gradient (hidden states gathered: XLA:TPU, f32)", "reduce-scatter",
        head_axes, h * 4, 1)
    add("all-gather of the token ids for the embedding lookup (XLA:TPU)", "all-gather", embed_axes, 4, 1)
    add("reduce-scatter of the embedding lookup's output (XLA:TPU)", "reduce-scatter", embed_axes, h * itemsize, 1)
    add("all-gather of the embedding lookup's output gradient (XLA:TPU)", "all-gather", embed_axes, h * itemsize, 1)
    return out


def expert_token_terms(
    model: ModelSpec, sizes: Mapping[str, int], placement: AxisPlacement, *, batch: int, seq: int, itemsize: int,
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
      >>> [(t.kind, t.nbytes // 2**20, t.calls) for t in expert_token_terms(m, {"fsdp": 8}, p, batch=16, seq=2048,
      ...                                                                   itemsize=2, axes=("fsdp",))]
      [('all-gather', 640, 9), ('reduce-scatter', 640, 6)]
    """
    policy = as_choice(remat, "remat", ("none", "dots", "full", "offload"), error=PlanError)
    shown = tuple([a for a in axes if sizes.get(a, 1) > 1])
    moe = model.num_moe_layers
    if not shown or not moe or policy not in TOKEN_REMATS:
        return []
    b, s = local_batch(sizes, batch, seq)
    rows = MoeDispatch(moe_dispatch, capacity_factor).rows(top_k=model.num_experts_per_tok, seq=s,
                                                          experts=model.num_experts)
    nbytes = b * math.prod(sizes[a] for a in shown) * rows * model.hidden_size * itemsize
    i, d = placement.split(shown)
    group = "+".join(shown)
    gathers = f"{group} all-gather of the dispatched tokens for the experts (XLA:TPU)"
    sums = f"{group} reduce-scatter of the experts' partial outputs and input grads (XLA:TPU)"
    if policy == "none":
        return [Pending(gathers, "all-gather", shown, nbytes, 5 * moe - 1, i, d),
                Pending(f"{group} all-reduce of the experts' partial outputs (fwd, XLA:TPU)", "all-reduce", shown,
                        nbytes, moe, i, d),
                Pending(f"{group} reduce-scatter of the experts' partial input grads (bwd, XLA:TPU)",
                        "reduce-scatter", shown, nbytes, moe, i, d)]
    return [Pending(gathers, "all-gather", shown, nbytes, 6 * moe - 3, i, d),
            Pending(sums, "reduce-scatter", shown, nbytes, 3 * moe, i, d)]


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
      >>> t = [Pending("fsdp reduce-scatter of grads", "reduce-scatter", ("fsdp",), 100, 2, 8, 1)]
      >>> [(p.what, p.kind) for p in whole_slice_sums(t, {"fsdp": 8}, chips=8)]
      [('fsdp all-reduce of grads (whole v5p slice: XLA:TPU)', 'all-reduce')]
      >>> whole_slice_sums(t, {"fsdp": 8}, chips=16) == t
      True
    """
    out: list[Pending] = []
    for p in pending:
        if p.kind == "reduce-scatter" and math.prod(sizes.get(a, 1) for a in p.axes) == chips:
            group, _, rest = p.what.partition(" reduce-scatter ")
            p = p._replace(what=f"{group} all-reduce {rest} (whole v5p slice: XLA:TPU)", kind="all-reduce")
        out.append(p)
    return out
