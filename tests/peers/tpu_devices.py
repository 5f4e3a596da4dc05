"""Plain TPU device descriptions, as jax's own mesh tests build them.

Ported from jax's ``tests/mesh_utils_test.py`` (github.com/jax-ml/jax,
``MockTpuDevice`` and ``mock_tpu_devices``): frozen dataclasses with the
attributes jax's ``mesh_utils`` and meshplan read off a ``jax.Device``.
They describe devices; nothing of meshplan is replaced.

Each host (process) owns a 2x2x1 block of chips (fewer on sub-host slices),
hosts are numbered x-fastest, then y, then z, then slice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Client:
    """jax's ``MockClient``: sharding code asks the client which process it runs in (process 0)."""

    def process_index(self) -> int:
        return 0


@dataclasses.dataclass(frozen=True)
class TpuDevice:
    """A TPU device description: what ``mesh_utils`` reads."""

    id: int
    platform: str
    device_kind: str
    process_index: int
    coords: Sequence[int]
    core_on_chip: int
    slice_index: int = 0
    client: Client = dataclasses.field(default_factory=Client)


@dataclasses.dataclass(frozen=True)
class TpuDeviceNoSlice:
    """A TPU device without ``slice_index`` (AXLearn's ``DummyTpuDevice``, a single-slice job)."""

    id: int
    platform: str
    device_kind: str
    process_index: int
    coords: Sequence[int]
    core_on_chip: int = 0


def tpu_devices(x: int, y: int, z: int, kind: str, one_device_per_chip: bool = True, num_slices: int = 1,
                reorder: bool = False, host_block: tuple[int, int] = (2, 2)) -> list[TpuDevice]:
    """jax's ``mock_tpu_devices``: an x*y*z slice (times ``num_slices``), hosts of ``host_block`` chips."""
    cores = 1 if one_device_per_chip else 2
    nxd, nyd, nzd = min(x, host_block[0]), min(y, host_block[1]), 1
    nxp, nyp, nzp = x // nxd, y // nyd, z // nzd
    assert (nxp * nxd, nyp * nyd, nzp * nzd) == (x, y, z)

    def device(core, xd, yd, zd, xp, yp, zp, s):
        process = xp + nxp * (yp + nyp * (zp + nzp * s))
        coords = (xd + nxd * xp, yd + nyd * yp, zd + nzd * zp)
        ident = core + cores * (xd + nxd * (xp + nxp * (yd + nyd * (yp + nyp * (zd + nzd * (zp + nzp * s))))))
        return TpuDevice(ident, "tpu", kind, process, coords, core, s)

    out = [device(core, xd, yd, zd, xp, yp, zp, s)
           for s in range(num_slices)
           for zp in range(nzp) for yp in range(nyp) for xp in range(nxp)
           for zd in range(nzd) for yd in range(nyd) for xd in range(nxd)
           for core in range(cores)]
    return out[::-1] if reorder else out


def without_slice_index(devices: Sequence[TpuDevice]) -> list[TpuDeviceNoSlice]:
    """The same devices with no ``slice_index`` attribute at all."""
    return [TpuDeviceNoSlice(d.id, d.platform, d.device_kind, d.process_index, d.coords, d.core_on_chip)
            for d in devices]
