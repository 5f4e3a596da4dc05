"""CPU meshes and CPU-pinned execution, for tests and debugging."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import Mesh

from meshplan.facade._mesh import create_mesh
from meshplan.pure.mesh._parse import parse_mesh_string

__all__ = ["create_cpu_mesh", "force_cpu", "cpu_context", "parse_mesh_from_string"]


def create_cpu_mesh(
    axis_dims: Sequence[int] = (1, -1, 1, 1, 1),
    axis_names: Sequence[str] = ("dp", "fsdp", "ep", "tp", "sp"),
) -> Mesh:
    """A mesh over every CPU device (see :func:`create_mesh` for the arguments).

    Example:
      >>> dict(create_cpu_mesh().shape)
      {'dp': 1, 'fsdp': 8, 'ep': 1, 'tp': 1, 'sp': 1}
    """
    return create_mesh(axis_dims, axis_names, backend="cpu")


@contextlib.contextmanager
def force_cpu() -> Iterator[jax.Device]:
    """Run jax computations on the first CPU device inside the block.

    The previous default device is restored on exit, also after an error.

    Example:
      >>> import jax.numpy as jnp
      >>> with force_cpu() as cpu:
      ...     x = jnp.ones(3)
      >>> x.devices() == {cpu}
      True
    """
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        yield cpu


@contextlib.contextmanager
def cpu_context(
    axis_dims: Sequence[int] = (1, -1, 1, 1, 1),
    axis_names: Sequence[str] = ("dp", "fsdp", "ep", "tp", "sp"),
) -> Iterator[Mesh]:
    """CPU execution with a CPU mesh made current through ``jax.set_mesh``.

    Example:
      >>> import jax
      >>> with cpu_context() as mesh:
      ...     jax.sharding.get_mesh() is mesh
      True
    """
    with force_cpu():
        mesh = create_cpu_mesh(axis_dims, axis_names)
        with jax.set_mesh(mesh):
            yield mesh


def parse_mesh_from_string(axis_dims: str, names: Sequence[str]) -> Mesh:
    """A mesh from ``"dp:2,tp:4"`` (named) or ``"2,4"`` (positional).

    Named strings keep the string's axis order (as eformer does); see
    :func:`meshplan.pure.parse_mesh_string` for the exact grammar.

    Example:
      >>> dict(parse_mesh_from_string("dp:2,tp:4", ["dp", "tp"]).shape)
      {'dp': 2, 'tp': 4}
      >>> dict(parse_mesh_from_string("2,-1", ["data", "model"]).shape)
      {'data': 2, 'model': 4}
    """
    ordered_names, dims = parse_mesh_string(axis_dims, names)
    return create_mesh(dims, ordered_names)
