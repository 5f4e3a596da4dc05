"""GPU target descriptions, and which compilers are installed: compiling for a GPU with no GPU.

XLA:GPU compiles for a GPU it does not have when it is told what the GPU is: an
XLA ``GpuTargetConfigProto`` in text form (SM count, memory, compute capability,
...). meshplan ships one per GPU of its hardware catalogue
(:data:`~meshplan.pure.search.DEVICE_SPECS`) in ``meshplan/facade/gpu_targets/``
(``<catalogue name>.txtpb``, each field's source in its header comment), so
``jax.experimental.topologies.get_topology_desc(platform="cuda", ...)`` gives
compile-only devices of that GPU on a CPU-only machine. It needs the jax CUDA
plugin (``pip install 'meshplan[gpu]'``) and a process whose jax runs with
``JAX_PLATFORMS=cpu`` (otherwise the plugin calls ``cuInit``, fails, and jax
drops it): :mod:`meshplan.facade._worker` compiles in such a subprocess.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

from meshplan.pure.cluster._devices import DEVICE_SPECS, DeviceSpec
from meshplan.pure.errors import ClusterError

__all__ = ["ESTIMATE_ONLY", "GPU_TARGETS_DIR", "compiler_version", "cuda_plugin_available", "cuda_plugin_problem",
           "deviceless_gpu_ready", "gpu_target_config", "known_gpu_targets"]

GPU_TARGETS_DIR = Path(__file__).with_name("gpu_targets")
"""Where the shipped ``<name>.txtpb`` target descriptions live (package data)."""

# The CUDA 12 plugin is what `meshplan[gpu]` installs; a machine with CUDA 13 (jax[cuda13]) has the other.
# Either compiles for a described GPU; the first installed, in this order, is the one jax loads here.
_PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin")
_INSTALL_GPU = "pip install 'meshplan[gpu]' (the jax CUDA plugin of your jax: jax[cuda12]==<your jax version>)"


def _plugin() -> str | None:
    """The installed jax CUDA plugin's distribution name (``None``: neither is installed)."""
    return next((name for name in _PLUGINS if _version(name) is not None), None)


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


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_plugin_available() -> bool:
    """Whether the jax CUDA plugin is installed (``meshplan[gpu]``), whatever its version.

    Example:
      >>> isinstance(cuda_plugin_available(), bool)
      True
    """
    return importlib.util.find_spec("jax_plugins") is not None and _plugin() is not None


def cuda_plugin_problem() -> str | None:
    """Why this install cannot compile for GPUs without one (``None``: it can), with what to install.

    Example:
      >>> problem = cuda_plugin_problem()
      >>> problem is None or "pip install" in problem
      True
    """
    jax_version = _version("jax")
    name = _plugin()
    if name is None:
        return f"the jax CUDA plugin is not installed; {_INSTALL_GPU}"
    plugin = _version(name)
    if jax_version is not None and plugin != jax_version:
        cuda = name.split("-")[1]  # "cuda12" / "cuda13"
        return f"{name} {plugin} does not match jax {jax_version}; pip install 'jax[{cuda}]=={jax_version}'"
    return None


def compiler_version(platform: str) -> str:
    """The compiler meshplan compiles with for ``platform`` (``cpu``/``tpu``/``gpu``), with its versions.

    Example:
      >>> compiler_version("cpu").startswith("XLA:CPU (jax ")
      True
    """
    jax_version = f"jax {_version('jax')}, jaxlib {_version('jaxlib')}"
    if platform == "tpu":
        return f"XLA:TPU (libtpu {_version('libtpu')}, {jax_version})"
    if platform == "gpu":
        name = _plugin()
        plugin = f"{name} {_version(name)}" if name else "no CUDA plugin"
        return f"XLA:GPU ({plugin}, {jax_version}; no device: no autotuning)"
    return f"XLA:CPU ({jax_version})"


def deviceless_gpu_ready() -> str | None:
    """Why this process cannot compile for a GPU it lacks (``None``: it can).

    Example:
      >>> deviceless_gpu_ready() is None or "JAX_PLATFORMS" in deviceless_gpu_ready() or "pip" in deviceless_gpu_ready()
      True
    """
    problem = cuda_plugin_problem()
    if problem is not None:
        return problem
    if os.environ.get("JAX_PLATFORMS", "") != "cpu":
        return ("compiling for a GPU this machine lacks needs a process with JAX_PLATFORMS=cpu (the CUDA plugin "
                "otherwise fails to start); meshplan's verification compiles in such a worker "
                "(meshplan.verify_plan)")
    return None
