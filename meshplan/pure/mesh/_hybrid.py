"""Hybrid (ICI x DCN) mesh shapes: the value object and how to obtain one.

``ici_mesh_shape`` is the shape inside one granule (a host or a TPU slice,
connected by the fast network); ``dcn_mesh_shape`` is how granules are
arranged over the slow data-center network. The global mesh is their
elementwise product. Three ways to get one:

- :func:`split_mesh_shape`: from a plain global shape, with the default
  split of :func:`meshplan.pure.split_over_granules`;
- :func:`resolve_hybrid`: from a user ``HybridMeshShape`` that may still
  hold a ``-1`` in either part;
- :func:`reconcile_dcn`: from a global shape plus a user DCN shape (eformer's
  ``create_mesh(axis_dims, dcn_mesh_dims=...)``); the global shape stays what
  the user asked for and the ICI shape is derived.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from meshplan.pure._check import as_count, as_positive_shape, as_sequence, unresolved_shape_problems
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError
from meshplan.pure.mesh._axes import MeshShape, infer_axis_dims, mesh_dims
from meshplan.pure.mesh._split import split_over_granules

__all__ = ["HybridMeshShape", "reconcile_dcn", "resolve_hybrid", "split_mesh_shape"]


@dataclasses.dataclass(frozen=True, slots=True)
class HybridMeshShape:
    """A mesh shape for hybrid (ICI and DCN) parallelism, as in loadax.

    For mesh axes ``(data, model)``: pure fsdp on a v4-8 is
    ``HybridMeshShape((1, 4), (1, 1))``; two-way data parallelism over 2
    H100 nodes with fsdp within each node is ``HybridMeshShape((1, 8), (2, 1))``.

    Args:
      ici_mesh_shape: the shape within one granule (host-local / slice-local).
      dcn_mesh_shape: how granules are arranged, same rank as ``ici_mesh_shape``.
        Each part may hold one ``-1``, resolved by :func:`resolve_hybrid`.

    Raises:
      MeshplanTypeError: an entry is not an int.
      MeshShapeError: the ranks differ (jax's ``create_hybrid_device_mesh``
        accepts that silently; meshplan does not), an entry is 0 or below -1,
        or a part holds more than one ``-1``.

    Example:
      >>> shape = HybridMeshShape(ici_mesh_shape=[1, 8], dcn_mesh_shape=(2, 1))
      >>> shape.ici_mesh_shape, shape.global_shape, shape.ndim, len(shape)
      ((1, 8), (2, 8), 2, 2)
      >>> shape.named(("data", "model"))
      MeshShape(data=2, model=8)
    """

    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        ici = mesh_dims(self.ici_mesh_shape, "ici_mesh_shape")
        dcn = mesh_dims(self.dcn_mesh_shape, "dcn_mesh_shape")
        problems = unresolved_shape_problems(ici, "ici_mesh_shape") + unresolved_shape_problems(dcn, "dcn_mesh_shape")
        if len(ici) != len(dcn):
            # "The mesh shapes must have the same number of axes" / "same length":
            # the words loadax's and AXLearn's users match on.
            problems.insert(
                0,
                f"The mesh shapes must have the same number of axes (same length): ici_mesh_shape "
                f"has rank {len(ici)} but dcn_mesh_shape has rank {len(dcn)}; give one ici and one dcn "
                "size per mesh axis (1 where an axis is not split)",
            )
        if problems:
            raise MeshShapeError(
                f"invalid HybridMeshShape(ici_mesh_shape={ici}, dcn_mesh_shape={dcn}): "
                f"{'; '.join(problems)}. Sizes must be >= 1, or -1 once per part."
            )
        object.__setattr__(self, "ici_mesh_shape", ici)
        object.__setattr__(self, "dcn_mesh_shape", dcn)

    @property
    def ndim(self) -> int:
        """The number of mesh axes."""
        return len(self.ici_mesh_shape)

    def __len__(self) -> int:
        """The number of mesh axes, as ``len`` of a plain shape tuple gives it."""
        return len(self.ici_mesh_shape)

    def named(self, names: Sequence[str]) -> MeshShape:
        """The global shape with axis names: a :class:`MeshShape` (resolved shapes only).

        Raises:
          MeshShapeError: a ``-1`` is unresolved, or ``names`` do not fit (see MeshShape).
        """
        return MeshShape(as_sequence(names, "names"), self.global_shape)

    @property
    def is_resolved(self) -> bool:
        """Whether no ``-1`` is left in either part."""
        return -1 not in self.ici_mesh_shape and -1 not in self.dcn_mesh_shape

    @property
    def global_shape(self) -> tuple[int, ...]:
        """The global mesh shape: ``ici[i] * dcn[i]`` per axis.

        Raises:
          MeshShapeError: a ``-1`` is still unresolved (use :func:`resolve_hybrid`).
        """
        if not self.is_resolved:
            raise MeshShapeError(
                f"{self!r} still holds a -1, so its global shape is unknown; resolve it "
                "first with resolve_hybrid(shape, devices_per_granule=..., num_granules=...)."
            )
        return tuple(i * d for i, d in zip(self.ici_mesh_shape, self.dcn_mesh_shape))


def split_mesh_shape(
    mesh_shape: Sequence[int],
    num_granules: int,
    *,
    num_devices: int | None = None,
    dims_name: str = "mesh_shape",
) -> HybridMeshShape:
    """The default ICI/DCN split of a plain (global) mesh shape, as in loadax.

    The first non-singleton axis divisible by ``num_granules`` goes over DCN;
    failing that the granules spread over several axes, outermost first (see
    :func:`meshplan.pure.split_over_granules`). All-singleton shapes on one
    granule give an all-1 DCN shape.

    Args:
      mesh_shape: the global mesh shape (ints, or a :class:`MeshShape`); may
        hold one ``-1`` if ``num_devices`` is given.
      num_granules: number of granules (slices or processes).
      num_devices: total number of devices; required to infer a ``-1``, and
        checked against the shape's product when given.
      dims_name: what to call ``mesh_shape`` in messages (the caller's argument name).

    Returns:
      A resolved :class:`HybridMeshShape` whose ``global_shape`` is the
      (resolved) ``mesh_shape``.

    Raises:
      MeshplanTypeError: a size or count is not an int.
      MeshShapeError: a ``-1`` without ``num_devices``, or sizes that do not fit it.
      DeviceLayoutError: ``num_granules`` does not divide the mesh size.

    Example:
      >>> split_mesh_shape((1, 2, 8), 2)
      HybridMeshShape(ici_mesh_shape=(1, 1, 8), dcn_mesh_shape=(1, 2, 1))
      >>> split_mesh_shape((2, -1, 8), 2, num_devices=16)
      HybridMeshShape(ici_mesh_shape=(1, 1, 8), dcn_mesh_shape=(2, 1, 1))
    """
    dims = mesh_dims(mesh_shape, dims_name)
    del mesh_shape
    if num_devices is not None:
        dims = infer_axis_dims(dims, num_devices, dims_name=dims_name)
    elif -1 in dims:
        raise MeshShapeError(
            f"{dims_name}={dims} holds a -1 but num_devices was not given; pass "
            "num_devices=<total device count> to infer it, or give every size."
        )
    else:
        dims = as_positive_shape(dims, dims_name)
    ici, dcn = split_over_granules(dims, num_granules)
    return HybridMeshShape(ici, dcn)


def resolve_hybrid(
    shape: HybridMeshShape, *, devices_per_granule: int, num_granules: int
) -> HybridMeshShape:
    """Resolves ``-1`` in each part separately and checks both products.

    Args:
      shape: a :class:`HybridMeshShape`, possibly holding a ``-1`` per part.
      devices_per_granule: the ICI product must equal this.
      num_granules: the DCN product must equal this.

    Returns:
      The resolved shape (``shape`` itself if nothing changed).

    Raises:
      MeshplanTypeError: ``shape`` is not a HybridMeshShape or a count is not an int.
      MeshShapeError: a part cannot be resolved to its count (both parts'
        problems are reported together).

    Example:
      >>> resolve_hybrid(HybridMeshShape((1, -1), (-1, 1)), devices_per_granule=8, num_granules=2)
      HybridMeshShape(ici_mesh_shape=(1, 8), dcn_mesh_shape=(2, 1))
    """
    if not isinstance(shape, HybridMeshShape):
        raise MeshplanTypeError(
            f"shape={shape!r} has type {type(shape).__name__}; expected a HybridMeshShape."
        )
    per_granule = as_count(devices_per_granule, "devices_per_granule")
    granules = as_count(num_granules, "num_granules")
    parts: list[tuple[int, ...]] = []
    problems: list[str] = []
    for dims, total, dims_name, total_name, part in (
        (shape.ici_mesh_shape, per_granule, "ici_mesh_shape", "devices_per_granule", "ICI"),
        (shape.dcn_mesh_shape, granules, "dcn_mesh_shape", "num_granules", "DCN"),
    ):
        try:
            parts.append(infer_axis_dims(dims, total, dims_name=dims_name, total_name=total_name))
        except MeshShapeError as err:
            # "Product of ICI/DCN mesh ... does not match": AXLearn's words.
            problems.append(f"Product of {part} mesh {dims} does not match {total_name}={total}: {err}")
    if problems:
        raise MeshShapeError(" | ".join(problems))
    resolved = HybridMeshShape(parts[0], parts[1])
    return shape if resolved == shape else resolved


def reconcile_dcn(
    axis_dims: Sequence[int],
    dcn_mesh_dims: Sequence[int],
    *,
    num_devices: int,
    num_granules: int,
    dims_name: str = "axis_dims",
) -> HybridMeshShape:
    """The hybrid shape for a user's global shape plus a user's DCN shape.

    The global shape stays exactly what the user asked for; the ICI shape is
    ``global // dcn`` per axis, so ``dcn_mesh_dims`` never changes the mesh
    size, it only says which part of each axis crosses the slow network.

    Args:
      axis_dims: the global mesh shape; one ``-1`` is inferred against ``num_devices``.
      dcn_mesh_dims: the DCN shape, same rank; one ``-1`` is inferred against ``num_granules``.
      num_devices: total number of devices.
      num_granules: number of granules (slices or processes).
      dims_name: what to call ``axis_dims`` in messages (the caller's argument name).

    Returns:
      A resolved :class:`HybridMeshShape` with ``global_shape`` equal to the
      resolved ``axis_dims`` (so its ICI product is ``num_devices // num_granules``).

    Raises:
      MeshplanTypeError: a size or count is not an int.
      MeshShapeError: rank mismatch; ``num_devices`` not divisible by
        ``num_granules``; a part that does not fit its count; or an axis whose
        global size the DCN size does not divide (every such axis is named).

    Example:
      >>> reconcile_dcn((1, -1, 1, 1, 1), (1, 2, 1, 1, 1), num_devices=16, num_granules=2)
      HybridMeshShape(ici_mesh_shape=(1, 8, 1, 1, 1), dcn_mesh_shape=(1, 2, 1, 1, 1))
    """
    dims = mesh_dims(axis_dims, dims_name)
    dcn_dims = mesh_dims(dcn_mesh_dims, "dcn_mesh_dims")
    devices = as_count(num_devices, "num_devices")
    granules = as_count(num_granules, "num_granules")
    del axis_dims, dcn_mesh_dims, num_devices, num_granules
    if len(dims) != len(dcn_dims):
        raise MeshShapeError(
            f"{dims_name}={dims} has rank {len(dims)} but dcn_mesh_dims={dcn_dims} has rank "
            f"{len(dcn_dims)}; give one dcn size per mesh axis (1 for axes not split over DCN)."
        )
    if devices % granules:
        raise MeshShapeError(
            f"num_devices={devices} is not divisible by num_granules={granules}; every "
            "granule must hold the same number of devices."
        )
    global_shape = infer_axis_dims(dims, devices, dims_name=dims_name)
    dcn = infer_axis_dims(dcn_dims, granules, dims_name="dcn_mesh_dims", total_name="num_granules")
    bad = [
        f"axis {i}: global size {g} is not divisible by dcn size {d}"
        for i, (g, d) in enumerate(zip(global_shape, dcn))
        if g % d
    ]
    if bad:
        raise MeshShapeError(
            f"dcn_mesh_dims={dcn} does not divide {dims_name}={global_shape}: {'; '.join(bad)}. "
            "Each dcn size must divide the global size of its axis."
        )
    ici = tuple(g // d for g, d in zip(global_shape, dcn))
    # prod(ici) == devices // granules needs no check: it follows from the two
    # products inferred above and the per-axis divisibility.
    return HybridMeshShape(ici, dcn)
