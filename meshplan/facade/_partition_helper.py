"""``MeshPartitionHelper``: the reference's suggest-and-shard helper, on pure suggestions.

The suggestions (:func:`meshplan.pure.suggest_methods`,
:func:`meshplan.pure.create_partition_spec`) keep eformer's axis preferences
(fsdp+sp, dp, sp, tp, fsdp) but only emit specs jax can store; see
:mod:`meshplan.pure.rules._suggest` for the differences. ``auto_shard_pytree``
plans the whole tree once per distinct shape and places it with a single
``jax.device_put``, not one call per leaf.

Leaves placed by ``auto_shard_pytree``: ``jax.Array``, ``numpy.ndarray`` and
numpy scalars. Everything else is returned unchanged: ``None``, Python
scalars, strings, ``jax.ShapeDtypeStruct`` (nothing to place) and boxed
values (objects with a ``.value``; register the box as a pytree node, as
flax does, to have its contents placed).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshplan.facade._context import x64_enabled
from meshplan.facade._planning import plan_live
from meshplan.pure.errors import MeshplanTypeError, SpecError
from meshplan.pure.rules._auto import DEFAULT_MIN_SHARD_SIZE
from meshplan.pure.rules._engine import Plan
from meshplan.pure.rules._suggest import (
    SuggestRule,
    analyze_pytree,
    create_partition_spec,
    suggest_methods,
)
from meshplan.pure.specs._validate import check_specs

__all__ = ["MeshPartitionHelper"]

# What jax.device_put accepts as an array (Python scalars would become
# arrays, which the reference does not do, so they stay as they are).
_PLACEABLE = (jax.Array, np.ndarray, np.generic)


class MeshPartitionHelper:
    """Suggest partition specs from array shapes and place pytrees on a mesh.

    Args:
      mesh: the ``jax.sharding.Mesh`` to plan for and place on.

    Attributes:
      mesh: the mesh.
      axis_sizes: ``{axis name: size}`` in mesh order.

    Raises:
      MeshplanTypeError: ``mesh`` is not a concrete ``Mesh``.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import AxisType
      >>> mesh = jax.make_mesh((1, 4, 2), ("dp", "fsdp", "sp"), axis_types=(AxisType.Auto,) * 3)
      >>> helper = MeshPartitionHelper(mesh)
      >>> params = {"w": np.ones((1024, 4096), np.float32), "b": np.ones(8, np.float32)}
      >>> placed = helper.auto_shard_pytree(params)
      >>> placed["w"].sharding.spec, placed["b"].sharding.spec
      (P('fsdp', 'sp'), P())
    """

    def __init__(self, mesh: Mesh) -> None:
        if not isinstance(mesh, Mesh):
            raise MeshplanTypeError(
                f"MeshPartitionHelper needs a jax.sharding.Mesh with devices to place arrays on; got {mesh!r}."
            )
        self.mesh = mesh
        self.axis_sizes = dict(mesh.shape)
        self._shardings: dict[PartitionSpec, NamedSharding] = {}

    def __repr__(self) -> str:
        return f"MeshPartitionHelper(axis_sizes={self.axis_sizes})"

    def analyze_pytree(self, pytree: Any) -> dict[tuple[int, ...], list[tuple[str, ...]]]:
        """Suggested methods for each distinct array shape in ``pytree`` (in leaf order).

        Example:
          >>> import numpy as np
          >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"))
          >>> MeshPartitionHelper(mesh).analyze_pytree({"w": np.zeros((8, 16))})
          {(8, 16): [('dp',), ('tp',)]}
        """
        return analyze_pytree(pytree, self.axis_sizes, x64=x64_enabled())

    def _suggest_methods(self, shape: tuple[int, ...]) -> list[tuple[str, ...]]:
        """Axis-name tuples to try for ``shape``, preferred first."""
        return suggest_methods(shape, self.axis_sizes)

    def create_partition_spec(
        self,
        array_shape: tuple[int, ...],
        methods: list[tuple[str, ...]],
        min_shard_size: int = DEFAULT_MIN_SHARD_SIZE,
    ) -> PartitionSpec:
        """A storable spec for ``array_shape`` from ``methods`` (see :func:`meshplan.pure.create_partition_spec`).

        Raises:
          ShardingRuleError: a method names an axis the mesh lacks.

        Example:
          >>> mesh = jax.make_mesh((2, 4), ("fsdp", "sp"))
          >>> helper = MeshPartitionHelper(mesh)
          >>> helper.create_partition_spec((1024, 4096), helper._suggest_methods((1024, 4096)))
          P('fsdp', 'sp')
        """
        return create_partition_spec(array_shape, methods, self.axis_sizes, min_shard_size=min_shard_size)

    def _sharding(self, spec: PartitionSpec) -> NamedSharding:
        sharding = self._shardings.get(spec)
        if sharding is None:
            sharding = self._shardings[spec] = NamedSharding(self.mesh, spec)
        return sharding

    def shard_array(self, array: Any, partition_spec: PartitionSpec) -> jax.Array:
        """Place one array on the mesh with ``partition_spec``.

        Raises:
          SpecError: the spec does not fit the array or the mesh (checked
            before jax is asked, so the message says what to change).
          MeshplanTypeError: ``array`` holds no data (a ``ShapeDtypeStruct``,
            a pytree) or ``partition_spec`` is not a PartitionSpec.
        """
        problems = []
        if isinstance(array, bool) or not isinstance(array, (np.ndarray, jax.Array, np.generic, int, float, complex)):
            if isinstance(array, (dict, list, tuple)):
                problems.append(f"array={array!r:.80} is a pytree ({type(array).__name__}), not one array; place a "
                                "whole tree with auto_shard_pytree(tree) or meshplan.place")
            else:
                problems.append(f"array={array!r:.80} ({type(array).__name__}) is not an array with data; "
                                "shard_array places one jax.Array or numpy array (for a ShapeDtypeStruct, plan its "
                                "spec with .plan() or create_partition_spec, and place the real array)")
        if partition_spec is not None and not isinstance(partition_spec, PartitionSpec):
            problems.append(f"partition_spec={partition_spec!r:.80} must be a PartitionSpec, not "
                            f"{type(partition_spec).__name__}")
        if problems:  # both named at once: a caller passing a tree usually passes a spec tree too
            raise MeshplanTypeError("; ".join(problems) + ".")
        if isinstance(array, int):
            # jax stores a Python int as int32 (int64 with x64) and raises a raw
            # OverflowError from device_put when it does not fit.
            bits = 64 if x64_enabled() else 32
            if not -(2 ** (bits - 1)) <= array < 2 ** (bits - 1):
                raise SpecError(f"array={array} does not fit jax's int{bits}; pass a numpy array with the dtype "
                                "you mean" + ("" if bits == 64 else " (or enable jax_enable_x64)") + ".")
        if partition_spec is None:
            partition_spec = PartitionSpec()
        check_specs(array, partition_spec, self.axis_sizes, x64=x64_enabled())
        placed: jax.Array = jax.device_put(array, self._sharding(partition_spec))
        return placed

    def plan(self, pytree: Any, min_shard_size: int = DEFAULT_MIN_SHARD_SIZE) -> Plan:
        """The specs ``auto_shard_pytree`` would use, with the reason for each leaf.

        Example:
          >>> import numpy as np
          >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"))
          >>> MeshPartitionHelper(mesh).plan({"b": np.zeros(8)}).explain("b")
          'b: (8,) float64 -> P() [suggest] 8 elements < min_shard_size=1024; replicated'
        """
        return plan_live(pytree, SuggestRule(min_shard_size), self.axis_sizes)

    def auto_shard_pytree(self, pytree: Any, min_shard_size: int = DEFAULT_MIN_SHARD_SIZE) -> Any:
        """Plan ``pytree`` and place all its arrays with one ``jax.device_put``.

        Args:
          pytree: a pytree of arrays (see the module docstring for other leaves).
          min_shard_size: arrays with fewer elements stay replicated.

        Returns:
          The same structure with each array placed on the mesh.
        """
        plan = self.plan(pytree, min_shard_size)
        leaves = plan.treedef.flatten_up_to(pytree)
        placeable: dict[type, bool] = {}
        where: list[int] = []
        shardings: list[NamedSharding] = []
        for i, leaf in enumerate(leaves):
            kind = type(leaf)
            ok = placeable.get(kind)
            if ok is None:
                ok = placeable[kind] = issubclass(kind, _PLACEABLE)
            if ok:
                where.append(i)
                shardings.append(self._sharding(plan.leaf_specs[i]))
        placed = jax.device_put([leaves[i] for i in where], shardings)
        for i, array in zip(where, placed, strict=True):
            leaves[i] = array
        return plan.treedef.unflatten(leaves)
