"""What the machine is: the accelerator catalogue (:class:`DeviceSpec`, :data:`DEVICE_SPECS`), the two links a
collective can run over (:class:`Link`, :func:`select_link`), a cluster of nodes or TPU slices
(:class:`Cluster`, :func:`parse_cluster`: ``"8x8xH100"``, ``"2xv5p-256"``) and the TPU topology libtpu compiles
for (:func:`tpu_topology`), and how much of a device's memory a program gets by default
(:func:`default_headroom`). Plain descriptions only: nothing here asks a device what it is.

Example:
  >>> c = parse_cluster("2x8xH100")
  >>> c.num_devices, c.device.name
  (16, 'H100')
"""

from meshplan.pure.cluster._budget import JAX_GPU_MEM_FRACTION, TPU_HEADROOM, default_headroom
from meshplan.pure.cluster._cluster import Cluster, parse_cluster
from meshplan.pure.cluster._devices import DEVICE_SPECS, DeviceSpec
from meshplan.pure.cluster._link import Link, select_link
from meshplan.pure.cluster._machine import (
    CPU_DEVICE_NAME,
    check_profile_device,
    cpu_device,
    device_for_kind,
    link_grid,
    machine_cluster,
)
from meshplan.pure.cluster._measured import MEASURE_FORMAT, measure_document, rank_measured, read_measure
from meshplan.pure.cluster._profile import (
    LINK_KINDS,
    PROFILE_COLLECTIVES,
    PROFILE_FORMAT,
    CollectiveTiming,
    MachineProfile,
    MatmulTiming,
    MemoryTiming,
    StepTiming,
)
from meshplan.pure.cluster._topology import TpuTopology, tpu_topology

__all__ = ["Cluster", "DEVICE_SPECS", "DeviceSpec", "JAX_GPU_MEM_FRACTION", "Link", "TPU_HEADROOM", "TpuTopology",
           "default_headroom", "parse_cluster", "select_link", "tpu_topology"]
# a machine as measured: live device facts -> a Cluster, and the profile of timings
__all__ += ["CPU_DEVICE_NAME", "LINK_KINDS", "MEASURE_FORMAT", "PROFILE_COLLECTIVES", "PROFILE_FORMAT",
            "CollectiveTiming", "MachineProfile", "MatmulTiming", "MemoryTiming", "StepTiming", "check_profile_device",
            "cpu_device", "device_for_kind", "link_grid", "machine_cluster", "measure_document", "rank_measured",
            "read_measure"]
