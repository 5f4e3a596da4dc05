"""The collective-permutes XLA's SPMD partitioner emits for a slice of a split dimension.

A dimension of size ``dim`` split evenly in ``shards`` contiguous blocks, sliced
to ``[start, start + size)`` and the slice split evenly in ``shards`` blocks again
(``jnp.split`` of GPT-2's fused ``c_attn`` output ``[q | k | v]`` over tp, each
part then pinned to its heads): device ``i`` holds ``[i * dim/n, (i+1) * dim/n)``
and needs ``[start + i * size/n, start + (i+1) * size/n)``. Where the two differ,
XLA moves data. This module replays its algorithm (``xla/service/spmd``:
``HandleSlice`` -> ``ReshardDataForSlicing`` -> ``ReshardAsWindowedInput`` with the
slice as a size-1 window of padding ``(-start, start + size - dim)``, then
``ExchangeHaloAndGetValidData`` in ``spmd_partitioner_util.cc``), shard by shard,
for the permutes' widths along the dimension; no devices, no jax.

With the window's left and right halo sizes per shard ``l(i) = i * (dim - size)/n
- start`` and ``r(i) = start + size - dim - l(i)`` (negative halos trim):

- if the largest halo exceeds twice the output shard (``size/n``), the *compact*
  exchange (``ExchangeHaloCompact``): each shard's window is cut at the input
  shards' edges, the pieces held elsewhere are listed per source shard (by offset
  in the window) and packed greedily into permutes whose targets are distinct; a
  permute is as wide as the union of its pieces' in-shard ranges;
- else the *neighbour* exchange (``ExchangeHalo``): one permute per neighbour
  distance on each side, as wide as the largest halo at that distance (less what
  no shard reads);
- where neither applies (a window wider than XLA's limits), the dimension is
  gathered whole and sliced locally (``gathered``).

Checked against jax 0.10.2's XLA:CPU compiles of GPT-2 (hidden 128, tp = 2, 4, 8):
the widths equal the permutes in the HLO one for one; XLA:TPU (v5e-8, hidden 1024,
tp = 4) emits the same bytes (``docs/design-notes.md``, "GPT-2's fused
``c_attn`` under tp").
"""

from __future__ import annotations

import dataclasses

from meshplan.pure._check import as_count, as_int
from meshplan.pure.errors import PlanError

__all__ = ["SliceReshard", "slice_reshard"]


@dataclasses.dataclass(frozen=True, slots=True)
class SliceReshard:
    """What one slice's reshard moves, per device.

    Attributes:
      permutes: the widths (elements along the sliced dimension) of the
        collective-permutes, in XLA's emission order; each moves ``width`` times the
        other dimensions' bytes from every device (the HLO's operand, per device).
      gathered: XLA gathers the whole dimension instead (an all-gather of ``dim``).
    """

    permutes: tuple[int, ...]
    gathered: bool

    @property
    def width(self) -> int:
        """The permutes' summed width (0 when nothing moves, or when gathered)."""
        return sum(self.permutes)


def _neighbour(left: list[int], right: list[int], shard: int, n: int) -> tuple[int, ...] | None:
    """``ExchangeHalo``: one permute per neighbour distance and side; None where XLA gives up."""
    max_left, max_right = max(left[1:]), max(right[:-1])
    if max_left + max_right + shard >= shard * n and (max_left > shard or max_right > shard):
        return None
    left_bound, right_bound = -max(left), shard + max(right)  # the part of the shard any window reads
    if left_bound >= right_bound:
        return None
    widths = []
    i = -(-max_left // shard) - 1
    while i >= 0 and (-i - 1) * shard < right_bound:  # left halos, farthest first
        widths.append(min(max_left - shard * i, shard) - max(-i * shard - right_bound, 0))
        i -= 1
    skipped = min(max(left_bound - shard, 0), max(max_right, 0)) // shard
    for i in range(skipped, -(-max_right // shard)):  # right halos, nearest first
        widths.append(min(max_right - shard * i, shard) - max(left_bound - (i + 1) * shard, 0))
    return tuple(widths)


def _compact(left: list[int], right: list[int], shard: int, n: int) -> tuple[int, ...]:
    """``ExchangeHaloCompact``: pieces from other shards packed into permutes with distinct targets."""
    # Each shard's window cut at the input shards' edges: (offset in window, start, limit in the source shard).
    by_source: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n)]
    pieces = []
    for i in range(n):
        first, limit = i * shard - left[i], (i + 1) * shard + right[i]
        at, own = first, []
        while at < limit:
            start = at % shard
            width = min(shard - start, limit - at)
            own.append((at // shard, at - first, start, start + width, i))
            at += width
        pieces.append(own)
    # XLA lists the pieces round by round (every shard's first piece, then every shard's second, ...).
    for k in range(max(len(p) for p in pieces)):
        for i in range(n):
            if k < len(pieces[i]) and pieces[i][k][0] != i:
                source, offset, start, stop, target = pieces[i][k]
                by_source[source].append((offset, start, stop, target))
    for row in by_source:
        row.sort(key=lambda piece: piece[0])  # stable, as absl::c_stable_sort on the window offset
    widths: list[int] = []
    taken = [0] * n
    while True:
        seen, lo, hi, used = [False] * n, shard, 0, False
        for i in range(n):
            if taken[i] >= len(by_source[i]):
                continue
            _, start, stop, target = by_source[i][taken[i]]
            # Delayed: a target already served, or a small left halo joined to a small right one.
            if used and (seen[target] or (lo > stop and hi == shard and start == 0)
                         or (hi < start and lo == 0 and stop == shard)):
                continue
            seen[target], used = True, True
            lo, hi = min(lo, start), max(hi, stop)
            taken[i] += 1
        if not used:
            return tuple(widths)
        widths.append(hi - lo)


def slice_reshard(dim: int, start: int, size: int, shards: int) -> SliceReshard:
    """The permutes XLA emits to slice ``[start, start + size)`` of a dimension split in ``shards`` blocks.

    Args:
      dim: the dimension's size (divisible by ``shards``).
      start: the slice's first index (0 <= start, start + size <= dim).
      size: the slice's size (divisible by ``shards``).
      shards: blocks the dimension and the slice are split in (>= 1).

    Returns:
      A :class:`SliceReshard` (no permutes when each device already holds its part).

    Raises:
      PlanError: a slice outside the dimension, or a size the shards do not divide.

    Example:
      >>> [slice_reshard(384, k * 128, 128, 4).permutes for k in range(3)]  # GPT-2's q, k, v at tp=4
      [(64, 32), (64, 64), (32, 32, 32)]
      >>> slice_reshard(384, 128, 128, 2).permutes, slice_reshard(256, 0, 128, 2).width
      ((), 64)
    """
    dim, start = as_count(dim, "dim", error=PlanError), as_int(start, "start")
    size, n = as_count(size, "size", error=PlanError), as_count(shards, "shards", error=PlanError)
    if start < 0 or start + size > dim:
        raise PlanError(f"slice [start={start}, start + size={start + size}) must lie inside dim={dim}.")
    if dim % n or size % n:
        raise PlanError(f"dim={dim} and size={size} must both be multiples of shards={n} (even blocks).")
    if n == 1:
        return SliceReshard((), False)
    shard, out = dim // n, size // n
    # The window of shard i is [start + i * out, start + (i + 1) * out): its halos past its own block.
    left = [i * shard - start - i * out for i in range(n)]
    right = [start + (i + 1) * out - (i + 1) * shard for i in range(n)]
    if max(max(left), max(right)) > 2 * out:  # ExchangeHaloAndGetValidData's choice
        if 2 * out >= n * shard:
            return SliceReshard((), True)
        return SliceReshard(_compact(left, right, shard, n), False)
    widths = _neighbour(left, right, shard, n)
    return SliceReshard((), True) if widths is None else SliceReshard(widths, False)
