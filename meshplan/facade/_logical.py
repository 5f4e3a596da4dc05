"""Logical-axis rules over live flax trees: names read from flax metadata, resolved by the pure LogicalRule.

flax records a parameter's logical axis names on its box:

* linen: ``nn.Partitioned`` / ``nn.LogicallyPartitioned`` (``nn.with_partitioning``,
  ``nn.with_logical_partitioning``) hold them in ``.names``;
* nnx: a ``Variable`` holds them in its ``out_sharding`` metadata
  (``nnx.with_partitioning``, ``Param(..., out_sharding=...)``); flax 0.12
  still reads the older ``sharding_names`` / ``sharding`` spellings, and so
  does :func:`logical_names`;
* ``nn.get_partition_spec(variables)`` / ``nnx.get_partition_spec(state)``
  return them as PartitionSpecs of names.

:func:`logical_names` gathers them (path -> names); :class:`LogicalShardingRule`
is the :class:`~meshplan.facade._rules.ShardingRule` form that reads them from
the tree it is applied to and resolves them with
:class:`~meshplan.pure.LogicalRule` (flax's resolution, divisibility-aware). It
composes with :class:`~meshplan.CompositeShardingRule` like the built-in rules.
Boxes are recognised by their attributes, so flax is never imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import AbstractMesh, Mesh, PartitionSpec

from meshplan.facade._context import require_mesh
from meshplan.facade._planning import plan_live
from meshplan.facade._rules import AxisSizes, _MeshRule, _sizes_of
from meshplan.pure.rules._base import Rule
from meshplan.pure.rules._conventions import normalize_path
from meshplan.pure.rules._engine import Plan
from meshplan.pure.rules._logical import (
    LogicalNames,
    LogicalRule,
    canonical_logical_names,
    logical_names_by_path,
)
from meshplan.pure._check import as_sequence
from meshplan.pure.specs._tree import flatten_with_path, path_str

__all__ = ["LogicalShardingRule", "logical_names"]

# nnx metadata keys holding logical names, newest first (flax 0.12 reads all three).
_NNX_KEYS = ("out_sharding", "sharding_names", "sharding")


def _is_linen_box(x: Any) -> bool:
    return hasattr(x, "names") and hasattr(x, "value") and callable(getattr(x, "unbox", None))


def _is_nnx_variable(x: Any) -> bool:
    return callable(getattr(x, "get_metadata", None)) and callable(getattr(x, "get_value", None))


def _is_names(x: Any) -> bool:
    # A tuple of Nones in a live tree is more likely an empty container than a leaf's names.
    return isinstance(x, PartitionSpec) or (
        isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x) and any(n is not None for n in x))


def _box_names(x: Any) -> Any:
    """The raw logical names a box carries (``None``: none)."""
    if _is_linen_box(x):
        return x.names
    metadata = x.get_metadata()
    for key in _NNX_KEYS:
        found = metadata.get(key) if isinstance(metadata, Mapping) else None
        if found is not None:
            return found
    return None


def logical_names(tree: Any) -> dict[str, LogicalNames]:
    """Path -> logical names of every leaf of ``tree`` that carries them in flax metadata.

    Args:
      tree: linen variables (boxed, as ``init`` returns them with
        ``with_logical_partitioning``), an nnx ``State`` / module state, or a
        tree of name tuples / PartitionSpecs (``nn.get_partition_spec``).

    Returns:
      ``{"Dense_0/kernel": ("embed", "mlp"), ...}`` (paths in
      :func:`~meshplan.pure.normalize_path` form: no ``params/`` prefix, no
      ``/value`` box tail; leaves without names are left out).

    Raises:
      MeshplanTypeError: a leaf's names are not strings and ``None``.

    Example:
      >>> import numpy as np
      >>> from flax import linen as nn
      >>> logical_names({"params": {"w": nn.Partitioned(np.zeros((2, 3)), names=("embed", "mlp"))}})
      {'w': ('embed', 'mlp')}
    """
    flat, _ = flatten_with_path(
        tree, "tree", is_leaf=lambda x: _is_linen_box(x) or _is_nnx_variable(x) or _is_names(x))
    out: dict[str, LogicalNames] = {}
    for keypath, leaf in flat:
        if _is_names(leaf):
            raw: Any = leaf
        elif _is_linen_box(leaf) or _is_nnx_variable(leaf):
            raw = _box_names(leaf)
        else:
            continue
        if raw is None:
            continue
        path = normalize_path(path_str(keypath))
        out[path] = canonical_logical_names(raw, f"logical names of {path!r}")
    return out


class LogicalShardingRule(_MeshRule):
    """Logical axis names resolved through an ordered table (flax's ``logical_axis_rules``).

    Args:
      rules: ordered ``(logical name, mesh axes)`` rows; names may repeat
        (fallbacks). MaxText's ``logical_axis_rules`` and flax's rule tuples
        are this form.
      names: the leaves' logical names, as a path -> names mapping or a tree of
        names (``nn.get_partition_spec(variables)``); names in the flax metadata
        of the tree the rule is applied to are read too (given names win).
      patterns: ``(regex, names)`` rows for leaves without names.
      fallback: a pure rule for leaves with no names (default: no opinion, replicated).
      mesh: the mesh (default: the current one, see :mod:`meshplan.facade._rules`).
      mesh_axes: every mesh axis the table may name (default: the given mesh's axes).
        A row naming another axis is refused when the rule is built. Rows naming
        an axis that is listed here but missing from the mesh are skipped, so a table
        written for a larger mesh (MaxText's) still applies.

    A row whose axes do not divide the dim, or that names an axis the mesh
    lacks, is skipped for the next row and the reason says so (flax would
    emit the spec and fail in ``device_put``); otherwise the specs are flax's.

    Example:
      >>> import jax, numpy as np
      >>> from flax import linen as nn
      >>> from jax.sharding import AxisType
      >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
      >>> boxed = {"w": nn.Partitioned(np.zeros((16, 8), np.float32), names=("embed", "mlp"))}
      >>> rule = LogicalShardingRule([("mlp", "tp"), ("embed", "dp")], mesh=mesh)
      >>> rule.apply(boxed)["w"].value  # names read from the box
      P('dp', 'tp')
      >>> rule = LogicalShardingRule([("mlp", "tp"), ("embed", "dp")], names=nn.get_partition_spec(boxed), mesh=mesh)
      >>> rule.apply(nn.unbox(boxed))  # plain arrays: names given
      {'w': P('dp', 'tp')}
    """

    def __init__(self, rules: Any, *, names: Any = None, patterns: Any = (), fallback: Rule | None = None,
                 mesh: Mesh | AbstractMesh | None = None, mesh_axes: Sequence[str] | None = None) -> None:
        super().__init__(mesh)
        # A path -> names mapping is itself a tree of names whose paths are those keys.
        given = {} if names is None else logical_names_by_path(names)
        if mesh_axes is None and self.mesh is not None:
            mesh_axes = tuple(_sizes_of(self.mesh))  # a row naming another axis is a typo, refused now
        self._rule = LogicalRule(rules, names=given, patterns=patterns, fallback=fallback,
                                 mesh_axes=None if mesh_axes is None else as_sequence(mesh_axes, "mesh_axes"))
        self.rules = self._rule.table

    @property
    def pure_rule(self) -> LogicalRule:
        """The pure :class:`~meshplan.pure.LogicalRule` (names given at construction only)."""
        return self._rule

    def rule_for(self, pytree: Any) -> LogicalRule:
        """The pure rule for ``pytree``: given names first, then those in the tree's flax metadata."""
        found = logical_names(pytree)
        if not found:
            return self._rule
        return LogicalRule(self._rule.table, names={**found, **self._rule.names}, patterns=self._rule.patterns,
                           fallback=self._rule.fallback, mesh_axes=self._rule.mesh_axes, name=self._rule.name)

    def _builtin_plan(self, pytree: Any) -> Plan:
        sizes = self._axis_sizes()
        if sizes is None:
            mesh = require_mesh(None, type(self).__name__)  # raises NoMeshError: there is none
            sizes = {} if mesh is None else _sizes_of(mesh)
        return plan_live(pytree, self.rule_for(pytree), sizes)

    def _pure(self, pytree: Any, **options: Any) -> tuple[Rule, AxisSizes | None]:
        # The composite asks each rule for its pure form; ours depends on the tree's metadata.
        if self._customised():
            return super()._pure(pytree, **options)
        return self.rule_for(pytree), self._axis_sizes()

