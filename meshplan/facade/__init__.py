"""meshplan.facade: binds the pure planners to live jax devices and meshes.

Each function here gathers facts from jax, calls :mod:`meshplan.pure`, and
applies the answer. Decisions live in pure.
"""

__all__: list[str] = []

# --- meshes ----------------------------------------------------------------------------------------

# --- sharding rules, analyzer, partition helper ----------------------------------------------------

# --- multi-host --------------------------------------------------------------------------------------
from meshplan.facade._distributed import barrier_sync, host_batch_slice, host_mesh_shape

__all__ += ["barrier_sync", "host_batch_slice", "host_mesh_shape"]
