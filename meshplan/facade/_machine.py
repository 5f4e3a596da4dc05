"""The machine this process runs on, as plain facts: its devices' kind and counts, its software versions.

The facade gathers; :func:`~meshplan.pure.cluster.machine_cluster` decides which catalogue cluster the devices
are (a CPU is the ``"XLA:CPU"`` device, with nominal link figures until a profile measures them).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform as _platform
from collections.abc import Sequence
from typing import Any

import jax

from meshplan.pure._check import as_sequence
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cluster._machine import machine_cluster
from meshplan.pure.errors import ClusterError, MeshplanTypeError

__all__ = ["host_memory_bytes", "live_cluster", "live_devices", "software_versions", "utc_now"]

# The distributions whose versions decide what a profile measured (the compiler, its plugins, the runtime).
_PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "libtpu")


def live_devices(devices: Sequence[Any] | None = None) -> list[Any]:
    """``devices``, or every device of every process (``jax.devices()``), checked to be one kind.

    Raises:
      ClusterError: devices of several kinds; MeshplanTypeError: not jax devices.
    """
    found = list(jax.devices()) if devices is None else list(as_sequence(devices, "devices"))
    if not found or not all(hasattr(d, "device_kind") and hasattr(d, "platform") for d in found):
        raise MeshplanTypeError(f"devices={devices!r:.80} must be a non-empty sequence of jax devices.")
    kinds = sorted({(d.platform, d.device_kind) for d in found})
    if len(kinds) > 1:
        raise ClusterError(f"the devices are of several kinds {kinds}; meshplan plans clusters of one kind.")
    return found


def host_memory_bytes() -> int | None:
    """This host's physical memory (``None`` where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def live_cluster(devices: Sequence[Any] | None = None) -> Cluster:
    """The :class:`~meshplan.pure.Cluster` the live devices are (one node per process, one slice per TPU slice).

    Raises:
      ClusterError: a GPU or TPU kind the catalogue lacks, or counts that do not divide.

    Example:
      >>> live_cluster().device.name  # the suite's 8 CPU devices
      'XLA:CPU'
    """
    found = live_devices(devices)
    first = found[0]
    processes = len({d.process_index for d in found})
    slices = len({getattr(d, "slice_index", 0) or 0 for d in found}) if first.platform == "tpu" else 1
    return machine_cluster(first.device_kind, first.platform, len(found), process_count=processes,
                           slice_count=slices, host_memory_bytes=host_memory_bytes())


def software_versions() -> tuple[tuple[str, str], ...]:
    """``(package, version)`` of jax, jaxlib, the CUDA plugins and libtpu where installed, and Python."""
    out = []
    for name in _PACKAGES:
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    out.append(("python", _platform.python_version()))
    return tuple(sorted(out))


def utc_now() -> str:
    """Now, as a profile records it: ISO 8601 in UTC to the second (``"2026-01-02T03:04:05Z"``)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
