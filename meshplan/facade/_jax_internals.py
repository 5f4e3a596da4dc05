"""The two facts meshplan needs that jax keeps private, each read in one place.

- Whether jax's backends have started (``jax._src.xla_bridge.backends_are_initialized``): after they
  start, asking for more simulated CPU devices is silently ignored, so a caller must know beforehand
  to say what to do instead. No public API tells it.
- jax's distributed client (``jax._src.distributed.global_state.client``), for a barrier across
  processes: ``jax.distributed`` exposes initialisation but no barrier, and the client's
  ``wait_at_barrier`` is the only one that needs no devices.

Each function imports the private module when called, so a jax that moved it fails only the feature
that needs it, with a message naming what moved.
"""

from __future__ import annotations

from typing import Any

__all__ = ["backends_started", "distributed_client"]


def backends_started() -> bool:
    """Whether this process's jax has started its backends (devices can no longer be reconfigured).

    Example:
      >>> import jax
      >>> _ = jax.devices()
      >>> backends_started()
      True
    """
    from jax._src import xla_bridge  # private: see the module docstring

    return bool(xla_bridge.backends_are_initialized())


def distributed_client() -> Any:
    """jax's distributed-runtime client, or ``None`` when ``jax.distributed.initialize`` has not run.

    Raises:
      AttributeError: this jax keeps its distributed state elsewhere (the caller says what to do).

    Example:
      >>> distributed_client() is None  # a single process: jax.distributed was never initialised
      True
    """
    from jax._src import distributed  # private: see the module docstring

    return distributed.global_state.client
