"""Sharding rules bound to a mesh: the reference's class names over pure rules.

Each built-in rule holds a pure rule (:mod:`meshplan.pure`) and a mesh; its
``plan(pytree)`` hands the tree and the mesh's axis sizes to
:func:`meshplan.pure.plan_tree` and returns the :class:`~meshplan.pure.Plan`
(specs plus the reason for each); ``apply(pytree)`` returns just the specs.

Which mesh: the ``mesh`` argument (a ``Mesh`` or ``AbstractMesh``); else the
mesh current when the rule is built (``jax.set_mesh``); else the one current
when it is applied. ``ShapeBasedShardingRule`` takes ``mesh`` as a keyword;
inside a ``CompositeShardingRule`` a rule without a mesh uses its siblings'.
``ShapeBasedShardingRule`` also works with no mesh at all (eformer's
``ShapeBasedShardingRule(patterns).apply(params)``): each matched pattern's
spec is returned after the checks that need no mesh (rank, spec form), and
checked against the mesh whenever one is known. The auto and memory rules
need axis sizes to decide anything, so without a mesh they raise
``NoMeshError``.

User subclasses of :class:`ShardingRule` that only define ``apply`` (the
reference's ``CustomRule`` example) work everywhere, including inside
:class:`CompositeShardingRule`, whose other rules still short-circuit per
leaf. Differences from eformer: defaults work out of the box
(``min_shard_size=None`` means 1024), specs are always storable, results do
not depend on hash order, shape patterns that do not fit raise, and the
memory rule never returns an over-budget spec (:class:`MemoryBudgetError`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

from jax.sharding import AbstractMesh, Mesh

from meshplan.facade._context import current_mesh, require_mesh, x64_enabled
from meshplan.facade._planning import plan_live
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._auto import AutoRule
from meshplan.pure.rules._base import Rule, select_axes
from meshplan.pure.rules._composite import CompositeRule
from meshplan.pure.rules._engine import Plan, plan_from_specs
from meshplan.pure.rules._memory import MemoryRule
from meshplan.pure.rules._replay import PlanRule
from meshplan.pure.rules._shape import ShapePatternRule

__all__ = [
    "AutoShardingRule",
    "CompositeShardingRule",
    "MemoryConstrainedShardingRule",
    "ShapeBasedShardingRule",
    "ShardingRule",
]

AxisSizes = dict[str, int]


def _check_mesh(mesh: Any, owner: str) -> Mesh | AbstractMesh | None:
    return require_mesh(mesh, owner, optional=True)


def _sizes_of(mesh: Mesh | AbstractMesh) -> AxisSizes:
    return dict(mesh.shape)


class ShardingRule(abc.ABC):
    """A strategy that gives every array leaf of a pytree a PartitionSpec.

    Subclasses define ``apply(pytree) -> spec tree``. ``plan(pytree)``
    returns the same specs as a :class:`~meshplan.pure.Plan`, with a reason
    per leaf; for a subclass that only defines ``apply`` every reason is
    "returned by <Class>.apply".

    Example:
      >>> import jax
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> class Everything(ShardingRule):
      ...     def apply(self, pytree):
      ...         return jax.tree_util.tree_map(lambda x: P("dp"), pytree)
      >>> Everything().plan({"w": np.zeros((4, 4))}).explain("w")
      "w: (4, 4) float64 -> P('dp',) [Everything] returned by Everything.apply"
    """

    @abc.abstractmethod
    def apply(self, pytree: Any) -> Any:
        """The spec tree for ``pytree`` (same structure, a PartitionSpec per array leaf)."""

    def plan(self, pytree: Any) -> Plan:
        """The specs for ``pytree`` with the reason for each leaf."""
        name = type(self).__name__
        return plan_from_specs(pytree, self.apply(pytree), rule=name, reason=f"returned by {name}.apply",
                               x64=x64_enabled())

    def _pure(self, pytree: Any, *, meshless: bool = False) -> tuple[Rule, AxisSizes | None]:
        """This rule as a pure rule for ``pytree``, and the axis sizes it is bound to (if any).

        ``meshless``: no mesh is known anywhere (none given, none current).
        """
        return PlanRule(self.plan(pytree)), None


class _MeshRule(ShardingRule):
    """A built-in rule: a pure rule plus a mesh."""

    needs_mesh = True
    """Whether the rule can decide nothing without axis sizes (see :meth:`_meshless_rule`)."""

    def __init__(self, mesh: Mesh | AbstractMesh | None) -> None:
        self.mesh = _check_mesh(mesh, type(self).__name__)

    def _meshless_rule(self) -> Rule:
        """The pure rule to use when no mesh is known (only for ``needs_mesh = False``)."""
        raise NotImplementedError(type(self).__name__)

    @property
    @abc.abstractmethod
    def pure_rule(self) -> Rule:
        """The pure rule this class binds to a mesh."""

    def _check_axis_names(self, axis_names: Sequence[str] | None) -> None:
        """Unknown axis names fail when the rule is built, if its mesh is known by then."""
        if self.mesh is not None:
            select_axes(axis_names, _sizes_of(self.mesh), type(self).__name__)

    def _axis_sizes(self) -> AxisSizes | None:
        mesh = self.mesh if self.mesh is not None else current_mesh()
        return None if mesh is None else _sizes_of(mesh)

    def _customised(self) -> bool:
        # A subclass that overrides apply or plan decides itself; the
        # built-in pure rule must not bypass it inside a composite.
        cls = type(self)
        return cls.apply is not _MeshRule.apply or cls.plan is not _MeshRule.plan

    def _builtin_plan(self, pytree: Any) -> Plan:
        sizes = self._axis_sizes()
        if sizes is None:
            if not self.needs_mesh:
                return plan_live(pytree, self._meshless_rule(), {})
            mesh = require_mesh(None, type(self).__name__)  # raises NoMeshError: there is none
            sizes = {} if mesh is None else _sizes_of(mesh)
        return plan_live(pytree, self.pure_rule, sizes)

    def apply(self, pytree: Any) -> Any:
        """The spec tree for ``pytree`` (same structure, a PartitionSpec per array leaf)."""
        if type(self).plan is not _MeshRule.plan:
            return self.plan(pytree).specs
        return self._builtin_plan(pytree).specs

    def plan(self, pytree: Any) -> Plan:
        """The specs for ``pytree`` with the reason for each leaf."""
        if type(self).apply is not _MeshRule.apply:
            return ShardingRule.plan(self, pytree)
        return self._builtin_plan(pytree)

    def _pure(self, pytree: Any, *, meshless: bool = False) -> tuple[Rule, AxisSizes | None]:
        if self._customised():
            return ShardingRule._pure(self, pytree)
        if meshless and not self.needs_mesh:
            return self._meshless_rule(), None
        return self.pure_rule, self._axis_sizes()

    def __repr__(self) -> str:
        mesh = None if self.mesh is None else _sizes_of(self.mesh)
        return f"{type(self).__name__}({self.pure_rule!r}, mesh={mesh})"


class AutoShardingRule(_MeshRule):
    """Give the largest dims the first mesh axes that divide them.

    Args:
      mesh: the mesh (default: the current one, see the module docstring).
      axis_names: axes to use, in preference order (default: mesh order).
      min_shard_size: leaves with fewer elements stay replicated (``None`` = 1024).
      reverse: visit the smallest dims first.

    See :mod:`meshplan.pure.rules._auto` for the exact algorithm.

    Example:
      >>> import jax
      >>> import numpy as np
      >>> from jax.sharding import AxisType
      >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
      >>> rule = AutoShardingRule(mesh=mesh, axis_names=["dp", "tp"])
      >>> rule.apply({"w": np.zeros((1024, 4096), np.float32), "b": np.zeros(16)})
      {'b': P(), 'w': P('tp', 'dp')}
    """

    def __init__(
        self,
        mesh: Mesh | AbstractMesh | None = None,
        axis_names: list[str] | None = None,
        min_shard_size: int | None = None,
        reverse: bool = False,
    ) -> None:
        super().__init__(mesh)
        self._rule = AutoRule(axis_names=axis_names, min_shard_size=min_shard_size, reverse=reverse)
        self._check_axis_names(self._rule.axis_names)
        self.axis_names = None if self._rule.axis_names is None else list(self._rule.axis_names)
        self.min_shard_size = self._rule.min_shard_size
        self.reverse = reverse

    @property
    def pure_rule(self) -> AutoRule:
        """The pure :class:`~meshplan.pure.AutoRule`."""
        return self._rule


class ShapeBasedShardingRule(_MeshRule):
    """Specs for leaves whose shapes match patterns (``None`` matches any size).

    Args:
      shape_patterns: ``{pattern: PartitionSpec}``, tried in insertion order;
        the first pattern of the leaf's rank that matches wins. Unmatched
        leaves are replicated.
      mesh: the mesh the specs must fit (keyword; default: the current one,
        or the composite's). With no mesh anywhere the matched specs are
        returned unchecked against a mesh (their rank and form are checked).

    Raises:
      ShardingRuleError: (when applied) a matched pattern's spec does not fit
        the mesh or the leaf's shape; the message names both.

    Example:
      >>> import jax
      >>> import numpy as np
      >>> from jax.sharding import AxisType, PartitionSpec as P
      >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
      >>> rule = ShapeBasedShardingRule({(None, 1024): P("tp", None)}, mesh=mesh)
      >>> rule.apply({"emb": np.zeros((32000, 1024), np.int8), "b": np.zeros(8)})
      {'b': P(), 'emb': P('tp', None)}
      >>> ShapeBasedShardingRule({(None, 1024): P("tp", None)}).apply({"emb": np.zeros((64, 1024))})
      {'emb': P('tp', None)}
    """

    needs_mesh = False

    def __init__(self, shape_patterns: Any, *, mesh: Mesh | AbstractMesh | None = None) -> None:
        super().__init__(mesh)
        self._rule = ShapePatternRule(shape_patterns)
        self.shape_patterns = dict(self._rule.patterns)

    @property
    def pure_rule(self) -> ShapePatternRule:
        """The pure :class:`~meshplan.pure.ShapePatternRule`."""
        return self._rule

    def _meshless_rule(self) -> Rule:
        return dataclasses.replace(self._rule, check_mesh=False)


class MemoryConstrainedShardingRule(_MeshRule):
    """Split each leaf just enough to fit ``max_memory_per_device`` bytes.

    Args:
      max_memory_per_device: per-device budget for one leaf, in bytes.
      mesh: the mesh (default: the current one).
      axis_names: axes it may use (default: all).

    Raises:
      MemoryBudgetError: (when applied) a leaf cannot fit even fully split;
        the message names it, its best bytes per device and the budget.

    Example:
      >>> import jax
      >>> import numpy as np
      >>> from jax.sharding import AxisType
      >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
      >>> rule = MemoryConstrainedShardingRule(2 * 1024**2, mesh=mesh)
      >>> rule.plan({"w": jax.ShapeDtypeStruct((4096, 1024), np.float32)}).specs
      {'w': P(('tp', 'dp'),)}
    """

    def __init__(
        self,
        max_memory_per_device: int,
        mesh: Mesh | AbstractMesh | None = None,
        axis_names: list[str] | None = None,
    ) -> None:
        super().__init__(mesh)
        self._rule = MemoryRule(max_memory_per_device, axis_names=axis_names)
        self._check_axis_names(self._rule.axis_names)
        self.max_memory_per_device = self._rule.max_memory_per_device
        self.axis_names = None if self._rule.axis_names is None else list(self._rule.axis_names)

    @property
    def pure_rule(self) -> MemoryRule:
        """The pure :class:`~meshplan.pure.MemoryRule`."""
        return self._rule


AnyRule = ShardingRule | Rule
"""What CompositeShardingRule takes: a facade rule, any object with ``apply(pytree)``, or a pure rule."""


def _as_pure(rule: AnyRule, pytree: Any, meshless: bool) -> tuple[Rule, AxisSizes | None]:
    if isinstance(rule, ShardingRule):
        return rule._pure(pytree, meshless=meshless)
    apply = getattr(rule, "apply", None)
    if callable(apply):
        name = type(rule).__name__
        plan = plan_from_specs(pytree, apply(pytree), rule=name, reason=f"returned by {name}.apply",
                               x64=x64_enabled())
        return PlanRule(plan), None
    return rule, None  # a pure rule (checked callable by CompositeRule)


class CompositeShardingRule(ShardingRule):
    """Try rules in order; each leaf gets the first spec that shards something.

    ``None`` answers and all-``None`` specs (``P()``, ``P(None, None)``) pass
    the leaf on; if no rule shards it, it is replicated. Rules may be the
    built-in classes, user subclasses of :class:`ShardingRule` (or any object
    with ``apply``), or pure rules (``rule(ctx) -> Decision | None``). Built-in
    rules must share one mesh; one without a mesh uses the others'.

    Raises:
      ShardingRuleError: no rules, or rules bound to different meshes.

    Example:
      >>> import jax
      >>> import numpy as np
      >>> from jax.sharding import AxisType, PartitionSpec as P
      >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
      >>> rule = CompositeShardingRule(ShapeBasedShardingRule({(None, 1024): P("tp")}),
      ...                              AutoShardingRule(mesh=mesh))
      >>> plan = rule.plan({"emb": np.zeros((32000, 1024), np.int8), "w": np.zeros((64, 4096), np.int8)})
      >>> plan.specs
      {'emb': P('tp',), 'w': P('tp', 'dp')}
      >>> plan.explain("w")
      "w: (64, 4096) int8 -> P('tp', 'dp') [auto] auto won (rule 2 of 2; shape: no opinion): largest dims first: dim 1 (4096) <- 'dp'(2), dim 0 (64) <- 'tp'(4)"
    """

    def __init__(self, *rules: AnyRule) -> None:
        if not rules:
            raise ShardingRuleError("CompositeShardingRule needs at least one rule, e.g. "
                                    "CompositeShardingRule(shape_rule, AutoShardingRule(mesh=mesh)).")
        bad = [r for r in rules if not (isinstance(r, ShardingRule) or callable(getattr(r, "apply", None))
                                        or callable(r))]
        if bad:
            raise MeshplanTypeError(f"CompositeShardingRule: {bad} are not rules (no apply(), not callable).")
        self.rules = tuple(rules)

    def _builtin_rules(self) -> list[_MeshRule]:
        """The built-in rules inside (nested composites included) that plan with their own pure rule."""
        out: list[_MeshRule] = []
        for rule in self.rules:
            if isinstance(rule, _MeshRule) and not rule._customised():
                out.append(rule)
            elif isinstance(rule, CompositeShardingRule):
                out.extend(rule._builtin_rules())
        return out

    def _pure(self, pytree: Any, *, meshless: bool = False) -> tuple[Rule, AxisSizes | None]:
        if type(self).apply is not CompositeShardingRule.apply:
            return ShardingRule._pure(self, pytree)
        parts = [_as_pure(rule, pytree, meshless) for rule in self.rules]
        bound = {tuple(sizes.items()) for _, sizes in parts if sizes is not None}
        if len(bound) > 1:
            listed = ", ".join(str(dict(b)) for b in sorted(bound))
            raise ShardingRuleError(
                f"CompositeShardingRule: its rules are bound to different meshes ({listed}); "
                "give every rule the same mesh."
            )
        sizes = dict(bound.pop()) if bound else None
        return CompositeRule(tuple(rule for rule, _ in parts)), sizes

    def apply(self, pytree: Any) -> Any:
        """The spec tree for ``pytree``: per leaf, the first rule's spec that shards something."""
        return self.plan(pytree).specs

    def plan(self, pytree: Any) -> Plan:
        """The specs for ``pytree`` with, per leaf, which rule won and why."""
        builtins = self._builtin_rules()
        # No mesh anywhere (none given to a rule, none current): shape rules
        # still answer, unchecked against a mesh; rules that need one raise.
        meshless = current_mesh() is None and all(r.mesh is None for r in builtins)
        if meshless and any(r.needs_mesh for r in builtins):
            require_mesh(None, "CompositeShardingRule")  # raises NoMeshError
        rule, sizes = self._pure(pytree, meshless=meshless)
        if sizes is None:
            mesh = current_mesh()
            sizes = {} if mesh is None else _sizes_of(mesh)
        return plan_live(pytree, rule, sizes)

    def __repr__(self) -> str:
        return f"CompositeShardingRule({', '.join(map(repr, self.rules))})"
