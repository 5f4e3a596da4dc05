"""The pure rule protocol: one leaf's facts in, a decision (or no opinion) out.

A *pure rule* (:class:`Rule`) is an immutable callable ``rule(ctx) -> Decision | None``:

* ``ctx`` is a :class:`LeafContext`: the leaf's shape, dtype, the mesh axis
  sizes, and (lazily) its path in the tree;
* a :class:`Decision` is the spec plus a one-line reason and the rule's name;
* ``None`` means "no opinion" (the planner then replicates the leaf).

Rules may declare ``shape_only = True`` when their answer depends on shape,
dtype and axis sizes alone; :func:`meshplan.pure.plan_tree` then asks them
once per distinct ``(shape, dtype)`` and reuses the answer, so a 50k-leaf
tree with a few dozen distinct shapes costs about one tree walk. Rules that
read ``ctx.path`` (path/regex or logical-axis rules) leave it ``False`` and
are asked once per leaf. Plain functions are rules too (``shape_only`` is
then ``False``).

The optional hints (``name``, ``shape_only``, ``group_key``, ``reads_axes``)
have one reader each here, with the defaults :class:`Rule` lists; :func:`ask`
is the one checked call. The built-in rules live beside this module
(``_auto``, ``_shape``, ``_memory``, ``_composite``, ``_path``, ``_axis_kind``,
``_suggest``, ``_replay``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_int_tuple, as_sequence, canonical_axis_sizes
from meshplan.pure._types import FrozenAxisSizes, Shape
from meshplan.pure.errors import (
    MemoryBudgetError,
    MeshplanTypeError,
    ShardingRuleError,
    SpecError,
)

__all__ = [
    "LEAF_ERRORS",
    "Decision",
    "LeafContext",
    "Rule",
    "as_rule",
    "ask",
    "group_key_fn",
    "is_shape_only",
    "reads_axes",
    "rule_name",
    "shards_something",
]


def canonical_shape(shape: Any) -> Shape:
    """A leaf shape as a tuple of non-negative Python ints."""
    out = as_int_tuple(shape, "shape")
    if any(d < 0 for d in out):
        raise MeshplanTypeError(f"shape={out} has negative dims; array dims are >= 0.")
    return out


def canonical_axis_names(axis_names: Any, what: str) -> tuple[str, ...] | None:
    """A rule's ``axis_names`` option: ``None`` (every mesh axis) or a tuple of unique names."""
    if axis_names is None:
        return None
    names = as_sequence(axis_names, what)
    not_str = [n for n in names if not isinstance(n, str)]
    if not_str:
        raise MeshplanTypeError(f"{what}={names!r} holds non-string names {not_str}.")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ShardingRuleError(f"{what}={names!r} repeats {repeated}; list each mesh axis once.")
    return names


def select_axes(axis_names: Sequence[str] | None, axis_sizes: Mapping[str, int], rule: str) -> tuple[str, ...]:
    """The axes a rule may spend, in its order: ``axis_names`` or mesh order.

    Raises:
      ShardingRuleError: ``axis_names`` names an axis the mesh lacks.
    """
    if axis_names is None:
        return tuple(axis_sizes)
    unknown = [n for n in axis_names if n not in axis_sizes]
    if unknown:
        raise ShardingRuleError(
            f"{rule} rule: axis_names={list(axis_names)} includes {unknown}, not axes of the mesh "
            f"(mesh axes: {list(axis_sizes)}); drop them or use a mesh that has them."
        )
    return tuple(axis_names)


def shards_something(spec: PartitionSpec) -> bool:
    """Whether a spec splits anything (an all-``None`` spec does not).

    Example:
      >>> shards_something(PartitionSpec(None, None)), shards_something(PartitionSpec(None, "tp"))
      (False, True)
    """
    if not isinstance(spec, PartitionSpec):
        raise MeshplanTypeError(f"spec={spec!r:.80} must be a PartitionSpec, not {type(spec).__name__}.")
    return any(entry is not None for entry in spec)


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What a rule decided for one leaf, and why.

    Attributes:
      spec: the PartitionSpec for the leaf.
      reason: one line a person can read ("dim 0 (4096) <- 'tp' (4)").
      rule: the name of the rule that decided ("auto", "shape", ...).

    Example:
      >>> Decision(PartitionSpec("tp"), "dim 0 (4096) <- 'tp' (4)", "auto").spec
      P('tp',)
    """

    spec: PartitionSpec
    reason: str
    rule: str

    def __post_init__(self) -> None:
        if not isinstance(self.spec, PartitionSpec):
            raise MeshplanTypeError(f"Decision.spec must be a PartitionSpec, got {self.spec!r}.")
        if not isinstance(self.reason, str) or not isinstance(self.rule, str):
            raise MeshplanTypeError(
                f"Decision.reason and Decision.rule must be strings, got {self.reason!r}, {self.rule!r}."
            )


class LeafPaths(Protocol):
    """Where a context finds its leaf's key path (a :class:`~meshplan.pure.TreeFacts`)."""

    @property
    def keypaths(self) -> tuple[Any, ...]: ...

    def path(self, i: int) -> str: ...


@dataclasses.dataclass(frozen=True, slots=True)
class LeafContext:
    """The facts a rule may use about one leaf.

    Attributes:
      shape: the leaf's global shape.
      dtype: its dtype.
      axis_sizes: read-only ordered mapping mesh axis name -> size.
      index: the leaf's position in the flattened tree (0 outside a tree).
      paths: the tree's :class:`~meshplan.pure.TreeFacts`, where ``path`` and
        ``keypath`` are looked up (lazily); ``None`` outside a tree.

    Shape-only rules are asked once per distinct (shape, dtype); their
    context carries the first such leaf's index, so ``path`` in an error
    message names a real leaf (the planner adds how many others share it).

    Example:
      >>> import numpy as np
      >>> ctx = LeafContext((1024, 64), np.dtype("float32"), {"tp": 4})
      >>> ctx.num_elements, ctx.path
      (65536, '<leaf>')
    """

    shape: Shape
    dtype: Any
    axis_sizes: Mapping[str, int]
    index: int = 0
    paths: LeafPaths | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple):
            if isinstance(self.shape, str) or not isinstance(self.shape, Sequence):
                raise MeshplanTypeError(f"LeafContext.shape must be a tuple of ints, got {self.shape!r}.")
            object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "axis_sizes", canonical_axis_sizes(self.axis_sizes))

    @classmethod
    def trusted(cls, shape: Shape, dtype: Any, axis_sizes: FrozenAxisSizes, index: int,
                paths: LeafPaths | None) -> LeafContext:
        """The context without :meth:`__post_init__`'s checks, for a caller whose ``shape`` is a
        tuple and whose ``axis_sizes`` came from :func:`~meshplan.pure._check.canonical_axis_sizes`
        (the mesh search asks its rule thousands of times with such values).

        Example:
          >>> import numpy as np
          >>> from meshplan.pure._check import canonical_axis_sizes
          >>> sizes = canonical_axis_sizes({"tp": 4})
          >>> LeafContext.trusted((8,), np.dtype("float32"), sizes, 0, None) == LeafContext((8,), np.dtype("float32"), sizes)
          True
        """
        out = object.__new__(cls)
        setattr_ = object.__setattr__
        setattr_(out, "shape", shape)
        setattr_(out, "dtype", dtype)
        setattr_(out, "axis_sizes", axis_sizes)
        setattr_(out, "index", index)
        setattr_(out, "paths", paths)
        return out

    @property
    def num_elements(self) -> int:
        """Number of elements of the leaf."""
        return math.prod(self.shape)

    @property
    def keypath(self) -> tuple[Any, ...]:
        """The leaf's jax key path (``()`` outside a tree)."""
        return () if self.paths is None else self.paths.keypaths[self.index]

    @property
    def path(self) -> str:
        """The leaf's path as ``"a/b/0"`` (``"<leaf>"`` outside a tree)."""
        return "<leaf>" if self.paths is None else self.paths.path(self.index)


@runtime_checkable
class Rule(Protocol):
    """What the planner calls: ``rule(ctx) -> Decision | None``.

    Plain functions are rules. A rule may also declare these hints, which the
    planner and the search read with :func:`rule_name`, :func:`is_shape_only`,
    :func:`declared_group_key` and :func:`reads_axes` (the defaults apply when
    a hint is missing):

    * ``name: str``: labels its decisions (default: its function or class name);
    * ``shape_only: bool``: the answer depends on ``ctx.shape``, ``ctx.dtype``
      and ``ctx.axis_sizes`` only (default ``False``);
    * ``group_key(ctx) -> Hashable``: leaves with equal keys get equal
      decisions on every mesh (default ``None``: no promise);
    * ``reads_axes: tuple[str, ...]``: the only axes whose sizes change its
      answers (default ``None``: possibly all);
    * ``template_group(template) -> bool``: True when every leaf whose path has
      this :func:`~meshplan.pure.rules.path_template` gets the same decision for
      the same shape, dtype and axis sizes; :func:`plan_tree` then asks it once
      per (template, shape, dtype) instead of once per leaf (default: no promise).
    """

    def __call__(self, ctx: LeafContext) -> Decision | None: ...


GroupKey: TypeAlias = Callable[[LeafContext], Hashable]
"""``ctx -> key``: leaves with equal keys get equal decisions from one rule."""

LEAF_ERRORS: tuple[type[Exception], ...] = (ShardingRuleError, MemoryBudgetError, SpecError)
"""Errors a rule raises about one leaf (its spec cannot be made). Planners collect
or report them per leaf; any other error (a misconfigured rule) propagates at once."""


def as_rule(value: Any, what: str = "rule") -> Rule:
    """``value`` checked to be a rule: a callable ``ctx -> Decision | None`` that is not a class.

    The one check of every place a rule is taken (``plan_tree``, a composite's rules, a fallback). A class
    is callable too, but calling it with a leaf constructs something from the leaf (``AutoRule`` for
    ``AutoRule()``; ``int`` raises a raw TypeError): refused up front, with the fix.

    Raises:
      MeshplanTypeError: not callable, or a class.

    Example:
      >>> from meshplan.pure.rules import AutoRule
      >>> as_rule(AutoRule)
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: rule=AutoRule is a class, not a rule; pass an instance (AutoRule(...)).
    """
    if isinstance(value, type):
        raise MeshplanTypeError(f"{what}={value.__name__} is a class, not a rule; pass an instance "
                                f"({value.__name__}(...)).")
    if not callable(value):
        raise MeshplanTypeError(f"{what}={value!r:.80} is not a rule (not callable); pass a pure rule such as "
                                "AutoRule().")
    rule: Rule = value  # callable and not a class: what a Rule is to the planner
    return rule


def rule_name(rule: Rule) -> str:
    """A rule's display name: its ``name``, else its function or class name."""
    name = getattr(rule, "name", None)
    if isinstance(name, str):
        return name
    found = getattr(rule, "__name__", None)
    return found if isinstance(found, str) else type(rule).__name__


def is_shape_only(rule: Rule) -> bool:
    """Whether the planner may ask ``rule`` once per distinct (shape, dtype) (default False)."""
    return getattr(rule, "shape_only", False) is True


def declared_group_key(rule: Rule) -> GroupKey | None:
    """The rule's own ``group_key`` (``None`` when it makes no promise)."""
    key = getattr(rule, "group_key", None)
    return key if callable(key) else None


def as_context(ctx: Any) -> LeafContext:
    """``ctx`` checked to be a :class:`LeafContext` (what the engine passes a rule's methods)."""
    if not isinstance(ctx, LeafContext):
        raise MeshplanTypeError(f"ctx={ctx!r:.80} must be a LeafContext (the engine builds one per leaf), not "
                                f"{type(ctx).__name__}.")
    return ctx


def _shape_key(ctx: LeafContext) -> Hashable:
    return (ctx.shape, ctx.dtype)


def _leaf_key(ctx: LeafContext) -> Hashable:
    return ("leaf", ctx.index)


def group_key_fn(rule: Rule) -> GroupKey:
    """``ctx -> key`` such that leaves with equal keys get equal decisions from ``rule``.

    The rule's ``group_key`` when it declares one, ``(shape, dtype)`` for
    shape-only rules, else the leaf index (one group per leaf: right for any
    rule, just slower).
    """
    key = declared_group_key(rule)
    if key is not None:
        return key
    return _shape_key if is_shape_only(rule) else _leaf_key


def declared_template_group(rule: Rule) -> Callable[[str], bool] | None:
    """The rule's own ``template_group`` (``None`` when it makes no promise)."""
    found = getattr(rule, "template_group", None)
    return found if callable(found) else None


def reads_axes(rule: Rule) -> tuple[str, ...] | None:
    """The axes whose sizes ``rule``'s answers depend on (``None``: possibly all; the default)."""
    found = getattr(rule, "reads_axes", None)
    return tuple(found) if isinstance(found, tuple | list) else None


def ask(rule: Rule, ctx: LeafContext) -> Decision | None:
    """``rule(ctx)``, checked: a rule returns a :class:`Decision` or ``None``.

    Raises:
      MeshplanTypeError: the rule returned anything else.
    """
    decision = rule(ctx)
    if decision is not None and not isinstance(decision, Decision):
        raise MeshplanTypeError(
            f"{ctx.path}: rule {rule_name(rule)!r} returned {decision!r}; a rule returns a Decision or None."
        )
    return decision


def format_axes(axes: Sequence[str], axis_sizes: Mapping[str, int]) -> str:
    """``'fsdp'(4)*'sp'(2)`` for a reason string."""
    # "*" reads as "split by the product", which is what a tuple entry means.
    return "*".join(f"{a!r}({axis_sizes[a]})" for a in axes)
