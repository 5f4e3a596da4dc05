"""Accelerator descriptions: one device's memory and link figures.

:class:`DeviceSpec` holds one accelerator's published figures and
:data:`DEVICE_SPECS` ships the ones people rent (NVIDIA A100 80GB, H100, H800,
H20, H200, B200, GB200; AMD MI300X, MI325X; TPU v4, v5e, v5p, v6e, TPU7x), each
figure with its source below. Users pass their own :class:`DeviceSpec` for
anything else or for measured numbers.

Bandwidth convention (all figures): bytes per second ONE device can send in
ONE direction during a ring collective along one mesh axis. Vendors often
quote bidirectional totals; each entry shows the conversion.
"""

from __future__ import annotations

import dataclasses
import re
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
        ``"slice"`` when it joins a whole slice across hosts (TPUs), ``"rack"``
        when a GPU's NVLink joins ``domain_nodes`` hosts through NVLink switches
        (GB200 NVL72: 18 hosts of 4 GPUs, one 72-GPU domain). A rack is a GPU
        cluster in every other respect (the CUDA compiler, jax's GPU allocator).
      peak_fp8_flops: dense FP8 tensor-core FLOP/s per device, if it has FP8 matmul units (``None``:
        it has none, or none is known). Only read with ``peak_bf16_flops`` (the FP8 recipe prices its
        other work at that), so it needs one.
      hbm_bandwidth: bytes/s one device reads or writes its HBM at, the datasheet peak (``None``: not
        known). What a memory-bound op (an elementwise fusion, a decode step's weight and KV reads) is
        priced at.
      domain_nodes: hosts in one NVLink domain; set with ``ici_scope="rack"`` only (and required there).

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
    ici_scope: Literal["node", "slice", "rack"] = "node"
    # Last, so positional construction of the fields above keeps working.
    peak_fp8_flops: float | None = None
    hbm_bandwidth: float | None = None
    domain_nodes: int | None = None

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
        collect(type_errors, value_errors, as_choice, self.ici_scope, "ici_scope", ("node", "slice", "rack"),
                error=ClusterError)
        if self.domain_nodes is not None:
            canonical["domain_nodes"] = collect(type_errors, value_errors, as_count, self.domain_nodes,
                                                "domain_nodes", maximum=_MAX_INT["devices_per_node"],
                                                error=ClusterError)
        if self.ici_scope == "rack" and self.domain_nodes is None:
            value_errors.append("ici_scope='rack' needs domain_nodes (the hosts one NVLink domain joins, e.g. 18 "
                                "for a GB200 NVL72)")
        elif self.ici_scope in ("node", "slice") and self.domain_nodes is not None:
            value_errors.append(f"domain_nodes={self.domain_nodes!r} is only read with ici_scope='rack'; leave it "
                                "None or set ici_scope='rack'")
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
        ``-``) in the kind as a whole word, ignoring case (``"H100-PCIe"`` and ``"NVIDIA H100 80GB
        HBM3"``). Whole words, because model names nest: ``H20`` is in ``H200`` and ``B200`` in
        ``GB200``.

        Example:
          >>> h100 = DEVICE_SPECS["H100"]
          >>> h100.matches_kind("NVIDIA H100 80GB HBM3"), h100.matches_kind("NVIDIA H200")
          (True, False)
          >>> DEVICE_SPECS["H20"].matches_kind("NVIDIA H200"), DEVICE_SPECS["B200"].matches_kind("NVIDIA GB200")
          (False, False)
        """
        model = re.escape(self.name.split("-")[0].lower())
        return re.search(rf"(?<![a-z0-9]){model}(?![0-9])", str(device_kind).lower()) is not None

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
# One entry per jax device: a GPU, a TPU chip (v4/v5p megacore: one device per chip), or one TensorCore
# of a TPU7x chip (its two chiplets are two jax devices). Latencies are NOT published figures: they are
# order-of-magnitude assumptions for one ring step (a few us on NVLink, ~10 us through a NIC and a
# switch, ~1 us per ICI hop). They only matter for small messages; pass your own DeviceSpec if you have
# measurements.
#
# NVIDIA GPUs: the H100 / H200 / A100 datasheets and the DGX H100 / H200 / A100 / B200 user guides.
#  - NVLink 4 (H100, H200, H20): 18 links x 25 GB/s per direction = 450 GB/s per direction; the
#    datasheets' "900 GB/s" is the bidirectional total. Through NVSwitch every GPU reaches every
#    other at that rate, so a ring on any intra-node axis sees it. This is a peak: measured NCCL
#    bus bandwidth is lower, so pass measured numbers for tighter estimates.
#  - NVLink 3 (A100): 12 links x 25 GB/s = 300 GB/s per direction ("600 GB/s" bidirectional).
#  - NVLink 5 (B200, GB200): 18 links x 50 GB/s = 900 GB/s per direction ("1.8 TB/s" bidirectional,
#    NVIDIA Blackwell Tuning Guide, "Fifth-Generation NVLink"). In a GB200 NVL72 the NVLink Switch
#    System joins all 72 GPUs of the rack (18 compute trays of 4) at that rate ("130 TB/s" = 72 x
#    1.8 TB/s): the fast domain is the rack, not the host (ici_scope "rack", domain_nodes 18).
#  - H800: H100 silicon with NVLink cut to 400 GB/s bidirectional = 200 GB/s per direction (8 of
#    the 18 links); DeepSeek-V3's report (arXiv 2412.19437, section 3.2.2) measures about 160 GB/s
#    of it and 50 GB/s over InfiniBand on its H800 cluster. Compute and HBM as the H100 SXM.
#  - H20: H100 silicon with compute cut for export: 96 GB HBM3 at 4.0 TB/s, 148 TFLOPS dense bf16,
#    296 dense FP8, full 900 GB/s NVLink 4. NVIDIA publishes no H20 datasheet on its public site;
#    these are the figures of its China product brief as reported by willitrunai.com/gpus/h20-96gb
#    and others, and they agree with each other. Estimate-grade: check them against your provider.
#  - Network: DGX H100/H200/B200 pair each GPU with one ConnectX-7 400 Gb/s port = 50 GB/s per
#    direction; DGX A100 with one ConnectX-6 HDR port, 200 Gb/s = 25 GB/s. GB200 NVL72 trays carry
#    one 400 Gb/s ConnectX-7 port per GPU between racks (the GB300 generation moves to 800 Gb/s
#    ConnectX-8). H800 (DeepSeek's 50 GB/s above) and H20: ASSUMED the same 400 Gb/s per GPU. Clouds
#    that give less (e.g. 100-200 Gb/s per GPU over Ethernet) should pass their own DeviceSpec.
#  - HBM: the datasheet capacity in decimal GB (H100/H800 SXM 80 GB, H200 141 GB, A100 80 GB, H20
#    96 GB; B200 180 GB = the DGX B200's "1,440 GB total GPU memory" / 8; GB200 186 GB = the NVL72's
#    "13.4 TB HBM3e" / 72). The driver reports a little more than the decimal figure (H100: 79.1 GiB =
#    84.9e9 B, jax #28376; B200: 178.35 GiB = 191.5e9 B in a device query, pytorch/ao #4002), and
#    jax's allocator takes 75% of it by default, so a GPU budget here is conservative by ~6%.
#  - bf16 / fp8: dense Tensor Core peaks (the datasheets' headline figures are 2x, with sparsity):
#    H100/H200/H800 989 / 1,979 TFLOPS; B200 (HGX, 1,000 W) 2,250 / 4,500; GB200 (1,200 W) 2,500 /
#    5,000 (NVIDIA's Blackwell datasheet tables as summarised at glennklockwood.com/garden/
#    processors/B200; the GB200 NVL72's "360 PFLOPS FP16/BF16" sparse / 72 / 2 agrees). A100: no FP8.
#  - HBM bandwidth: datasheet peaks, H100/H800 SXM 3.35 TB/s, H200 4.8 TB/s, A100 80GB SXM 2,039
#    GB/s, H20 4.0 TB/s, B200 and GB200 8 TB/s (the B200 driver's bus width and memory clock give
#    7.67 TB/s, pytorch/ao #4002). Sustained copies reach roughly 85-90% of a peak.
#
# AMD Instinct (CDNA 3; jax runs on ROCm through the jax-rocm plugin): the MI300X and MI325X
# datasheets (amd.com/en/products/accelerators/instinct/mi300/mi300x.html, .../mi325x.html).
#  - HBM: MI300X 192 GB HBM3 at 5.3 TB/s; MI325X 256 GB HBM3E at 6 TB/s.
#  - bf16 / fp8: 1,307.4 / 2,614.9 TFLOPS dense, both parts (the same 304 compute units).
#  - Infinity Fabric: 7 links per GPU, 128 GB/s bidirectional each = 64 GB/s per direction, one
#    link to each other GPU of the 8-GPU platform (a full mesh, no switch). A ring over all 8 GPUs
#    can spread over all 7 links: 448 GB/s per direction is the figure here. A group of g < 8 GPUs
#    reaches only g - 1 links, so for tp/fsdp axes smaller than the node this is optimistic by up
#    to 7x (a 2-GPU group has one 64 GB/s link): pass a DeviceSpec with your axis's figure.
#  - Network: ASSUMED one 400 Gb/s NIC per GPU (50 GB/s), as MI300X platforms are built (e.g.
#    Azure's ND MI300X v5: 8 x 400 Gb/s InfiniBand per node).
#
# TPU figures: Google Cloud TPU docs, cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e,tpu7x} (system
# architecture tables). v4's per-link figure is from the TPU v4 ISCA 2023 paper (Jouppi et al.) as
# summarised at glennklockwood.com/garden/processors/TPUv4 ("400G bandwidth in each direction").
#  - A TPU mesh axis maps onto one torus dimension: a bidirectional ring over two ICI links, so the
#    per-axis bandwidth is 2 x (one-way bandwidth of one link). Per-link one-way figures:
#      v4:  400 Gb/s per direction per link (paper) = 50 GB/s            -> 100 GB/s per axis
#      v5e: 400 GB/s bidirectional per chip over 4 ports -> 50 GB/s      -> 100 GB/s per axis
#      v5p: 1200 GB/s bidirectional per chip over 6 ports -> 100 GB/s    -> 200 GB/s per axis
#      v6e: 800 GB/s bidirectional per chip over 4 ports -> 100 GB/s     -> 200 GB/s per axis
#      TPU7x: 1200 GB/s bidirectional per chip (a 3D torus, as v5p) -> 200 GB/s per axis per chip,
#             shared by the chip's two devices: 100 GB/s per device (an ESTIMATE: how the two
#             chiplets split the chip's links is not published)
#    An axis folded over several torus dimensions may see more; the figure is conservative there.
#  - DCN per chip: v5p "50 Gbps per chip" = 6.25 GB/s; v5e 2 x 100 Gbps NIC per 8-chip host =
#    25 Gbps = 3.125 GB/s per chip; v6e 4 x 200 Gbps per 8-chip host = 100 Gbps = 12.5 GB/s per
#    chip; TPU7x "100 Gbps per chip" = 12.5 GB/s, 6.25 GB/s per device. v4: no per-chip DCN figure
#    found in Google's docs; ASSUMED equal to v5p's 6.25 GB/s.
#  - HBM: what libtpu lets one device's program use, not the docs' capacity (v4 "32 GiB", v5p "95
#    GiB", v5e "16 GB", v6e "32 GB", TPU7x "192 GiB" per chip = 96 GiB per device): the largest
#    array libtpu 0.0.42.1 compiles onto one device ahead of time, bisected to 1 KiB (its refusal
#    reads "exceeds available HBM (31.25G)" for v6e; benchmarks/RESULTS.md, "TPU HBM a program
#    gets"). v6e's figure is 56 KiB under the 33,550,237,696 B bytes_limit a v6e runtime reports
#    (vllm-project/vllm #16211; Enzyme-JAX #2422 logs "Limit: 31.246 GiB"). Read as the docs print
#    it, v4 would promise 1.25 GiB a program never gets and v6e hide 1.45 GiB it does.
#  - HBM bandwidth per chip as the docs print it: v4 1,200 GB/s, v5e 819 GB/s, v5p 2,765 GB/s,
#    v6e 1,640 GB/s, TPU7x 7,380 GB/s (3,690 GB/s per device).
#  - bf16 / fp8 per device: v4 275, v5e 197, v5p 459, v6e 918 TFLOPS bf16, no fp8 peak (their docs
#    give bf16 and int8, or an FP8 figure equal to bf16: no FP8 matmul units), so an FP8 recipe is
#    refused there rather than guessed. TPU7x: 2,307 bf16 / 4,614 fp8 TFLOPS per chip, half per device.
#  - Devices per host: v4 and v5p 4 (a 2x2x1 host), v5e and v6e 8, TPU7x 8 (4 chips x 2). (v6e
#    multi-host slices on GKE run two 4-chip VMs per host; if each process sees 4 devices, build
#    Cluster(..., 4) directly.)
DEVICE_SPECS: Mapping[str, DeviceSpec] = types.MappingProxyType({
    "H100": DeviceSpec("H100", hbm_bytes=80 * _GB, intra_bandwidth=450e9, inter_bandwidth=50e9,
                       intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                       peak_bf16_flops=989e12, peak_fp8_flops=1979e12, hbm_bandwidth=3.35e12),
    "H200": DeviceSpec("H200", hbm_bytes=141 * _GB, intra_bandwidth=450e9, inter_bandwidth=50e9,
                       intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                       peak_bf16_flops=989e12, peak_fp8_flops=1979e12, hbm_bandwidth=4.8e12),
    "H800": DeviceSpec("H800", hbm_bytes=80 * _GB, intra_bandwidth=200e9, inter_bandwidth=50e9,
                       intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                       peak_bf16_flops=989e12, peak_fp8_flops=1979e12, hbm_bandwidth=3.35e12),
    "H20": DeviceSpec("H20", hbm_bytes=96 * _GB, intra_bandwidth=450e9, inter_bandwidth=50e9,
                      intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                      peak_bf16_flops=148e12, peak_fp8_flops=296e12, hbm_bandwidth=4.0e12),
    "A100-80GB": DeviceSpec("A100-80GB", hbm_bytes=80 * _GB, intra_bandwidth=300e9,
                            inter_bandwidth=25e9, intra_latency_s=3e-6, inter_latency_s=1e-5,
                            devices_per_node=8, peak_bf16_flops=312e12, hbm_bandwidth=2.039e12),
    "B200": DeviceSpec("B200", hbm_bytes=180 * _GB, intra_bandwidth=900e9, inter_bandwidth=50e9,
                       intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                       peak_bf16_flops=2.25e15, peak_fp8_flops=4.5e15, hbm_bandwidth=8e12),
    "GB200": DeviceSpec("GB200", hbm_bytes=186 * _GB, intra_bandwidth=900e9, inter_bandwidth=50e9,
                        intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=4,
                        peak_bf16_flops=2.5e15, peak_fp8_flops=5e15, hbm_bandwidth=8e12,
                        ici_scope="rack", domain_nodes=18),
    "MI300X": DeviceSpec("MI300X", hbm_bytes=192 * _GB, intra_bandwidth=448e9, inter_bandwidth=50e9,
                         intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                         peak_bf16_flops=1307.4e12, peak_fp8_flops=2614.9e12, hbm_bandwidth=5.3e12),
    "MI325X": DeviceSpec("MI325X", hbm_bytes=256 * _GB, intra_bandwidth=448e9, inter_bandwidth=50e9,
                         intra_latency_s=3e-6, inter_latency_s=1e-5, devices_per_node=8,
                         peak_bf16_flops=1307.4e12, peak_fp8_flops=2614.9e12, hbm_bandwidth=6e12),
    "v4": DeviceSpec("v4", hbm_bytes=33_014_367_232, intra_bandwidth=100e9, inter_bandwidth=6.25e9,
                     intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=4,
                     peak_bf16_flops=275e12, ici_scope="slice", hbm_bandwidth=1.2e12),
    "v5e": DeviceSpec("v5e", hbm_bytes=16_909_283_328, intra_bandwidth=100e9, inter_bandwidth=3.125e9,
                      intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=8,
                      peak_bf16_flops=197e12, ici_scope="slice", hbm_bandwidth=819e9),
    "v5p": DeviceSpec("v5p", hbm_bytes=102_803_369_984, intra_bandwidth=200e9, inter_bandwidth=6.25e9,
                      intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=4,
                      peak_bf16_flops=459e12, ici_scope="slice", hbm_bandwidth=2.765e12),
    "v6e": DeviceSpec("v6e", hbm_bytes=33_550_180_352, intra_bandwidth=200e9, inter_bandwidth=12.5e9,
                      intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=8,
                      peak_bf16_flops=918e12, ici_scope="slice", hbm_bandwidth=1.64e12),
    "tpu7x": DeviceSpec("tpu7x", hbm_bytes=101_732_749_312, intra_bandwidth=100e9, inter_bandwidth=6.25e9,
                        intra_latency_s=1e-6, inter_latency_s=1e-5, devices_per_node=8,
                        peak_bf16_flops=1153.5e12, peak_fp8_flops=2307e12, ici_scope="slice",
                        hbm_bandwidth=3.69e12),
})

TPU_HBM_SOURCE = "libtpu 0.0.42.1's ahead-of-time limit (the largest array it compiles onto one device)"
"""Where the TPU entries' ``hbm_bytes`` come from (the table's comment says how it was measured)."""

# Extra spellings people type, lower-case -> DEVICE_SPECS key.
_ALIASES: Mapping[str, str] = types.MappingProxyType({
    "h100-80gb": "H100", "h100-sxm": "H100", "h100-sxm5": "H100",
    "h200-141gb": "H200", "h200-sxm": "H200", "h800-sxm": "H800", "h20-96gb": "H20",
    "a100": "A100-80GB", "a100-80g": "A100-80GB", "a100-sxm": "A100-80GB",
    "b200-180gb": "B200", "hgx-b200": "B200", "dgx-b200": "B200",
    "mi300": "MI300X", "mi325": "MI325X",
    "tpu-v4": "v4", "tpuv4": "v4", "tpu-v5e": "v5e", "v5litepod": "v5e", "tpu-v5p": "v5p",
    "tpu-v6e": "v6e", "trillium": "v6e", "v7": "tpu7x", "v7x": "tpu7x", "tpu-v7": "tpu7x", "ironwood": "tpu7x",
})
