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

from meshplan.pure.mesh._axes import validate_axis_names
from meshplan.pure.mesh._hybrid import HybridMeshShape, reconcile_dcn, resolve_hybrid, split_mesh_shape
from meshplan.pure.errors import DeviceLayoutError, MeshShapeError, MeshplanTypeError

__all__ = ["MeshRequest", "canonical_dims", "resolve_mesh_request"]


@dataclasses.dataclass(frozen=True, slots=True)
class MeshRequest:
    """A fully resolved mesh request: no -1 left, ICI x DCN = global shape."""

    axis_names: tuple[str, ...]
    hybrid: HybridMeshShape

    @property
    def shape(self) -> tuple[int, ...]:
        """The global mesh shape."""
        return self.hybrid.global_shape


def canonical_dims(value: object, label: str = "axis_dims") -> tuple[int, ...]:
    """``value`` as a tuple of ints, or a MeshplanTypeError naming it (bools and floats are refused)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise MeshplanTypeError(
            f"{label} must be a sequence of ints, got {value!r}; "
            "for a string such as 'dp:2,tp:4' use parse_mesh_from_string."
        )
    dims = tuple(value)
    bad = [d for d in dims if isinstance(d, bool) or not isinstance(d, int)]
    if bad:
        raise MeshplanTypeError(f"{label}={dims!r} holds non-integers {bad!r}; use ints (-1 to infer one).")
    return dims


def resolve_mesh_request(
    mesh_shape: Sequence[int] | HybridMeshShape,
    axis_names: Sequence[str],
    *,
    num_devices: int,
    num_granules: int = 1,
    dcn_mesh_dims: Sequence[int] | None = None,
) -> MeshRequest:
    """Resolve what the user asked for into ICI and DCN shapes.

    Three spellings are accepted, in this order of precedence:

    * a :class:`HybridMeshShape`: taken as-is, -1 inferred per granule (ICI)
      and over granules (DCN);
    * a global shape plus ``dcn_mesh_dims``: the global shape stays what the
      user asked for and ICI = global / DCN per axis;
    * a global shape alone: the granules are split over the outermost axes
      that can take them (see :func:`split_over_granules`).

    Args:
      mesh_shape: global axis sizes (one -1 allowed) or a HybridMeshShape.
      axis_names: one unique name per axis.
      num_devices: devices the mesh must use, all of them.
      num_granules: slices (TPU) or processes that the devices form.
      dcn_mesh_dims: optional DCN shape; only with a plain global shape.

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
        dims = canonical_dims(mesh_shape, "axis_dims")
        if dcn_mesh_dims is not None:
            hybrid = reconcile_dcn(
                dims, canonical_dims(dcn_mesh_dims, "dcn_mesh_dims"),
                num_devices=num_devices, num_granules=num_granules,
            )
        else:
            hybrid = split_mesh_shape(dims, num_granules, num_devices=num_devices)
    if len(names) != hybrid.ndim:
        raise MeshShapeError(
            f"axis_names={names} has {len(names)} names but the mesh shape has {hybrid.ndim} axes "
            f"({hybrid.global_shape}); give one name per axis."
        )
    return MeshRequest(names, hybrid)
