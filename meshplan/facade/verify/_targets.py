"""Where a step compiles: meshes of compile-only TPU and GPU devices, or of this process's own devices.

- A TPU slice: libtpu describes the topology (:func:`tpu_topology_mesh`); its devices compile, they do not run.
- A GPU cluster: the jax CUDA plugin describes ``hosts x GPUs`` compile-only devices from meshplan's shipped
  description of the GPU (:func:`gpu_topology_mesh`), or from a local GPU of that kind.
- XLA:CPU: this process's simulated CPU devices (``target="cpu"``).

:func:`compile_target` picks one for a cluster and says what it is: its label and whether XLA:GPU compiled for
GPUs it did not run on (``deviceless``: no autotuning, so a run on the GPU may peak higher).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from meshplan.facade.verify._compilers import deviceless_gpu_ready, libtpu_available
from meshplan.facade.verify._gpu_targets import gpu_target_config
from meshplan.pure._check import as_count, as_sequence, as_str
from meshplan.pure.cluster import Cluster, TpuTopology, parse_cluster, tpu_topology
from meshplan.pure.errors import ClusterError, MeshplanTypeError, PlanError

__all__ = ["TPU_WINDOWED_EINSUM_OFF", "CompileTarget", "compile_target", "gpu_topology_mesh",
           "hybrid_device_order", "local_gpus", "tpu_topology_mesh"]


TPU_WINDOWED_EINSUM_OFF = ("--xla_tpu_enable_windowed_einsum_for_all_gather=false "
                           "--xla_tpu_enable_windowed_einsum_for_reduce_scatter=false")
"""``LIBTPU_INIT_ARGS`` that keep XLA:TPU from running an all-gather or reduce-scatter and its matmul as a
windowed loop (its collective matmul), for checking a compiled step's FLOPs and collectives against the
analytic model: ``cost_analysis()`` counts a loop body once. libtpu reads them once, when it starts."""


@functools.lru_cache(maxsize=16)
def _topology_devices(topology: TpuTopology) -> tuple[Any, ...]:
    from jax.experimental import topologies

    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no cloud metadata server to ask on this machine
    # Compiling for a topology touches no TPU, so several processes (test workers, a benchmark) may load
    # libtpu at once; without this the second one fails on libtpu's single-process lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    desc = topologies.get_topology_desc(**topology.kwargs())
    return tuple(desc.devices)


def local_gpus() -> list[Any]:
    """This process's GPUs (none when jax has no GPU backend).

    Example:
      >>> local_gpus()  # the test suite runs on CPU devices
      []
    """
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:
        return []


def _mesh_axes(axis_names: Sequence[str], axis_sizes: Sequence[int], num_devices: int,
               where: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Checked axis names and sizes of a mesh over ``num_devices`` devices of ``where``."""
    names = tuple(as_str(n, f"axis_names[{i}]", nonempty=True, error=PlanError)
                  for i, n in enumerate(as_sequence(axis_names, "axis_names")))
    sizes = tuple(as_count(n, f"axis_sizes[{i}]", error=PlanError)
                  for i, n in enumerate(as_sequence(axis_sizes, "axis_sizes")))
    if len(set(names)) != len(names):
        raise PlanError(f"axis_names={names!r:.80} must not repeat a name.")
    if len(names) != len(sizes) or math.prod(sizes) != num_devices:
        raise PlanError(f"mesh {dict(zip(names, sizes, strict=False))} must have one size per axis, multiplying "
                        f"to the {num_devices} devices of {where}.")
    return names, sizes


def gpu_topology_mesh(cluster: Cluster | str, axis_names: Sequence[str], axis_sizes: Sequence[int], *,
                      target_config: str | None = None) -> Mesh:
    """A mesh of a GPU cluster's compile-only devices, for compiling ahead of time with or without a GPU.

    XLA:GPU compiles for a topology of GPUs it does not have (``jax.experimental.topologies``,
    platform ``cuda``, topology ``"1 x hosts x GPUs per host"``) from a description of the GPU:
    with no local GPU of the cluster's kind, the one meshplan ships for it
    (:func:`~meshplan.facade.verify._gpu_targets.gpu_target_config`; needs the jax CUDA plugin,
    ``pip install 'meshplan[gpu]'``, and a process whose jax runs with ``JAX_PLATFORMS=cpu``);
    with one, the local GPU's own. So a laptop compiles a step for ``1x8xH100`` or ``8x8xH100``:
    the program, its collectives and its buffer assignment are the whole cluster's; it compiles,
    it does not run. XLA:GPU does not refuse a step that is too big: compare the compiled peak
    with the budget.

    Args:
      cluster: a GPU :class:`~meshplan.pure.Cluster` or its text (``"1x8xH200"``).
      axis_names, axis_sizes: the mesh, outermost first; sizes multiply to the device count.
      target_config: a ``GpuTargetConfigProto`` text to compile for instead of the shipped one
        (or the local GPU's).

    Returns:
      A ``jax.sharding.Mesh`` (Auto axes) over the cluster's compile-only GPU devices, hosts outermost.

    Raises:
      ClusterError: a TPU cluster; a GPU with no shipped description (the message names the known
        ones); no CUDA plugin, a mismatched one, or a process not running with ``JAX_PLATFORMS=cpu``.
      PlanError: sizes that do not multiply to the device count.

    Example:
      >>> mesh = gpu_topology_mesh("2x8xH100", ("dp", "fsdp"), (2, 8))  # doctest: +SKIP
      >>> mesh.devices.shape, mesh.devices.flat[0].device_kind  # doctest: +SKIP
      ((2, 8), 'NVIDIA H100 80GB HBM3')
    """
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(clus, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.80} must be a Cluster or its text, e.g. '1x8xH200'.")
    if clus.device.ici_scope == "slice":
        raise ClusterError(f"{clus.text} is a TPU cluster; use tpu_topology_mesh for it.")
    names, sizes = _mesh_axes(axis_names, axis_sizes, clus.num_devices, clus.text)
    if target_config is not None:
        config: str | None = as_str(target_config, "target_config", nonempty=True, error=PlanError)
    elif any(clus.device.matches_kind(d.device_kind) for d in local_gpus()):
        config = None  # the local GPU describes itself
    else:
        config = gpu_target_config(clus.device)  # ClusterError naming the known GPUs when none is shipped
    if config is not None:
        problem = deviceless_gpu_ready()
        if problem is not None:
            raise ClusterError(f"compiling for {clus.text} with no local {clus.device.name}: {problem}.")
    devices = _gpu_topology_devices(f"1x{clus.num_nodes}x{clus.devices_per_node}", config)
    grid = np.array(list(devices), dtype=object).reshape(sizes)
    return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


@functools.lru_cache(maxsize=16)
def _gpu_topology_devices(topology: str, target_config: str | None) -> tuple[Any, ...]:
    from jax.experimental import topologies

    kwargs = {} if target_config is None else {"target_config": target_config}
    try:
        desc = topologies.get_topology_desc(platform="cuda", topology=topology, **kwargs)
    except (NotImplementedError, RuntimeError) as err:  # jax's words when the CUDA plugin is absent or failed
        raise ClusterError(f"XLA:GPU could not describe topology {topology}: {str(err).splitlines()[0][:200]}; "
                           "pip install 'meshplan[gpu]' and run with JAX_PLATFORMS=cpu.") from None
    return tuple(desc.devices)


def tpu_topology_mesh(cluster: Cluster | str, axis_names: Sequence[str], axis_sizes: Sequence[int], *,
                      dcn_shape: Sequence[int] | None = None) -> Mesh:
    """A mesh of a TPU cluster's devices, for compiling ahead of time on any machine.

    The cluster's slice is named for libtpu by
    :func:`~meshplan.pure.cluster.tpu_topology` (``v5p-256`` -> ``v5:4x4x8``,
    megacore, wrapped); its devices are laid out by jax's ``mesh_utils`` (the
    hybrid ICI x DCN layout when ``dcn_shape`` spans slices).

    Args:
      cluster: a TPU :class:`~meshplan.pure.Cluster` or its text (``"v5e-16"``).
      axis_names, axis_sizes: the mesh, outermost first; sizes multiply to the device count.
      dcn_shape: each axis's part across slices (a search candidate's ``dcn_shape``).

    Returns:
      A ``jax.sharding.Mesh`` over TPU devices (they compile, they do not run).

    Raises:
      ClusterError: not a TPU cluster, or libtpu is not installed.
      PlanError: sizes that do not multiply to the device count.

    Example:
      >>> mesh = tpu_topology_mesh("v5e-4", ("dp", "tp"), (2, 2))  # doctest: +SKIP
      >>> mesh.devices.shape  # doctest: +SKIP
      (2, 2)
    """
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    topology = tpu_topology(clus)
    if not libtpu_available():
        raise ClusterError(f"compiling for {clus.text} needs libtpu, which is not installed; "
                           "pip install 'meshplan[tpu]' (or jax[tpu] matching your jax).")
    names, sizes = _mesh_axes(axis_names, axis_sizes, topology.num_devices, clus.text)
    devices = list(_topology_devices(topology))
    from jax.experimental import mesh_utils

    dcn = None if dcn_shape is None else tuple(
        as_count(d, f"dcn_shape[{i}]", error=PlanError)
        for i, d in enumerate(as_sequence(dcn_shape, "dcn_shape")))
    if dcn is not None and (len(dcn) != len(sizes) or any(s % d for s, d in zip(sizes, dcn, strict=False))):
        raise PlanError(f"dcn_shape={dcn} must have one entry per axis, each dividing its size {sizes}.")
    if dcn is not None and math.prod(dcn) > 1:
        ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, allow_split_physical_axes=True)
    else:
        try:
            grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):
            # Shapes mesh_utils has no physical layout for: jax's device order, reshaped.
            grid = np.array(devices, dtype=object).reshape(sizes)
    return Mesh(grid, names)


@dataclasses.dataclass(frozen=True)
class CompileTarget:
    """The mesh a step compiles on and what it is.

    Attributes:
      mesh: a ``jax.sharding.Mesh`` of XLA:CPU devices, TPU topology devices or GPU devices.
      label: where it compiled, as rows name it (``"8 x NVIDIA H100 80GB HBM3"``, ``"v5e:2x2 (v5e-4)"``).
      deviceless: XLA:GPU compiled for GPUs it did not run on (a description, or local GPUs of another
        count): no autotuning, so a run on the GPU may peak higher
        (:func:`~meshplan.pure.xla.deviceless_gpu_run_range`).
    """

    mesh: Any
    label: str
    deviceless: bool = False


def _ensure_cpu_devices(n: int) -> None:
    """Ask for ``n`` simulated CPU devices if jax has not started its backends yet (else keep what it has)."""
    from meshplan.facade._jax_internals import backends_started

    current = int(getattr(jax.config, "jax_num_cpu_devices", -1))  # an untyped config attribute
    if not backends_started() and current < n:
        jax.config.update("jax_num_cpu_devices", n)  # type: ignore[no-untyped-call]


def _local_mesh(devices: Any, sizes: Sequence[int], names: Sequence[str]) -> Mesh:
    """A mesh of local devices in the order given (Auto axes, as the reference step's constraints need)."""
    return Mesh(np.array(devices, dtype=object).reshape(tuple(sizes)), tuple(names),
                axis_types=(AxisType.Auto,) * len(names))


def compile_target(cluster: Cluster, names: Sequence[str], sizes: Sequence[int], dcn: Sequence[int] | None,
                   target: str) -> CompileTarget:
    """The mesh to compile on and what it is: XLA:CPU devices, a TPU topology, or GPUs (local or described).

    Raises:
      PlanError: ``target="cpu"`` in a process that started jax with fewer CPU devices.
      ClusterError: the target's compiler is missing (libtpu, the CUDA plugin) or the GPU unknown.

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> compile_target(parse_cluster("1x8xH100"), ("dp",), (8,), None, "cpu").label
      '8 x XLA:CPU'
    """
    n = cluster.num_devices
    if target == "cpu":
        _ensure_cpu_devices(n)
        cpus = jax.devices("cpu")
        if len(cpus) < n:
            raise PlanError(f"--target cpu needs {n} CPU devices for {cluster.text}, this process has "
                            f"{len(cpus)}; run with XLA_FLAGS=--xla_force_host_platform_device_count={n} (or "
                            f"verify a smaller cluster).")
        return CompileTarget(_local_mesh(cpus[:n], sizes, names), f"{n} x XLA:CPU")
    if cluster.device.ici_scope == "slice":
        mesh = tpu_topology_mesh(cluster, names, sizes, dcn_shape=dcn)
        return CompileTarget(mesh, f"{tpu_topology(cluster).topology_name} ({cluster.text})")
    gpus = [d for d in local_gpus() if cluster.device.matches_kind(d.device_kind)]
    if len(gpus) >= n:
        return CompileTarget(_local_mesh(gpus[:n], sizes, names), f"{n} x {gpus[0].device_kind}")
    mesh = gpu_topology_mesh(cluster, names, sizes)
    how = "compiled ahead of time" if gpus else "no GPU: meshplan's shipped description"
    return CompileTarget(mesh, f"{n} x {mesh.devices.flat[0].device_kind} ({how})", deviceless=True)


def hybrid_device_order(devices: Any, dcn: Sequence[int] | None, hosts: int) -> Any:
    """``devices`` (a grid, hosts outermost in its flat order, as ``gpu_topology_mesh`` lays them) rearranged
    so that axis ``i`` spans ``dcn[i]`` hosts and ``size_i / dcn[i]`` devices of each: ``pp`` placed inside
    each node (ICI) stays inside it. The grid as it is where ``dcn`` does not split the hosts.

    Example:
      >>> import numpy as np
      >>> hybrid_device_order(np.arange(8).reshape(2, 4), (1, 2), 2).tolist()  # pp=2 in each of 2 nodes
      [[0, 1, 4, 5], [2, 3, 6, 7]]
      >>> hybrid_device_order(np.arange(8).reshape(2, 4), (2, 1), 2).tolist()  # pp=2 over the network
      [[0, 1, 2, 3], [4, 5, 6, 7]]
    """
    sizes = tuple(devices.shape)
    if (dcn is None or len(dcn) != len(sizes) or math.prod(dcn) != hosts or hosts <= 1
            or any(s % d for s, d in zip(sizes, dcn, strict=True))):
        return devices
    ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
    # Device (host h, local l): h ravels the axes' DCN parts, l their ICI parts; axis i's index is d_i * ici_i + c_i.
    grid = np.asarray(devices).reshape(*dcn, *ici)
    order = [k for i in range(len(sizes)) for k in (i, len(sizes) + i)]
    return grid.transpose(order).reshape(sizes)
