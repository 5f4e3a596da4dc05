"""Where a training step's collectives run and what they cost: the axis kinds, the mesh axes' ICI and DCN
parts, and the two-level link schedule that prices a collective not yet priced (:class:`Pending`).

Axis kinds (the mesh search's axes, outermost first ``dp, fsdp, ep, sp, tp``):
``dp``, ``fsdp`` and ``ep`` split the batch, ``sp`` splits the sequence, ``tp``
splits the model's matmuls. Per device a step sees ``b = batch / (dp*fsdp*ep)``
sequences of ``s = seq / sp`` tokens. ``L`` is the number of layers, ``h`` the
hidden size, ``a`` the activation itemsize (2 for bf16). The collectives of a step are listed by
:mod:`~meshplan.pure.cost._param_collectives` (the parameters') and
:mod:`~meshplan.pure.cost._activation_collectives` (the activations'), each as a :class:`Pending` record;
:func:`price` prices them all in one pass.

**Links.** A device group whose axes all lie inside ICI domains
(``dcn == 1`` for each) runs on the fast link; one that lies wholly across
domains (``ici == 1``) on the network; a group with ``i`` devices per domain
over ``d`` domains runs a two-level schedule, the way XLA runs multislice
collectives and NCCL's hierarchical algorithms do: all-gather /
reduce-scatter = ring of ``i`` on ICI (buffer ``B``) + ring of ``d`` on DCN
(buffer ``B/i``); all-reduce likewise; all-to-all = exchange of ``B`` within
the domain + exchange of ``B`` across domains. :func:`axis_domain_counts`
checks which groups cross domains on an actual device layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias

import numpy as np

from meshplan.pure._check import as_count
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.cost._estimates import CommTerm
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cost._collective_time import CollectiveKind, collective_time

__all__ = ["AXIS_ORDER", "BATCH_AXES", "DATA_AXES", "STORAGE_AXES", "AxisPlacement", "Pending", "StepKind",
           "axis_domain_counts", "group_time", "local_batch", "price", "to_terms"]

AXIS_ORDER: tuple[str, ...] = ("dp", "fsdp", "ep", "sp", "tp")
"""The axis kinds the search knows, outermost (least traffic) first."""

BATCH_AXES: tuple[str, ...] = ("dp", "fsdp", "ep")
"""Axes that split the global batch."""

DATA_AXES: tuple[str, ...] = ("dp", "fsdp", "ep", "sp")
"""Axes that split the tokens: gradients are summed over those a leaf is not split on."""

STORAGE_AXES: tuple[str, ...] = ("dp", "fsdp", "sp")
"""Axes that split weights only to store them: split weights are gathered before use."""


def local_batch(sizes: Mapping[str, int], batch: int, seq: int) -> tuple[int, int]:
    """``(b, s)``: the sequences and the tokens per sequence one device sees of a ``batch x seq`` step.

    Example:
      >>> local_batch({"dp": 2, "fsdp": 2, "sp": 4, "tp": 2}, 16, 4096)
      (4, 1024)
    """
    ways = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
    return batch // ways, seq // sizes.get("sp", 1)


def axis_domain_counts(device_ids: np.ndarray, ici_domain_size: int) -> tuple[int, ...]:
    """For each mesh axis, the most ICI domains one of its device groups touches.

    Device ``i`` sits in domain ``i // ici_domain_size`` (ids numbered node by
    node, as :class:`~meshplan.pure.Cluster` lays them out). A count of 1 means
    every group along that axis stays on the fast link.

    Args:
      device_ids: the mesh as an array of device ids (one mesh axis per array axis).
      ici_domain_size: devices per ICI domain.

    Returns:
      One count per mesh axis.

    Example:
      >>> ids = np.arange(16).reshape(2, 8)            # dp=2 outer, tp=8 inner
      >>> axis_domain_counts(ids, 8)
      (2, 1)
      >>> axis_domain_counts(ids.reshape(8, 2), 8)     # the inner axis of size 2 stays in a node
      (2, 1)
    """
    size = as_count(ici_domain_size, "ici_domain_size", error=PlanError)
    try:
        ids = np.asarray(device_ids)
    except (ValueError, TypeError, OverflowError):
        ids = np.asarray(None)  # ragged: refused just below
    if ids.dtype.kind not in "iu":
        raise MeshplanTypeError(f"device_ids={device_ids!r:.80} must be an integer array (the mesh's device ids).")
    del ici_domain_size
    ici_domain_size = size
    if ici_domain_size > int(np.iinfo(ids.dtype).max):
        # Floor division by a divisor beyond every id the dtype holds (numpy cannot even convert it).
        domains = np.where(ids < 0, -1, 0)
    else:
        domains = ids // ici_domain_size
    out = []
    for axis in range(domains.ndim):
        rows = np.moveaxis(domains, axis, -1).reshape(-1, domains.shape[axis])
        ordered = np.sort(rows, axis=1)
        distinct = (np.diff(ordered, axis=1) != 0).sum(axis=1) + 1
        out.append(int(distinct.max()))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class AxisPlacement:
    """Each mesh axis's ICI and DCN parts on a cluster (``ici[k] * dcn[k]`` = its size)."""

    names: tuple[str, ...]
    ici: tuple[int, ...]
    dcn: tuple[int, ...]
    cluster: Cluster

    def split(self, axes: Sequence[str]) -> tuple[int, int]:
        """(devices per domain, domains) of the device group over ``axes``."""
        i = d = 1
        for a in axes:
            k = self.names.index(a)
            i *= self.ici[k]
            d *= self.dcn[k]
        return i, d


StepKind: TypeAlias = CollectiveKind | Literal["collective-permute"]
"""A collective of a step: the cost model's kinds and XLA's collective-permute (a slice resharded between
devices, :func:`~meshplan.pure.cost._activation_collectives._fused_qkv_permutes`), priced as one point-to-point
send of its buffer."""


class Pending(NamedTuple):
    """A collective of a step not yet priced (:func:`price` prices a list of them in one pass).

    Example:
      >>> p = Pending("tp all-reduce of activations", "all-reduce", ("tp",), 1e9, 2, 8, 1)
      >>> p.kind, p.nbytes * p.calls, p.ici * p.dcn
      ('all-reduce', 2000000000.0, 8)
    """

    what: str
    """What it moves, as the plan shows it (its group's axes first: ``"fsdp all-gather of params ..."``)."""
    kind: StepKind
    axes: tuple[str, ...]
    """The mesh axes of its device group."""
    nbytes: float
    """Bytes of one call (the full buffer, as :mod:`meshplan.pure.cost._collective_time` defines it)."""
    calls: int
    """Calls per step."""
    ici: int
    """Devices of the group per ICI domain."""
    dcn: int
    """ICI domains the group spans."""


def _link_name(i: int, d: int) -> str:
    if i * d == 1:
        return "none"
    return "intra" if d == 1 else "inter" if i == 1 else "intra+inter"


def _two_level(kind: StepKind, nbytes: Any, i: Any, d: Any, cluster: Cluster) -> Any:
    """Seconds of one call: ring of ``i`` on ICI + ring of ``d`` on DCN (either may be 1, costing 0)."""
    if kind == "collective-permute":
        # Each device sends its buffer once, to one peer of the group: over DCN when the group spans domains.
        i, d = np.asarray(i), np.asarray(d)
        intra, inter = cluster.intra_link, cluster.inter_link
        return np.where(d > 1, inter.latency + nbytes / inter.bandwidth,
                        np.where(i > 1, intra.latency + nbytes / intra.bandwidth, 0.0))
    outer = nbytes if kind == "all-to-all" else nbytes / i
    return (collective_time(kind, nbytes, i, cluster.intra_link)
            + collective_time(kind, outer, d, cluster.inter_link))


def group_time(kind: StepKind, nbytes: float, axes: Sequence[str], placement: AxisPlacement) -> tuple[float, str]:
    """Seconds of one collective over the device group ``axes``, and the link it uses.

    Args:
      kind: ``"all-gather"``, ``"reduce-scatter"``, ``"all-reduce"``, ``"all-to-all"`` or
        ``"collective-permute"`` (one send of ``nbytes`` per device).
      nbytes: the full buffer (as :mod:`meshplan.pure.cost._collective_time` defines it).
      axes: the mesh axes of the group.
      placement: where the axes lie.

    Returns:
      ``(seconds, link)`` with link ``"intra"``, ``"inter"``, ``"intra+inter"`` (two-level)
      or ``"none"`` (a group of one device).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> c = parse_cluster("2x8xH100")
      >>> p = AxisPlacement(("dp", "tp"), (1, 8), (2, 1), c)
      >>> group_time("all-reduce", 1e9, ("tp",), p)[1], group_time("all-reduce", 1e9, ("dp", "tp"), p)[1]
      ('intra', 'intra+inter')
    """
    i, d = placement.split(axes)
    return float(_two_level(kind, float(nbytes), i, d, placement.cluster)), _link_name(i, d)


def price(pending: Sequence[Pending], cluster: Cluster) -> np.ndarray:
    """Seconds of every pending collective (all its calls), priced in one numpy pass per kind.

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> price([Pending("x", "all-reduce", ("tp",), 1e9, 2, 8, 1)], parse_cluster("H100")).round(6).tolist()
      [0.007862]
    """
    out = np.zeros(len(pending))
    by_kind: dict[StepKind, list[int]] = {}
    for k, item in enumerate(pending):
        by_kind.setdefault(item.kind, []).append(k)
    for kind, rows in by_kind.items():
        cols = np.array([(p.nbytes, p.calls, p.ici, p.dcn) for p in (pending[k] for k in rows)], dtype=np.float64)
        nbytes, calls, i, d = cols[:, 0], cols[:, 1], cols[:, 2].astype(np.int64), cols[:, 3].astype(np.int64)
        out[rows] = calls * _two_level(kind, nbytes, i, d, cluster)
    return out


def to_terms(pending: Sequence[Pending], seconds: Sequence[float] | np.ndarray) -> tuple[CommTerm, ...]:
    """Priced collectives as :class:`CommTerm` records."""
    return tuple(CommTerm(p.what, p.kind, p.axes, int(p.nbytes), p.calls, _link_name(p.ici, p.dcn), float(t))
                 for p, t in zip(pending, seconds, strict=True))
