"""Live jax meshes over the local devices: a strategy, and one mesh per drawn shape.

The other strategies draw plain values (sizes, shapes, specs); a test that
then needs ``device_put`` or ``NamedSharding`` turns the drawn sizes into a
mesh with :func:`mesh_for`. jax is imported lazily, so the plain strategies
never touch a backend.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from meshplan._testing._check import InvalidArgument, check_axis_sizes, check_bool, check_int
from meshplan._testing._meshes import mesh_shapes
from meshplan.pure.mesh import MeshShape

__all__ = ["mesh_for", "meshes"]

_AXIS_TYPES = ("auto", "explicit")


def _check_axis_types(axis_types: Any) -> None:
    if axis_types is not None and axis_types not in _AXIS_TYPES:
        raise InvalidArgument(f"axis_types={axis_types!r} must be None, 'auto' or 'explicit'.")


def _local_devices(num_devices: int) -> list[Any]:
    import jax

    devices = jax.devices()
    if num_devices > len(devices):
        raise InvalidArgument(f"num_devices={num_devices} is more than the {len(devices)} local "
                              "devices; set XLA_FLAGS=--xla_force_host_platform_device_count "
                              "(or chex.set_n_cpu_devices) before jax starts.")
    return devices[:num_devices]


# One Mesh per (sizes, types): tests draw the same few shapes many times, and
# jax caches compiled shardings per mesh object.
@functools.lru_cache(maxsize=256)
def _mesh(size_items: tuple[tuple[str, int], ...], axis_types: str | None) -> Any:
    import jax
    from jax.sharding import AxisType

    names = tuple(n for n, _ in size_items)
    sizes = tuple(s for _, s in size_items)
    devices = _local_devices(math.prod(sizes))
    if axis_types is None:
        return jax.make_mesh(sizes, names, devices=devices)
    kind = AxisType.Auto if axis_types == "auto" else AxisType.Explicit
    return jax.make_mesh(sizes, names, axis_types=(kind,) * len(names), devices=devices)


def mesh_for(axis_sizes: Mapping[str, int] | MeshShape, *, axis_types: str | None = None) -> Any:
    """A live ``jax.sharding.Mesh`` with these axis sizes, over the first local devices.

    For a test that draws plain sizes (:func:`mesh_shapes`, :func:`sharded_trees`)
    and then places arrays. The same arguments return the same mesh object.

    Args:
      axis_sizes: mesh axis name -> size, in mesh order (a MeshShape or mesh also works).
      axis_types: ``"auto"``, ``"explicit"``, or None for ``jax.make_mesh``'s default.

    Returns:
      A mesh over the first ``prod(sizes)`` of ``jax.devices()``.

    Raises:
      InvalidArgument: bad sizes or axis types, or more devices than jax has.

    Example:
      >>> mesh = mesh_for({"dp": 2, "tp": 1}, axis_types="auto")
      >>> dict(mesh.shape), mesh is mesh_for({"dp": 2, "tp": 1}, axis_types="auto")
      ({'dp': 2, 'tp': 1}, True)
    """
    sizes = check_axis_sizes(axis_sizes)
    _check_axis_types(axis_types)
    return _mesh(tuple(sizes.items()), axis_types)


def meshes(*, axis_names: Sequence[str] | None = None, min_axes: int = 1, max_axes: int = 3,
           num_devices: int | None = None, abstract: bool = False,
           axis_types: str | None = None) -> st.SearchStrategy[Any]:
    """Live ``jax.sharding.Mesh`` values over the local devices, or ``AbstractMesh`` values.

    Args:
      axis_names, min_axes, max_axes: as in :func:`mesh_shapes`.
      num_devices: the mesh size; None draws a divisor of the local device
        count (live) or a count in ``[1, 8]`` (abstract).
      abstract: draw ``AbstractMesh`` (no devices) instead of ``Mesh``.
      axis_types: ``"auto"``, ``"explicit"``, or None to draw one for all axes.

    Returns:
      A strategy of meshes; shrinks to a one-device Auto mesh with one axis ``dp``.

    Example:
      >>> from hypothesis import find
      >>> find(meshes(abstract=True), lambda m: True)
      AbstractMesh('dp': 1, axis_types=(Auto,))
    """
    import jax
    from jax.sharding import AbstractMesh, AxisType

    check_bool(abstract, "abstract")
    _check_axis_types(axis_types)
    local = None if abstract else len(jax.devices())
    if num_devices is not None:
        check_int(num_devices, "num_devices", minimum=1)
        if local is not None:
            _local_devices(num_devices)
        counts = st.just(num_devices)
    elif local is None:
        counts = st.integers(1, 8)
    else:
        counts = st.sampled_from([d for d in range(1, local + 1) if local % d == 0])
    types = st.just(axis_types) if axis_types else st.sampled_from(_AXIS_TYPES)
    shapes = counts.flatmap(lambda n: mesh_shapes(num_devices=n, axis_names=axis_names,
                                                  min_axes=None if axis_names else min_axes,
                                                  max_axes=None if axis_names else max_axes))

    def build(shape_type: tuple[MeshShape, str]) -> Any:
        shape, kind = shape_type
        if abstract:
            axis_type = AxisType.Auto if kind == "auto" else AxisType.Explicit
            return AbstractMesh(shape.sizes, shape.names, axis_types=(axis_type,) * shape.ndim)
        return _mesh(tuple(zip(shape.names, shape.sizes)), kind)

    return st.tuples(shapes, types).map(build)
