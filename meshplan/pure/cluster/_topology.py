"""TPU topology names for ahead-of-time compilation: Cluster -> what libtpu's topology API takes.

``jax.experimental.topologies.get_topology_desc(platform="tpu", topology_name=...,
chip_config_name=..., chips_per_host_bounds=..., num_slices=..., wrap=...)`` gives
the devices of a whole TPU slice on a machine without TPUs; the facade compiles
against them. This module only names the slice: the shapes are MaxText's
``accelerator_to_spec_map`` (``v5p-256`` -> ``v5:4x4x8``, megacore, host bounds
``(2, 2, 1)``, wrapped from 64 chips; ``v5e-256`` -> ``v5e:16x16``, wrapped on
the first two dims). v4/v5p slices of 64 chips or more are 4x4x4 blocks
arranged as the most cubic box (smallest largest side, then largest smallest
side), which reproduces every entry of that table. TPU7x slices take the same
chip grids (AXLearn's table: ``tpu7x-128`` -> ``tpu7x:4x4x4``, ``"default"``
chip config: each of a chip's two TensorCores is a device, so the topology has
twice as many devices as chips).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan.pure.errors import ClusterError, MeshplanTypeError
from meshplan.pure.cluster._cluster import Cluster

__all__ = ["TpuTopology", "tpu_topology"]

# libtpu's generation prefix in topology names.
_PREFIX = {"v4": "v4", "v5p": "v5", "v5e": "v5e", "v6e": "v6e", "tpu7x": "tpu7x"}
_SMALL_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4)}
_GRID_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}


@dataclasses.dataclass(frozen=True, slots=True)
class TpuTopology:
    """The arguments of ``jax.experimental.topologies.get_topology_desc`` for one cluster.

    Attributes:
      topology_name: ``"v5:4x4x8"`` (generation prefix, then the chip grid of one slice).
      chip_config_name: ``"megacore"`` (v4, v5p: one device per chip) or ``"default"``.
      chips_per_host_bounds: the chip grid of one host.
      num_slices: slices joined by DCN.
      wrap: torus wrap-around per grid dimension.
      chips_per_slice: chips in one slice.
      devices_per_chip: jax devices per chip (2 on TPU7x, else 1).

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> tpu_topology(parse_cluster("v5p-256")).topology_name
      'v5:4x4x8'
    """

    topology_name: str
    chip_config_name: str
    chips_per_host_bounds: tuple[int, int, int]
    num_slices: int
    wrap: tuple[bool, bool, bool]
    chips_per_slice: int
    devices_per_chip: int = 1

    @property
    def grid(self) -> tuple[int, ...]:
        """The chip grid of one slice, ``(4, 4, 8)``."""
        return tuple(int(d) for d in self.topology_name.split(":")[1].split("x"))

    @property
    def num_devices(self) -> int:
        """Devices over all slices."""
        return self.chips_per_slice * self.devices_per_chip * self.num_slices

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``get_topology_desc`` (with ``platform="tpu"``)."""
        return {"platform": "tpu", "topology_name": self.topology_name, "chip_config_name": self.chip_config_name,
                "chips_per_host_bounds": self.chips_per_host_bounds, "num_slices": self.num_slices,
                "wrap": self.wrap}


def _cubic_blocks(n: int) -> tuple[int, int, int]:
    """``a <= b <= c`` with ``a*b*c == n``: smallest ``c``, then largest ``a``."""
    best: tuple[int, int, int] | None = None
    for a in range(1, n + 1):
        if a * a * a > n:
            break
        if n % a:
            continue
        for b in range(a, n // a + 1):
            if a * b * b > n:
                break
            if (n // a) % b:
                continue
            c = n // (a * b)
            if best is None or (c, -a) < (best[2], -best[0]):
                best = (a, b, c)
    assert best is not None  # n >= 1 always has (1, 1, n)
    return best


def tpu_topology(cluster: Cluster) -> TpuTopology:
    """The topology ``cluster`` names, as libtpu's AOT topology API takes it.

    Args:
      cluster: a TPU cluster (``parse_cluster("v5p-256")``, ``"2xv5e-256"``).

    Returns:
      A :class:`TpuTopology`; ``num_devices`` equals ``cluster.num_devices``.

    Raises:
      ClusterError: not a TPU cluster, or a slice size with no TPU shape.
      MeshplanTypeError: ``cluster`` is not a Cluster.

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> t = tpu_topology(parse_cluster("2xv5e-256"))
      >>> t.topology_name, t.chip_config_name, t.num_slices, t.wrap
      ('v5e:16x16', 'default', 2, (True, True, False))
      >>> tpu_topology(parse_cluster("v4-8")).topology_name
      'v4:2x2x1'
    """
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r} must be a Cluster, e.g. parse_cluster('v5p-256').")
    gen = cluster.device.name
    prefix = _PREFIX.get(gen)
    if prefix is None or cluster.device.ici_scope != "slice":
        raise ClusterError(f"cluster {cluster.text!r} ({gen}) is not a TPU cluster; AOT topologies exist for "
                           f"{sorted(_PREFIX)}.")
    per_chip = 2 if prefix == "tpu7x" else 1
    chips = cluster.devices_per_slice // per_chip
    if chips * per_chip != cluster.devices_per_slice:
        raise ClusterError(f"cluster {cluster.text!r}: {cluster.devices_per_slice} devices per slice is not a whole "
                           f"number of {gen} chips ({per_chip} devices each).")
    wrap: tuple[bool, bool, bool]
    if prefix in ("v5e", "v6e"):
        grid2 = _GRID_2D.get(chips)
        if grid2 is None:
            raise ClusterError(f"cluster {cluster.text!r}: no {gen} slice has {chips} chips; valid: "
                               f"{sorted(_GRID_2D)}.")
        grid: tuple[int, ...] = grid2
        wrap = (chips == 256, chips >= 128, False)
        bounds = (1, 1, 1) if chips == 1 else (2, 2, 1)
        config = "default"
    else:
        if prefix == "tpu7x" and chips == 1:
            grid = (1, 1, 1)
        elif chips in _SMALL_3D:
            grid = _SMALL_3D[chips]
        elif chips % 64 == 0:
            grid = tuple(4 * d for d in _cubic_blocks(chips // 64))
        else:
            raise ClusterError(f"cluster {cluster.text!r}: no {gen} slice has {chips} chips; valid: "
                               f"{sorted(_SMALL_3D)} or a multiple of 64.")
        wrap = (True, True, True) if chips >= 64 else (False, False, False)
        bounds = (2, 2, 1)
        config = "megacore"
        if prefix == "tpu7x":
            bounds = (1, 1, 1) if chips == 1 else bounds
            config = "default"  # each TensorCore its own device: no megacore
    name = f"{prefix}:" + "x".join(str(d) for d in grid)
    return TpuTopology(name, config, bounds, cluster.num_slices, wrap, chips, per_chip)
