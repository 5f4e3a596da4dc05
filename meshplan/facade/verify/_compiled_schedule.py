"""How long a compiled step takes, simulated from the schedule XLA compiled for it.

Compiles (or takes) a program, reads ``compiled.as_text()`` with the pure schedule reader
(:func:`meshplan.pure.xla.read_schedule`) and simulates it
(:func:`meshplan.pure.cost.simulate_schedule`) on the cluster's links, each device of the program in the
fast domain (node, slice) its jax device sits in. On XLA:TPU, ``cost_analysis()`` also gives XLA's own
``optimal_seconds`` for the step (each op at its bottleneck rate, at peak, loop bodies once), returned
beside the simulation as a floor; XLA:GPU's deviceless ``cost_analysis()`` gives none.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import NamedSharding

from meshplan.facade.verify._compiled import jitted_step, lower_step
from meshplan.pure.cluster import Cluster, parse_cluster
from meshplan.pure.cost._roofline import Roofline, default_roofline, schedule_links
from meshplan.pure.cost._schedule_time import ScheduleTime, simulate_schedule
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.xla._schedule import read_schedule
from meshplan.pure.xla._schedule_records import ProgramTotals
from meshplan.pure.xla._xla_floor import xla_floor

__all__ = ["CompiledStepTime", "compiled_step_time"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledStepTime:
    """A compiled step's simulated schedule, and what XLA says of the same program.

    Attributes:
      schedule: the simulated step (``.step_s``, ``.compute_s``, ``.exposed_s``, per-collective exposure,
        the costliest ops).
      totals: the program's FLOPs and bytes per step (loop trips counted).
      roofline: the device pricing the simulation used.
      platform: the compiler (``"gpu"``, ``"tpu"``, ``"cpu"``).
      device_kind: the target device's kind as jax names it.
      num_devices: devices the program is partitioned over.
      compile_seconds: the compile alone.
      xla_optimal_seconds: XLA's ``cost_analysis()["optimal_seconds"]`` (XLA:TPU), with the ``-1`` it adds for
        each custom call it cannot price taken back out (:func:`~meshplan.pure.xla.xla_floor`); ``None``
        where XLA gives none (XLA:GPU deviceless) or the markers do not account for a negative figure.
      xla_reported_seconds: ``optimal_seconds`` as XLA reported it.
      xla_flops: XLA's ``cost_analysis()["flops"]`` (loop bodies once), ``None`` where it gives none.
      xla_bytes_accessed: XLA's ``cost_analysis()["bytes accessed"]`` (loop bodies once), ``None`` likewise.
      domains_note: how each device's fast domain was found (``""``: from the mesh's own devices).
    """

    schedule: ScheduleTime
    totals: ProgramTotals
    roofline: Roofline
    platform: str
    device_kind: str
    num_devices: int
    compile_seconds: float
    xla_optimal_seconds: float | None = None
    xla_reported_seconds: float | None = None
    xla_flops: float | None = None
    xla_bytes_accessed: float | None = None
    domains_note: str = ""

    @property
    def step_s(self) -> float:
        """The simulated step in seconds."""
        return self.schedule.step_s


def _mesh_devices(shardings: Any) -> list[Any] | None:
    """The devices of the first mesh among a compiled program's input shardings, in mesh order.

    A jit over a mesh assigns partition ``i`` to ``mesh.devices.flat[i]``, so this is the device each
    replica-group id of the HLO names."""
    for leaf in jax.tree.leaves(shardings):
        if isinstance(leaf, NamedSharding):
            return list(leaf.mesh.devices.flat)
    return None


def _domains(devices: list[Any] | None, cluster: Cluster, partitions: int) -> tuple[tuple[int, ...] | None, str]:
    """Each program device's fast domain: its TPU slice (``slice_index``) or its GPU host (``process_index``)."""
    if devices is None or len(devices) != partitions:
        return None, (f"the program's {partitions} devices are not one mesh's; device i is taken to sit in "
                      f"{cluster.ici_domain_name} i // {cluster.ici_domain_size}")
    if cluster.device.ici_scope == "slice":
        return tuple(int(getattr(d, "slice_index", 0) or 0) for d in devices), ""
    return tuple(int(getattr(d, "process_index", 0) or 0) for d in devices), ""


def _cost_figures(compiled: Any) -> tuple[float | None, float | None, float | None]:
    """``optimal_seconds``, ``flops`` and ``bytes accessed`` of ``compiled.cost_analysis()`` (``None``: not given)."""
    try:
        cost = compiled.cost_analysis()
    except (RuntimeError, NotImplementedError):  # a backend without a cost analysis (jax's JaxRuntimeError)
        return None, None, None
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    if not isinstance(cost, Mapping):
        return None, None, None
    figures = [cost.get(k) for k in ("optimal_seconds", "flops", "bytes accessed")]
    optimal, flops, nbytes = (float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None for x in figures)
    return optimal, flops if flops is None or flops >= 0 else None, nbytes if nbytes is None or nbytes >= 0 else None


def compiled_step_time(step: Any, *abstract_args: Any, cluster: Cluster | str, roofline: Roofline | None = None,
                       compiler_options: Mapping[str, Any] | None = None, top: int = 5,
                       **abstract_kwargs: Any) -> CompiledStepTime:
    """Compile ``step`` for its abstract arguments and simulate the schedule XLA compiled.

    Args:
      step: a compiled program (anything with ``as_text()``), or a function (ideally ``jax.jit``-ed) to
        compile for ``abstract_args``.
      *abstract_args: ``jax.ShapeDtypeStruct`` trees with shardings over the target's devices
        (:func:`~meshplan.gpu_topology_mesh`, :func:`~meshplan.tpu_topology_mesh`, or local devices).
      cluster: the cluster the program runs on (a :class:`~meshplan.pure.Cluster` or its text): its links,
        and its device for the default roofline.
      roofline: how an op is priced (default :func:`~meshplan.pure.cost.default_roofline` of the cluster's
        device).
      compiler_options: XLA options for ``compile()``.
      top: how many of the costliest ops to report.
      **abstract_kwargs: keyword arguments, likewise abstract.

    Returns:
      A :class:`CompiledStepTime`.

    Raises:
      MeshplanTypeError: ``step`` is neither compiled nor callable; a bad cluster or roofline.
      PlanError: the backend returns no HLO text; the cluster's device has no figures to price with.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((len(jax.devices()),), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
      >>> x = jax.ShapeDtypeStruct((256 * len(jax.devices()), 256), jnp.float32,
      ...                          sharding=NamedSharding(mesh, P("dp")))
      >>> t = compiled_step_time(jax.jit(lambda a: (a @ a.T).sum()), x, cluster="1x8xH100")
      >>> t.step_s > 0, t.totals.flops > 0
      (True, True)
    """
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(clus, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.80} must be a Cluster or its text, e.g. '8x8xH100'.")
    roof = default_roofline(clus.device) if roofline is None else roofline
    if not isinstance(roof, Roofline):
        raise MeshplanTypeError(f"roofline={roofline!r:.80} must be a Roofline or None.")
    start = time.perf_counter()
    if hasattr(step, "as_text") and not hasattr(step, "lower"):
        compiled = step
    else:
        jitted = jitted_step(step, (abstract_args, abstract_kwargs), compiler_options)
        compiled = lower_step(jitted, *abstract_args, **abstract_kwargs).compile(
            dict(compiler_options) if compiler_options else None)
    seconds = time.perf_counter() - start
    text = compiled.as_text()
    if not isinstance(text, str):
        raise PlanError("the backend returned no HLO text for the compiled program; its schedule cannot be read.")
    program = read_schedule(text)
    devices = _mesh_devices(getattr(compiled, "input_shardings", None))
    domains, note = _domains(devices, clus, program.num_partitions)
    links = schedule_links(clus, domains) if domains is not None else schedule_links(clus)
    schedule = simulate_schedule(program, roof, links, top=top)
    reported, flops, nbytes = _cost_figures(compiled)
    optimal = xla_floor(reported, program) if reported is not None else None
    first = devices[0] if devices else None
    return CompiledStepTime(schedule, program.totals(), roof, str(getattr(first, "platform", "unknown")),
                            str(getattr(first, "device_kind", "unknown")), program.num_partitions, seconds,
                            optimal, reported, flops, nbytes, note)
