"""``meshplan plan`` (verified by default) and ``meshplan check``: compile the reference step, show XLA's figures.

``plan`` ranks meshes with the estimate, then compiles the reference train step
(:func:`meshplan.reference_step`) of the top ``--verify K`` (default 3) and of
every ranked mesh whose stated range straddles the budget, in worker
subprocesses (:func:`meshplan.verify_plan`); a compiled peak over the budget
removes the mesh and the next is compiled. ``check`` compiles one layout. Targets:

- a TPU cluster: its topology, from any machine (needs libtpu: ``meshplan[tpu]``);
- a GPU cluster: from any machine, no GPU needed, with meshplan's shipped
  description of the GPU (needs the jax CUDA plugin: ``meshplan[gpu]``);
- ``--target cpu``: simulated CPU devices, as many as the cluster has (XLA:CPU
  lowers differently from TPU/GPU; the figures are XLA:CPU's).

Where the target's compiler is not installed, the plan is shown with its
estimates and one line says what to install. Progress goes to stderr; tables to stdout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from meshplan.cli._args import fraction
from meshplan.errors import ClusterError, PlanError
from meshplan.pure._format import fmt_bytes
from meshplan.pure.presets import ModelSpec
from meshplan.pure.search import Cluster

if TYPE_CHECKING:  # imported where used: importing meshplan.facade imports jax, which reads JAX_PLATFORMS
    # once, and `meshplan demo` sets it after the command line is parsed
    from meshplan.facade._verify_row import VerifyRow

__all__ = ["compiled_peaks", "reference_config", "render_plan_verification", "run_check", "training_recipe",
           "verify_for_plan", "verify_pipelines_for_plan"]


def training_recipe(args: Any, *, backend: str | None = None) -> Any:
    """The :class:`~meshplan.pure.search.TrainingRecipe` the reference-step flags describe (``--remat``,
    ``--attention``, ...): what ``plan`` prices, and what ``check`` prices next to the step it compiles.
    ``backend`` ``None``: the cluster's compiler, which the search fills in."""
    from meshplan.pure.search import TrainingRecipe

    # --matmul-dtype is plan's alone: check compiles the reference step, whose matmuls are bf16. check takes
    # --moe-dispatch only to refuse dropless for an MoE model (run_check).
    return TrainingRecipe(weight_dtype=args.dtype, optimizer=args.optimizer,
                          master_weights=getattr(args, "master_weights", False), remat=args.remat,
                          attention=args.attention, micro_batches=args.micro_batches or 1,
                          vocab_tiles=args.vocab_tiles, backend=backend,
                          matmul_dtype=getattr(args, "matmul_dtype", "bfloat16"),
                          moe_dispatch=getattr(args, "moe_dispatch", "einsum"))


def reference_config(args: Any, param_dtype: str) -> Any:
    """The :class:`~meshplan.ReferenceConfig` the command-line flags describe."""
    from meshplan.facade._reference import ReferenceConfig

    return ReferenceConfig(remat=args.remat, attention=args.attention, optimizer=args.optimizer,
                           micro_batches=args.micro_batches or 1, vocab_tiles=args.vocab_tiles,
                           param_dtype=param_dtype, scan_layers=True)


def _target_label(cluster: Cluster, target: str) -> str:
    """Where a compile will run, as the progress line names it (the worker reports the same)."""
    if target == "cpu":
        return f"{cluster.num_devices} x XLA:CPU"
    if cluster.device.ici_scope == "slice":
        from meshplan.pure.search import tpu_topology

        return f"{tpu_topology(cluster).topology_name} ({cluster.text})"
    return f"{cluster.num_devices} x {cluster.device.name} (no GPU: meshplan's shipped description)"


def _compile_one(spec: ModelSpec, cluster: Cluster, names: Sequence[str], sizes: Sequence[int],
                 dcn: Sequence[int] | None, plan: Any, *, batch: int, seq: int, config: Any, target: str,
                 analytic: int | None, budget: int, stream: TextIO) -> VerifyRow:
    """Compile one layout in a worker subprocess; the row carries XLA's figures or why there are none."""
    from meshplan.facade._compiled import libtpu_available
    from meshplan.facade._gpu_targets import compiler_version, cuda_plugin_problem, gpu_target_config
    from meshplan.facade._verify_row import VerifyRow, compiled_fit
    from meshplan.facade._worker import CompileJob, run_jobs

    job = CompileJob(spec, cluster, tuple(names), tuple(sizes), None if dcn is None else tuple(dcn), plan,
                     batch=batch, seq=seq, config=config, target=target)
    # The target's compiler must be here: refuse with what to install before starting a worker.
    if target != "cpu" and cluster.device.ici_scope == "slice" and not libtpu_available():
        raise ClusterError(f"compiling for {cluster.text} needs libtpu, which is not installed; "
                           "pip install 'meshplan[tpu]' (or jax[tpu] matching your jax).")
    if target != "cpu" and cluster.device.ici_scope != "slice":
        gpu_target_config(cluster.device)  # ClusterError naming the GPUs meshplan can describe
        problem = cuda_plugin_problem()
        if problem is not None:
            raise ClusterError(f"compiling for {cluster.text} with no GPU: {problem}; or compile for "
                               "--target cpu (XLA:CPU lowers differently).")
    where = _target_label(cluster, target)
    stream.write(f"meshplan: compiling the reference step of {spec.name} on {job.mesh_text} for {where} ...\n")
    stream.flush()
    outcome = run_jobs([job], parallel=1)[0]
    platform = "cpu" if target == "cpu" else "tpu" if cluster.device.ici_scope == "slice" else "gpu"
    row = VerifyRow(job.mesh_text, None, analytic, budget, outcome.target, micro_batches=config.micro_batches,
                    compile_seconds=outcome.seconds, compiler=compiler_version(platform))
    if outcome.oom:
        stream.write(f"meshplan:   does not fit ({outcome.seconds:.1f} s)\n")
        need = (f"XLA needs {fmt_bytes(outcome.oom_required_bytes)} of {fmt_bytes(outcome.oom_available_bytes)}"
                if outcome.oom_required_bytes and outcome.oom_available_bytes else "XLA ran out of memory")
        return dataclasses.replace(row, peak_bytes=outcome.oom_required_bytes, error=f"does not fit: {need}",
                                   status="over budget", peak_source="XLA's out-of-memory message")
    mem = outcome.memory
    if mem is None:
        stream.write(f"meshplan:   not verified: {outcome.error}\n")
        return dataclasses.replace(row, status="not verified", error=f"not verified: {outcome.error}")
    stream.write(f"meshplan:   peak {fmt_bytes(mem.peak_bytes)} ({mem.compile_seconds:.1f} s)\n")
    stream.flush()
    over, run_high, _ = compiled_fit(mem.peak_bytes, budget, outcome.target)
    return dataclasses.replace(row, argument_bytes=mem.argument_bytes, temp_bytes=mem.temp_bytes,
                               peak_bytes=mem.peak_bytes, peak_source=mem.peak_source,
                               compile_seconds=mem.compile_seconds, largest=mem.largest,
                               largest_note=mem.largest_note, run_high_bytes=run_high,
                               status="over budget" if over else "exact")


def scaled_model(spec: ModelSpec, layers: int | None) -> ModelSpec:
    """``spec`` with ``layers`` layers (dense-first layers kept up to that count), or as is."""
    if layers is None or layers >= spec.num_layers:
        return spec
    dense = min(spec.num_dense_layers, max(layers - 1, 0)) if spec.is_moe else spec.num_dense_layers
    # Sliding-window layers keep their share of the layers (Gemma 3: 5 in 6), at least one if any.
    local = max(1, round(spec.sliding_window_layers * layers / spec.num_layers)) if spec.sliding_window else 0
    return dataclasses.replace(spec, name=f"{spec.name} ({layers} layers)", num_layers=layers,
                               num_dense_layers=dense, num_params=None, sliding_window_layers=local)


def render_rows(rows: Sequence[VerifyRow], console: Any, *, title: str) -> None:
    """A table: mesh, the planner's estimate, XLA's argument / temp / peak, their ratio, the verdict."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("#", "mesh", "micro-batches", "target", "analytic", "XLA argument", "XLA temp", "XLA peak",
                "analytic/peak", "fits (XLA)", "compile"):
        table.add_column(col, justify="left" if col in ("mesh", "target", "fits (XLA)") else "right")
    for r in rows:
        run = "" if r.run_high_bytes is None else f" (a run <= {fmt_bytes(r.run_high_bytes)})"
        fits = r.error or (f"yes{run}" if r.fits else f"no{run}: over the {fmt_bytes(r.budget_bytes)} budget")
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
                        help="auto: the cluster's own compiler (a TPU topology with libtpu, a GPU cluster with "
                             "the CUDA plugin; no TPU or GPU needed); cpu: simulated XLA:CPU devices, as many "
                             "as the cluster has")
    parser.add_argument("--remat", choices=("none", "full", "dots", "offload"), default="full",
                        help="reference step's remat policy (default full)")
    parser.add_argument("--attention", choices=("plain", "dot_product", "flash"), default="dot_product",
                        help="reference step's attention (default jax.nn.dot_product_attention; flash: the "
                             "Pallas kernel on TPU, cuDNN's fused attention on GPU)")
    parser.add_argument("--optimizer", choices=("adamw", "adafactor", "lion", "sgd"), default="adamw",
                        help="reference step's optax optimizer, state in fp32 (default adamw)")
    parser.add_argument("--micro-batches", type=int, default=None, metavar="M",
                        help="gradient accumulation steps (plan: default the fewest that fit, chosen per mesh; "
                             "check: default 1)")
    parser.add_argument("--vocab-tiles", type=int, default=1, metavar="T",
                        help="loss computed in T sequence chunks (default 1)")




def add_moe_dispatch(parser: Any) -> None:
    """``--moe-dispatch einsum|dropless``: how an MoE model's layers reach their experts (the recipe's
    ``moe_dispatch``)."""
    from meshplan.pure.cost import MOE_DISPATCHES

    parser.add_argument("--moe-dispatch", default="einsum", choices=MOE_DISPATCHES,
                        help="how MoE layers reach their experts: einsum (default: GShard's capacity dispatch, as "
                             "meshplan's reference step and MaxText's sparse_matmul: False run it) or dropless "
                             "(grouped GEMMs over the routed tokens, as DeepSeek-V3, MaxText's sparse_matmul: True "
                             "and Megatron-LM run them; priced at the mean expert load); the reference step runs "
                             "einsum only, so a dropless MoE plan is not compiled (check refuses it)")


def add_mem_fraction(parser: Any) -> None:
    """``--mem-fraction F``: the share of each GPU jax's allocator takes, which is a GPU plan's budget."""
    parser.add_argument("--mem-fraction", type=fraction("GPU memory"), metavar="F",
                        help="GPU: the fraction of each GPU's memory jax preallocates, the budget (default "
                             "$XLA_PYTHON_CLIENT_MEM_FRACTION, else jax's 0.75)")


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
    parser.add_argument("--headroom", type=float, default=None,
                        help="fraction of HBM kept free (default: 0.1 on TPU; on GPU 1 - --mem-fraction)")
    add_mem_fraction(parser)
    parser.add_argument("--json", dest="format", action="store_const", const="json", default="table",
                        help="print the row as JSON only (XLA's figures, the estimate, the largest buffers)")
    add_reference_flags(parser)
    add_moe_dispatch(parser)


JAX_DEFAULT_MEM_FRACTION = 0.75
"""The share of each GPU's memory jax's allocator preallocates by default (``XLA_PYTHON_CLIENT_MEM_FRACTION``)."""


def headroom_for(args: Any, cluster: Cluster) -> tuple[float, str]:
    """The headroom a plan or check uses, and where it comes from, as the plan's header says it.

    On a GPU the memory a jax process has is what its allocator preallocates: ``--mem-fraction``, else
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` when set, else jax's default 0.75. A budget of 90% of HBM would
    promise memory a default jax install does not take. ``--headroom`` still wins when given; TPUs keep
    the 10% headroom.
    """
    import os

    if args.headroom is not None:
        return args.headroom, "--headroom"
    if cluster.device.ici_scope == "slice":
        return 0.1, "--headroom"
    given, env = getattr(args, "mem_fraction", None), os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if given is not None:
        fraction, source = given, "--mem-fraction"
    elif env:
        try:
            fraction = float(env)
        except ValueError:
            fraction = -1.0
        if not 0 < fraction <= 1:
            raise PlanError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={env!r:.40} must be a fraction in (0, 1]; unset it "
                            "or pass --mem-fraction.")
        source = "XLA_PYTHON_CLIENT_MEM_FRACTION"
    else:
        fraction, source = JAX_DEFAULT_MEM_FRACTION, "its default; --mem-fraction to change"
    return 1.0 - fraction, f"jax's GPU allocator takes {fraction:.0%}: {source}"


# MESHPLAN_VERIFY=0 (or off / no / false) makes --no-verify the default, e.g. in a test suite or on a laptop
# where the compiler is installed but a plan should stay instant; --verify K still asks for it.
_VERIFY_OFF = ("0", "off", "no", "false")


def verification_wanted(args: Any) -> bool:
    """Whether ``plan`` verifies: by default for the table, unless ``--no-verify`` or ``MESHPLAN_VERIFY=0``;
    ``--verify K`` asks for it."""
    import os

    if args.no_verify or args.format != "table" or args.params is not None:
        return False
    return bool(args.verify) or os.environ.get("MESHPLAN_VERIFY", "").strip().lower() not in _VERIFY_OFF


def verify_for_plan(result: Any, spec: ModelSpec, args: Any) -> Any:
    """``plan``'s verification: compile the top ``--verify K`` (default 3) meshes; the
    :class:`~meshplan.PlanVerification` (rows exact, estimates, removed or not verified)."""
    from meshplan.facade._verify_plan import verify_plan

    from meshplan.facade._executor import resolve_executor

    req = result.request
    config = reference_config(args, req.param_dtype if req.param_dtype != "mixed" else "bfloat16")
    choice = resolve_executor(getattr(args, "executor", None), fallback=getattr(args, "executor_fallback", False))
    if choice.note:
        print(f"meshplan: {choice.note}", file=sys.stderr)
    return verify_plan(result, model=spec, top=args.verify or 3, target=args.target, config=config,
                       time_budget_s=args.verify_time, executor=choice.executor)


def verify_pipelines_for_plan(found: Any, result: Any, spec: ModelSpec, args: Any, *, top: int,
                              spent_s: float) -> Any:
    """``plan``'s verification of its pipeline layouts: the best ``top`` compiled in what is left of
    ``--verify-time`` after the unpipelined meshes (``spent_s``); a :class:`~meshplan.PlanVerification`."""
    from meshplan.facade._verify_pipeline import verify_pipelines

    req = result.request
    config = reference_config(args, req.param_dtype if req.param_dtype != "mixed" else "bfloat16")
    return verify_pipelines(found, result, model=spec, top=top, target=args.target, config=config,
                            time_budget_s=args.verify_time - spent_s)


def compiled_peaks(checked: Any) -> dict[str, tuple[int, str]]:
    """Mesh text -> (XLA's compiled peak, the compiler and versions) of each compiled row, for the renderers."""
    if checked is None:
        return {}
    return {r.mesh: (r.peak_bytes, r.compiler) for r in (*checked.rows, *checked.removed)
            if r.peak_bytes is not None and r.status in ("exact", "over budget")}


def render_plan_verification(checked: Any, result: Any, args: Any, console: Any) -> None:
    """What the summary's exact rows leave out: the meshes removed (compiled over the budget), the rows not
    verified and why, how to get exact figures where no compiler is installed; ``--detail``: the whole table."""
    req = result.request
    if checked.note and not checked.compiler:  # no compiler: one line says how to get exact figures
        console.print(f"memory: {checked.note}", markup=False)
        return
    if args.detail:
        render_verification(checked, console, title="Verified: the reference step compiled")
    else:
        if checked.removed:
            console.print("removed (compiled peak over the budget): "
                          + ", ".join(f"#{r.rank} {r.mesh}" for r in checked.removed), markup=False)
        # Rows that share a reason (a dropless plan: every row) say it once, after their ranks and meshes.
        why: dict[str, list[str]] = {}
        for r in checked.rows:
            if r.status == "not verified":
                why.setdefault(r.error.removeprefix("not verified: "), []).append(f"#{r.rank} {r.mesh}")
        for reason, rows in why.items():
            console.print(f"{', '.join(rows)}: not verified ({reason})", markup=False)
    if args.target == "cpu" and req.recipe.compiler != "cpu" and checked.compiler:
        # The plan priced the cluster's compiler; XLA:CPU lowers the same step differently (fp32 matmul
        # operands, whole-gradient all-reduces), so this ratio measures the lowering as well as the model.
        console.print(f"analytic: priced for XLA:{req.recipe.compiler.upper()}, the plan's cluster, and compiled "
                      "on XLA:CPU, which lowers the step differently: `meshplan check --target cpu` prices "
                      "XLA:CPU's lowering.")


def render_verification(checked: Any, console: Any, *, title: str) -> None:
    """The verified rows (exact figures or estimates with their range), the removed ones, and the note.

    A minimal table: the plan's own rendering is :mod:`meshplan.cli._render`'s; these rows are data
    (:class:`~meshplan.VerifyRow`) that a richer renderer can take over.
    """
    from rich.table import Table

    if checked.note and not checked.compiler:  # no compiler: one line says how to get exact figures
        console.print(f"memory: {checked.note}", markup=False)
        return
    table = Table(title=title)
    for col in ("#", "mesh", "memory per device", "target", "compile"):
        table.add_column(col, justify="right" if col in ("#", "compile") else "left")
    for r in (*checked.rows, *checked.removed):
        seconds = "cached" if r.cached else f"{r.compile_seconds:.1f} s" if r.status != "estimate" else "-"
        table.add_row("" if r.rank is None else str(r.rank), r.mesh, r.summary(), r.target or "-", seconds)
    console.print(table)
    if checked.compiler:
        console.print(f"exact: peak per device from {checked.compiler}; estimate: the planner's figure and the "
                      "range its calibration's recorded spread gives.", markup=False)
    if checked.removed:
        console.print("removed (compiled peak over the budget): "
                      + ", ".join(f"#{r.rank} {r.mesh}" for r in checked.removed), markup=False)
    if checked.note:
        console.print(f"note: {checked.note}", markup=False)


def run_check(args: Any, console: Any) -> int:
    """``meshplan check``: one layout, compiled; the planner's estimate next to it."""
    from meshplan.cli._models import load
    from meshplan.pure import parse_cluster, search_meshes

    from meshplan.facade._verify_row import uncompiled_dispatch

    cluster = parse_cluster(args.cluster)
    spec = scaled_model(load(args.model).spec, args.layers)
    why = uncompiled_dispatch(spec, training_recipe(args))
    if why:  # nothing to compile: the einsum step's peak is not the dropless step's
        raise PlanError(f"--moe-dispatch {args.moe_dispatch}: meshplan check compiles the reference step, which runs "
                        "the einsum MoE dispatch only (capacity padding, s x s routing tensors), so its peak is not "
                        f"that of a {args.moe_dispatch} step of {spec.name}. Leave --moe-dispatch out to check the "
                        f"einsum step, or run 'meshplan plan --moe-dispatch {args.moe_dispatch} --no-verify' for the "
                        f"{args.moe_dispatch} estimate.")
    total = math.prod(args.mesh.values())
    if total != cluster.num_devices:
        raise PlanError(f"--mesh {','.join(f'{a}={s}' for a, s in args.mesh.items())} has {total} devices; "
                        f"{cluster.text} has {cluster.num_devices}: the sizes must multiply to that.")
    batch = args.batch if args.batch is not None else cluster.num_devices
    seq = args.seq if args.seq is not None else min(4096, spec.max_position_embeddings or 4096)
    mesh = dict(args.mesh)
    analytic: int | None = None
    plan: Any = None
    headroom, _ = headroom_for(args, cluster)
    budget = int(cluster.hbm_bytes * (1 - headroom))
    note = ""
    # Price the step that compiles: its remat, attention, optimizer, micro-batches and vocab tiles, and
    # the compiler it compiles on (XLA:CPU with --target cpu lowers differently: calibration_key).
    recipe = training_recipe(args, backend="cpu" if args.target == "cpu" else None)
    try:
        found = search_meshes(spec, cluster, dtype=args.dtype, axes=list(mesh), fixed=mesh, batch=batch, seq=seq,
                              headroom=headroom, top_k=1, recipe=recipe, micro_batches=args.micro_batches or 1)
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
                       target=args.target, analytic=analytic, budget=budget, stream=sys.stderr)
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
