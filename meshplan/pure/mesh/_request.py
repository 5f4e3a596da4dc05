"""A mesh request, resolved: axis names plus the ICI/DCN shape to lay out.

``create_mesh`` and ``MeshConfig.create_device_mesh`` both reduce to the same
question: given what the user asked for (a plain shape with maybe a -1, an
explicit DCN shape, or a :class:`HybridMeshShape`) and how many devices and
granules (slices or processes) exist, what ICI and DCN shapes do we lay out?
This module answers it once for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeAlias

from meshplan.pure._check import as_count, as_int_tuple
from meshplan.pure.errors import DeviceLayoutError, MeshplanTypeError, MeshShapeError
from meshplan.pure.mesh._axes import MeshShape, validate_axis_names
from meshplan.pure.mesh._hybrid import (
    HybridMeshShape,
    reconcile_dcn,
    resolve_hybrid,
    split_mesh_shape,
)

__all__ = ["MeshRequest", "MeshShapeLike", "canonical_dims", "resolve_mesh_request"]

MeshShapeLike: TypeAlias = Sequence[int] | HybridMeshShape | MeshShape
"""What a user may ask for: plain sizes (one -1 allowed), a hybrid shape, or a named shape."""


@dataclasses.dataclass(frozen=True, slots=True)
class MeshRequest:
    """A fully resolved mesh request: named axes, no -1 left, ICI x DCN = global shape.

    Args:
      axis_names: one unique name per mesh axis.
      hybrid: the resolved ICI and DCN shapes, one size per name in each.

    Raises:
      MeshplanTypeError: ``hybrid`` is not a HybridMeshShape, or bad name types.
      MeshShapeError: ``hybrid`` still holds a -1, or the name count differs from its rank.

    Example:
      >>> r = MeshRequest(("dp", "tp"), HybridMeshShape((1, 4), (2, 1)))
      >>> r.shape, r.mesh_shape
      ((2, 4), MeshShape(dp=2, tp=4))
    """

    axis_names: tuple[str, ...]
    hybrid: HybridMeshShape

    def __post_init__(self) -> None:
        names = validate_axis_names(self.axis_names)
        if not isinstance(self.hybrid, HybridMeshShape):
            raise MeshplanTypeError(
                f"hybrid={self.hybrid!r} has type {type(self.hybrid).__name__}; expected a HybridMeshShape."
            )
        global_shape = self.hybrid.global_shape  # raises for an unresolved -1
        if len(names) != self.hybrid.ndim:
            raise MeshShapeError(
                f"axis_names={names} has {len(names)} names but the mesh shape has {self.hybrid.ndim} "
                f"axes ({global_shape}); give one name per axis."
            )
        object.__setattr__(self, "axis_names", names)

    @property
    def shape(self) -> tuple[int, ...]:
        """The global mesh shape."""
        return self.hybrid.global_shape

    @property
    def mesh_shape(self) -> MeshShape:
        """The global shape with its axis names."""
        return self.hybrid.named(self.axis_names)


def canonical_dims(value: object, label: str = "axis_dims") -> tuple[int, ...]:
    """``value`` as a tuple of ints (:func:`~meshplan.pure._check.as_int_tuple`), or a MeshplanTypeError naming it.

    A string gets its own message: ``"2,4"`` is a mesh *string*, which
    ``parse_mesh_from_string`` reads.
    """
    if isinstance(value, str | bytes):
        raise MeshplanTypeError(
            f"{label} must be a sequence of ints, got {value!r}; "
            "for a string such as 'dp:2,tp:4' use parse_mesh_from_string."
        )
    return as_int_tuple(value, label)


def resolve_mesh_request(
    mesh_shape: MeshShapeLike,
    axis_names: Sequence[str],
    *,
    num_devices: int,
    num_granules: int = 1,
    dcn_mesh_dims: Sequence[int] | None = None,
    shape_name: str = "axis_dims",
) -> MeshRequest:
    """Resolve what the user asked for into ICI and DCN shapes.

    Three spellings are accepted, in this order of precedence:

    * a :class:`HybridMeshShape`: taken as-is, -1 inferred per granule (ICI)
      and over granules (DCN);
    * a global shape plus ``dcn_mesh_dims``: the global shape stays what the
      user asked for and ICI = global / DCN per axis;
    * a global shape alone: the granules are split over the outermost axes
      that can take them (see :func:`split_over_granules`).

    A :class:`MeshShape` is a global shape whose names must be ``axis_names``.

    Args:
      mesh_shape: global axis sizes (one -1 allowed), a MeshShape or a HybridMeshShape.
      axis_names: one unique name per axis.
      num_devices: devices the mesh must use, all of them.
      num_granules: slices (TPU) or processes that the devices form.
      dcn_mesh_dims: optional DCN shape; only with a plain global shape.
      shape_name: what the caller calls ``mesh_shape`` (``"axis_dims"`` for
        ``create_mesh``, ``"mesh_shape"`` for ``MeshConfig``), used in messages.

    Returns:
      A :class:`MeshRequest`.

    Raises:
      MeshShapeError, DeviceLayoutError: the request does not fit.

    Example:
      >>> r = resolve_mesh_request((1, 2, 8), ("pp", "dp", "tp"), num_devices=16, num_granules=2)
      >>> r.hybrid
      HybridMeshShape(ici_mesh_shape=(1, 1, 8), dcn_mesh_shape=(1, 2, 1))
    """
    names = validate_axis_names(axis_names)
    num_devices = as_count(num_devices, "num_devices")
    num_granules = as_count(num_granules, "num_granules", error=DeviceLayoutError)
    if isinstance(mesh_shape, MeshShape):
        if mesh_shape.names != names:
            raise MeshShapeError(
                f"{shape_name}={mesh_shape!r} names axes {mesh_shape.names} but axis_names={names}; "
                "give the same names in the same order."
            )
        mesh_shape = mesh_shape.sizes
    if num_granules < 1 or num_devices % num_granules:
        raise DeviceLayoutError(
            f"num_devices={num_devices} cannot form num_granules={num_granules} equal granules; "
            "every slice or process must hold the same number of devices."
        )
    if isinstance(mesh_shape, HybridMeshShape):
        if dcn_mesh_dims is not None:
            raise MeshShapeError(
                "dcn_mesh_dims was given together with a HybridMeshShape, which already holds "
                f"dcn_mesh_shape={mesh_shape.dcn_mesh_shape}; pass only one of them."
            )
        hybrid = resolve_hybrid(
            mesh_shape, devices_per_granule=num_devices // num_granules, num_granules=num_granules
        )
    else:
        dims = canonical_dims(mesh_shape, shape_name)
        if dcn_mesh_dims is not None:
            hybrid = reconcile_dcn(
                dims, canonical_dims(dcn_mesh_dims, "dcn_mesh_dims"),
                num_devices=num_devices, num_granules=num_granules, dims_name=shape_name,
            )
        else:
            hybrid = split_mesh_shape(dims, num_granules, num_devices=num_devices, dims_name=shape_name)
    return MeshRequest(names, hybrid)  # checks one name per axis
