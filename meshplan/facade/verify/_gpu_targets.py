"""GPU target descriptions: what XLA:GPU compiles for when there is no GPU.

XLA:GPU compiles for a GPU it does not have when it is told what the GPU is: an
XLA ``GpuTargetConfigProto`` in text form (SM count, memory, compute capability,
...). meshplan ships one per GPU of its hardware catalogue
(:data:`~meshplan.pure.cluster.DEVICE_SPECS`) in ``meshplan/facade/verify/gpu_targets/``
(``<catalogue name>.txtpb``, each field's source in its header comment), so
``jax.experimental.topologies.get_topology_desc(platform="cuda", ...)`` gives
compile-only devices of that GPU on a CPU-only machine. It needs the jax CUDA
plugin (``pip install 'meshplan[gpu]'``) and a process whose jax runs with
``JAX_PLATFORMS=cpu`` (otherwise the plugin calls ``cuInit``, fails, and jax
drops it): :mod:`meshplan.facade.verify._worker` compiles in such a subprocess, and
:mod:`meshplan.facade.verify._compilers` says whether the plugin is installed.
"""

from __future__ import annotations

from pathlib import Path

from meshplan.pure.cluster._devices import DeviceSpec
from meshplan.pure.errors import ClusterError

__all__ = ["ESTIMATE_ONLY", "GPU_TARGETS_DIR", "gpu_target_config", "known_gpu_targets"]

GPU_TARGETS_DIR = Path(__file__).with_name("gpu_targets")
"""Where the shipped ``<name>.txtpb`` target descriptions live (package data)."""


ESTIMATE_ONLY = {
    "H800": ("NVIDIA publishes no H800 device figures (its SM count, the memory its driver reports) to write a "
             "compile target from; it is H100 silicon with cut NVLink, so an H100 compile of the same layout is a "
             "close proxy, not its figure"),
    "H20": ("NVIDIA publishes no H20 device figures (its SM count, the memory its driver reports) to write a "
            "compile target from"),
    "GB200": ("no public device query of a GB200 GPU (its SM count, the memory its driver reports) to write a "
              "compile target from; the B200 description is the same die at another power and memory size, not "
              "its figure"),
    "MI300X": ("AMD GPUs compile with jax's ROCm plugin, which meshplan does not install; XLA's deviceless "
               "target descriptions are read by the CUDA plugin, and a deviceless ROCm compile is untested"),
    "MI325X": ("AMD GPUs compile with jax's ROCm plugin, which meshplan does not install; XLA's deviceless "
               "target descriptions are read by the CUDA plugin, and a deviceless ROCm compile is untested"),
}
"""Catalogue GPUs with no shipped target description, each with why its rows stay estimates."""


def known_gpu_targets() -> tuple[str, ...]:
    """The catalogue GPUs meshplan ships a target description for, sorted.

    Example:
      >>> known_gpu_targets()
      ('A100-80GB', 'B200', 'H100', 'H200')
    """
    return tuple(sorted(p.stem for p in GPU_TARGETS_DIR.glob("*.txtpb")))


def gpu_target_config(device: DeviceSpec | str) -> str:
    """The shipped ``GpuTargetConfigProto`` text for a catalogue GPU (``"H100"`` or its DeviceSpec).

    Args:
      device: a GPU :class:`~meshplan.pure.DeviceSpec` or its catalogue name.

    Returns:
      The text proto, comments included (XLA's text parser skips them).

    Raises:
      ClusterError: no description is shipped for this GPU; the message names the known ones and how
        to add one.

    Example:
      >>> 'device_description_str: "NVIDIA H100 80GB HBM3"' in gpu_target_config("H100")
      True
    """
    name = device.name if isinstance(device, DeviceSpec) else device
    path = GPU_TARGETS_DIR / f"{name}.txtpb"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        known = list(known_gpu_targets())
        raise ClusterError(
            f"no GPU target description for {str(name)!r:.60}; meshplan ships {known}. Add one: copy "
            f"{known[-1]}.txtpb to {GPU_TARGETS_DIR}/<catalogue name>.txtpb and change its figures to the "
            "GPU's datasheet (SMs, memory, compute capability; cite each source), or compile on a machine "
            "with one such GPU.")
    return path.read_text(encoding="utf-8")
