"""How much of a device's memory a program gets: the headroom a plan keeps free by default, and why.

- A GPU: jax's allocator preallocates a fraction of each GPU's memory (``XLA_PYTHON_CLIENT_MEM_FRACTION``,
  0.75 by default) and a jax program gets no more, so a budget of 90% of HBM would promise memory a default
  install does not take. The default headroom is ``1 - 0.75``; a caller that knows the process's own
  fraction (the command line reads ``--mem-fraction`` and the environment) passes it as ``mem_fraction``.
- A TPU slice: the runtime keeps a little for itself; 10% is kept free.

The library (:func:`~meshplan.pure.search.search_meshes` with ``headroom=None``) and ``meshplan plan`` both
take their default from :func:`default_headroom`, so they give the same budget for the same cluster.

Example:
  >>> from meshplan.pure.cluster import parse_cluster
  >>> default_headroom(parse_cluster("1x8xH100"))
  (0.25, "jax's GPU allocator takes 75%: its default; --mem-fraction to change")
  >>> default_headroom(parse_cluster("v5p-8"))[0]
  0.1
"""

from __future__ import annotations

from meshplan.pure._check import as_real
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = ["JAX_GPU_MEM_FRACTION", "TPU_HEADROOM", "default_headroom"]

JAX_GPU_MEM_FRACTION = 0.75
"""The share of each GPU's memory jax's allocator preallocates by default (``XLA_PYTHON_CLIENT_MEM_FRACTION``)."""

TPU_HEADROOM = 0.1
"""The share of a TPU chip's HBM a plan keeps free by default."""


def default_headroom(cluster: Cluster, *, mem_fraction: float | None = None,
                     source: str = "its default; --mem-fraction to change") -> tuple[float, str]:
    """``(headroom, where it comes from)``: the fraction of HBM a plan on ``cluster`` keeps free by default.

    Args:
      cluster: the cluster planned.
      mem_fraction: on a GPU, the fraction of memory jax's allocator takes in the process that will run
        (default :data:`JAX_GPU_MEM_FRACTION`); ignored on a TPU.
      source: what set ``mem_fraction``, as the plan's header says it.

    Raises:
      PlanError: ``mem_fraction`` outside ``(0, 1]``.
      MeshplanTypeError: ``cluster`` is not a Cluster.
    """
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.80} must be a Cluster (parse_cluster('1x8xH100')).")
    if cluster.device.ici_scope == "slice":
        return TPU_HEADROOM, "--headroom"
    fraction = JAX_GPU_MEM_FRACTION if mem_fraction is None else as_real(mem_fraction, "mem_fraction",
                                                                       error=PlanError)
    if fraction > 1:
        raise PlanError(f"mem_fraction={mem_fraction!r} must be a fraction in (0, 1]: the share of each GPU "
                        "jax's allocator takes.")
    return 1.0 - fraction, f"jax's GPU allocator takes {fraction:.0%}: {source}"
