"""Which compiler compiles for a cluster, whether this install has it, and its versions.

One answer for every caller: plan verification, pipeline verification, ``meshplan check`` and the compile
cache's key all ask :func:`compiler_for`.

- A TPU slice: XLA:TPU through libtpu (``pip install 'meshplan[tpu]'``), from any machine.
- A GPU cluster: XLA:GPU through the jax CUDA plugin (``pip install 'meshplan[gpu]'``) and meshplan's shipped
  description of the GPU (:mod:`meshplan.facade.verify._gpu_targets`); no GPU needed, but the compile runs
  in a process whose jax has ``JAX_PLATFORMS=cpu`` (a worker), and with no device XLA does no autotuning.
- ``target="cpu"``: XLA:CPU, as many simulated devices as the cluster has.

Nothing here starts a jax backend: the questions are answered from the installed distributions, so asking
them in the user's process never loads the CUDA plugin there.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os

from meshplan.facade.verify._gpu_targets import ESTIMATE_ONLY, known_gpu_targets
from meshplan.pure.cluster import Cluster
from meshplan.pure.errors import PlanError

__all__ = ["COMPILE_TARGETS", "Compiler", "compiler_for", "compiler_version", "cuda_plugin_available",
           "cuda_plugin_problem", "deviceless_gpu_ready", "installed_versions", "libtpu_available"]

COMPILE_TARGETS: tuple[str, ...] = ("auto", "cpu")
"""Where a verification compiles: ``"auto"`` (the cluster's own compiler) or ``"cpu"`` (XLA:CPU)."""

# The CUDA 12 plugin is what `meshplan[gpu]` installs; a machine with CUDA 13 (jax[cuda13]) has the other.
# Either compiles for a described GPU; the first installed, in this order, is the one jax loads here.
_PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin")
_INSTALL_GPU = "pip install 'meshplan[gpu]' (the jax CUDA plugin of your jax: jax[cuda12]==<your jax version>)"
_COMPILER_DISTRIBUTIONS = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
                           "jax-cuda13-pjrt")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_versions() -> dict[str, str | None]:
    """The installed version of each distribution that compiles (jax, jaxlib, libtpu, the CUDA plugins);
    ``None`` for one that is not installed. What a compiled figure depends on besides the program.

    Example:
      >>> installed_versions()["jax"] is not None
      True
    """
    return {dist: _version(dist) for dist in _COMPILER_DISTRIBUTIONS}


def _plugin() -> str | None:
    """The installed jax CUDA plugin's distribution name (``None``: neither is installed)."""
    return next((name for name in _PLUGINS if _version(name) is not None), None)


def libtpu_available() -> bool:
    """Whether libtpu is installed, so TPU topologies can be compiled for (``pip install 'meshplan[tpu]'``).

    Example:
      >>> isinstance(libtpu_available(), bool)
      True
    """
    return importlib.util.find_spec("libtpu") is not None


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
      >>> problem = deviceless_gpu_ready()
      >>> problem is None or "JAX_PLATFORMS" in problem or "pip" in problem
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


@dataclasses.dataclass(frozen=True, slots=True)
class Compiler:
    """The compiler for a cluster and target, and whether it can compile here.

    Attributes:
      platform: ``"cpu"``, ``"tpu"`` or ``"gpu"``.
      name: the compiler and its versions, as a figure it produced is labelled
        (``"XLA:TPU (libtpu 0.0.42.1, jax 0.10.2, jaxlib 0.10.2)"``); ``"XLA:GPU"`` alone where missing.
      problem: why it cannot compile here, with what to install (``None``: it can).

    Example:
      >>> Compiler("cpu", "XLA:CPU (jax 0.10.2, jaxlib 0.10.2)", None).ready
      True
    """

    platform: str
    name: str
    problem: str | None

    @property
    def ready(self) -> bool:
        """Whether this install can compile for the target."""
        return self.problem is None


def compiler_for(cluster: Cluster, target: str = "auto") -> Compiler:
    """The compiler that compiles for ``cluster`` (``target="cpu"``: XLA:CPU), and whether it is installed.

    No look at local GPUs: that would start jax's backends (and the CUDA plugin) in the caller's process.
    A GPU compile runs in a worker with ``JAX_PLATFORMS=cpu`` from meshplan's shipped description.

    Raises:
      PlanError: ``target`` is neither ``"auto"`` nor ``"cpu"``.

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> compiler_for(parse_cluster("1x8xH100"), "cpu").ready
      True
      >>> compiler_for(parse_cluster("v5e-8")).name.startswith("XLA:TPU")
      True
    """
    if not isinstance(target, str) or target not in COMPILE_TARGETS:
        raise PlanError(f"target={target!r:.40} must be one of {list(COMPILE_TARGETS)} ('auto': the cluster's "
                        "compiler; 'cpu': XLA:CPU).")
    if target == "cpu":
        return Compiler("cpu", compiler_version("cpu"), None)
    if cluster.device.ici_scope == "slice":
        if not libtpu_available():
            return Compiler("tpu", "XLA:TPU", "libtpu is not installed: pip install 'meshplan[tpu]' for exact figures")
        return Compiler("tpu", compiler_version("tpu"), None)
    if cluster.device.name in ESTIMATE_ONLY:
        return Compiler("gpu", "XLA:GPU", ESTIMATE_ONLY[cluster.device.name])
    problem = cuda_plugin_problem()
    if problem is not None:
        return Compiler("gpu", "XLA:GPU", f"{problem}, for exact figures with no GPU")
    if cluster.device.name not in known_gpu_targets():
        return Compiler("gpu", "XLA:GPU", f"meshplan ships no target description for {cluster.device.name} (it "
                                          f"has {list(known_gpu_targets())}); add one to get exact figures")
    return Compiler("gpu", compiler_version("gpu"), None)
