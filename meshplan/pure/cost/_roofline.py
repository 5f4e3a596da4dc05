"""What a compiled op costs on a device, and which link a collective's device groups cross.

The two inputs of the schedule simulator (:mod:`meshplan.pure.cost._schedule_time`), as plain records:

- :class:`Roofline`: one device's matmul peak, its HBM bandwidth, the matmul efficiency it sustains for
  an op of a given size (:class:`SizeEfficiency`, a function of the op's time at peak, ``flops / peak``),
  the fraction of the HBM peak memory-bound kernels reach, and a per-kernel launch cost. An op runs for
  ``max(t / efficiency(t), bytes / (hbm_bandwidth x hbm_efficiency)) + launch_s`` with ``t = flops / peak``:
  matmuls are compute-bound unless they are skinny, elementwise fusions are bandwidth-bound. Sizing the
  efficiency by time rather than by FLOPs carries one curve across devices of different peaks: what keeps
  a small matmul from its peak (the launch, the last wave, the pipeline's fill) is time;
- :class:`ScheduleLinks`: the fast link (NVLink, ICI) and the network (InfiniBand, DCN), and the fast
  domain (a node for GPUs, a slice for TPUs) of each device the program is partitioned over: a
  collective whose replica groups hold devices of more than one domain runs on the network
  (:func:`~meshplan.pure.cluster.select_link`'s rule, an upper bound for mostly-local groups).

Example:
  >>> from meshplan.pure.cluster import parse_cluster
  >>> links = schedule_links(parse_cluster("2x8xH100"))
  >>> links.link_of(((0, 1), (8, 9))), links.link_of(((0, 8),))
  ('intra', 'inter')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from meshplan.pure._check import as_int_tuple, as_real
from meshplan.pure.cluster import Cluster, DeviceSpec, Link
from meshplan.pure.cluster._link import check_link
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = ["SCHEDULE_FIT", "Roofline", "ScheduleLinks", "SizeEfficiency", "default_roofline", "roofline",
           "schedule_links"]


@dataclasses.dataclass(frozen=True, slots=True)
class SizeEfficiency:
    """Matmul efficiency as a function of the op's time at peak ``t``: ``e_max x t / (t + half_s)``.

    A small matmul fills the device less (its launch, its last partial wave, the pipeline's fill and
    drain); a long one approaches ``e_max``. ``half_s`` is the time at peak at which an op reaches half of
    ``e_max``; ``half_s = 0`` is a flat ``e_max``.

    Example:
      >>> e = SizeEfficiency(0.8, 1e-4)
      >>> e(1e-4), e(0.0), SizeEfficiency(0.5)(1e-9)
      (0.4, 0.0, 0.5)
    """

    e_max: float
    half_s: float = 0.0

    def __post_init__(self) -> None:
        e = as_real(self.e_max, "e_max", error=PlanError)
        if e > 1:
            raise PlanError(f"e_max={e:g} must be a fraction of the peak, in (0, 1].")
        object.__setattr__(self, "e_max", e)
        object.__setattr__(self, "half_s", as_real(self.half_s, "half_s", allow_zero=True, error=PlanError))

    def __call__(self, seconds_at_peak: float) -> float:
        if self.half_s == 0:
            return self.e_max
        t = seconds_at_peak
        return self.e_max * t / (t + self.half_s) if t > 0 else 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Roofline:
    """One device as the schedule simulator prices an op on it (the module docstring).

    Attributes:
      peak_flops: dense matmul FLOP/s (bf16).
      hbm_bandwidth: bytes/s of HBM, the datasheet peak.
      efficiency: matmul efficiency of an op that takes ``t`` seconds at peak (a :class:`SizeEfficiency`,
        or any function of one float returning a fraction in (0, 1]).
      hbm_efficiency: fraction of ``hbm_bandwidth`` a memory-bound kernel reaches.
      launch_s: seconds each kernel costs beyond its roofline time (a launch and its tail): an
        assumption per backend, 0 where none is stated.

    Raises:
      PlanError: a rate that is not > 0, a fraction outside (0, 1], a negative launch cost.
      MeshplanTypeError: ``efficiency`` is not callable.

    Example:
      >>> r = Roofline(1e15, 4e12, SizeEfficiency(0.5))
      >>> r.seconds(2e12, 0), r.seconds(0.0, 4e9)
      (0.004, 0.001)
    """

    peak_flops: float
    hbm_bandwidth: float
    efficiency: Callable[[float], float] = SizeEfficiency(1.0)
    hbm_efficiency: float = 1.0
    launch_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", as_real(self.peak_flops, "peak_flops", error=PlanError))
        object.__setattr__(self, "hbm_bandwidth", as_real(self.hbm_bandwidth, "hbm_bandwidth", error=PlanError))
        h = as_real(self.hbm_efficiency, "hbm_efficiency", error=PlanError)
        if h > 1:
            raise PlanError(f"hbm_efficiency={h:g} must be a fraction of the HBM peak, in (0, 1].")
        object.__setattr__(self, "hbm_efficiency", h)
        object.__setattr__(self, "launch_s", as_real(self.launch_s, "launch_s", allow_zero=True, error=PlanError))
        if not callable(self.efficiency):
            raise MeshplanTypeError(f"efficiency={self.efficiency!r:.60} must be a function of an op's time at "
                                    "peak (e.g. SizeEfficiency(0.7, 6e-5)).")

    def seconds(self, flops: float, nbytes: float, *, kernel: bool = True) -> float:
        """Seconds of one op: the slower of its matmul and its memory time, plus a launch if it is a kernel.

        Raises:
          PlanError: negative or non-finite FLOPs or bytes; an efficiency outside (0, 1].
        """
        flops = as_real(flops, "flops", allow_zero=True, error=PlanError)
        nbytes = as_real(nbytes, "nbytes", allow_zero=True, error=PlanError)
        compute = 0.0
        if flops > 0:
            at_peak = flops / self.peak_flops
            e = float(self.efficiency(at_peak))
            if not 0 < e <= 1:
                raise PlanError(f"efficiency({at_peak:g}) returned {e!r}; it must be a fraction in (0, 1].")
            compute = at_peak / e
        memory = nbytes / (self.hbm_bandwidth * self.hbm_efficiency) if nbytes > 0 else 0.0
        return max(compute, memory) + (self.launch_s if kernel else 0.0)


SCHEDULE_FIT: dict[str, tuple[float, float, float, float]] = {"gpu": (0.7, 6.4e-5, 0.85, 4e-6),
                                                              "tpu": (0.7, 0.0, 0.85, 0.0)}
"""``(e_max, half_s, hbm_efficiency, launch_s)`` of :func:`default_roofline`, per device kind. Estimates.

GPU: ``e_max`` and ``half_s`` fitted (least squares on ``ln(simulated / measured)``, a grid) on five of
the thirteen recorded single-GPU steps (``benchmarks/data/step_time_h200.jsonl``: Llama-3 8B/16L 2x4096
full remat, 8B/4L 8x2048 no remat, 70B/2L 4x4096, Mixtral 8x7B/2L 4x2048, GPT-2 16x1024 full remat; each
compiled deviceless for the H200 by ``benchmarks/bench_compiled_schedule.py --fit``), the other eight held
out (three H200 steps and all five H100 steps: 1.01-1.11x the measured step). ``hbm_efficiency`` 0.85 is
the sustained fraction of the datasheet HBM peak copies reach (not fitted); ``launch_s`` 4 us per kernel is
an assumed launch and tail, not measured. TPU: no TPU step was measured, so nothing is fitted: the GPU fit's
``e_max`` flat (no size curve: the GPU's half point of 64 us at peak is a kernel-launch-scale cost a TPU,
which runs its program as one executable, does not pay op by op), no launch cost."""


def default_roofline(device: DeviceSpec) -> Roofline:
    """The roofline the schedule simulator prices a catalogue device's ops with (:data:`SCHEDULE_FIT`).

    Raises:
      PlanError: the device states no bf16 peak or HBM bandwidth.

    Example:
      >>> from meshplan.pure.cluster import DEVICE_SPECS
      >>> r = default_roofline(DEVICE_SPECS["H200"])
      >>> r.hbm_bandwidth
      4800000000000.0
    """
    if not isinstance(device, DeviceSpec):
        raise MeshplanTypeError(f"device={device!r:.60} must be a DeviceSpec.")
    e_max, half, hbm, launch = SCHEDULE_FIT["tpu" if device.ici_scope == "slice" else "gpu"]
    return roofline(device, SizeEfficiency(e_max, half), hbm_efficiency=hbm, launch_s=launch)


def roofline(device: DeviceSpec, efficiency: Callable[[float], float] | float, *, hbm_efficiency: float = 1.0,
             launch_s: float = 0.0) -> Roofline:
    """A :class:`Roofline` from a catalogue device: its bf16 peak and its HBM bandwidth.

    Args:
      device: the :class:`~meshplan.pure.cluster.DeviceSpec` (needs ``peak_bf16_flops`` and ``hbm_bandwidth``).
      efficiency: a function of an op's time at peak, or a flat fraction.
      hbm_efficiency, launch_s: as :class:`Roofline`'s.

    Raises:
      PlanError: the device states no bf16 peak or no HBM bandwidth (give a Roofline of your own).

    Example:
      >>> from meshplan.pure.cluster import DEVICE_SPECS
      >>> roofline(DEVICE_SPECS["H100"], 0.5).peak_flops
      989000000000000.0
    """
    if not isinstance(device, DeviceSpec):
        raise MeshplanTypeError(f"device={device!r:.60} must be a DeviceSpec.")
    if device.peak_bf16_flops is None or device.hbm_bandwidth is None:
        raise PlanError(f"device {device.name!r} states no peak_bf16_flops or hbm_bandwidth; build a "
                        "Roofline(peak_flops=..., hbm_bandwidth=...) of your own.")
    eff = (SizeEfficiency(as_real(efficiency, "efficiency", error=PlanError))
           if isinstance(efficiency, (int, float)) else efficiency)
    return Roofline(device.peak_bf16_flops, device.hbm_bandwidth, eff, hbm_efficiency, launch_s)


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleLinks:
    """The links a program's collectives run on, and the fast domain of each of its devices.

    Attributes:
      intra: the fast link (NVLink, ICI).
      inter: the network (InfiniBand, DCN).
      domains: the fast domain (node, slice) of each device, indexed by the program's device
        (partition) id; ``()``: all in one domain.

    Example:
      >>> links = ScheduleLinks(Link(450e9, 3e-6), Link(50e9, 1e-5), (0, 0, 1, 1))
      >>> links.link_of(((0, 1), (2, 3))), links.link_of(((0, 2), (1, 3)))
      ('intra', 'inter')
    """

    intra: Link
    inter: Link
    domains: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_link(self.intra)
        check_link(self.inter)
        object.__setattr__(self, "domains", as_int_tuple(self.domains, "domains"))

    @property
    def num_domains(self) -> int:
        """How many fast domains the devices span (1 when ``domains`` is empty)."""
        return len(set(self.domains)) or 1

    def link_of(self, groups: Sequence[Sequence[int]], *, network: bool = False) -> str:
        """``"inter"`` if any group holds devices of two domains (or ``network``), else ``"intra"``.

        A device id beyond ``domains`` counts as its own domain only if ``domains`` is empty
        (a one-domain program); otherwise it is an error.

        Raises:
          PlanError: a device id outside ``domains``.
        """
        if not isinstance(groups, (tuple, list)) or not all(
                isinstance(g, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) for d in g)
                for g in groups):
            raise MeshplanTypeError(f"groups={groups!r:.60} must be a sequence of device-id sequences (ints).")
        if network:
            return "inter"
        if not self.domains:
            return "intra"
        n = len(self.domains)
        for group in groups:
            bad = [d for d in group if not 0 <= d < n]
            if bad:
                raise PlanError(f"device ids {bad[:4]} of a replica group are outside the {n} devices of "
                                "ScheduleLinks.domains; give one domain per device of the program.")
            if len({self.domains[d] for d in group}) > 1:
                return "inter"
        return "intra"

    def link(self, name: str) -> Link:
        """The :class:`Link` called ``"intra"`` or ``"inter"``."""
        return self.inter if name == "inter" else self.intra


def schedule_links(cluster: Cluster, domains: Sequence[int] | None = None) -> ScheduleLinks:
    """The links of a :class:`~meshplan.pure.cluster.Cluster` and its devices' fast domains.

    Args:
      cluster: the cluster the program was compiled for.
      domains: each program device's domain (the facade reads it off the mesh's devices); default:
        device ``i`` in domain ``i // cluster.ici_domain_size``, as jax numbers a cluster's devices.

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> schedule_links(parse_cluster("2xv5e-4")).domains
      (0, 0, 0, 0, 1, 1, 1, 1)
    """
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster (parse_cluster('8x8xH100')).")
    size = cluster.ici_domain_size
    dom: Any = tuple(i // size for i in range(cluster.num_devices)) if domains is None else domains
    return ScheduleLinks(cluster.intra_link, cluster.inter_link, dom)
