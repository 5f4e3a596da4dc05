"""``meshplan plan --verify K`` and ``meshplan check``: compile the reference step, show XLA's figures.

For each mesh the reference train step (:func:`meshplan.reference_step`) is
built for the plan's parameter specs and compiled for the target, and XLA's
per-device argument / temp / peak bytes are shown next to the planner's
analytic estimate. Targets:

- a TPU cluster: its topology, from any machine (needs libtpu: ``meshplan[tpu]``);
- ``--target cpu``: simulated CPU devices, as many as the cluster has (XLA:CPU
  lowers differently from TPU/GPU; the figures are XLA:CPU's);
- a GPU cluster: on a machine with at least one of those GPUs (with fewer than the
  cluster has, XLA:GPU compiles for the whole cluster's topology ahead of time,
  taking the GPU's description from the local one); otherwise the command says so
  and suggests ``--target cpu``.

Progress goes to stderr while compiling; the table to stdout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from meshplan.errors import ClusterError, CompiledOutOfMemoryError, PlanError
from meshplan.pure._format import fmt_bytes
from meshplan.pure.presets import ModelSpec
from meshplan.pure.search import Cluster, MeshCandidate

__all__ = ["VerifyRow", "check_layout", "reference_config", "training_recipe", "verify_candidates"]

_TOP_BUFFERS = 5  # buffers live at the peak shown per compiled mesh


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyRow:
    """One compiled mesh: the planner's estimate and XLA's figures (or why there are none)."""

    mesh: str
    rank: int | None
    analytic_bytes: int | None
    budget_bytes: int
    target: str
    argument_bytes: int | None = None
    temp_bytes: int | None = None
    peak_bytes: int | None = None
    peak_source: str = ""
    compile_seconds: float = 0.0
    error: str = ""
    largest: tuple[Any, ...] = ()  # LiveBuffer records: the biggest buffers live at XLA's peak
    largest_note: str = ""
    micro_batches: int = 1  # gradient-accumulation steps the compiled step ran (the candidate's own count)

    @property
    def ratio(self) -> float | None:
        """Analytic estimate over XLA's peak (1.0: exact; below: the planner is optimistic)."""
        if self.peak_bytes and self.analytic_bytes:
            return self.analytic_bytes / self.peak_bytes
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with the ratio)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["largest"] = [b.to_dict() for b in self.largest]
        out["analytic_over_exact"] = self.ratio
        return out


def training_recipe(args: Any, *, backend: str | None = None) -> Any:
    """The :class:`~meshplan.pure.search.TrainingRecipe` the reference-step flags describe (``--remat``,
    ``--attention``, ...): what ``plan`` prices, and what ``check`` prices next to the step it compiles.
    ``backend`` ``None``: the cluster's compiler, which the search fills in."""
    from meshplan.pure.search import TrainingRecipe

    return TrainingRecipe(weight_dtype=args.dtype, optimizer=args.optimizer,
                          master_weights=getattr(args, "master_weights", False), remat=args.remat,
                          attention=args.attention, micro_batches=args.micro_batches or 1,
                          vocab_tiles=args.vocab_tiles, backend=backend)


def reference_config(args: Any, param_dtype: str) -> Any:
    """The :class:`~meshplan.ReferenceConfig` the command-line flags describe."""
    from meshplan.facade._reference import ReferenceConfig

    return ReferenceConfig(remat=args.remat, attention=args.attention, optimizer=args.optimizer,
                           micro_batches=args.micro_batches or 1, vocab_tiles=args.vocab_tiles,
                           param_dtype=param_dtype, scan_layers=True)


def _gpu_devices(cluster: Cluster) -> list[Any]:
    from meshplan.facade._compiled import local_gpus

    return [d for d in local_gpus() if cluster.device.matches_kind(d.device_kind)]


def _ensure_cpu_devices(n: int) -> None:
    """Ask for ``n`` simulated CPU devices if jax has not started its backends yet (else keep what it has)."""
    from meshplan.facade._cpu import use_cpu_devices

    use_cpu_devices(n)


def _target_mesh(cluster: Cluster, names: Sequence[str], sizes: Sequence[int], dcn: Sequence[int] | None,
                 target: str) -> tuple[Any, str]:
    """The mesh to compile on, and the target's name."""
    import jax

    n = cluster.num_devices
    if target == "cpu":
        _ensure_cpu_devices(n)
        cpus = jax.devices("cpu")
        if len(cpus) < n:
            raise PlanError(f"--target cpu needs {n} CPU devices for {cluster.text}, this process has "
                            f"{len(cpus)}; run with XLA_FLAGS=--xla_force_host_platform_device_count={n} (or "
                            f"verify a smaller cluster).")
        return _local_mesh(cpus[:n], sizes, names), f"{n} x XLA:CPU"
    if cluster.device.ici_scope == "slice":
        from meshplan.facade._compiled import tpu_topology_mesh
        from meshplan.pure.search import tpu_topology

        mesh = tpu_topology_mesh(cluster, names, sizes, dcn_shape=dcn)
        return mesh, f"{tpu_topology(cluster).topology_name} ({cluster.text})"
    gpus = _gpu_devices(cluster)
    if len(gpus) < n:  # one such GPU is enough to compile for the whole cluster ahead of time
        from meshplan.facade._compiled import gpu_topology_mesh

        mesh = gpu_topology_mesh(cluster, names, sizes)
        return mesh, f"{n} x {mesh.devices.flat[0].device_kind} (compiled ahead of time)"
    return _local_mesh(gpus[:n], sizes, names), f"{n} x {gpus[0].device_kind}"


def _local_mesh(devices: Any, sizes: Any, names: Any) -> Any:
    """A mesh of local devices in the order given (Auto axes, as the reference step's constraints need)."""
    import numpy as np
    from jax.sharding import AxisType, Mesh

    return Mesh(np.array(devices, dtype=object).reshape(tuple(sizes)), tuple(names),
                axis_types=(AxisType.Auto,) * len(names))


def _compile_one(spec: ModelSpec, cluster: Cluster, names: Sequence[str], sizes: Sequence[int],
                 dcn: Sequence[int] | None, plan: Any, *, batch: int, seq: int, config: Any, target: str,
                 rank: int | None, analytic: int | None, budget: int, stream: TextIO) -> VerifyRow:
    from meshplan.facade._compiled import compiled_memory
    from meshplan.facade._reference import reference_step

    text = ",".join(f"{a}={s}" for a, s in zip(names, sizes, strict=True) if s > 1) or "single device"
    mesh, where = _target_mesh(cluster, names, sizes, dcn, target)
    stream.write(f"meshplan: compiling the reference step of {spec.name} on {text} for {where} ...\n")
    stream.flush()
    start = time.perf_counter()
    row = VerifyRow(text, rank, analytic, budget, where, micro_batches=config.micro_batches)
    try:
        ref = reference_step(spec, mesh, batch=batch, seq=seq, plan=plan, config=config)
        # XLA:CPU: less LLVM effort halves the compile; buffer assignment (the figures) comes before it.
        options = {"xla_backend_optimization_level": 0} if target == "cpu" else None
        mem = compiled_memory(ref.fn, *ref.args, compiler_options=options, top_buffers=_TOP_BUFFERS)
    except CompiledOutOfMemoryError as err:
        seconds = time.perf_counter() - start
        stream.write(f"meshplan:   does not fit ({seconds:.1f} s)\n")
        need = (f"XLA needs {fmt_bytes(err.required_bytes)} of {fmt_bytes(err.available_bytes)}"
                if err.required_bytes and err.available_bytes else "XLA ran out of memory")
        return dataclasses.replace(row, peak_bytes=err.required_bytes, compile_seconds=seconds,
                                   error=f"does not fit: {need}", peak_source="XLA's out-of-memory message")
    stream.write(f"meshplan:   peak {fmt_bytes(mem.peak_bytes)} ({mem.compile_seconds:.1f} s)\n")
    stream.flush()
    return dataclasses.replace(row, argument_bytes=mem.argument_bytes, temp_bytes=mem.temp_bytes,
                               peak_bytes=mem.peak_bytes, peak_source=mem.peak_source,
                               compile_seconds=mem.compile_seconds, largest=mem.largest,
                               largest_note=mem.largest_note)


def scaled_model(spec: ModelSpec, layers: int | None) -> ModelSpec:
    """``spec`` with ``layers`` layers (dense-first layers kept up to that count), or as is."""
    if layers is None or layers >= spec.num_layers:
        return spec
    dense = min(spec.num_dense_layers, max(layers - 1, 0)) if spec.is_moe else spec.num_dense_layers
    # Sliding-window layers keep their share of the layers (Gemma 3: 5 in 6), at least one if any.
    local = max(1, round(spec.sliding_window_layers * layers / spec.num_layers)) if spec.sliding_window else 0
    return dataclasses.replace(spec, name=f"{spec.name} ({layers} layers)", num_layers=layers,
                               num_dense_layers=dense, num_params=None, sliding_window_layers=local)


def verify_candidates(candidates: Sequence[MeshCandidate], spec: ModelSpec, cluster: Cluster, *, batch: int,
                      seq: int, config: Any, target: str = "auto", budget: int,
                      stream: TextIO | None = None) -> list[VerifyRow]:
    """Compile the reference step of each candidate; one :class:`VerifyRow` per candidate.

    Each compiles with the micro-batch count its estimate priced (the search chooses one per mesh when the
    request does not fix it); ``config`` gives everything else.
    """
    out = stream if stream is not None else sys.stderr
    rows = []
    for i, cand in enumerate(candidates, 1):
        out.write(f"meshplan: [{i}/{len(candidates)}] ")
        own = config if cand.step is None else dataclasses.replace(config, micro_batches=cand.step.micro_batches)
        rows.append(_compile_one(spec, cluster, cand.axis_names, cand.axis_sizes, cand.dcn_shape, cand,
                                 batch=batch, seq=seq, config=own, target=target, rank=cand.rank,
                                 analytic=cand.memory.total, budget=budget, stream=out))
    return rows


def check_layout(spec: ModelSpec, cluster: Cluster, mesh: dict[str, int], *, batch: int, seq: int, config: Any,
                 target: str = "auto", dcn: dict[str, int] | None = None, analytic: int | None,
                 budget: int, stream: TextIO | None = None) -> VerifyRow:
    """Compile the reference step for one mesh (``{"dp": 2, "tp": 4}``) with the default rule's specs."""
    names, sizes = tuple(mesh), tuple(mesh.values())
    dcn_shape = tuple(dcn.get(n, 1) for n in names) if dcn else None
    return _compile_one(spec, cluster, names, sizes, dcn_shape, None, batch=batch, seq=seq, config=config,
                        target=target, rank=None, analytic=analytic, budget=budget,
                        stream=stream if stream is not None else sys.stderr)


def render_rows(rows: Sequence[VerifyRow], console: Any, *, title: str) -> None:
    """A table: mesh, the planner's estimate, XLA's argument / temp / peak, their ratio, the verdict."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("#", "mesh", "micro-batches", "target", "analytic", "XLA argument", "XLA temp", "XLA peak",
                "analytic/peak", "fits (XLA)", "compile"):
        table.add_column(col, justify="left" if col in ("mesh", "target", "fits (XLA)") else "right")
    for r in rows:
        fits = r.error or ("yes" if r.peak_bytes is not None and r.peak_bytes <= r.budget_bytes else
                           f"no: over the {fmt_bytes(r.budget_bytes)} budget")
        table.add_row("" if r.rank is None else str(r.rank), r.mesh, str(r.micro_batches), r.target,
                      "-" if r.analytic_bytes is None else fmt_bytes(r.analytic_bytes),
                      _b(r.argument_bytes), _b(r.temp_bytes), _b(r.peak_bytes),
                      "-" if r.ratio is None else f"{r.ratio:.2f}", fits, f"{r.compile_seconds:.1f} s")
    console.print(table)
    sources = sorted({r.peak_source for r in rows if r.peak_source})
    console.print("peak: " + "; ".join(sources) + ". analytic: the planner's per-device total "
                  "(params, grads and optimizer exact, activations calibrated).")


def render_largest(row: VerifyRow, console: Any) -> None:
    """The biggest buffers live at XLA's peak, one line each (or why there are none)."""
    if not row.largest:
        if row.largest_note:
            console.print(f"largest buffers at the peak: {row.largest_note}", markup=False)
        return
    console.print(f"largest buffers live at the peak: {row.largest_note}", markup=False)
    for b in row.largest:
        console.print(f"  {b.describe()}", markup=False)


def _b(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def add_reference_flags(parser: Any) -> None:
    """The flags that say how the reference step is written and where it compiles."""
    parser.add_argument("--target", choices=("auto", "cpu"), default="auto",
                        help="auto: the cluster's TPU topology (libtpu) or its local GPUs; cpu: simulated "
                             "XLA:CPU devices, as many as the cluster has")
    parser.add_argument("--remat", choices=("none", "full", "dots", "offload"), default="full",
                        help="reference step's remat policy (default full)")
    parser.add_argument("--attention", choices=("plain", "dot_product"), default="dot_product",
                        help="reference step's attention (default jax.nn.dot_product_attention)")
    parser.add_argument("--optimizer", choices=("adamw", "adafactor", "lion", "sgd"), default="adamw",
                        help="reference step's optax optimizer, state in fp32 (default adamw)")
    parser.add_argument("--micro-batches", type=int, default=None, metavar="M",
                        help="gradient accumulation steps (plan: default the fewest that fit, chosen per mesh; "
                             "check: default 1)")
    parser.add_argument("--vocab-tiles", type=int, default=1, metavar="T",
                        help="loss computed in T sequence chunks (default 1)")


def add_check_arguments(parser: Any, sizes: Any, positive: Any) -> None:
    """``meshplan check``'s arguments (``sizes``/``positive``: the CLI's argparse types)."""
    parser.add_argument("--model", required=True, help="a preset (meshplan models lists them), a Hugging Face "
                                                       "config.json or a MaxText model yml")
    parser.add_argument("--cluster", required=True, help="e.g. v5p-256, v5e-16, H100 (with --target cpu)")
    parser.add_argument("--mesh", required=True, type=sizes, metavar="AXIS=N,...",
                        help="the layout, e.g. fsdp=8,tp=4 (axes from dp,fsdp,ep,sp,tp, outermost first)")
    parser.add_argument("--dcn", type=sizes, metavar="AXIS=N,...", help="each axis's part across slices")
    parser.add_argument("--batch", type=positive, help="global batch in sequences (default: one per device)")
    parser.add_argument("--seq", type=positive, help="tokens per sequence (default 4096)")
    parser.add_argument("--layers", type=positive, help="compile a copy with this many layers (faster)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                        help="parameter dtype (default bfloat16)")
    parser.add_argument("--headroom", type=float, default=0.1, help="fraction of HBM kept free (default 0.1)")
    parser.add_argument("--json", dest="format", action="store_const", const="json", default="table",
                        help="print the row as JSON only (XLA's figures, the estimate, the largest buffers)")
    add_reference_flags(parser)


def run_plan_verify(result: Any, spec: ModelSpec, args: Any, console: Any) -> None:
    """``plan --verify K``: compile the top K candidates and print the comparison table."""
    req = result.request
    cands = list(result.candidates[: args.verify])
    config = reference_config(args, req.param_dtype if req.param_dtype != "mixed" else "bfloat16")
    rows = verify_candidates(cands, spec, req.cluster, batch=req.batch, seq=req.seq, config=config,
                             target=args.target, budget=req.budget)
    render_rows(rows, console, title=f"Exact memory: the reference step compiled by XLA ({config.text})")
    if args.target == "cpu" and req.recipe.compiler != "cpu":
        # The plan priced the cluster's compiler; XLA:CPU lowers the same step differently (fp32 matmul
        # operands, whole-gradient all-reduces), so this ratio measures the lowering as well as the model.
        console.print(f"analytic: priced for XLA:{req.recipe.compiler.upper()}, the plan's cluster, and compiled "
                      "on XLA:CPU, which lowers the step differently: `meshplan check --target cpu` prices "
                      "XLA:CPU's lowering.")


def run_check(args: Any, console: Any) -> int:
    """``meshplan check``: one layout, compiled; the planner's estimate next to it."""
    from meshplan.cli._models import load
    from meshplan.pure import parse_cluster, search_meshes

    cluster = parse_cluster(args.cluster)
    spec = scaled_model(load(args.model).spec, args.layers)
    total = math.prod(args.mesh.values())
    if total != cluster.num_devices:
        raise PlanError(f"--mesh {','.join(f'{a}={s}' for a, s in args.mesh.items())} has {total} devices; "
                        f"{cluster.text} has {cluster.num_devices}: the sizes must multiply to that.")
    batch = args.batch if args.batch is not None else cluster.num_devices
    seq = args.seq if args.seq is not None else min(4096, spec.max_position_embeddings or 4096)
    mesh = dict(args.mesh)
    analytic: int | None = None
    plan: Any = None
    budget = int(cluster.hbm_bytes * (1 - args.headroom))
    note = ""
    # Price the step that compiles: its remat, attention, optimizer, micro-batches and vocab tiles, and
    # the compiler it compiles on (XLA:CPU with --target cpu lowers differently: calibration_key).
    recipe = training_recipe(args, backend="cpu" if args.target == "cpu" else None)
    try:
        found = search_meshes(spec, cluster, dtype=args.dtype, axes=list(mesh), fixed=mesh, batch=batch, seq=seq,
                              headroom=args.headroom, top_k=1, recipe=recipe, micro_batches=args.micro_batches or 1)
        cand = found.candidates[0]
        analytic, plan = cand.memory.total, cand
        recipe = found.request.recipe  # the search filled in the compiler and device it priced
        dcn = args.dcn if args.dcn is not None else dict(zip(cand.axis_names, cand.dcn_shape, strict=True))
    except PlanError as err:
        note = f"planner: {err}"
        dcn = args.dcn
    config = reference_config(args, args.dtype)
    names, sizes = tuple(mesh), tuple(mesh.values())
    dcn_shape = tuple(dcn.get(n, 1) for n in names) if dcn else None
    row = _compile_one(spec, cluster, names, sizes, dcn_shape, plan, batch=batch, seq=seq, config=config,
                       target=args.target, rank=None, analytic=analytic, budget=budget, stream=sys.stderr)
    if args.format == "json":
        sys.stdout.write(json.dumps({**row.to_dict(), "model": spec.name, "cluster": cluster.text, "batch": batch,
                                     "seq": seq, "config": config.text, "planner_note": note,
                                     "spread": None if plan is None else _spread_dict(plan.memory, recipe)})
                         + "\n")
        return 0 if not row.error else 1
    render_rows([row], console, title=f"meshplan check: {spec.name} on {cluster.text}, batch {batch} x seq {seq} "
                                      f"({config.text})")
    render_largest(row, console)
    if plan is not None and row.peak_bytes is not None:
        console.print(_against_spread(plan.memory, row.peak_bytes, recipe))
    if note:
        console.print(note)
    return 0 if not row.error else 1


def _spread_dict(memory: Any, recipe: Any) -> dict[str, Any] | None:
    """The recorded spread for ``recipe`` and the estimate's peak at both ends, JSON-ready (``None``: none
    recorded)."""
    from meshplan.pure.search import attention_class, calibration_spread, peak_bounds

    found = calibration_spread(recipe)
    if found is None:
        return None
    key, s = found
    low, high = peak_bounds(memory, s)
    return {"calibration": key, "remat": recipe.remat, "attention": attention_class(recipe.attention),
            "low": s.low, "high": s.high, "rows": s.rows, "peak_low_bytes": low, "peak_high_bytes": high}


def _against_spread(memory: Any, peak: int, recipe: Any) -> str:
    """Where XLA's peak falls against the range the recorded spread gives the estimate."""
    from meshplan.pure.search import calibration_spread, describe_spread, peak_bounds

    found = calibration_spread(recipe)
    if found is None:
        return f"spread: {describe_spread(recipe)}."
    low, high = peak_bounds(memory, found[1])
    where = "inside" if low <= peak <= high else "below" if peak < low else "above"
    return (f"spread: {describe_spread(recipe)}; for this estimate {fmt_bytes(low)} - {fmt_bytes(high)}, "
            f"and XLA's peak ({fmt_bytes(peak)}) is {where} it.")
