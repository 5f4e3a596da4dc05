"""``MeshConfig``: loadax's mesh configuration, validated up front and on assignment.

The config is plain data (shape, names, batch axes, per-platform rules). As in
loadax its fields can be assigned (``config.mesh_shape = (2, 4)``); each value
is checked on its own when it is set (types, sizes, regexes), and the fields
are checked against each other (one size per axis name, batch axes that are
mesh axes) when the config is built and again when a mesh is made, so a
launch script may change ``mesh_axis_names`` and ``mesh_shape`` one after
the other. ``create_device_mesh`` lays out the devices with the same engine
as :func:`create_mesh`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from meshplan.facade._devices import flatten_devices, resolve_devices
from meshplan.facade._mesh import build_mesh
from meshplan.pure._check import as_int_tuple, as_names, unresolved_shape_problems
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError
from meshplan.pure.mesh._axes import MeshShape, validate_axis_names
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.mesh._request import MeshShapeLike
from meshplan.pure.mesh._selectors import select_mesh_shape, validate_mesh_rules

__all__ = ["MeshConfig"]


def _check_rank(shape: MeshShapeLike, names: tuple[str, ...], label: str) -> None:
    rank = len(shape)  # a plain shape, a MeshShape and a HybridMeshShape all have one
    if isinstance(shape, MeshShape) and shape.names != names:
        raise MeshShapeError(
            f"{label}={shape!r} names axes {shape.names} but mesh_axis_names={names}; "
            "give the same names in the same order."
        )
    if rank != len(names):
        raise MeshShapeError(
            f"{label}={shape!r} has {rank} axes but mesh_axis_names={names} has {len(names)}; "
            "give one size per axis name."
        )


def _canonical_mesh_shape(shape: Any) -> MeshShapeLike:
    """``mesh_shape`` on its own: a checked tuple of sizes, or a (checked) MeshShape / HybridMeshShape."""
    if isinstance(shape, HybridMeshShape | MeshShape):
        return shape
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise MeshplanTypeError(
            f"mesh_shape must be a sequence of ints, a MeshShape or a HybridMeshShape, got {shape!r}."
        )
    dims = as_int_tuple(shape, "mesh_shape")  # (2.0, 4) is a type error; numpy ints are ints
    problems = unresolved_shape_problems(dims, "mesh_shape")
    if problems:
        raise MeshShapeError(
            f"invalid mesh_shape={dims}: {', '.join(problems)}; every size must be >= 1, or -1 once "
            "to take the devices the other axes leave over."
        )
    return dims


def _canonical_batch_axis_names(value: Any) -> str | Sequence[str]:
    """``batch_axis_names`` on its own: a name or a sequence of names (kept as given)."""
    as_names(value, "batch_axis_names")  # None, 3, sets and [] are refused
    checked: str | Sequence[str] = value  # kept as the caller wrote it (loadax compares it back)
    return checked


_FIELD_CHECKS: dict[str, Callable[[Any], Any]] = {
    "mesh_shape": _canonical_mesh_shape,
    "mesh_axis_names": validate_axis_names,
    "batch_axis_names": _canonical_batch_axis_names,
    "mesh_rules": lambda rules: None if rules is None else validate_mesh_rules(rules),
}


@dataclasses.dataclass
class MeshConfig:
    """How to build the training mesh (loadax's ``MeshConfig``, fields assignable).

    Attributes:
      mesh_shape: global axis sizes (one -1 allowed), a :class:`MeshShape`
        (named as ``mesh_axis_names``) or a :class:`HybridMeshShape`. A plain
        shape puts the granules (slices or processes) on the outermost axes
        that can take them.
      mesh_axis_names: one unique name per axis.
      batch_axis_names: the axis or axes input batches are sharded over.
        A value you pass must name mesh axes (checked here); the default
        ``"data"`` is only checked when a batch is actually sharded.
      mesh_rules: ``(regex, shape_or_None)`` pairs; the first regex that
        fully matches ``mesh_selector`` picks the shape, ``None`` meaning
        "no mesh for this platform" (an error when selected).

    Raises:
      MeshplanTypeError: a field of the wrong type (``mesh_shape=(2.0, 4)``,
        ``batch_axis_names=None``), when built or assigned.
      MeshShapeError: bad sizes (``(0, 8)``, ``(-1, -1)``) or names, when built
        or assigned; fields that disagree with each other, when built and when
        a mesh is made.
      MeshRuleError: a bad mesh rule, when built or assigned.

    Example:
      >>> config = MeshConfig(mesh_shape=(2, -1), mesh_axis_names=("data", "model"))
      >>> dict(config.create_device_mesh().shape)
      {'data': 2, 'model': 4}
      >>> config.mesh_shape = (4, 2)
      >>> dict(config.create_device_mesh().shape)
      {'data': 4, 'model': 2}
      >>> config.hosts, config.host_id
      (1, 0)
    """

    mesh_shape: MeshShapeLike
    mesh_axis_names: Sequence[str]
    batch_axis_names: str | Sequence[str] = "data"
    mesh_rules: Sequence[tuple[str, MeshShapeLike | None]] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Every field is checked on its own as it is set (also by __init__).
        check = _FIELD_CHECKS.get(name)
        object.__setattr__(self, name, value if check is None else check(value))

    def __post_init__(self) -> None:
        self._check_fields_agree()

    def _check_fields_agree(self) -> None:
        """The checks that need several fields: ranks against names, batch axes among the names."""
        names = tuple(self.mesh_axis_names)
        _check_rank(self.mesh_shape, names, "mesh_shape")
        batch = (self.batch_axis_names,) if isinstance(self.batch_axis_names, str) else tuple(
            self.batch_axis_names
        )
        unknown = [b for b in batch if b not in names]
        # The untouched default is exempt: configs that never shard batches
        # need not have a "data" axis. Anything the user spelled out is checked.
        if unknown and self.batch_axis_names != "data":
            raise MeshShapeError(
                f"batch_axis_names={self.batch_axis_names!r} names {unknown} which are not mesh axes; "
                f"choose from {list(names)}."
            )
        for i, (pattern, rule_shape) in enumerate(self.mesh_rules or ()):
            if rule_shape is not None:
                _check_rank(rule_shape, names, f"mesh_rules[{i}] ({pattern!r})")

    @property
    def hosts(self) -> int:
        """Number of processes (hosts) in the job: ``jax.process_count()``."""
        return int(jax.process_count())

    @property
    def host_id(self) -> int:
        """This process's index: ``jax.process_index()``."""
        return jax.process_index()

    def select_mesh_shape(self, mesh_selector: str | None = None) -> MeshShapeLike:
        """The mesh shape ``mesh_rules`` pick for ``mesh_selector`` (default: ``mesh_shape``)."""
        self._check_fields_agree()  # fields may have been assigned since the config was built
        return select_mesh_shape(self.mesh_rules, mesh_selector, self.mesh_shape)

    def create_device_mesh(
        self,
        devices: Sequence[Any] | None = None,
        mesh_selector: str | None = None,
        *,
        contiguous_hosts: bool = True,
    ) -> Mesh:
        """Build the mesh over ``devices`` (default: all devices).

        A passed device list (flat or an array) is laid out by the planner,
        not used as an array as given: by id on CPU and GPU, by jax's
        topology layout inside a TPU slice (which, for some chips, reads the
        order jax.devices() lists them in). ``contiguous_hosts`` is
        :func:`create_mesh`'s: each host of a multi-host TPU slice is one
        contiguous block unless it is ``False``.
        """
        devs = resolve_devices(None) if devices is None else flatten_devices(devices)
        return build_mesh(self.select_mesh_shape(mesh_selector), self.mesh_axis_names, devices=devs,
                          contiguous_hosts=contiguous_hosts, shape_name="mesh_shape")
