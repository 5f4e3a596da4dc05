"""The mesh search's default rule: one behaviour per axis kind, read from the tree's conventions.

:class:`AxisKindRule` shards a model the way Megatron-style training does,
reading each leaf's path and shape through
:func:`~meshplan.pure.rules._conventions.leaf_layout` (flax nnx / linen,
equinox, Hugging Face PyTorch and Flax, scanned layers, stacked experts,
MaxText names: the role of the layer and the meaning of every dim), and the
sizes of three mesh axes:

- **tp** (tensor parallel) splits *column-parallel* layers (``q_proj``,
  ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj``, ``w1``, ``w3``,
  ``q_b_proj``, ``kv_b_proj``, ``query``/``key``/``value``, ``wi_0``,
  ``lm_head``, GPT-2's ``c_attn`` and ``c_fc``) on their *output* features or
  heads (and their bias); *row-parallel* layers (``o_proj``, ``down_proj``,
  ``w2``, ``out``, ``wo``, GPT-2's ``c_proj``) on their *input* features or
  heads (bias replicated); embeddings (``embed_tokens``, ``wte``, any flax
  ``embedding``) on the vocabulary (Megatron's vocab-parallel embedding).
  Where those dims are depends on the convention: a PyTorch ``weight`` is
  ``(out, in)``, a flax ``kernel`` ``(in, out)``, a ``DenseGeneral`` query
  kernel ``(embed, heads, head_dim)``. Attention projections are split only
  when ``tp`` divides the head count; ``k_proj``/``v_proj`` stay replicated
  over ``tp`` when it does not divide the kv-head count (each tp rank then
  keeps the kv heads its query heads read, an upper bound on memory).
  Everything else (norms, routers, MLA's low-rank ``q_a_proj``) is not split
  over ``tp``, and the reason says so.
- **ep** (expert parallel) splits the ``experts`` dim of *stacked* expert
  weights (``.../experts/<name>/weight`` of shape ``(E, out, in)``). Per-expert
  leaves (``.../experts/<e>/...``) cannot be split by a spec: the expert
  index is in the path, so ``ep`` saves no memory there (the reason says so).
- **fsdp** then shards the largest remaining dim it divides (ties to the
  lower dim; a scanned ``layers`` dim last); if no free dim divides, it
  joins a tp/ep-split dim that can take both (a tuple entry).
- leaves with fewer than ``min_shard_size`` elements stay replicated; dp and
  sp never shard weights.

Every spec it emits can be stored (every split divides its dim). A reason
names each tp or fsdp axis of size > 1 that the leaf is not split over, and
why (ep: for expert leaves, or when nothing else is said), so it never
claims that no axis was left to place while one of size > 1 is.

The rule promises more than :class:`~meshplan.pure.rules.Rule` asks, and the
mesh search uses it to stay fast: :meth:`AxisKindRule.group_key` says which
leaves always get the same answer, and :attr:`AxisKindRule.reads_axes`
which axes' sizes matter.

Users replace or refine it with any pure rule, e.g. a
:class:`~meshplan.pure.PathRule` (``meshplan plan --rules FILE``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_count, as_int, as_sequence, as_shape, as_str, canonical_axis_sizes
from meshplan.pure._types import make_spec
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._auto import DEFAULT_MIN_SHARD_SIZE
from meshplan.pure.rules._base import Decision, LeafContext, as_context
from meshplan.pure.rules._conventions import CONVENTIONS, DIM_KINDS, LeafLayout, leaf_layout, normalize_path
from meshplan.pure.specs._geometry import spec_from_entries
from meshplan.pure.specs._tree import path_template as _path_template

__all__ = ["AxisKindRule", "path_template"]

_Placed = tuple[tuple[tuple[str, ...], ...], tuple[str, ...], tuple[int, ...]]
"""A leaf's entries and reasons after tp and ep are placed, and the order fsdp tries its dims in."""

def path_template(path: str) -> str:
    """``path`` with every all-digit component replaced by ``*``.

    Leaves that differ only in layer or expert index share a template, which
    is how the search groups a 45k-leaf tree into a few dozen groups.

    Example:
      >>> path_template("model/layers/12/mlp/experts/3/w1/weight")
      'model/layers/*/mlp/experts/*/w1/weight'
    """
    return _path_template(as_str(path, "path"))


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    return as_count(value, what, error=ShardingRuleError, hint="or None when unknown")


@dataclasses.dataclass(frozen=True, slots=True)
class AxisKindRule:
    """The mesh search's default rule (see the module docstring).

    Attributes:
      num_heads: attention heads, if known (tp splits attention only when it
        divides them).
      num_kv_heads: key/value heads, if known.
      num_experts: routed experts per MoE layer, if known (ep splits a stacked
        expert leaf only on a dim of this size).
      min_shard_size: leaves with fewer elements stay replicated.
      fsdp_axis, tp_axis, ep_axis: the mesh axis names of each kind.
      name: the label on its decisions.
      convention: how to read parameter layouts, one of
        :data:`~meshplan.pure.rules._conventions.CONVENTIONS` (``"auto"``: by parameter name).
      dims: explicit dim meanings, ``(regex, kinds)`` pairs searched in the
        normalised path (first match wins), e.g.
        ``(("mlp/wi/kernel", ("layers", "in", "out")),)``.

    Example:
      >>> import numpy as np
      >>> from meshplan.pure import tree_facts
      >>> tree = {"model": {"layers": {"0": {"self_attn": {"q_proj": {"weight": np.zeros((64, 32))}}}}}}
      >>> facts = tree_facts(tree)
      >>> rule = AxisKindRule(num_heads=8)
      >>> d = rule(LeafContext((64, 32), np.dtype("float32"), {"fsdp": 4, "tp": 2}, 0, facts))
      >>> d.spec, d.reason
      (P('tp', 'fsdp'), "q_proj column-parallel: dim 0 (64) <- 'tp'(2); fsdp: dim 1 (32) <- 'fsdp'(4)")
      >>> rule.decide("params/q_proj/kernel/value", (32, 64), {"tp": 2}).spec  # flax: (in, out)
      P(None, 'tp')
    """

    num_heads: int | None = None
    num_kv_heads: int | None = None
    num_experts: int | None = None
    min_shard_size: int = DEFAULT_MIN_SHARD_SIZE
    fsdp_axis: str = "fsdp"
    tp_axis: str = "tp"
    ep_axis: str = "ep"
    name: str = "axis-kind"
    convention: str = "auto"
    dims: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # (path, shape) -> layout: the search asks about one leaf per group for every mesh, and
    # reading the path costs more than the decision. A memo, not state: same leaf, same answer.
    _layouts: dict[tuple[str, tuple[int, ...]], LeafLayout] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)
    _dim_patterns: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = dataclasses.field(
        default=(), repr=False, compare=False)
    # (layout id, shape, tp, ep) -> entries and reasons after placing tp and ep, and the order fsdp
    # tries the dims in (see _decide).
    _placed: dict[tuple[int, tuple[int, ...], int, int], _Placed | Decision] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)
    # (layout id, shape) -> the order fsdp tries the dims in, which reads no axis size.
    _orders: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)
    # entries -> spec: the search builds a few dozen distinct specs thousands of times.
    _specs: dict[tuple[tuple[str, ...], ...], PartitionSpec] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)
    shape_only: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for field in ("num_heads", "num_kv_heads", "num_experts"):
            object.__setattr__(self, field, _count(getattr(self, field), field))
        size = as_int(self.min_shard_size, "min_shard_size")
        if size < 0:
            raise ShardingRuleError(f"min_shard_size={size} must be >= 0.")
        object.__setattr__(self, "min_shard_size", size)
        names = (self.fsdp_axis, self.tp_axis, self.ep_axis, self.name)
        if not all(isinstance(n, str) and n for n in names):
            raise MeshplanTypeError(f"axis names and name must be non-empty strings, got {names!r}.")
        if len({self.fsdp_axis, self.tp_axis, self.ep_axis}) != 3:
            raise ShardingRuleError(f"fsdp_axis, tp_axis and ep_axis must differ, got {names[:3]!r}.")
        if self.convention not in CONVENTIONS:
            raise ShardingRuleError(f"convention={self.convention!r} is not one of {list(CONVENTIONS)}.")
        dims, patterns = _compile_dims(self.dims)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "_dim_patterns", patterns)

    @classmethod
    def for_model(cls, spec: Any, **options: Any) -> AxisKindRule:
        """The rule with head and expert counts taken from a :class:`~meshplan.pure.ModelSpec`.

        Example:
          >>> from meshplan.pure.presets import MODEL_SPECS
          >>> AxisKindRule.for_model(MODEL_SPECS["mixtral-8x7b"]).num_experts
          8
        """
        missing = [a for a in ("num_heads", "num_kv_heads", "num_experts") if not hasattr(spec, a)]
        if missing:
            raise MeshplanTypeError(f"spec={spec!r:.80} is not a ModelSpec (it lacks {missing}).")
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise MeshplanTypeError(f"AxisKindRule.for_model got unknown options {unknown}; the options are "
                                    f"{sorted(_OPTIONS)} (the head and expert counts come from spec).")
        return cls(num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                   num_experts=spec.num_experts or None, **options)

    @property
    def reads_axes(self) -> tuple[str, ...]:
        """The only mesh axes whose sizes change its answers (and the only ones it shards over)."""
        return (self.fsdp_axis, self.tp_axis, self.ep_axis)

    def group_key(self, ctx: LeafContext) -> Hashable:
        """Leaves with equal keys get equal decisions on every mesh: (template, shape, dtype), or the exact
        path in place of the template where the answer reads an index (:meth:`template_group` is False).

        Example:
          >>> import numpy as np
          >>> from meshplan.pure.specs import tree_facts
          >>> facts = tree_facts({"layers": [{"mlp": {"up": np.zeros((4, 8))}}] * 2})
          >>> ctx = LeafContext.trusted((4, 8), np.dtype("float64"), {}, 1, facts)
          >>> AxisKindRule().group_key(ctx)[0], AxisKindRule(dims=(("up", ("in", "out")),)).group_key(ctx)[0]
          ('layers/*/mlp/up', 'layers/1/mlp/up')
        """
        ctx = as_context(ctx)
        template = path_template(ctx.path)
        return (template if self.template_group(template) else ctx.path, ctx.shape, ctx.dtype)

    def template_group(self, template: str) -> bool:
        """Whether all leaves whose paths have this template get one decision per shape, dtype and
        axis sizes: :func:`~meshplan.pure.rules.plan_tree` then reads the conventions of one of them.

        Leaves that differ only in all-digit components (layer and expert indices) read the same
        conventions: an index is never a marker, a prefix or a box tail, and an expert index counts
        only as digits. Two things read the index itself, and there the answer is False: ``dims``
        overrides (a pattern may name ``layers/0``), and a template whose layer or parameter name
        is an index (the reason names it: ``"0/kernel: not a tensor-parallel layer"``).

        Example:
          >>> rule = AxisKindRule()
          >>> rule.template_group("model/layers/*/mlp/experts/*/up_proj/weight")
          True
          >>> rule.template_group("norms/*"), AxisKindRule(dims=(("norm", ("embed",)),)).template_group("a/w")
          (False, False)
        """
        template = as_str(template, "template")
        if self.dims:
            return False
        return "*" not in normalize_path(template).split("/")[-2:]

    def layout(self, path: str, shape: tuple[int, ...]) -> LeafLayout:
        """How this rule reads a leaf: its role and the meaning of each dim.

        Example:
          >>> AxisKindRule().layout("params/lm_head/kernel", (64, 1000)).dims
          ('in', 'vocab')
        """
        key = (as_str(path, "path"), as_shape(shape, "shape"))
        path, shape = key
        found = self._layouts.get(key)
        if found is None:
            override = next((kinds for pattern, kinds in self._dim_patterns
                             if pattern.search(normalize_path(path))), None)
            found = self._layouts[key] = leaf_layout(
                path, shape, convention=self.convention, dims=override, num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads, num_experts=self.num_experts)
        return found

    def __call__(self, ctx: LeafContext) -> Decision:
        return self._decide(self._layout_of(ctx), ctx.shape, ctx.axis_sizes)

    def spec(self, ctx: LeafContext) -> PartitionSpec:
        """``self(ctx).spec``, without writing the reason (see :meth:`spec_function`).

        Example:
          >>> import numpy as np
          >>> from meshplan.pure import tree_facts
          >>> facts = tree_facts({"mlp": {"up_proj": {"weight": np.zeros((64, 32))}}})
          >>> AxisKindRule().spec(LeafContext((64, 32), np.dtype("float32"), {"fsdp": 4, "tp": 2}, 0, facts))
          P('tp', 'fsdp')
        """
        return self.spec_function(ctx)[0](ctx.axis_sizes)

    def spec_function(self, ctx: LeafContext) -> tuple[Callable[[Mapping[str, int]], PartitionSpec], tuple[str, ...]]:
        """``sizes -> self(ctx on a mesh of those axis sizes).spec`` (without writing the reason),
        and the axes whose sizes that spec reads: meshes that agree on them give this leaf one spec.

        The mesh search prices a few hundred plans and shows a few: it asks this once per leaf
        group, reuses a group's spec and shard on every mesh that agrees on the axes it reads
        (dense leaves ignore ep, norms ignore tp), and asks for whole decisions only for the
        plans it shows (writing the reasons cost a third of the decisions). Raises what
        ``self(ctx)`` raises about the leaf's path and shape, whatever the mesh.

        Example:
          >>> import numpy as np
          >>> from meshplan.pure import tree_facts
          >>> facts = tree_facts({"mlp": {"down_proj": {"weight": np.zeros((32, 64))}}})
          >>> f, reads = AxisKindRule().spec_function(LeafContext((32, 64), np.dtype("float32"), {}, 0, facts))
          >>> f({"fsdp": 4, "tp": 2}), f({"fsdp": 8}), reads
          (P('fsdp', 'tp'), P(None, 'fsdp'), ('fsdp', 'tp'))
        """
        lay, shape = self._layout_of(as_context(ctx)), ctx.shape
        return (lambda sizes: self._spec_for(lay, shape, sizes)), self._leaf_reads(lay, shape)

    def _leaf_reads(self, lay: LeafLayout, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The axes :meth:`_spec_for` reads for this leaf: none below ``min_shard_size``; else fsdp,
        tp unless :meth:`_place_tp` never splits its role, ep where :meth:`_place_ep` finds stacked
        experts (fsdp joining a split dim reads only the axes already there)."""
        if math.prod(shape) < self.min_shard_size:
            return ()
        reads = [self.fsdp_axis]
        if lay.role != "other":
            reads.append(self.tp_axis)
        if not lay.per_expert and lay.dim("experts") is not None:
            reads.append(self.ep_axis)
        return tuple(reads)

    def _spec_for(self, lay: LeafLayout, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> PartitionSpec:
        placed = self._placed_for(lay, shape, axis_sizes)
        if isinstance(placed, Decision):
            return placed.spec
        return self._spec_of(self._entries(placed, shape, axis_sizes)[0])

    def _layout_of(self, ctx: LeafContext) -> LeafLayout:
        path, shape = ctx.path, ctx.shape
        # A leaf asked about before (the search asks one per group for every mesh) is read from
        # the memo without re-checking its path and shape, which cost more than the decision. Only
        # a plain str path and plain-int shape can equal a key that layout() checked.
        found = (self._layouts.get((path, shape))
                 if type(path) is str and all(type(d) is int for d in shape) else None)
        return self.layout(path, shape) if found is None else found

    def decide(self, path: str, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> Decision:
        """The decision for a leaf with this path (or path template) and shape (any dtype).

        Example:
          >>> AxisKindRule().decide("model/layers/*/mlp/down_proj/weight", (4096, 14336), {"tp": 8}).spec
          P(None, 'tp')
        """
        path = as_str(path, "path")
        shape = as_shape(shape, "shape")
        sizes = canonical_axis_sizes(axis_sizes)
        return self._decide(self.layout(path, shape), shape, sizes)

    def _decide(self, lay: LeafLayout, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> Decision:
        placed = self._placed_for(lay, shape, axis_sizes)
        if isinstance(placed, Decision):  # below min_shard_size: replicated whatever the mesh
            return placed
        key, where = self._entries(placed, shape, axis_sizes)
        steps = list(placed[1])
        fsdp = axis_sizes.get(self.fsdp_axis, 1)
        if fsdp > 1:
            axis = self.fsdp_axis
            if where is None:
                steps.append(f"fsdp: no dim of {shape} divisible by fsdp={fsdp}; not split over fsdp")
            elif not placed[0][where[0]]:  # a dim nothing else splits
                d = where[0]
                steps.append(f"fsdp: dim {d} ({shape[d]}) <- {axis!r}({fsdp})")
            else:  # joined a tp/ep-split dim
                d, split = where
                steps.append(f"fsdp: dim {d} ({shape[d]}) <- {key[d]!r} ({split} ways)")
        text = "; ".join(s for s in steps if s)
        if not text:
            ep = axis_sizes.get(self.ep_axis, 1)
            text = (f"not an expert weight; not split over ep={ep}; replicated" if ep > 1
                    else "no axis of size > 1 to place; replicated")
        return Decision(self._spec_of(key), text, self.name)

    def _placed_for(self, lay: LeafLayout, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> _Placed | Decision:
        """:meth:`_place_tp_ep` for the mesh's tp and ep, memoized: the search asks each leaf for
        every (fsdp, tp, ep) and only fsdp's placement reads the other two."""
        tp = axis_sizes.get(self.tp_axis, 1)
        ep = axis_sizes.get(self.ep_axis, 1)
        # Layouts live in self._layouts for the rule's lifetime, so id() names one for as long as
        # the memo exists.
        placed_key = (id(lay), shape, tp, ep)
        placed = self._placed.get(placed_key)
        if placed is None:
            placed = self._placed[placed_key] = self._place_tp_ep(lay, shape, tp, ep)
        return placed

    def _entries(self, placed: _Placed, shape: tuple[int, ...], axis_sizes: Mapping[str, int]
                 ) -> tuple[tuple[tuple[str, ...], ...], tuple[int, int] | None]:
        """The leaf's entries with fsdp placed, and where it went: ``(dim, ways that dim is then
        split)``, ``None`` when fsdp is 1 or no dim can take it."""
        first, _, order = placed
        fsdp = axis_sizes.get(self.fsdp_axis, 1)
        if fsdp <= 1:
            return first, None
        where = self._fsdp_dim(shape, fsdp, axis_sizes, first, order)
        if where is None:
            return first, None
        d = where[0]
        return first[:d] + (first[d] + (self.fsdp_axis,),) + first[d + 1:], where

    def _spec_of(self, key: tuple[tuple[str, ...], ...]) -> PartitionSpec:
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = spec_from_entries(key)
        return spec

    def _place_tp_ep(self, lay: LeafLayout, shape: tuple[int, ...], tp: int, ep: int) -> _Placed | Decision:
        """The entries and reasons after placing tp and ep, and the order fsdp tries the dims in;
        the whole decision for a leaf below ``min_shard_size``."""
        n = math.prod(shape)
        if n < self.min_shard_size:
            return Decision(make_spec(), f"{n} elements < min_shard_size={self.min_shard_size}; replicated",
                            self.name)
        first: list[tuple[str, ...]] = [()] * len(shape)
        done: list[str] = []
        if tp > 1:
            done.append(self._place_tp(lay, shape, tp, first))
        if ep > 1:
            done.append(self._place_ep(lay, shape, ep, first))
        # A scanned layer stack goes last for fsdp: splitting it puts whole layers on one device.
        order = self._orders.get((id(lay), shape))
        if order is None:
            order = self._orders[(id(lay), shape)] = tuple(
                sorted(range(len(shape)), key=lambda d: (lay.dims[d] == "layers", -shape[d], d)))
        return tuple(first), tuple(done), order

    def _place_tp(self, lay: LeafLayout, shape: tuple[int, ...], tp: int, entries: list[tuple[str, ...]]) -> str:
        axis, module = self.tp_axis, lay.module
        if lay.role == "other":
            return f"{module}/{lay.param}: not a tensor-parallel layer; not split over tp={tp}"
        if lay.heads in {"q", "o"} and self.num_heads is not None and self.num_heads % tp:
            return f"{module}: tp={tp} does not divide {self.num_heads} heads; not split over tp"
        if lay.heads == "kv" and self.num_kv_heads is not None and self.num_kv_heads % tp:
            return (f"{module}: tp={tp} does not divide {self.num_kv_heads} kv heads; kept whole on "
                    "every tp rank")
        kind = {"column": "column-parallel", "row": "row-parallel", "vocab": "vocab-parallel"}[lay.role]
        if lay.role == "row" and lay.param in {"bias", "b"}:
            return f"{module} {kind} bias: added after the tp all-reduce; not split over tp={tp}"
        wanted = {"column": ("heads", "out", "vocab"), "row": ("heads", "in"), "vocab": ("vocab",)}[lay.role]
        dim = next((d for d in (lay.dim(k) for k in wanted) if d is not None), None)
        if dim is None:
            return f"{module} {kind}: no {'/'.join(wanted)} dim in {lay.dims}; not split over tp={tp}"
        if shape[dim] % tp:
            return f"{module} {kind}: dim {dim} ({shape[dim]}) not divisible by tp={tp}; not split over tp"
        entries[dim] = (axis,)
        return f"{module} {kind}: dim {dim} ({shape[dim]}) <- {axis!r}({tp})"

    def _place_ep(self, lay: LeafLayout, shape: tuple[int, ...], ep: int, entries: list[tuple[str, ...]]) -> str:
        if lay.per_expert:
            return "per-expert leaf: ep cannot split it (stack the experts for expert parallelism)"
        dim = lay.dim("experts")
        if dim is None:
            return ""  # said in _decide only when nothing else is (every dense leaf would repeat it)
        if self.num_experts is not None and shape[dim] != self.num_experts:
            return f"experts: dim {dim} ({shape[dim]}) is not the {self.num_experts} experts; not split over ep"
        if shape[dim] % ep:
            return f"experts: dim {dim} ({shape[dim]}) not divisible by ep={ep}; not split over ep"
        entries[dim] = (self.ep_axis,)
        return f"experts: dim {dim} ({shape[dim]}) <- {self.ep_axis!r}({ep})"

    @staticmethod
    def _fsdp_dim(shape: tuple[int, ...], fsdp: int, sizes: Mapping[str, int], first: tuple[tuple[str, ...], ...],
                  order: tuple[int, ...]) -> tuple[int, int] | None:
        """Where fsdp goes: the first free dim it divides in ``order``, else the first tp/ep-split
        dim that can take both; ``(dim, ways that dim is then split)``, or ``None``."""
        for d in order:
            if not first[d] and shape[d] % fsdp == 0:
                return d, fsdp
        for d in order:
            if first[d]:
                split = math.prod(sizes[a] for a in first[d]) * fsdp
                if shape[d] % split == 0:
                    return d, split
        return None


_OPTIONS = frozenset(f.name for f in dataclasses.fields(AxisKindRule) if not f.name.startswith("_")) - {
    "num_heads", "num_kv_heads", "num_experts"}
"""What :meth:`AxisKindRule.for_model` passes on: the fields a ModelSpec does not give."""


def _compile_dims(dims: Any) -> tuple[tuple[tuple[str, tuple[str, ...]], ...],
                                      tuple[tuple[re.Pattern[str], tuple[str, ...]], ...]]:
    """``dims`` as ``(regex, kinds)`` pairs and their compiled patterns, every bad pair named at once.

    Raises:
      MeshplanTypeError: ``dims`` is not a sequence (a string, a mapping, a number).
      ShardingRuleError: a pair that is not ``(regex str, sequence of kinds)``, an invalid regex or
        an unknown kind.
    """
    rows = as_sequence(dims, "dims")
    pairs, out, problems = [], [], []
    for k, row in enumerate(rows):
        if not (isinstance(row, tuple | list) and len(row) == 2 and isinstance(row[0], str)):
            problems.append(f"dims #{k} {row!r:.80} is not a (regex str, kinds) pair")
            continue
        pattern, kinds = row
        if isinstance(kinds, str) or not isinstance(kinds, Sequence):
            problems.append(f"dims #{k} {pattern!r}: kinds={kinds!r:.60} is not a sequence of dim kinds")
            continue
        bad = [x for x in kinds if not (isinstance(x, str) and x in DIM_KINDS)]
        if bad:
            problems.append(f"dims #{k} {pattern!r}: unknown kinds {bad} (valid: {list(DIM_KINDS)})")
            continue
        try:
            out.append((re.compile(pattern), tuple(kinds)))
        except re.error as err:
            problems.append(f"dims #{k} pattern {pattern!r} is not a valid regex ({err})")
            continue
        pairs.append((pattern, tuple(kinds)))
    if problems:
        raise ShardingRuleError("invalid dims overrides: " + "; ".join(problems) + ".")
    return tuple(pairs), tuple(out)
