"""CPU meshes, simulated CPU devices and CPU-pinned execution, for tests and debugging."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import Mesh

from meshplan.facade._mesh import create_mesh
from meshplan.pure._check import as_count
from meshplan.pure.mesh._parse import parse_mesh_string

__all__ = ["create_cpu_mesh", "force_cpu", "cpu_context", "parse_mesh_from_string", "use_cpu_devices"]


def use_cpu_devices(n: int) -> bool:
    """Ask for ``n`` simulated CPU devices with ``chex.set_n_cpu_devices``, if jax's backends are not up yet.

    chex's is the ecosystem's way to fake devices in tests: it writes ``XLA_FLAGS``
    (which subprocesses inherit) and says how to fix a call made too late. A
    ``jax_num_cpu_devices`` set to ``n`` or more, or an ``XLA_FLAGS`` count of ``n`` or
    more, is left as it is; once the backends are up nothing changes, and the
    caller says what to do when there are too few devices.

    Args:
      n: how many CPU devices the caller needs.

    Returns:
      Whether the devices were asked for (False: enough were asked for already, or too late).

    Raises:
      MeshShapeError: ``n`` < 1.

    Example:
      >>> use_cpu_devices(8)  # this process's backends are up already: nothing changes
      False
    """
    n = as_count(n, "n")
    import chex

    from meshplan.facade._jax_internals import backends_started

    if backends_started():
        return False
    configured = int(getattr(jax.config, "jax_num_cpu_devices", -1))  # an untyped config attribute
    flags = os.environ.get("XLA_FLAGS", "")
    asked = [int(f.split("=", 1)[1]) for f in flags.split()
             if f.startswith("--xla_force_host_platform_device_count=") and f.split("=", 1)[1].isdigit()]
    if configured >= n or (configured < 0 and asked and asked[-1] >= n):
        return False
    if configured >= 0:  # jax's own setting wins over XLA_FLAGS: raise it where it is
        jax.config.update("jax_num_cpu_devices", n)  # type: ignore[no-untyped-call]
    chex.set_n_cpu_devices(n)
    return True


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
