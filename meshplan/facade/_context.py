"""Reading jax's ambient state: the current mesh and the x64 flag.

The analyzer, the sharding rules and the host helpers all accept ``mesh=None``
meaning "the mesh made current with ``jax.set_mesh``"; this is the one place
that knows how jax 0.10 exposes it.
"""

from __future__ import annotations

import jax
from jax.sharding import AbstractMesh, Mesh

__all__ = ["current_mesh", "x64_enabled"]


def current_mesh() -> Mesh | AbstractMesh | None:
    """The mesh made current with ``jax.set_mesh`` (or an abstract one in use), else None.

    ``jax.sharding.get_mesh()`` is the public reader of ``jax.set_mesh`` in
    jax 0.10 (outside jit); ``get_abstract_mesh()`` also sees
    ``use_abstract_mesh`` and tracing contexts. The deprecated ``with mesh:``
    sets neither and is not honoured.

    Example:
      >>> import jax
      >>> current_mesh() is None
      True
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> with jax.set_mesh(mesh):
      ...     current_mesh() == mesh
      True
    """
    mesh = jax.sharding.get_mesh()
    if mesh.empty:
        mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def x64_enabled() -> bool:
    """Whether jax makes Python scalars 64-bit (``jax_enable_x64``)."""
    return bool(jax.config.jax_enable_x64)
