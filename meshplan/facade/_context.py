"""Reading jax's ambient state: the current mesh and the x64 flag.

The analyzer, the sharding rules and the host helpers all accept ``mesh=None``
meaning "the mesh made current with ``jax.set_mesh``"; this is the one place
that knows how jax 0.10 exposes it.
"""

from __future__ import annotations

import jax
from jax.sharding import AbstractMesh, Mesh

from meshplan.pure.errors import MeshplanTypeError, NoMeshError

__all__ = ["current_mesh", "require_mesh", "x64_enabled"]


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
    mesh: Mesh | AbstractMesh = jax.sharding.get_mesh()
    if mesh.empty:
        mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def require_mesh(
    mesh: object, owner: str, *, concrete: bool = False, optional: bool = False
) -> Mesh | AbstractMesh | None:
    """The given mesh, else the current one; the one "mesh or raise" of the facade.

    Args:
      mesh: what the caller passed (``None``: use the current mesh).
      owner: who asks, for messages ("ShardingAnalyzer", "host_batch_slice").
      concrete: require a ``Mesh`` with devices (an ``AbstractMesh`` does not
        say which process owns which position).
      optional: return ``None`` instead of raising when there is no mesh at all
        (a rule built outside any mesh finds one later, when applied).

    Raises:
      NoMeshError: ``mesh=None``, no mesh is current and ``optional`` is False.
      MeshplanTypeError: ``mesh`` is not a Mesh (or AbstractMesh, unless ``concrete``).

    Example:
      >>> import jax
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> require_mesh(mesh, "demo") is mesh
      True
      >>> require_mesh(None, "demo")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.NoMeshError: demo has no mesh: pass mesh=... or make one current with `jax.set_mesh(mesh)` (mesh=None and no mesh is set).
    """
    kinds = Mesh if concrete else (Mesh, AbstractMesh)
    if mesh is not None and not isinstance(mesh, kinds):
        wanted = ("a jax.sharding.Mesh with devices (an AbstractMesh does not say which process owns "
                  "which position)") if concrete else "a jax.sharding.Mesh or AbstractMesh"
        raise MeshplanTypeError(f"{owner}: mesh={mesh!r} must be {wanted}.")
    found = mesh if mesh is not None else current_mesh()
    if found is None:
        if optional:
            return None
        raise NoMeshError(
            f"{owner} has no mesh: pass mesh=... or make one current with `jax.set_mesh(mesh)` "
            "(mesh=None and no mesh is set)."
        )
    if not isinstance(found, kinds):
        raise MeshplanTypeError(f"{owner}: the current mesh {found!r} is abstract; pass a jax.sharding.Mesh with devices.")
    return found


def x64_enabled() -> bool:
    """Whether jax makes Python scalars 64-bit (``jax_enable_x64``)."""
    # jax leaves Config.read unannotated (and the attribute form untyped), hence the ignore.
    return bool(jax.config.read("jax_enable_x64"))  # type: ignore[no-untyped-call]
