"""Compile a serving plan's reference decode steps (and prefill chunks) for the plan's own target, in worker
subprocesses, and read XLA's figures: the compiled peak per device and the argument bytes, which must equal
the weights + KV cache + inputs the pure planner counts.

A serving replica is its own program (replicas share nothing), so one replica's mesh is compiled: for a GPU
cluster, the replica's GPUs (``gpu_topology_mesh``, no GPU needed); for a TPU cluster, the slice of the
replica's chips (``tpu_topology_mesh``, libtpu); with ``target="cpu"``, that many XLA:CPU devices. A compile
that fails or times out is a row with its reason, never the plan's end.

Example:
  >>> from meshplan.pure.cluster import parse_cluster
  >>> replica_cluster(parse_cluster("1x8xH100"), ServeLayout(2, 4)).num_devices
  4
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

from meshplan.facade.verify._compilers import compiler_for
from meshplan.facade.verify._gpu_targets import gpu_target_config
from meshplan.facade.verify._serve_job import ServeJob
from meshplan.facade.verify._worker import run_jobs
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster import Cluster, tpu_topology
from meshplan.pure.errors import ClusterError
from meshplan.pure.presets import ModelSpec, scaled_model
from meshplan.pure.serve import ServeLayout, ServePlan
from meshplan.pure.verify import CompileOutcome
from meshplan.pure.xla import CompiledMemory

__all__ = ["ServeCheck", "check_row", "expected_argument_bytes", "replica_cluster", "verify_serving"]


def replica_cluster(cluster: Cluster, layout: ServeLayout) -> Cluster:
    """The devices of one replica as a cluster of their own (one GPU node's share, or a TPU sub-slice).

    Raises:
      ClusterError: a TPU replica that is no slice libtpu describes.

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> replica_cluster(parse_cluster("2x8xH100"), ServeLayout(4, 4)).text
      '1x4xH100'
    """
    per, dev = layout.devices_per_replica, cluster.device
    if per == cluster.num_devices:
        return cluster
    per_node = min(per, cluster.devices_per_node)
    sub = Cluster(dev, max(1, per // per_node), per_node)
    if dev.ici_scope == "slice":
        tpu_topology(sub)  # ClusterError when no slice has these chips
    return sub


@dataclasses.dataclass(frozen=True, slots=True)
class ServeCheck:
    """XLA's figures for one compiled serving step, or why there are none.

    Attributes:
      mesh: the layout.
      kind: ``"decode"`` or ``"prefill"``.
      status: ``"exact"`` (compiled, fits), ``"over budget"`` (compiled, its peak over what the engine takes)
        or ``"not verified"``.
      budget_bytes: what the engine takes per device (its fraction of HBM).
      expected_argument_bytes: weights + KV cache + inputs, the pure planner's count.
      argument_bytes, temp_bytes, peak_bytes: XLA's (``None`` when not compiled).
      target: where it compiled.
      compiler: the compiler and versions.
      seconds: the compile's wall time.
      error: why there are no figures (``""`` when there are).
      layers: the layers compiled (fewer than the model's when asked).
    """

    mesh: str
    kind: str
    status: str
    budget_bytes: int
    expected_argument_bytes: int
    argument_bytes: int | None = None
    temp_bytes: int | None = None
    peak_bytes: int | None = None
    target: str = ""
    compiler: str = ""
    seconds: float = 0.0
    error: str = ""
    layers: int = 0

    @property
    def arguments_match(self) -> bool | None:
        """Whether XLA's argument bytes equal the planner's (``None``: not compiled)."""
        return None if self.argument_bytes is None else self.argument_bytes == self.expected_argument_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "arguments_match": self.arguments_match}

    def summary(self) -> str:
        """``'exact: peak 61.2 GiB (arguments 58.9 GiB = the plan's weights + KV + inputs)'``."""
        if self.peak_bytes is None:
            return self.error or self.status
        extra = (self.argument_bytes or 0) - self.expected_argument_bytes
        match = ("= the plan's weights + KV + inputs" if self.arguments_match
                 else f"= the plan's weights + KV + inputs {extra:+,} B" + (
                     " (XLA:TPU pads small arrays to its tiles)" if "xla:tpu" in self.compiler.lower() else ""))
        return (f"{self.status}: peak {fmt_bytes(self.peak_bytes)} (arguments "
                f"{fmt_bytes(self.argument_bytes or 0)} {match}; temp {fmt_bytes(self.temp_bytes or 0)})")


def expected_argument_bytes(job: ServeJob) -> int:
    """The planner's weights + KV + inputs for ``job`` (what XLA's argument bytes must equal)."""
    from meshplan.pure.serve import decode_input_bytes, kv_geometry, weight_bytes

    fmt = dataclasses.replace(job.cache, window_capped=False)
    geometry = kv_geometry(job.spec, job.layout, job.kv_dtype, fmt)
    base = weight_bytes(job.spec, job.layout, job.quant).total + geometry.cache_bytes(job.sequences, job.context)
    if job.kind == "decode":
        return base + decode_input_bytes(job.layout, geometry, sequences=job.sequences, context=job.context)
    rows = job.layout.ep * -(-job.sequences // job.layout.ep)
    chunk = min(job.chunk, job.context)
    pages = 4 * rows * -(-job.context // fmt.page_size) if fmt.layout == "paged" else 0
    return base + 4 * (2 * chunk + 1) + pages


def check_row(job: ServeJob, outcome: CompileOutcome, budget: int, compiler: str) -> ServeCheck:
    """The :class:`ServeCheck` of one compile's outcome against the engine's ``budget``."""
    row = ServeCheck(job.mesh_text, job.kind, "not verified", budget, expected_argument_bytes(job),
                     target=outcome.target, compiler=compiler, seconds=outcome.seconds, layers=job.spec.num_layers)
    if outcome.oom:
        return dataclasses.replace(row, status="over budget", peak_bytes=outcome.oom_required_bytes,
                                   error="XLA ran out of memory")
    mem: CompiledMemory | None = outcome.memory
    if mem is None:
        return dataclasses.replace(row, error=f"not verified: {outcome.error}")
    return dataclasses.replace(row, status="over budget" if mem.peak_bytes > budget else "exact",
                               argument_bytes=mem.argument_bytes, temp_bytes=mem.temp_bytes, peak_bytes=mem.peak_bytes)


def verify_serving(plan: ServePlan, spec: ModelSpec, *, top: int = 3, target: str = "auto",
                   layers: int | None = None, timeout_s: float = 600.0, kinds: Sequence[str] = ("decode",),
                   parallel: int | None = None) -> tuple[ServeCheck, ...]:
    """Compile the reference step of the plan's top ``top`` fitting layouts (their sequences, context and
    cache) and read XLA's peak; one :class:`ServeCheck` per layout and kind, in rank order.

    Args:
      plan: the serving plan.
      spec: its model (the spec the plan priced; ``layers`` compiles a copy with fewer).
      top: how many of its fitting rows.
      target: ``"auto"`` (the cluster's compiler, no accelerator needed) or ``"cpu"``.
      layers: compile this many layers (faster; the weights and KV then count those layers).
      timeout_s: the most one compile may take.
      kinds: ``"decode"`` and / or ``"prefill"``.
      parallel: worker processes side by side (default: one per core).

    Returns:
      The checks; a compile that failed or timed out is a row saying why.

    Raises:
      ClusterError: the target's compiler is not installed (libtpu, the jax CUDA plugin).
    """
    req = plan.request
    cluster = req.cluster
    tpu = cluster.device.ici_scope == "slice"
    compiler = compiler_for(cluster, target)
    if compiler.platform == "gpu":
        gpu_target_config(cluster.device)  # ClusterError naming the GPUs meshplan can describe
    if not compiler.ready:
        raise ClusterError(f"compiling for {cluster.text}: {compiler.problem}.")
    compiled_spec = scaled_model(spec, layers)
    jobs, budgets, early = [], [], []
    for row in [r for r in plan.rows if r.fits][:top]:
        frac = row.budget.fraction if row.budget.fraction is not None else (0.9 if tpu else 0.75)
        budget = int(frac * cluster.device.hbm_bytes)
        try:
            sub = replica_cluster(cluster, row.layout)
        except ClusterError as err:
            early.append(ServeCheck(row.mesh, "decode", "not verified", budget, 0, error=f"not verified: {err}"))
            continue
        for kind in kinds:
            jobs.append(ServeJob(compiled_spec, sub, row.layout, row.sequences, row.context, req.quant, req.kv_dtype,
                                 row.kv.format, target=target, kind=kind, chunk=min(req.prompt_tokens, 2048)))
            budgets.append(budget)
    outcomes = run_jobs(cast(Any, jobs), parallel=parallel, timeout_s=timeout_s)  # run_jobs runs any job kind
    return tuple(early) + tuple(check_row(j, o, b, compiler.name)
                                for j, o, b in zip(jobs, outcomes, budgets, strict=True))
