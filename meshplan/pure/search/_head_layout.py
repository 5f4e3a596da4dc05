"""Which operand of the output head's matmul XLA:TPU gathers: the table or the batch's hidden states.

A plan that splits a ``(vocab, hidden)`` table's vocabulary over a batch axis
(fsdp alone stores Llama-3-8B's ``lm_head`` as ``(vocab / fsdp, hidden)``)
splits both operands of the head's matmul over that axis: the table's rows and
the hidden states' tokens. XLA's SPMD partitioner gathers the smaller shard
and keeps the other split. At full width the hidden states are the smaller
one (Llama-3-8B, fsdp=8, 16 x 2048: 4096 tokens x 4096 against 16032 rows x
4096), and XLA:TPU then

- gathers the hidden states for the head, forward and backward, and sums the
  head's fp32 input gradient (a reduce-scatter) instead of gathering the
  table and reduce-scattering its fp32 gradient;
- for an input embedding split the same way, gathers the token ids, looks them
  up in its shard of the table, sums the lookup's output (a reduce-scatter)
  and gathers the output's gradient for the scatter-add, which then needs no
  sum.

Read from XLA:TPU's HLO of full-width Llama-3-8B/2L steps (v5e-8 and v5p-16;
benchmarks/RESULTS.md, "Session 6" and "Session 7"). Hidden 1024 (the
TPU-sized steps) gathers the tables: there the table's shard is the smaller.
The memory model prices the same choice in its loss phase
(:mod:`meshplan.pure.search._step_memory`), the comm model in its collectives
(:mod:`meshplan.pure.search._step_cost`): both ask :func:`gathers_hidden`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["HeadLayout", "gathers_hidden", "head_layout", "vocab_batch_axes"]

BATCH_AXES = ("dp", "fsdp", "ep")
"""The mesh axes a plan splits the batch over (as :data:`meshplan.pure.search._step_cost.BATCH_AXES`)."""


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
    (:func:`~meshplan.pure.search._step_memory.step_memory` checks the layout it is given).

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


def gathers_hidden(head: HeadLayout | None, *, tokens: float, hidden: int, table: float) -> bool:
    """Whether XLA gathers the hidden states rather than the table for a head (or embedding) of ``table``
    elements split as ``head``, read by ``tokens`` tokens per device of width ``hidden``: the table's
    vocabulary is split over a batch axis and the hidden states' shard is the smaller operand.

    Example:
      >>> gathers_hidden(HeadLayout(vocab_batch=8), tokens=4096, hidden=4096, table=128256 * 4096)
      True
      >>> gathers_hidden(HeadLayout(vocab_batch=8), tokens=4096, hidden=1024, table=8192 * 1024)
      False
      >>> gathers_hidden(HeadLayout(vocab_other=8), tokens=4096, hidden=4096, table=128256 * 4096)
      False
    """
    return head is not None and head.vocab_batch > 1 and (
        tokens * hidden < table / (head.vocab_batch * head.vocab_other * head.hidden))


def _entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (``None``, a name or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
