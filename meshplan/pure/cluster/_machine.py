"""Which catalogue cluster a set of live devices is: jax's ``device_kind`` and counts in, a :class:`Cluster` out.

The facade reads the facts (``device_kind``, ``platform``, how many devices, processes and TPU slices, the
host's memory) and :func:`machine_cluster` decides, so the decision is property-tested without devices:

- a GPU kind names its catalogue device by model (``"NVIDIA H100 80GB HBM3"`` -> ``H100``,
  :meth:`DeviceSpec.matches_kind`); a TPU kind by jax's spelling (``"TPU v5 lite"`` -> ``v5e``,
  :data:`TPU_KINDS`); one node per process, one slice per ``slice_index``;
- a CPU (jax's ``"cpu"`` platform, the suite's simulated devices) is no catalogue accelerator: it is
  :func:`cpu_device`, named ``"XLA:CPU"``, whose memory is the host's shared out over its devices and whose
  link figures are **nominal placeholders, not measurements** (``meshplan profile`` measures them, and a plan
  priced with that profile uses the measured ones); it has no peak FLOP/s, so without a profile a CPU plan's
  step is its exposed communication only, and says so.

Example:
  >>> machine_cluster("NVIDIA H100 80GB HBM3", "gpu", 16, process_count=2).text
  '2x8xH100'
  >>> c = machine_cluster("cpu", "cpu", 8, host_memory_bytes=16 * 2**30)
  >>> c.device.name, c.num_devices, c.device.hbm_bytes // 2**30
  ('XLA:CPU', 8, 2)
"""

from __future__ import annotations

import types
from collections.abc import Mapping

from collections.abc import Sequence

from meshplan.pure._check import as_choice, as_count, as_sequence, as_str
from meshplan.pure.cluster._cluster import MAX_DEVICES, Cluster
from meshplan.pure.cluster._devices import DEVICE_SPECS, DeviceSpec
from meshplan.pure.cluster._profile import MachineProfile
from meshplan.pure.errors import ClusterError, MeshplanTypeError, ProfileError
from meshplan.pure.mesh import DeviceInfo

__all__ = ["CPU_DEVICE_NAME", "TPU_KINDS", "check_profile_device", "cpu_device", "device_for_kind", "link_grid",
           "machine_cluster"]

CPU_DEVICE_NAME = "XLA:CPU"
"""The :class:`DeviceSpec` name of a CPU device (jax's ``"cpu"`` platform)."""

TPU_KINDS: Mapping[str, str] = types.MappingProxyType({
    "tpu v4": "v4", "tpu v5 lite": "v5e", "tpu v5e": "v5e", "tpu v5": "v5p", "tpu v5p": "v5p",
    "tpu v6 lite": "v6e", "tpu v6e": "v6e",
})
"""jax's TPU ``device_kind`` spellings (lower case) -> :data:`DEVICE_SPECS` key."""

# Nominal CPU link figures: a jax CPU device's collectives are memory copies inside one process (intra) or
# TCP through gloo between processes (inter). Not measured: placeholders of the right order, so a CPU plan
# ranks at all; a profile replaces them.
_CPU_INTRA = (10e9, 1e-5)
_CPU_INTER = (1e9, 1e-4)
_DEFAULT_HOST_MEMORY = 16 * 2**30  # when the host's memory is not known


def cpu_device(devices_per_node: int, *, host_memory_bytes: int | None = None) -> DeviceSpec:
    """The :class:`DeviceSpec` of one of ``devices_per_node`` jax CPU devices sharing a host's memory.

    Args:
      devices_per_node: CPU devices in one process.
      host_memory_bytes: the host's memory (default 16 GiB), shared evenly among them.

    Returns:
      ``DeviceSpec("XLA:CPU", ...)`` with nominal link figures (see the module docstring) and no peak.

    Raises:
      ClusterError: a count below 1 or past the limits; MeshplanTypeError: not an int.

    Example:
      >>> cpu_device(8, host_memory_bytes=8 * 2**30).hbm_bytes == 2**30
      True
    """
    n = as_count(devices_per_node, "devices_per_node", maximum=MAX_DEVICES, error=ClusterError)
    memory = _DEFAULT_HOST_MEMORY if host_memory_bytes is None else as_count(
        host_memory_bytes, "host_memory_bytes", maximum=2**50, error=ClusterError)
    return DeviceSpec(CPU_DEVICE_NAME, hbm_bytes=max(memory // n, 1), intra_bandwidth=_CPU_INTRA[0],
                      inter_bandwidth=_CPU_INTER[0], intra_latency_s=_CPU_INTRA[1],
                      inter_latency_s=_CPU_INTER[1], devices_per_node=n, ici_scope="node")


def device_for_kind(device_kind: str, platform: str) -> DeviceSpec | None:
    """The catalogue device jax's ``device_kind`` names, ``None`` for a CPU (see :func:`cpu_device`).

    Raises:
      ClusterError: a GPU or TPU kind the catalogue does not hold (the message lists the catalogue).

    Example:
      >>> device_for_kind("TPU v5 lite", "tpu").name, device_for_kind("NVIDIA H200", "gpu").name
      ('v5e', 'H200')
    """
    kind = as_str(device_kind, "device_kind", nonempty=True, error=ClusterError)
    plat = as_choice(platform, "platform", ("cpu", "gpu", "tpu"), error=ClusterError)
    if plat == "cpu":
        return None
    if plat == "tpu":
        key = TPU_KINDS.get(" ".join(kind.lower().split()))
        if key is not None:
            return DEVICE_SPECS[key]
    else:
        # The longest matching name first: "H100" must not be read as a shorter model's name inside it.
        for name in sorted(DEVICE_SPECS, key=lambda n: (-len(n), n)):
            spec = DEVICE_SPECS[name]
            if spec.ici_scope == "node" and spec.matches_kind(kind):
                return spec
    raise ClusterError(f"device_kind={kind!r} ({plat}) is no catalogue device (the catalogue: "
                       f"{sorted(DEVICE_SPECS)}; TPU kinds {sorted(TPU_KINDS)}); describe it with a "
                       "DeviceSpec of your own and build the Cluster yourself.")


def machine_cluster(device_kind: str, platform: str, device_count: int, *, process_count: int = 1,
                    slice_count: int = 1, host_memory_bytes: int | None = None) -> Cluster:
    """The :class:`Cluster` a set of live devices is (see the module docstring).

    Args:
      device_kind: jax's ``device_kind`` of the devices (all alike).
      platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
      device_count: all devices, every process together.
      process_count: jax processes, one per host.
      slice_count: TPU slices (multislice); 1 elsewhere.
      host_memory_bytes: one host's memory, for CPU devices (their "HBM" is a share of it).

    Returns:
      A cluster of ``process_count`` nodes of ``device_count / process_count`` devices.

    Raises:
      ClusterError: counts that do not divide, an unknown GPU/TPU kind, counts out of range.
      MeshplanTypeError: wrong types.

    Example:
      >>> machine_cluster("TPU v5 lite", "tpu", 16, process_count=2, slice_count=2)
      Cluster('2xv5e-8': 16 devices, 2 nodes x 8, 2 slices, 16.9093 GB HBM each)
    """
    n = as_count(device_count, "device_count", maximum=MAX_DEVICES, error=ClusterError)
    hosts = as_count(process_count, "process_count", maximum=MAX_DEVICES, error=ClusterError)
    slices = as_count(slice_count, "slice_count", maximum=MAX_DEVICES, error=ClusterError)
    if n % hosts:
        raise ClusterError(f"device_count={n} does not split evenly over process_count={hosts} hosts.")
    if hosts % slices and slices > 1:
        raise ClusterError(f"process_count={hosts} hosts do not split evenly into slice_count={slices} slices.")
    spec = device_for_kind(device_kind, platform)
    per_node = n // hosts
    if spec is None:
        spec = cpu_device(per_node, host_memory_bytes=host_memory_bytes)
    elif slices > 1 and spec.ici_scope != "slice":
        raise ClusterError(f"slice_count={slices}: only TPU devices come in slices; {spec.name} is a GPU.")
    if spec.ici_scope == "slice" and hosts < slices:
        raise ClusterError(f"{slices} TPU slices need at least as many hosts; got process_count={hosts}.")
    return Cluster(spec, num_nodes=hosts, devices_per_node=per_node, num_slices=slices)


def check_profile_device(profile: MachineProfile, device: DeviceSpec) -> None:
    """Refuse a profile measured on another kind of device than ``device``, naming both.

    Raises:
      ProfileError: the kinds differ; MeshplanTypeError: not a profile / a DeviceSpec.

    Example:
      >>> p = MachineProfile("cpu", "cpu", 8, 1, (), "2026-01-02T03:04:05Z")
      >>> check_profile_device(p, cpu_device(8))
      >>> check_profile_device(p, DEVICE_SPECS["H100"])
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.ProfileError: the profile was measured on 'cpu' (cpu, id ...), not on the cluster's device H100; profile an H100 machine, or price this cluster without --profile.
    """
    if not isinstance(profile, MachineProfile):
        raise MeshplanTypeError(f"profile={profile!r:.60} must be a MachineProfile.")
    if not isinstance(device, DeviceSpec):
        raise MeshplanTypeError(f"device={device!r:.60} must be a DeviceSpec.")
    if profile.platform == "cpu":
        same = device.name == CPU_DEVICE_NAME
    else:
        try:
            found = device_for_kind(profile.device_kind, profile.platform)
        except ClusterError:
            found = None
        same = found is not None and found.name == device.name
    if not same:
        article = "an" if device.name[:1].upper() in "AEFHILMNORSX" else "a"
        raise ProfileError(f"the profile was measured on {profile.device_kind!r} ({profile.platform}, id "
                           f"{profile.id}), not on the cluster's device {device.name}; profile {article} "
                           f"{device.name} machine, or price this cluster without --profile.")


def link_grid(devices: Sequence[DeviceInfo]) -> tuple[tuple[int, ...], ...]:
    """Device ids as ``(domains, per domain)``: one row per fast domain (a TPU slice, else a process/host),
    rows and ids in order, so axis 0 of a mesh over it crosses the network (``"inter"``) and axis 1 stays on
    the fast link (``"intra"``), every process laying it out alike.

    Raises:
      ClusterError: domains of unequal sizes, or repeated ids; MeshplanTypeError: not DeviceInfos.

    Example:
      >>> link_grid([DeviceInfo(i, process_index=i // 2) for i in (3, 0, 2, 1)])
      ((0, 1), (2, 3))
    """
    infos = as_sequence(devices, "devices")
    if not infos or not all(isinstance(d, DeviceInfo) for d in infos):
        raise MeshplanTypeError(f"devices={devices!r:.60} must be a non-empty sequence of DeviceInfo.")
    ids = [d.id for d in infos]
    if len(set(ids)) != len(ids):
        raise ClusterError(f"device ids {sorted(i for i in set(ids) if ids.count(i) > 1)} appear more than once.")
    domains: dict[int, list[int]] = {}
    for d in infos:
        key = d.slice_index if d.platform == "tpu" and d.slice_index is not None else d.process_index
        domains.setdefault(key, []).append(d.id)
    sizes = sorted({len(v) for v in domains.values()})
    if len(sizes) > 1:
        raise ClusterError(f"the hosts/slices hold different device counts {sizes}; a profile times equal groups.")
    return tuple(tuple(sorted(domains[k])) for k in sorted(domains))
