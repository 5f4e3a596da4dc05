"""``MeshConfig``: loadax's mesh configuration, validated up front.

The config is plain data (shape, names, batch axes, per-platform rules) and
is checked when it is built, so a typo surfaces at start-up rather than when
the mesh is first needed. ``create_device_mesh`` lays out the devices with
the same engine as :func:`create_mesh`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from meshplan.facade._devices import flatten_devices, resolve_devices
from meshplan.facade._mesh import build_mesh
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


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """How to build the training mesh (loadax's ``MeshConfig``).

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

    Example:
      >>> config = MeshConfig(mesh_shape=(2, -1), mesh_axis_names=("data", "model"))
      >>> dict(config.create_device_mesh().shape)
      {'data': 2, 'model': 4}
      >>> config.hosts, config.host_id
      (1, 0)
    """

    mesh_shape: MeshShapeLike
    mesh_axis_names: Sequence[str]
    batch_axis_names: str | Sequence[str] = "data"
    mesh_rules: Sequence[tuple[str, MeshShapeLike | None]] | None = None

    def __post_init__(self) -> None:
        names = validate_axis_names(self.mesh_axis_names)
        object.__setattr__(self, "mesh_axis_names", names)
        shape = self.mesh_shape
        if not isinstance(shape, HybridMeshShape | MeshShape):
            if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
                raise MeshplanTypeError(
                    f"mesh_shape must be a sequence of ints, a MeshShape or a HybridMeshShape, got {shape!r}."
                )
            shape = tuple(shape)
            object.__setattr__(self, "mesh_shape", shape)
        _check_rank(shape, names, "mesh_shape")
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
        if self.mesh_rules is not None:
            rules = validate_mesh_rules(self.mesh_rules)
            for i, (pattern, rule_shape) in enumerate(rules):
                if rule_shape is not None:
                    _check_rank(rule_shape, names, f"mesh_rules[{i}] ({pattern!r})")
            object.__setattr__(self, "mesh_rules", tuple(rules))

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
        return select_mesh_shape(self.mesh_rules, mesh_selector, self.mesh_shape)

    def create_device_mesh(
        self, devices: Sequence[Any] | None = None, mesh_selector: str | None = None
    ) -> Mesh:
        """Build the mesh over ``devices`` (default: all devices).

        A passed device list (flat or an array) is laid out by the planner,
        not used in the order given, so every process derives the same mesh.
        """
        devs = resolve_devices(None) if devices is None else flatten_devices(devices)
        return build_mesh(self.select_mesh_shape(mesh_selector), self.mesh_axis_names, devices=devs)
