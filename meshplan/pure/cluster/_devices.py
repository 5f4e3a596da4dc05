"""Accelerator descriptions: one device's memory and link figures.

:class:`DeviceSpec` holds one accelerator's published figures and
:data:`DEVICE_SPECS` ships the common ones (H100, H200, A100 80GB, TPU v4,
v5e, v5p, v6e), each with its source below. Users pass their own
:class:`DeviceSpec` for anything else or for measured numbers.

Bandwidth convention (all figures): bytes per second ONE device can send in
ONE direction during a ring collective along one mesh axis. Vendors often
quote bidirectional totals; each entry shows the conversion.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, Literal

from meshplan.pure._check import as_choice, as_count, as_real, as_record, collect
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import ClusterError, MeshplanTypeError
from meshplan.pure.cluster._link import Link

__all__ = [
    "DEVICE_SPECS",
    "DeviceSpec",
]

_GB = 10**9
_GIB = 2**30


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator's memory and link figures.

    Attributes:
      name: short name, e.g. ``"H100"``.
      hbm_bytes: HBM per device in bytes.
      intra_bandwidth: bytes/s per device, one direction, over the fast link
        (NVLink / ICI) during a ring collective.
      inter_bandwidth: bytes/s per device, one direction, over the network
        between ICI domains (InfiniBand / DCN).
      intra_latency_s: seconds per ring step on the fast link.
      inter_latency_s: seconds per ring step on the network.
      devices_per_node: devices in one host by default.
      peak_bf16_flops: dense bf16 FLOP/s per device, if known.
      ici_scope: ``"node"`` when the fast link ends at the host (GPUs),
        ``"slice"`` when it joins a whole slice across hosts (TPUs).
      peak_fp8_flops: dense FP8 tensor-core FLOP/s per device, if it has FP8 matmul units (``None``:
        it has none, or none is known). Only read with ``peak_bf16_flops`` (the FP8 recipe prices its
        other work at that), so it needs one.
      hbm_bandwidth: bytes/s one device reads or writes its HBM at, the datasheet peak (``None``: not
        known). What a memory-bound op (an elementwise fusion, a decode step's weight and KV reads) is
        priced at.

    Raises:
      ClusterError: a value out of range (every problem listed at once).
      MeshplanTypeError: a value of the wrong type.

    Example:
      >>> DeviceSpec("MyGPU", hbm_bytes=48 * 10**9, intra_bandwidth=300e9,
      ...            inter_bandwidth=25e9, intra_latency_s=3e-6, inter_latency_s=1e-5)
      DeviceSpec('MyGPU', 48 GB HBM, intra 300 GB/s, inter 25 GB/s, 8/node)
    """

    name: str
    hbm_bytes: int
    intra_bandwidth: float
    inter_bandwidth: float
    intra_latency_s: float
    inter_latency_s: float
    devices_per_node: int = 8
    peak_bf16_flops: float | None = None
    ici_scope: Literal["node", "slice"] = "node"
    # Last, so positional construction of the fields above keeps working.
    peak_fp8_flops: float | None = None
    hbm_bandwidth: float | None = None

    def __post_init__(self) -> None:
        type_errors: list[str] = []
        value_errors: list[str] = []
        if not isinstance(self.name, str):
            type_errors.append(f"name={self.name!r} must be a str")
        elif not self.name.strip():
            value_errors.append("name must not be empty")
        canonical: dict[str, int | float | None] = {}
        for field in ("hbm_bytes", "devices_per_node"):
            canonical[field] = collect(type_errors, value_errors, as_count, getattr(self, field), field,
                                       maximum=_MAX_INT[field], error=ClusterError)
        for field, allow_zero in (("intra_bandwidth", False), ("inter_bandwidth", False),
                                  ("intra_latency_s", True), ("inter_latency_s", True)):
            canonical[field] = collect(type_errors, value_errors, as_real, getattr(self, field), field,
                                       allow_zero=allow_zero, error=ClusterError)
        if self.peak_bf16_flops is not None:
            canonical["peak_bf16_flops"] = collect(type_errors, value_errors, as_real, self.peak_bf16_flops,
                                                   "peak_bf16_flops", error=ClusterError)
        if self.peak_fp8_flops is not None:
            canonical["peak_fp8_flops"] = collect(type_errors, value_errors, as_real, self.peak_fp8_flops,
                                                  "peak_fp8_flops", error=ClusterError)
            fp8 = canonical["peak_fp8_flops"]
            if self.peak_bf16_flops is None and fp8 is not None:
                value_errors.append(f"peak_fp8_flops={fp8:g} needs peak_bf16_flops (an FP8 recipe runs "
                                    "everything but its weight matmuls at the bf16 peak); give both")
        if self.hbm_bandwidth is not None:
            canonical["hbm_bandwidth"] = collect(type_errors, value_errors, as_real, self.hbm_bandwidth,
                                                 "hbm_bandwidth", error=ClusterError)
        collect(type_errors, value_errors, as_choice, self.ici_scope, "ici_scope", ("node", "slice"), error=ClusterError)
        _raise_collected(f"DeviceSpec {self.name!r}", type_errors, value_errors)
        for field, checked in canonical.items():
            object.__setattr__(self, field, checked)

    @property
    def intra_link(self) -> Link:
        """The NVLink / ICI link as a cost-model :class:`Link`."""
        return Link(self.intra_bandwidth, self.intra_latency_s)

    @property
    def inter_link(self) -> Link:
        """The network / DCN link as a cost-model :class:`Link`."""
        return Link(self.inter_bandwidth, self.inter_latency_s)

    def matches_kind(self, device_kind: str) -> bool:
        """Whether a jax device's ``device_kind`` is this device: its model (the name before any
        ``-``) in the kind, ignoring case (``"H100-PCIe"`` and ``"NVIDIA H100 80GB HBM3"``).

        Example:
          >>> h100 = DEVICE_SPECS["H100"]
          >>> h100.matches_kind("NVIDIA H100 80GB HBM3"), h100.matches_kind("NVIDIA H200")
          (True, False)
        """
        return self.name.split("-")[0].lower() in str(device_kind).lower()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; :meth:`from_dict` inverts it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceSpec:
        """Rebuild from :meth:`to_dict` output; unknown keys are an error."""
        return cls(**_known_fields(cls, data))

    def __repr__(self) -> str:
        return (f"DeviceSpec({self.name!r}, {fmt_bytes(self.hbm_bytes, style='exact')} HBM, "
                f"intra {self.intra_bandwidth / _GB:g} GB/s, inter {self.inter_bandwidth / _GB:g} GB/s, "
                f"{self.devices_per_node}/node)")


# Far beyond any device (1 PiB of HBM, a million devices per host), yet small
# enough that byte and device arithmetic stays exact in floats and fast.
_MAX_INT = {"hbm_bytes": 2**50, "devices_per_node": 2**20}


def _raise_collected(what: str, type_errors: list[str], value_errors: list[str]) -> None:
    if type_errors:
        raise MeshplanTypeError(f"{what}: " + "; ".join(type_errors + value_errors) + ".")
    if value_errors:
        raise ClusterError(f"{what}: " + "; ".join(value_errors) + ".")


def _known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """``from_dict`` input of a hardware record: a mapping with every required field and no unknown ones."""
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    return as_record(data, f"{cls.__name__}.from_dict input", fields=[f.name for f in fields], required=required,
                     error=ClusterError)


# --- the device table ---------------------------------------------------------------------------
# Latencies are NOT published figures: they are order-of-magnitude assumptions for one ring step
# (a few us on NVLink, ~10 us through a NIC and a switch, ~1 us per ICI hop). They only matter for
# small messages; pass your own DeviceSpec if you have measurements.
#
# GPU figures: NVIDIA H100 / H200 / A100 datasheets and the DGX H100 / H200 / A100 user guides.
#  - NVLink 4 (H100, H200): 18 links x 25 GB/s per direction = 450 GB/s per direction; the
#    datasheets' "900 GB/s" is the bidirectional total. Through NVSwitch every GPU reaches every
#    other at that rate, so a ring on any intra-node axis sees it. This is a peak: measured NCCL
#    bus bandwidth is lower, so pass measured numbers for tighter estimates.
#  - NVLink 3 (A100): 12 links x 25 GB/s = 300 GB/s per direction ("600 GB/s" bidirectional).
#  - Network: DGX H100/H200 pair each GPU with one ConnectX-7 NDR InfiniBand port, 400 Gb/s =
#    50 GB/s per direction; DGX A100 with one ConnectX-6 HDR port, 200 Gb/s = 25 GB/s. Clouds that
#    give less (e.g. 100-200 Gb/s per GPU over Ethernet) should pass their own DeviceSpec.
#  - HBM: the datasheet capacity in decimal GB (H100 SXM 80 GB, H200 141 GB, A100 80 GB); the
#    runtime reserves some of it, so usable memory is lower still.
#  - bf16: dense Tensor Core peak (the datasheets' 1,979 TFLOPS for H100/H200 is with sparsity).
#  - HBM bandwidth: the datasheets' peak, H100 SXM 3.35 TB/s, H200 4.8 TB/s, A100 80GB SXM 2,039 GB/s
#    (sustained copies reach roughly 85-90% of it).
#  - fp8: dense FP8 Tensor Core peak, 1,979 TFLOPS for H100/H200 SXM (the datasheets' 3,958 TFLOPS
#    is with sparsity). A100: None (Ampere's tensor cores take bf16/fp16/tf32/int8, no FP8).
#
# TPU figures: Google Cloud TPU docs, cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e} (system
# architecture tables). v4's per-link figure is from the TPU v4 ISCA 2023 paper (Jouppi et al.) as
# summarised at glennklockwood.com/garden/processors/TPUv4 ("400G bandwidth in each direction").
#  - A TPU mesh axis maps onto one torus dimension: a bidirectional ring over two ICI links, so the
#    per-axis bandwidth is 2 x (one-way bandwidth of one link). Per-link one-way figures:
#      v4:  400 Gb/s per direction per link (paper) = 50 GB/s            -> 100 GB/s per axis
#      v5e: 400 GB/s bidirectional per chip over 4 ports -> 50 GB/s      -> 100 GB/s per axis
#      v5p: 1200 GB/s bidirectional per chip over 6 ports -> 100 GB/s    -> 200 GB/s per axis
#      v6e: 800 GB/s bidirectional per chip over 4 ports -> 100 GB/s     -> 200 GB/s per axis
#    An axis folded over several torus dimensions may see more; the figure is conservative there.
#  - DCN per chip: v5p "50 Gbps per chip" = 6.25 GB/s; v5e 2 x 100 Gbps NIC per 8-chip host =
#    25 Gbps = 3.125 GB/s per chip; v6e 4 x 200 Gbps per 8-chip host = 100 Gbps = 12.5 GB/s per
#    chip. v4: no per-chip DCN figure found in Google's docs; ASSUMED equal to v5p's 6.25 GB/s.
#  - HBM as the docs print it: v4 "32 GiB", v5p "95 GiB", v5e "16 GB", v6e "32 GB" (read as
#    decimal GB, the smaller reading).
#  - HBM bandwidth per chip as the docs print it: v4 1,200 GB/s, v5e 819 GB/s, v5p 2,765 GB/s,
#    v6e 1,640 GB/s.
#  - No fp8 peak (peak_fp8_flops None): the v5e / v5p / v6e docs give a bf16 and an int8 peak, no
#    fp8 one (v4: bf16 and int8 only), so an FP8 recipe is refused there rather than guessed.
#  - Chips per host: v4 and v5p 4 (a 2x2x1 host), v5e and v6e 8. (v6e multi-host slices on GKE
#    run two 4-chip VMs per host; if each process sees 4 devices, build Cluster(..., 4) directly.)
DEVICE_SPECS: Mapping[str, DeviceSpec] = types.MappingProxyType({
    "H100": DeviceSpec("H100", hbm_bytes=80 * _GB, intra_bandwidth=450e9, inter_bandwidth=50e9,
                       intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                       peak_bf16_flops=989e12, peak_fp8_flops=1979e12,
                    hbm_bandwidth=3.35e12),
    "H200": DeviceSpec("H200", hbm_bytes=141 * _GB, intra_bandwidth=450e9, inter_bandwidth=50e9,
                       intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                       peak_bf16_flops=989e12, peak_fp8_flops=1979e12,
                    hbm_bandwidth=4.8e12),
    "A100-80GB": DeviceSpec("A100-80GB", hbm_bytes=80 * _GB, intra_bandwidth=300e9,
                            inter_bandwidth=25e9, intra_latency_s=3e-6, inter_latency_s=1e-5,
                            devices_per_node=8, peak_bf16_flops=312e12,
                    hbm_bandwidth=2.039e12),
    "v4": DeviceSpec("v4", hbm_bytes=32 * _GIB, intra_bandwidth=100e9, inter_bandwidth=6.25e9,
                     intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=4,
                     peak_bf16_flops=275e12, ici_scope="slice",
                    hbm_bandwidth=1.2e12),
    "v5e": DeviceSpec("v5e", hbm_bytes=16 * _GB, intra_bandwidth=100e9, inter_bandwidth=3.125e9,
                      intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=8,
                      peak_bf16_flops=197e12, ici_scope="slice",
                    hbm_bandwidth=819e9),
    "v5p": DeviceSpec("v5p", hbm_bytes=95 * _GIB, intra_bandwidth=200e9, inter_bandwidth=6.25e9,
                      intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=4,
                      peak_bf16_flops=459e12, ici_scope="slice",
                    hbm_bandwidth=2.765e12),
    "v6e": DeviceSpec("v6e", hbm_bytes=32 * _GB, intra_bandwidth=200e9, inter_bandwidth=12.5e9,
                      intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=8,
                      peak_bf16_flops=918e12, ici_scope="slice",
                    hbm_bandwidth=1.64e12),
})

# Extra spellings people type, lower-case -> DEVICE_SPECS key.
_ALIASES: Mapping[str, str] = types.MappingProxyType({
    "h100-80gb": "H100", "h100-sxm": "H100", "h100-sxm5": "H100",
    "h200-141gb": "H200", "h200-sxm": "H200",
    "a100": "A100-80GB", "a100-80g": "A100-80GB", "a100-sxm": "A100-80GB",
    "tpu-v4": "v4", "tpuv4": "v4", "tpu-v5e": "v5e", "v5litepod": "v5e", "tpu-v5p": "v5p",
    "tpu-v6e": "v6e", "trillium": "v6e",
})
