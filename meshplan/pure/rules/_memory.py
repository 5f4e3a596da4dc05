"""The memory rule: split a leaf just enough to fit a per-device byte budget.

For each leaf (bytes counted as :func:`meshplan.pure.array_bytes` does, i.e.
what a live ``jax.Array`` holds):

1. if the whole leaf fits ``max_memory_per_device``, it stays replicated;
2. otherwise mesh axes are taken largest first (ties in ``axis_names``/mesh
   order) and each goes onto the dim whose *current shard* is largest among
   those it divides evenly (ties to the lower dim); a dim may collect several
   axes (a tuple entry). This stops as soon as the shard fits;
3. if that greedy pass ends over budget, an exhaustive search over every
   divisible assignment finds the smallest shard there is (the greedy pass
   can spend an axis where it blocks a better split); if that fits, it is
   used;
4. if nothing fits, :class:`MemoryBudgetError` names the leaf, the best
   bytes per device any split reaches, and the budget. An over-budget spec is
   never returned. (The error from :class:`MemoryRule` also carries
   ``best_spec`` and ``best_bytes`` for a caller who would rather take the
   best split anyway.)

Only divisible splits are used, so every spec is valid for storing the leaf.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from jax.sharding import PartitionSpec

from meshplan.pure._check import canonical_axis_sizes
from meshplan.pure._types import make_spec
from meshplan.pure.errors import MemoryBudgetError, MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._base import (
    Decision,
    LeafContext,
    canonical_axis_names,
    canonical_shape,
    format_axes,
    select_axes,
)
from meshplan.pure.specs._dtypes import array_bytes
from meshplan.pure.specs._geometry import spec_from_entries

__all__ = ["MemoryRule", "min_shard_bytes"]

Assignment = tuple[tuple[str, ...], ...]


def _budget(value: Any) -> int | float:
    # Kept as given (an int budget stays an int in reasons), only checked.
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not is_number:
        raise MeshplanTypeError(
            f"max_memory_per_device={value!r} must be a number of bytes, e.g. 16 * 1024**3."
        )
    if not value > 0:
        raise ShardingRuleError(f"max_memory_per_device={value!r} must be > 0 bytes.")
    budget: int | float = value
    return budget


def _shard(shape: tuple[int, ...], entries: Assignment, sizes: Mapping[str, int]) -> tuple[int, ...]:
    out = list(shape)
    for d, axes in enumerate(entries):
        for a in axes:
            out[d] //= sizes[a]
    return tuple(out)


def _greedy(shape: tuple[int, ...], axes: list[str], sizes: Mapping[str, int], fits: Any) -> Assignment:
    """Largest axes first onto the largest divisible shard dim; stop once it fits."""
    shard = list(shape)
    entries: list[tuple[str, ...]] = [()] * len(shape)
    for a in axes:
        n = sizes[a]
        dims = [d for d in range(len(shape)) if shard[d] >= n and shard[d] % n == 0]
        if not dims:
            continue
        d = min(dims, key=lambda d: (-shard[d], d))
        shard[d] //= n
        entries[d] = entries[d] + (a,)
        if fits(tuple(shard)):
            break
    return tuple(entries)


def _exhaustive(shape: tuple[int, ...], axes: list[str], sizes: Mapping[str, int]) -> Assignment:
    """The assignment with the largest total split (smallest shard), by memoised search.

    States are (next axis, current shard shape); shard shapes are products of
    divisors, so the memo stays small for real meshes (a handful of axes).
    Ties keep the earlier option, which prefers leaving an axis unused and
    then lower dims, so the answer is deterministic.
    """
    memo: dict[tuple[int, tuple[int, ...]], tuple[int, tuple[int, ...]]] = {}

    def best(k: int, shard: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        if k == len(axes):
            return 1, ()
        key = (k, shard)
        if key not in memo:
            split, rest = best(k + 1, shard)
            choice = (split, (-1, *rest))
            n = sizes[axes[k]]
            for d, size in enumerate(shard):
                if size >= n and size % n == 0:
                    sub, rest = best(k + 1, shard[:d] + (size // n,) + shard[d + 1:])
                    if sub * n > choice[0]:
                        choice = (sub * n, (d, *rest))
            memo[key] = choice
        return memo[key]

    _, dims = best(0, shape)
    entries: list[tuple[str, ...]] = [()] * len(shape)
    for a, d in zip(axes, dims, strict=True):
        if d >= 0:
            entries[d] = entries[d] + (a,)
    return tuple(entries)


def min_shard_bytes(
    shape: Sequence[int],
    dtype: Any,
    axis_sizes: Mapping[str, int],
    *,
    axis_names: Sequence[str] | None = None,
    packed_subbyte: bool = False,
) -> tuple[int, PartitionSpec]:
    """The fewest bytes per device any divisible split reaches, and that split.

    Example:
      >>> min_shard_bytes((6, 4), "float32", {"a": 4, "b": 3})
      (8, P('b', 'a'))
    """
    shape = canonical_shape(shape)
    sizes = canonical_axis_sizes(axis_sizes)
    axes = _ordered_axes(select_axes(canonical_axis_names(axis_names, "axis_names"), sizes, "memory"), sizes)
    entries = _exhaustive(shape, axes, sizes)
    return array_bytes(_shard(shape, entries, sizes), dtype, packed_subbyte=packed_subbyte), spec_from_entries(entries)


def _ordered_axes(axes: tuple[str, ...], sizes: Mapping[str, int]) -> list[str]:
    """Axes of size > 1, largest first; equal sizes keep their given order."""
    return sorted((a for a in axes if sizes[a] > 1), key=lambda a: -sizes[a])


def _describe(shape: tuple[int, ...], entries: Assignment, sizes: Mapping[str, int]) -> str:
    return ", ".join(
        f"dim {d} ({shape[d]}) over {format_axes(axes, sizes)}" for d, axes in enumerate(entries) if axes
    )


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryRule:
    """Fit every leaf into ``max_memory_per_device`` bytes (see the module docstring).

    Attributes:
      max_memory_per_device: the per-device budget for one leaf, in bytes.
      axis_names: the mesh axes it may use; ``None`` = every axis.
      packed_subbyte: count sub-byte dtypes packed (TPU storage) instead of
        one byte per element (``jax.Array.nbytes``).
      name: the label on its decisions.

    Example:
      >>> import numpy as np
      >>> rule = MemoryRule(max_memory_per_device=2 * 1024**2)
      >>> ctx = LeafContext((4096, 1024), np.dtype("float32"), {"dp": 2, "tp": 4})
      >>> rule(ctx).spec, rule(ctx).reason
      (P(('tp', 'dp'),), "16777216 B > budget 2097152 B; dim 0 (4096) over 'tp'(4)*'dp'(2) -> 2097152 B per device")
      >>> MemoryRule(2**20)(LeafContext((1024, 1024), np.dtype("bfloat16"), {"fsdp": 4})).spec
      P('fsdp',)

    Raises (when called):
      MemoryBudgetError: no divisible split fits (``best_spec``/``best_bytes``
        on the error say how close it gets).
      ShardingRuleError: an unknown axis in ``axis_names``.
    """

    max_memory_per_device: int | float
    axis_names: Sequence[str] | None = None
    packed_subbyte: bool = False
    name: str = "memory"
    shape_only: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_memory_per_device", _budget(self.max_memory_per_device))
        object.__setattr__(self, "axis_names", canonical_axis_names(self.axis_names, "axis_names"))
        if not isinstance(self.packed_subbyte, bool):
            raise MeshplanTypeError(f"packed_subbyte={self.packed_subbyte!r} must be a bool.")
        if not isinstance(self.name, str):
            raise MeshplanTypeError(f"name={self.name!r} must be a string.")

    def __call__(self, ctx: LeafContext) -> Decision:
        budget, shape, sizes = self.max_memory_per_device, ctx.shape, ctx.axis_sizes

        if self.packed_subbyte:
            def nbytes(shard: tuple[int, ...]) -> int:
                return array_bytes(shard, ctx.dtype, packed_subbyte=True)
        else:
            # Unpacked, every element takes whole bytes, so bytes are linear in
            # the element count: one array_bytes call gives the unit.
            unit = array_bytes((1,), ctx.dtype)

            def nbytes(shard: tuple[int, ...]) -> int:
                return math.prod(shard) * unit

        full = nbytes(shape)
        if full <= budget:
            return Decision(make_spec(), f"{full} B fits the budget of {budget} B; replicated", self.name)
        axes = _ordered_axes(select_axes(self.axis_names, sizes, self.name), sizes)
        entries = _greedy(shape, axes, sizes, lambda shard: nbytes(shard) <= budget)
        got = nbytes(_shard(shape, entries, sizes))
        how = ""
        if got > budget:
            entries = _exhaustive(shape, axes, sizes)
            got = nbytes(_shard(shape, entries, sizes))
            how = " (exhaustive search)"
        spec = spec_from_entries(entries)
        if got > budget:
            err = MemoryBudgetError(
                f"{ctx.path}: {shape} {ctx.dtype} needs {full} B unsharded and at best {got} B per "
                f"device ({spec} over mesh axes {dict(sizes)}), above max_memory_per_device={budget} B. "
                "Raise the budget, add or enlarge mesh axes, or pad/reshape this leaf so more axes divide it."
            )
            err.best_spec = spec  # type: ignore[attr-defined]
            err.best_bytes = got  # type: ignore[attr-defined]
            raise err
        return Decision(
            spec, f"{full} B > budget {budget} B; {_describe(shape, entries, sizes)} -> {got} B per device{how}",
            self.name,
        )
