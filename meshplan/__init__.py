"""meshplan: plan JAX device meshes and parameter shardings.

Drop-in names for eformer's ``escale`` and loadax's mesh API, with a pure,
shape-only core (:mod:`meshplan.pure`) and a thin live-jax facade
(:mod:`meshplan.facade`).
"""

from meshplan import errors
from meshplan.errors import *  # noqa: F401,F403

__version__ = "0.1.0"

__all__ = ["errors", *errors.__all__]

# --- meshes ----------------------------------------------------------------------------------------

# --- sharding --------------------------------------------------------------------------------------

# --- multi-host --------------------------------------------------------------------------------------
from meshplan.facade._distributed import barrier_sync, host_batch_slice, host_mesh_shape
from meshplan.pure._batch import HostBatchSlice

__all__ += ["barrier_sync", "host_batch_slice", "host_mesh_shape", "HostBatchSlice"]

# --- planning --------------------------------------------------------------------------------------
