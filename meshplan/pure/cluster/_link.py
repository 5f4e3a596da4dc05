"""One interconnect as the cost model sees it (:class:`Link`), and which link a device group's collective runs at.

A cluster is two links: the fast one inside a node or TPU slice (NVLink, ICI) and the slow one between them
(InfiniBand / RoCE, DCN). :func:`select_link` picks between them for one group of devices.

Example:
  >>> select_link(Link(450e9, 3e-6), Link(50e9, 1e-5), spans_nodes=False)
  Link(bandwidth=450 GB/s, latency=3 us)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from meshplan.pure._check import as_real
from meshplan.pure.errors import ClusterError, MeshplanTypeError

__all__ = ["Link", "check_link", "select_link"]


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    """One interconnect, as the cost model sees it.

    Attributes:
      bandwidth: bytes per second one device can send in one direction during
        a ring collective (> 0). For NVLink this is the per-GPU one-direction
        total; for a TPU torus axis, two links' one-way bandwidth (a
        bidirectional ring). :mod:`meshplan.pure.cluster._cluster` derives the shipped
        figures and cites their sources.
      latency: seconds per ring step, the ``alpha`` term (>= 0).

    Raises:
      ClusterError: a negative, zero (bandwidth) or non-finite value.
      MeshplanTypeError: a value that is not a real number.

    Example:
      >>> Link(bandwidth=450e9, latency=3e-6)
      Link(bandwidth=450 GB/s, latency=3 us)
    """

    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", as_real(self.bandwidth, "bandwidth", error=ClusterError))
        object.__setattr__(self, "latency", as_real(self.latency, "latency", allow_zero=True, error=ClusterError))

    def __repr__(self) -> str:
        return f"Link(bandwidth={self.bandwidth / 1e9:g} GB/s, latency={self.latency * 1e6:g} us)"


def check_link(link: object) -> Link:
    if not isinstance(link, Link):
        raise MeshplanTypeError(f"link={link!r} must be a Link(bandwidth=..., latency=...).")
    return link


def select_link(intra: Link, inter: Link, *, spans_nodes: bool) -> Link:
    """The link a collective over one device group runs at.

    A group that stays inside one fast domain (an NVLink node, a TPU slice)
    uses ``intra``. A group that crosses domains, even partly, uses ``inter``:
    a ring is as slow as its slowest hop, and this model does not split a
    collective into a hierarchical intra + inter schedule, so the result is
    an upper bound for groups that are mostly intra-domain.

    Args:
      intra: the intra-node / ICI link.
      inter: the inter-node / DCN link.
      spans_nodes: whether the group has devices in more than one fast domain.

    Returns:
      ``inter`` if ``spans_nodes`` else ``intra``.

    Raises:
      MeshplanTypeError: a link that is not a :class:`Link`, or a non-bool flag.

    Example:
      >>> nvlink, ib = Link(450e9, 3e-6), Link(50e9, 1e-5)
      >>> select_link(nvlink, ib, spans_nodes=True)
      Link(bandwidth=50 GB/s, latency=10 us)
    """
    check_link(intra)
    check_link(inter)
    if not isinstance(spans_nodes, (bool, np.bool_)):
        raise MeshplanTypeError(f"spans_nodes={spans_nodes!r} must be a bool.")
    return inter if spans_nodes else intra

