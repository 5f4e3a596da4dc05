"""``meshplan check``'s compile: one layout's reference step, compiled in a worker, as one row.

Unlike a plan, a check is asked for one layout by name, so a missing compiler is an error that says what
to install (a plan shows its estimates instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from meshplan.facade.verify._compilers import compiler_for
from meshplan.facade.verify._driver import Compile, compile_rows
from meshplan.facade.verify._gpu_targets import gpu_target_config
from meshplan.facade.verify._jobs import CompileJob
from meshplan.facade.verify._reference import ReferenceConfig
from meshplan.pure.cluster import Cluster, tpu_topology
from meshplan.pure.errors import ClusterError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.verify import VerifyRow

__all__ = ["check_layout", "target_label"]


def target_label(cluster: Cluster, target: str) -> str:
    """Where a compile for ``cluster`` will run, as the progress line names it before it starts.

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> target_label(parse_cluster("1x8xH100"), "cpu"), target_label(parse_cluster("v5e-4"), "auto")
      ('8 x XLA:CPU', 'v5e:2x2 (v5e-4)')
    """
    if target == "cpu":
        return f"{cluster.num_devices} x XLA:CPU"
    if cluster.device.ici_scope == "slice":
        return f"{tpu_topology(cluster).topology_name} ({cluster.text})"
    return f"{cluster.num_devices} x {cluster.device.name} (no GPU: meshplan's shipped description)"


def check_layout(spec: ModelSpec, cluster: Cluster, names: Sequence[str], sizes: Sequence[int],
                 dcn: Sequence[int] | None, plan: Any, *, batch: int, seq: int, config: ReferenceConfig,
                 target: str, analytic: int | None, budget: int, stream: TextIO) -> VerifyRow:
    """Compile one layout's reference step in a worker subprocess (no cache: a check always compiles).

    Args:
      spec: the model.
      cluster: where it trains.
      names, sizes, dcn: the mesh and each axis's part across hosts or slices.
      plan: the search candidate whose specs the step uses (``None``: the default rule's).
      batch, seq: global batch in sequences, tokens per sequence.
      config: the reference step.
      target: ``"auto"`` (the cluster's compiler) or ``"cpu"``.
      analytic: the planner's estimate for the layout (``None``: it has none).
      budget: the bytes per device the check holds the peak against.
      stream: progress lines.

    Returns:
      The layout's row: exact, over budget or not verified (``error`` says why).

    Raises:
      ClusterError: the target's compiler is not installed (the message says what to install), or a GPU
        meshplan has no description for.
    """
    compiler = compiler_for(cluster, target)
    if compiler.platform == "gpu":
        gpu_target_config(cluster.device)  # ClusterError naming the GPUs meshplan can describe
    if not compiler.ready:
        if compiler.platform == "tpu":
            raise ClusterError(f"compiling for {cluster.text} needs libtpu, which is not installed; "
                               "pip install 'meshplan[tpu]' (or jax[tpu] matching your jax).")
        raise ClusterError(f"compiling for {cluster.text} with no GPU: {compiler.problem}; or compile for "
                           "--target cpu (XLA:CPU lowers differently).")
    job = CompileJob(spec, cluster, tuple(names), tuple(sizes), None if dcn is None else tuple(dcn), plan,
                     batch=batch, seq=seq, config=config, target=target)
    base = VerifyRow(job.mesh_text, None, analytic, budget, "", micro_batches=config.micro_batches,
                     status="estimate", compiler=compiler.name)
    starting = f"compiling the reference step of {spec.name} on {job.mesh_text} for {target_label(cluster, target)}"
    return compile_rows([Compile(job, base, job.mesh_text, starting)], compiler=compiler.name, stream=stream,
                        cache=False, parallel=1)[0]
