"""Which operand of a matmul XLA gathers when a plan splits both over the same batch axis: the smaller one.

A plan that splits the output head's vocabulary over a batch axis (fsdp alone stores Llama-3-8B's
``lm_head`` as ``(vocab / fsdp, hidden)``) splits both operands of the head's matmul over that axis: the
table's rows and the hidden states' tokens. The dot's output can take only one of the two splits. Shardy,
jax's sharding propagation, resolves such a conflict for the factor of the larger tensor ("it's normally
beneficial to reshard the smaller tensor": ``AggressiveFactorPropagation``, openxla/shardy), by the tensors'
whole (unsharded) sizes; XLA's partitioner then gathers the smaller operand. So where the batch holds fewer
tokens than the vocabulary has rows (:func:`gathers_hidden`; Llama-3-8B, fsdp=8, 16 x 2048: 32768 tokens
against 128256 rows) XLA:TPU

- gathers the hidden states for the head, forward and backward, and sums the head's fp32 input gradient (a
  reduce-scatter) instead of gathering the table and reduce-scattering its fp32 gradient;
- for an input embedding split the same way, gathers the token ids, looks them up in its shard of the table,
  sums the lookup's output (a reduce-scatter) and gathers the output's gradient for the scatter-add, which
  then needs no sum.

The routed experts of an MoE layer, stored split over a batch axis on their intermediate dim (fsdp alone
stores Mixtral's ``w1`` as ``(experts, ffn / fsdp, hidden)``), meet the same conflict with the dispatched
tokens ``(experts, batch, capacity, hidden)``. Where the tokens are the smaller tensor (:func:`gathers_tokens`;
Mixtral-8x7B at 16 x 2048: 16 x 640 slots per expert against 14336 rows of each matrix) XLA:TPU gathers the
tokens and keeps the weights split, so fsdp acts on the experts as tp would: the experts' outputs and input
gradients are partial sums, reduce-scattered, and the weights' gradients need no sum.

Both read from XLA:TPU's HLO of full-width Llama-3-8B and Mixtral-8x7B steps cut to 2 and 4 layers (v5e-8,
v6e-8, v5p-16; docs/design-notes.md), the comparison then found in Shardy's source. At hidden
1024 (the TPU-sized steps: 32768 tokens, 8192 rows) the tables are gathered. The memory model prices the
head's choice in its loss phase (:mod:`meshplan.pure.cost._step_memory`), the comm model the collectives
(:mod:`meshplan.pure.cost._tpu_terms`, :mod:`meshplan.pure.cost._param_collectives`): both ask these functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MoeDispatch

__all__ = ["HeadLayout", "gathers_hidden", "gathers_tokens", "head_layout", "vocab_batch_axes"]

BATCH_AXES = ("dp", "fsdp", "ep")
"""The mesh axes a plan splits the batch over (as :data:`meshplan.pure.cost._placement.BATCH_AXES`)."""


class HeadLayout(NamedTuple):
    """How a plan splits the output head ``(vocab, hidden)`` on a mesh: what decides which operand of the
    head's matmul XLA's SPMD partitioner gathers (see :func:`head_layout`).

    Attributes:
      vocab_batch: the ways its vocabulary is split over batch axes (``dp``, ``fsdp``, ``ep``): the
        hidden states are split over them too, so one of the two operands is gathered over them.
      vocab_other: the ways its vocabulary is split over other axes (``tp``).
      hidden: the ways its hidden dim is split.
    """

    vocab_batch: int = 1
    vocab_other: int = 1
    hidden: int = 1


def vocab_batch_axes(spec: Any, shape: tuple[int, ...], *, vocab: int) -> tuple[str, ...]:
    """The batch axes (:data:`BATCH_AXES`) a ``(vocab, hidden)`` leaf of ``shape`` stored with ``spec`` splits
    its vocabulary over, in the spec's order: the axes one operand of its matmul is gathered over. A leaf
    that is not 2-D, or has no dim of size ``vocab``, has none (its vocabulary dim is the first, when both
    are).

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> vocab_batch_axes(P(("dp", "fsdp"), "tp"), (32000, 4096), vocab=32000)
      ('dp', 'fsdp')
      >>> vocab_batch_axes(P("tp", "fsdp"), (32000, 4096), vocab=32000)
      ()
    """
    if len(shape) != 2 or vocab not in shape:
        return ()
    v = 0 if shape[0] == vocab else 1
    entries = tuple(spec)
    return tuple(a for a in _entry_axes(entries[v] if v < len(entries) else None) if a in BATCH_AXES)


def head_layout(spec: Any, shape: tuple[int, ...], sizes: Mapping[str, int], *, vocab: int) -> HeadLayout:
    """The :class:`HeadLayout` of a head leaf of ``shape`` stored with ``spec`` (a PartitionSpec or its
    entries) on a mesh of ``sizes``; its vocabulary dim is the one of size ``vocab`` (the first, when
    both are). A leaf that is not 2-D, or has no dim of that size, gives the default (nothing known).
    No argument checks: the search calls it per planned mesh with what it built
    (:func:`~meshplan.pure.cost._step_memory.step_memory` checks the layout it is given).

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> head_layout(P("fsdp"), (128256, 4096), {"fsdp": 8}, vocab=128256)
      HeadLayout(vocab_batch=8, vocab_other=1, hidden=1)
      >>> head_layout(P("tp", "fsdp"), (128256, 4096), {"fsdp": 4, "tp": 2}, vocab=128256)
      HeadLayout(vocab_batch=1, vocab_other=2, hidden=4)
    """
    if len(shape) != 2 or vocab not in shape:
        return HeadLayout()
    v = 0 if shape[0] == vocab else 1
    entries = tuple(spec)
    vocab_batch = vocab_other = hidden = 1
    for a in _entry_axes(entries[v] if v < len(entries) else None):
        if a in BATCH_AXES:
            vocab_batch *= sizes.get(a, 1)
        else:
            vocab_other *= sizes.get(a, 1)
    for a in _entry_axes(entries[1 - v] if 1 - v < len(entries) else None):
        hidden *= sizes.get(a, 1)
    return HeadLayout(vocab_batch, vocab_other, hidden)


def gathers_hidden(head: HeadLayout | None, *, tokens: float, vocab: int) -> bool:
    """Whether XLA gathers the hidden states rather than the table for a head (or embedding) split as
    ``head``, read by ``tokens`` tokens (the whole batch's in one call of the loss: global batch x sequence,
    per micro-batch and vocabulary tile) against its ``vocab`` rows: the table's vocabulary is split over a
    batch axis and the batch's hidden states are the smaller tensor (a tie keeps the hidden states' split,
    the dot's first operand).

    Example:
      >>> gathers_hidden(HeadLayout(vocab_batch=8), tokens=16 * 2048, vocab=128256)
      True
      >>> gathers_hidden(HeadLayout(vocab_batch=8), tokens=64 * 2048, vocab=128256)
      False
      >>> gathers_hidden(HeadLayout(vocab_other=8), tokens=16 * 2048, vocab=128256)
      False
    """
    return head is not None and head.vocab_batch > 1 and tokens < vocab


def gathers_tokens(*, batch: int, seq: int, top_k: int, experts: int, width: int,
                   capacity_factor: float = CAPACITY_FACTOR, moe_dispatch: str = "einsum") -> bool:
    """Whether XLA gathers an MoE layer's dispatched tokens rather than its experts' weights, where a plan
    splits both over batch axes (the weights on their intermediate dim): the dispatched tokens of the
    ``batch`` sequences of ``seq`` tokens (per micro-batch), ``experts x batch x capacity x hidden`` with
    GShard's ``capacity = ceil(top_k x seq x capacity_factor / experts)``, are the smaller tensor than one
    expert matrix, ``experts x width x hidden`` (a tie keeps the tokens' split, the dot's first operand).
    A ``"dropless"`` ``moe_dispatch`` compares its routed tokens, ``batch x seq x top_k x hidden``, the same
    way (read on the einsum step's dots only; :class:`~meshplan.pure.cost._moe_dispatch.MoeDispatch`).

    Example:
      >>> gathers_tokens(batch=16, seq=2048, top_k=2, experts=8, width=14336)  # Mixtral-8x7B, 16 x 2048
      True
      >>> gathers_tokens(batch=24, seq=2048, top_k=2, experts=8, width=14336)
      False
      >>> gathers_tokens(batch=24, seq=2048, top_k=2, experts=8, width=14336, moe_dispatch="dropless")
      True
    """
    rows = MoeDispatch(moe_dispatch, capacity_factor).rows(top_k=top_k, seq=seq, experts=experts)
    return batch * rows < width * experts


def _entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (``None``, a name or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
