"""Live jax devices -> the plain descriptions the pure planners take.

This is the only place that reads attributes off ``jax.Device`` objects, so
planners stay testable with frozen dataclasses and every process describes
its devices the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from meshplan.pure.mesh._layout import DeviceInfo
from meshplan.pure.errors import DeviceLayoutError, MeshplanTypeError

__all__ = ["describe_devices", "resolve_devices", "flatten_devices"]


def describe_devices(devices: Sequence[jax.Device]) -> tuple[DeviceInfo, ...]:
    """Plain :class:`DeviceInfo` facts for each device, in the given order."""
    return tuple(DeviceInfo.from_device(d) for d in devices)


def _is_device(value: object) -> bool:
    """A jax.Device, or a plain description of one (an int ``id`` and a str ``platform``).

    Device descriptions (jax's and AXLearn's test devices, a saved topology)
    lay out like live devices; only what layout reads is required.
    """
    if isinstance(value, jax.Device):
        return True
    ident = getattr(value, "id", None)
    return (isinstance(ident, int | np.integer) and not isinstance(ident, bool)
            and isinstance(getattr(value, "platform", None), str))


def flatten_devices(devices: object) -> list[jax.Device]:
    """A flat device list from a list, tuple or numpy array of devices (or device descriptions)."""
    if isinstance(devices, np.ndarray):
        flat = list(devices.flat)
    elif isinstance(devices, list | tuple):
        try:
            flat = list(np.asarray(devices, dtype=object).flat)
        except ValueError:  # numpy's "could not broadcast" / "inhomogeneous shape": no one grid holds them
            raise MeshplanTypeError(f"devices={devices!r:.80} nests sequences of unequal shapes; give a flat list "
                                    "or a rectangular grid of jax devices.") from None
    else:
        raise MeshplanTypeError(
            f"devices must be a list, tuple or numpy array of jax devices, got {type(devices).__name__}."
        )
    bad = [d for d in flat if not _is_device(d)]
    if bad:
        raise MeshplanTypeError(
            f"devices must hold jax.Device objects (or objects with an int id and a platform); got {bad[0]!r}."
        )
    if not flat:
        raise DeviceLayoutError("devices is empty; pass at least one jax device (or None for all).")
    return flat


def resolve_devices(backend: str | None) -> list[jax.Device]:
    """All devices of ``backend`` (the default backend when ``None``)."""
    if backend is not None and not isinstance(backend, str):
        raise MeshplanTypeError(f"backend must be a string such as 'cpu' or None, got {backend!r}.")
    try:
        return list(jax.devices(backend))
    except RuntimeError as err:
        # jax reports an unknown or unavailable backend as a RuntimeError.
        raise DeviceLayoutError(
            f"backend={backend!r} is not available here ({err}); use None for the default "
            f"backend ({jax.default_backend()!r}) or one of the platforms jax was built with."
        ) from err
