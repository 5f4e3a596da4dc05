"""Cluster descriptions as plain data: how many devices, on which hosts and slices.

A :class:`Cluster` says how many :class:`~meshplan.pure.DeviceSpec`
devices there are and how they are grouped; :func:`parse_cluster` reads the
short forms people type: ``"8x8xH100"``, ``"2xH200"``, ``"v5p-256"``,
``"2xv5e-256"``, ``"tpu7x-128"``, ``"GB200-NVL72"``, ``"2xGB200-NVL72"``.

Two groupings matter and they differ between GPUs and TPUs:

- a *node* (host) is one machine: 8 GPUs, 4 GB200 GPUs, 4 TPU v4/v5p chips,
  8 v5e/v6e chips, 8 TPU7x devices (4 chips of 2);
- the *ICI domain* is the set of devices joined by the fast link: the node for
  most GPUs (NVLink ends at the node), the whole slice for TPUs (ICI spans
  hosts), and for a GB200 NVL72 the whole rack: 18 hosts of 4 GPUs joined by
  NVLink switches. A rack is a "slice" of a GPU cluster: ``num_slices`` counts
  the NVLink domains, the network joins them, and tp/fsdp/ep may span the 18
  hosts of one domain at NVLink speed.

The mesh search splits every mesh into an ICI part of size
:attr:`Cluster.ici_domain_size` and a DCN part of size
:attr:`Cluster.num_ici_domains`, as jax's hybrid meshes do.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
from collections.abc import Mapping
from typing import Any

from meshplan.pure.mesh import DeviceInfo
from meshplan.pure.cluster._link import Link, select_link
from meshplan.pure._check import as_count, as_typed_mapping, collect
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster._devices import _ALIASES, DEVICE_SPECS, DeviceSpec, _known_fields, _raise_collected
from meshplan.pure.errors import ClusterError, MeshplanTypeError

__all__ = [
    "Cluster",
    "MAX_DEVICES",
    "parse_cluster",
]

MAX_DEVICES = 2**22
"""The largest cluster meshplan plans (4 Mi devices, ~40x the largest machines built)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _TpuNaming:
    """How one TPU generation's accelerator-type names count devices."""

    cores_per_name_unit: int  # v4/v5p/TPU7x names count TensorCores (2 per chip); v5e/v6e count chips
    small_chip_counts: tuple[int, ...]  # allowed slice sizes below one full "block"
    block_chips: int  # larger slices are multiples of this
    max_chips: int  # the largest single slice
    devices_per_chip: int = 1  # jax devices per chip: 2 on TPU7x (each chiplet's TensorCore), else 1


# Sources (cloud.google.com/tpu/docs/...): "types-topologies": v2-v4 names count TensorCores
# ("v4-128 ... 128 TensorCores"); v5p's table lists v5p topologies by cores, chips and hosts (4x4x8:
# 256 cores, 128 chips, 32 hosts), so "v5p-256" = 128 chips; v5e/v6e names use
# "v$VERSION-$CHIP_COUNT" (v5e's API spelling is "v5litepod-N") with slices of 1, 4, 8, ..., 256
# chips. v4/v5p topologies AxBxC have each dim <= 4 or a multiple of 4, giving 4, 8, 16, 32 chips
# or a multiple of 64 (a 4x4x4 cube). Largest single slice: v4 4096 chips (a pod), v5p 6144 chips
# (16x16x24), v5e/v6e 256 chips (2D 16x16 pod). TPU7x (cloud.google.com/tpu/docs/tpu7x): "tpu7x-N"
# counts TensorCores, and each of a chip's two TensorCores is its own jax device, so tpu7x-128 is 64
# chips (4x4x4) and 128 devices; slices of 1, 4, 8, 16, 32 chips or a multiple of 64 up to the 9,216-chip
# pod (AXLearn's and MaxText's accelerator tables list the same shapes: tpu7x-8 = 2x2x1, tpu7x-16 =
# 2x2x2, tpu7x-128 = 4x4x4).
_TPU_NAMING: Mapping[str, _TpuNaming] = types.MappingProxyType({
    "v4": _TpuNaming(2, (4, 8, 16, 32), 64, 4096),
    "v5p": _TpuNaming(2, (4, 8, 16, 32), 64, 6144),
    "v5e": _TpuNaming(1, (1, 4, 8, 16, 32, 64, 128), 256, 256),
    "v6e": _TpuNaming(1, (1, 4, 8, 16, 32, 64, 128), 256, 256),
    "tpu7x": _TpuNaming(2, (1, 4, 8, 16, 32), 64, 9216, devices_per_chip=2),
})


def _allowed_chips(naming: _TpuNaming) -> str:
    small = ", ".join(map(str, naming.small_chip_counts))
    if naming.block_chips == naming.max_chips:
        return f"{small} or {naming.max_chips} chips"
    return f"{small} or a multiple of {naming.block_chips} up to {naming.max_chips} chips"


def _chips_ok(naming: _TpuNaming, chips: int) -> bool:
    if chips in naming.small_chip_counts:
        return True
    return chips % naming.block_chips == 0 and 0 < chips <= naming.max_chips


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """A set of identical devices grouped into nodes (hosts) and slices.

    Attributes:
      device: the accelerator.
      num_nodes: hosts in the whole cluster (all slices together).
      devices_per_node: devices per host.
      num_slices: ICI slices (TPU multislice); hosts split evenly among them.

    Raises:
      ClusterError: a count < 1, or hosts that do not split evenly into slices.
      MeshplanTypeError: wrong types.

    Example:
      >>> c = Cluster(DEVICE_SPECS["H100"], num_nodes=8, devices_per_node=8)
      >>> c
      Cluster('8x8xH100': 64 devices, 8 nodes x 8, 80 GB HBM each)
      >>> c.ici_domain_size, c.num_ici_domains
      (8, 8)
    """

    device: DeviceSpec
    num_nodes: int
    devices_per_node: int
    num_slices: int = 1

    def __post_init__(self) -> None:
        type_errors: list[str] = []
        value_errors: list[str] = []
        if not isinstance(self.device, DeviceSpec):
            type_errors.append(f"device={self.device!r} must be a DeviceSpec")
        for name in ("num_nodes", "devices_per_node", "num_slices"):
            collect(type_errors, value_errors, as_count, getattr(self, name), name, error=ClusterError)
        if not type_errors and not value_errors and self.num_nodes % self.num_slices:
            value_errors.append(f"num_nodes={self.num_nodes} must split evenly into "
                                f"num_slices={self.num_slices}")
        if (not type_errors and not value_errors and self.device.ici_scope == "rack"
                and self.device.domain_nodes is not None
                and self.num_nodes // self.num_slices > self.device.domain_nodes):
            value_errors.append(
                f"{self.num_nodes // self.num_slices} hosts per NVLink domain: one {self.device.name} domain "
                f"joins at most domain_nodes={self.device.domain_nodes} hosts; {self.num_nodes} hosts need "
                f"num_slices={-(-self.num_nodes // self.device.domain_nodes)} (one per domain) or more")
        if not type_errors and not value_errors and self.num_nodes * self.devices_per_node > MAX_DEVICES:
            # The search factors the device count and prices every mesh: an
            # absurd count must be refused at once, not computed for hours.
            value_errors.append(f"{self.num_nodes} nodes x {self.devices_per_node} devices = "
                                f"{self.num_nodes * self.devices_per_node} devices is more than meshplan plans "
                                f"(at most {MAX_DEVICES})")
        _raise_collected("Cluster", type_errors, value_errors)
        for name in ("num_nodes", "devices_per_node", "num_slices"):
            object.__setattr__(self, name, int(getattr(self, name)))

    @property
    def num_devices(self) -> int:
        """All devices in the cluster."""
        return self.num_nodes * self.devices_per_node

    @property
    def hbm_bytes(self) -> int:
        """HBM per device in bytes."""
        return self.device.hbm_bytes

    @property
    def total_hbm_bytes(self) -> int:
        """HBM of all devices together in bytes."""
        return self.device.hbm_bytes * self.num_devices

    def with_more_hbm(self, factor: int) -> Cluster:
        """This cluster with ``factor`` times the HBM per device, all else the same: a search with room to find the
        meshes the real budget refuses (a pinned layout, a ZeRO stage priced unsplit), held to the real budget after.

        Raises:
          ClusterError: ``factor`` below 1 or above 1024; MeshplanTypeError: not an int.

        Example:
          >>> parse_cluster("8xH100").with_more_hbm(16).hbm_bytes == 16 * parse_cluster("8xH100").hbm_bytes
          True
        """
        factor = as_count(factor, "factor", maximum=1024, error=ClusterError)
        return dataclasses.replace(self, device=dataclasses.replace(self.device,
                                                                    hbm_bytes=factor * self.device.hbm_bytes))

    @property
    def nodes_per_slice(self) -> int:
        """Hosts in one slice."""
        return self.num_nodes // self.num_slices

    @property
    def devices_per_slice(self) -> int:
        """Devices in one slice."""
        return self.nodes_per_slice * self.devices_per_node

    @property
    def ici_domain_size(self) -> int:
        """Devices joined by the fast link: a node for GPUs, a slice for TPUs, an NVLink rack for GB200."""
        return self.devices_per_slice if self.device.ici_scope in ("slice", "rack") else self.devices_per_node

    @property
    def num_ici_domains(self) -> int:
        """How many fast domains the network (DCN) joins."""
        return self.num_devices // self.ici_domain_size

    @property
    def ici_domain_name(self) -> str:
        """What one fast domain is called: ``"node"`` for GPUs, ``"slice"`` for TPUs, ``"NVLink domain"``
        for a rack of GPUs joined by NVLink switches (GB200 NVL72)."""
        return {"slice": "slice", "rack": "NVLink domain"}.get(self.device.ici_scope, "node")

    def device_infos(self) -> tuple[DeviceInfo, ...]:
        """Plain descriptions of the cluster's devices, numbered as jax numbers real ones.

        Device ``i`` sits on host ``i // devices_per_node`` and, on TPUs, in
        slice ``i // devices_per_slice``; :func:`~meshplan.pure.layout_device_ids`
        lays them out exactly as ``create_mesh`` lays out live devices.

        Example:
          >>> [(d.id, d.process_index, d.slice_index) for d in parse_cluster("2xv5p-8").device_infos()][::4]
          [(0, 0, 0), (4, 1, 1)]
        """
        tpu = self.device.ici_scope == "slice"
        # An NVLink rack is a slice of GPUs: its devices are numbered domain by domain, as TPU slices are.
        sliced = self.device.ici_scope in ("slice", "rack")
        return tuple(
            DeviceInfo(i, process_index=i // self.devices_per_node,
                       slice_index=i // self.devices_per_slice if sliced else None,
                       platform="tpu" if tpu else "gpu")
            for i in range(self.num_devices)
        )

    @property
    def intra_link(self) -> Link:
        """The fast (NVLink / ICI) link."""
        return self.device.intra_link

    @property
    def inter_link(self) -> Link:
        """The network (InfiniBand / DCN) link."""
        return self.device.inter_link

    def link(self, *, spans_domains: bool) -> Link:
        """The link a collective runs at; see :func:`~meshplan.pure.cluster.select_link`.

        Args:
          spans_domains: whether the device group crosses ICI domains (nodes
            for GPUs, slices for TPUs), even partly.

        Returns:
          :attr:`inter_link` if it does, else :attr:`intra_link`.

        Example:
          >>> parse_cluster("2xv5p-16").link(spans_domains=False)
          Link(bandwidth=200 GB/s, latency=1 us)
        """
        return select_link(self.intra_link, self.inter_link, spans_nodes=spans_domains)

    @property
    def text(self) -> str:
        """The short form, ``"8x8xH100"`` or ``"2xv5p-256"``.

        :func:`parse_cluster` reads it back to an equal cluster when the device
        is in :data:`DEVICE_SPECS` (or the ``devices`` passed) and, for TPUs,
        when each slice is a real slice shape on whole hosts; other TPU
        clusters (built by hand) get the node form, which parse_cluster refuses.
        """
        naming = _TPU_NAMING.get(self.device.name)
        shipped = self.device.name in DEVICE_SPECS and self.device == DEVICE_SPECS[self.device.name]
        if naming is not None and self.devices_per_slice % naming.devices_per_chip == 0:
            chips = self.devices_per_slice // naming.devices_per_chip
            # Only the shipped TPU specs have slice names; a custom spec called "v5p" keeps the node form.
            if (shipped and _chips_ok(naming, chips)
                    and _tpu_host_split(self.device, self.devices_per_slice)
                    == (self.nodes_per_slice, self.devices_per_node)):
                base = f"{self.device.name}-{chips * naming.cores_per_name_unit}"
                return base if self.num_slices == 1 else f"{self.num_slices}x{base}"
        rack = self.device.domain_nodes
        if (shipped and rack is not None and self.nodes_per_slice == rack
                and self.devices_per_node == self.device.devices_per_node):
            base = f"{self.device.name}-NVL{rack * self.devices_per_node}"
            return base if self.num_slices == 1 else f"{self.num_slices}x{base}"
        return f"{self.num_nodes}x{self.devices_per_node}x{self.device.name}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the device nested); :meth:`from_dict` inverts it."""
        return {"device": self.device.to_dict(), "num_nodes": self.num_nodes,
                "devices_per_node": self.devices_per_node, "num_slices": self.num_slices}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cluster:
        """Rebuild from :meth:`to_dict` output."""
        fields = _known_fields(cls, data)
        device = fields.get("device")
        if isinstance(device, Mapping):
            try:
                fields["device"] = DeviceSpec.from_dict(device)
            except MeshplanTypeError as err:
                raise MeshplanTypeError(f"Cluster.device: {err}") from None
            except ClusterError as err:
                raise ClusterError(f"Cluster.device: {err}") from None
        return cls(**fields)

    def __repr__(self) -> str:
        slices = f", {self.num_slices} slices" if self.num_slices > 1 else ""
        nodes = "node" if self.num_nodes == 1 else "nodes"
        return (f"Cluster({self.text!r}: {self.num_devices} devices, {self.num_nodes} {nodes} x "
                f"{self.devices_per_node}{slices}, {fmt_bytes(self.hbm_bytes, style='exact')} HBM each)")


def _tpu_host_split(device: DeviceSpec, devices: int) -> tuple[int, int]:
    """(hosts, devices per host) of one slice of ``devices`` devices: sub-host slices sit on one host."""
    per_host = device.devices_per_node
    if devices <= per_host:
        return 1, devices
    return devices // per_host, per_host


_TPU_RE = re.compile(r"^(?:(?P<slices>\d+)x)?(?P<gen>v4|v5p|v5e|v5litepod|v6e|tpu7x|v7x)-(?P<count>\d+)$")
_RACK_RE = re.compile(r"^(?:(?P<racks>\d+)x)?(?P<dev>[a-z][a-z0-9_.]*)-nvl(?P<gpus>\d+)$")
_GPU_RE = re.compile(r"^(?:(?P<a>\d+)x)?(?:(?P<b>\d+)x)?(?P<dev>[a-z][a-z0-9_.-]*)$")

_FORMS = ("'<nodes>x<devices_per_node>x<DEVICE>' (e.g. '8x8xH100'), '<nodes>x<DEVICE>' "
          "(e.g. '2xH200', default devices per node), '<DEVICE>' (one node), "
          "'[<slices>x]<tpu>-<N>' (e.g. 'v5p-256', '2xv5e-256', 'v5litepod-16', 'tpu7x-128'), "
          "'[<racks>x]GB200-NVL72' (one or more 72-GPU NVLink racks)")


def _device_table(devices: Any) -> Mapping[str, DeviceSpec]:
    """``devices=`` of :func:`parse_cluster` checked: a mapping of str names to DeviceSpecs."""
    return as_typed_mapping(devices, "devices", values=DeviceSpec, expected="a DeviceSpec")


def _lookup_device(name: str, devices: Mapping[str, DeviceSpec]) -> DeviceSpec:
    by_lower = {key.lower(): spec for key, spec in devices.items()}
    key = name.lower()
    if key in by_lower:
        return by_lower[key]
    if devices is DEVICE_SPECS and key in _ALIASES:
        return DEVICE_SPECS[_ALIASES[key]]
    known = sorted(devices, key=str.lower)
    close = difflib.get_close_matches(key, sorted(by_lower), n=1)
    hint = f" Did you mean {by_lower[close[0]].name!r}?" if close else ""
    raise ClusterError(f"unknown device {name!r}; known devices: {known}.{hint} "
                       f"Pass a DeviceSpec of your own (Cluster(DeviceSpec(...), ...)) or "
                       f"parse_cluster(text, devices={{...}}) for others.")


def _count(text: str, what: str, value: str) -> int:
    if len(value) > len(str(MAX_DEVICES)):  # int() of a 5000-digit string refuses (or takes long)
        raise ClusterError(f"{what}={value[:30]}{'...' if len(value) > 30 else ''} in {text[:60]!r} is more "
                           f"than meshplan plans (at most {MAX_DEVICES} devices).")
    n = int(value)
    if n < 1:
        raise ClusterError(f"{what}={n} in {text!r} must be >= 1.")
    return n


def parse_cluster(text: str, *, devices: Mapping[str, DeviceSpec] | None = None) -> Cluster:
    """Read a cluster from its short form.

    Forms (case and spaces ignored):

    - ``"8x8xH100"``: 8 nodes of 8 H100s;
    - ``"2xH200"``: 2 nodes with the device's default devices per node;
    - ``"H100"``: one node;
    - ``"v5p-256"``, ``"v4-128"``: one TPU slice. v4 and v5p names count
      TensorCores (2 per chip), so ``v5p-256`` is 128 chips on 32 hosts of 4;
      v5e (API name ``v5litepod-N``) and v6e names count chips, so
      ``v5e-256`` is 256 chips on 32 hosts of 8. Slices smaller than a host
      (``v5e-4``) sit on one host;
    - ``"tpu7x-128"``: a TPU7x slice; the name counts TensorCores, each its own
      jax device (two per chip), so 128 devices on 64 chips, 16 hosts of 8;
    - ``"2xv5p-256"``: two such slices joined by DCN (multislice);
    - ``"GB200-NVL72"``, ``"2xGB200-NVL72"``: GB200 racks, each 18 hosts of 4
      GPUs in one NVLink domain; the node form (``"8x4xGB200"``) puts up to 18
      hosts in one domain and more in whole racks of 18.

    Args:
      text: the description.
      devices: device table to look names up in (default :data:`DEVICE_SPECS`,
        which also accepts aliases such as ``"a100"`` and ``"v5litepod"``).

    Returns:
      The :class:`Cluster`.

    Raises:
      ClusterError: malformed text (the message shows the valid forms), an
        unknown device (it lists the known ones), a TPU slice size that does
        not exist, or a TPU device written in the node form.
      MeshplanTypeError: ``text`` is not a string.

    Example:
      >>> parse_cluster("v5p-256")
      Cluster('v5p-256': 128 devices, 32 nodes x 4, 102.803 GB HBM each)
      >>> parse_cluster("2xH200").num_devices
      16
    """
    if not isinstance(text, str):
        raise MeshplanTypeError(f"cluster text={text!r} must be a str such as '8x8xH100'.")
    table = DEVICE_SPECS if devices is None else _device_table(devices)
    del devices
    compact = re.sub(r"\s+", "", text).lower().replace("×", "x")
    tpu = _TPU_RE.match(compact) if table is DEVICE_SPECS else None
    if tpu:
        return _parse_tpu(text, tpu)
    rack = _RACK_RE.match(compact)
    if rack:
        return _parse_rack(text, rack, table)
    gpu = _GPU_RE.match(compact)
    if not gpu:
        raise ClusterError(f"cannot read cluster {text!r}; valid forms: {_FORMS}.")
    device = _lookup_device(gpu["dev"], table)
    if device.ici_scope == "slice" and table is DEVICE_SPECS:
        example = f"{device.name}-{16 * _TPU_NAMING[device.name].cores_per_name_unit}"
        raise ClusterError(f"{text!r}: TPUs are described by slice name, not node counts; write "
                           f"e.g. {example!r} (16 chips), or '2x{example}' for two slices.")
    if gpu["a"] is not None and gpu["b"] is not None:
        nodes, per_node = _count(text, "nodes", gpu["a"]), _count(text, "devices_per_node", gpu["b"])
    elif gpu["a"] is not None:
        nodes, per_node = _count(text, "nodes", gpu["a"]), device.devices_per_node
    else:
        nodes, per_node = 1, device.devices_per_node
    return Cluster(device, num_nodes=nodes, devices_per_node=per_node, num_slices=_domains(text, device, nodes))


def _domains(text: str, device: DeviceSpec, nodes: int) -> int:
    """NVLink domains of a rack-scoped GPU written in the node form: one up to ``domain_nodes`` hosts, else
    whole racks (1 for every other GPU)."""
    rack = device.domain_nodes
    if device.ici_scope != "rack" or rack is None or nodes <= rack:
        return 1
    if nodes % rack:
        raise ClusterError(f"{text!r}: {nodes} {device.name} hosts do not fill whole NVLink racks of {rack} hosts; "
                           f"use up to {rack} hosts (one domain) or a multiple of {rack}, e.g. "
                           f"'{2 * rack}x{device.devices_per_node}x{device.name}' or "
                           f"'2x{device.name}-NVL{rack * device.devices_per_node}'.")
    return nodes // rack


def _parse_rack(text: str, match: re.Match[str], table: Mapping[str, DeviceSpec]) -> Cluster:
    device = _lookup_device(match["dev"], table)
    rack, per_node = device.domain_nodes, device.devices_per_node
    if device.ici_scope != "rack" or rack is None:
        raise ClusterError(f"{text!r}: {device.name} has no multi-host NVLink domain (its NVLink ends at the "
                           f"node); write e.g. '4x{per_node}x{device.name}'. Rack forms exist for "
                           f"{sorted(n for n, d in table.items() if d.ici_scope == 'rack')}.")
    racks = 1 if match["racks"] is None else _count(text, "racks", match["racks"])
    gpus = _count(text, "NVLink domain size", match["gpus"])
    if gpus != rack * per_node:
        raise ClusterError(f"{text!r}: a {device.name} NVLink rack holds {rack * per_node} GPUs "
                           f"({rack} hosts x {per_node}); write '{device.name}-NVL{rack * per_node}', or the node "
                           f"form ('8x{per_node}x{device.name}') for part of a rack.")
    return Cluster(device, num_nodes=racks * rack, devices_per_node=per_node, num_slices=racks)


def _parse_tpu(text: str, match: re.Match[str]) -> Cluster:
    gen = {"v5litepod": "v5e", "v7x": "tpu7x"}.get(match["gen"], match["gen"])
    naming = _TPU_NAMING[gen]
    device = DEVICE_SPECS[gen]
    slices = 1 if match["slices"] is None else _count(text, "slices", match["slices"])
    count = _count(text, f"{gen} size", match["count"])
    unit = "TensorCores" if naming.cores_per_name_unit == 2 else "chips"
    if count % naming.cores_per_name_unit:
        raise ClusterError(f"{text!r}: {gen} names count TensorCores (2 per chip), so the size must "
                           f"be even; got {count}. Valid: {gen}-N with N = 2 x ({_allowed_chips(naming)}).")
    chips = count // naming.cores_per_name_unit
    if not _chips_ok(naming, chips):
        size = f"{count} TensorCores ({chips} chips)" if unit == "TensorCores" else f"{chips} chips"
        note = " (the name counts 2 TensorCores per chip)" if unit == "TensorCores" else ""
        raise ClusterError(f"{text!r}: no {gen} slice has {size}; valid slices have "
                           f"{_allowed_chips(naming)}{note}.")
    hosts, per_host = _tpu_host_split(device, chips * naming.devices_per_chip)
    return Cluster(device, num_nodes=hosts * slices, devices_per_node=per_host, num_slices=slices)
