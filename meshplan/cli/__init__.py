"""The meshplan command line: plan, compare, check, models, show-mesh and demo.

This docstring is also what "meshplan plan --help" prints, so it is plain text.

meshplan plan --model llama3-70b --cluster 8x8xH100 ranks the meshes of a
cluster for training a model preset, or the model a Hugging Face config.json or
MaxText model yml describes (--model path/to/config.json; "meshplan models"
lists the presets), and prints a summary: the facts priced, the
ranked meshes, and the chosen mesh with the lines to type. --detail adds the
workings (assumptions in full, the collective table, parameter groups, meshes
left out); --format markdown prints the summary as markdown for a pull request;
--html FILE writes a self-contained report (memory and step-time bars, the device
grid). --json prints the whole result as JSON, which "show-mesh --plan FILE" and
SearchResult.from_json read back. --params my_pkg.model:make_model (or
path/to/model.py:make_model) plans your own tree instead of the preset's: an nnx
Module, linen variables, an equinox module or a pytree of arrays, built under
jax.eval_shape; the --model preset still gives the dims (activations, FLOPs).

--rules FILE is JSON: a list of [regex, spec] pairs (or {"rules": [...]}). Each
regex is searched in the leaf path (model/layers/0/mlp/down_proj/weight), the
first match wins, and spec has one entry per dim: null, an axis name, or a list
of axis names ([] replicates). Leaves no pattern matches keep the default
per-axis-kind rule. Example:

    [["embed_tokens", ["tp", "fsdp"]], ["norm", []]]

A logical table (flax / MaxText logical_axis_rules) is the other form:
{"logical_axis_rules": [["embed", "fsdp"], ["mlp", "tp"]], "logical_names":
[["down_proj", ["embed", "mlp"]], ...]}. --format flax|maxtext prints the best
mesh as a flax logical table or as MaxText settings (--json is --format json).

Exit codes: 0 success, 1 a request meshplan cannot answer (unknown model or
cluster, nothing fits, a bad rules file), 2 bad command-line usage.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from meshplan.cli import _args
from meshplan.errors import MeshplanError

if TYPE_CHECKING:
    from rich.console import Console


def _console() -> Console:
    from rich.console import Console  # lazily: `meshplan plan --json` never needs rich

    # Pipes get a wide console so tables are not folded to 80 columns.
    return Console(width=shutil.get_terminal_size((160, 40)).columns)


def _sizes(text: str) -> dict[str, int]:
    """``"tp=8,fsdp=4"`` -> ``{"tp": 8, "fsdp": 4}`` (argparse type: ValueError -> exit 2)."""
    out: dict[str, int] = {}
    for token in text.split(","):
        name, sep, size = token.strip().partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{token.strip()!r} is not name=size (e.g. tp=8) with size >= 1")
        if name.strip() in out:
            raise argparse.ArgumentTypeError(f"axis {name.strip()!r} given twice")
        out[name.strip()] = int(size)
    return out


_MAX_COUNT = 10**12  # far beyond any batch, sequence or count a plan prices; keeps arithmetic sane


def _positive(text: str) -> int:
    digits = text.strip()
    # isascii: "²".isdigit() is True but int("²") fails; the length bound keeps int() from a 5000-digit string.
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 13 or not 1 <= int(digits) <= _MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer in [1, {_MAX_COUNT}]")
    return int(digits)


_MAX_DEMO_DEVICES = 1024  # simulated CPU devices: beyond this XLA's CPU client fails or takes minutes


def _demo_devices(text: str) -> int:
    n = _positive(text)
    if n > _MAX_DEMO_DEVICES:
        raise argparse.ArgumentTypeError(f"{n} simulated devices is more than the demo runs (at most "
                                         f"{_MAX_DEMO_DEVICES})")
    return n


def _params_ref(text: str) -> tuple[str, str]:
    from meshplan.cli._params import params_ref  # lazily: the module imports numpy

    return params_ref(text)




def _plan(args: argparse.Namespace) -> int:
    from meshplan.cli import _export, _models
    from meshplan.pure import search_meshes

    preset = _models.load(args.model, dtype=args.dtype, unstack_experts=args.unstack_experts)
    params = preset.params
    if args.params is not None:
        params = _user_params(args)
    rule = None
    if args.rules is not None:
        try:
            rule = _export.load_rules(args.rules, preset.spec)  # path rules or a logical table
        except _export.RulesFileError as err:
            raise _UserError(str(err)) from None
    fixed: dict[str, int] = {}
    for group in args.fix or []:
        again = sorted(set(group) & set(fixed))
        if again:
            raise _UserError(f"--fix gives {again} more than once.")
        fixed.update(group)
    if args.verify and args.format != "table":
        raise _UserError("--verify prints a table next to the ranking; use it without --format/--json.")
    from meshplan.cli import _verify
    from meshplan.cli._progress import progress
    from meshplan.pure import parse_cluster

    cluster = parse_cluster(args.cluster)
    headroom, budget_source = _verify.headroom_for(args, cluster)
    # A spinner on stderr (only on a terminal, never with --json): large clusters take seconds to search.
    with progress(f"searching meshes of {args.cluster} for {args.model}", quiet=args.format == "json"):
        result = search_meshes(
            preset.spec, cluster, params=params, axes=args.axes, fixed=fixed or None, rule=rule,
            batch=args.batch, seq=args.seq, headroom=headroom, master_weights=args.master_weights,
            activations=not args.no_activations, tp_within_domain=not args.allow_tp_dcn,
            ep_within_domain=args.ep_within_domain, top_k=args.top, recipe=_recipe(args),
            efficiency=args.efficiency, rank=args.rank, micro_batches=args.micro_batches,
        )
    # The compiler decides before anything is shown: the summary and the report mark the verified rows exact.
    checked = _verify.verify_for_plan(result, preset.spec, args) if _verify.verification_wanted(args) else None
    compiled = _verify.compiled_peaks(checked)
    # The pipeline layouts go wherever the plan is shown to a reader: the table, markdown and the HTML report.
    shown = args.format in ("table", "markdown") or args.html is not None
    found, why_none = (_search_pipelines(result, preset.spec, args, fixed, headroom)
                       if shown and not args.no_pipeline else (None, None))
    if args.html is not None:
        from meshplan.cli import _html

        try:
            _html.write_plan_html(args.html, result, compiled=compiled, budget_source=budget_source,
                                  pipelines=found)
        except _html.HtmlWriteError as err:
            raise _UserError(str(err)) from None
    if args.format == "json":
        sys.stdout.write(result.to_json() + "\n")
        return 0
    if args.format == "markdown":
        from meshplan.pure.search import plan_markdown

        sys.stdout.write(plan_markdown(result, budget_source=budget_source, pipelines=found))
        return 0
    if args.format != "table":
        text = _export.render_export(result, args.format, params, rule)
        if args.format == "maxtext" and preset.maxtext_name is not None:
            text = f"model_name: {json.dumps(preset.maxtext_name)}\n" + text  # the yml MaxText loads by that name
        sys.stdout.write(text)
        return 0
    from meshplan.cli import _render
    from meshplan.pure.presets import pricing_notes

    _render.render_plan(result, _console(), notes=pricing_notes(preset.spec, seq=result.request.seq),
                        detail=args.detail, compiled=compiled, budget_source=budget_source)
    if checked is not None:
        _verify.render_plan_verification(checked, result, args, _console())
    if why_none is not None:
        _console().print(f"pipeline layouts: {why_none}")
    if found is not None:
        _show_pipelines(found, result, preset.spec, args, headroom, checked)
    if not args.detail:
        _render.render_footer(result, _console(), pipelines=found is not None)
    return 0


def _search_pipelines(result: Any, spec: Any, args: argparse.Namespace, fixed: dict[str, int],
                      headroom: float) -> tuple[Any, str | None]:
    """The pipeline layouts (``pp`` outermost) for the same model, cluster, batch, recipe and budget as the
    plan: ``(PipelineSearch, None)``, or ``(None, why there are none)``."""
    from meshplan.cli._progress import progress
    from meshplan.pure.errors import PlanError
    from meshplan.pure.search import search_pipelines

    if fixed or args.axes or args.params is not None or args.rules is not None:
        return None, "not searched with --fix, --axes, --params or --rules (they constrain the unpipelined axes only)"
    try:
        with progress("searching pipeline layouts"):
            found = search_pipelines(spec, result.request.cluster, batch=result.request.batch,
                                     seq=result.request.seq, recipe=_recipe(args), efficiency=args.efficiency,
                                     top_k=args.top, headroom=headroom)
    except PlanError as err:
        return None, f"none ({err})"
    if not found.candidates and not found.left_out:
        return None, "none (no pp >= 2 divides the cluster's nodes or its devices per node)"
    return found, None


def _show_pipelines(found: Any, result: Any, spec: Any, args: argparse.Namespace, headroom: float,
                    checked: Any = None) -> None:
    """Print the pipeline layouts after the ranking. Where the plan verified its meshes (``checked``), the
    best layouts of the schedule the compiler can check are compiled too: circular, the one meshplan's
    pipelined step and MaxText run (Megatron's 1F1B has no JAX step to compile); the summary's one, or the
    top ``--verify K`` under ``--detail``."""
    from meshplan.cli._pipeline import render_pipeline_verification, render_pipelines

    if args.detail:
        render_pipelines(found, result, _console())
    else:  # the summary gives the fastest layout in one line; its table is part of --detail
        from meshplan.cli._render import render_pipeline_summary

        render_pipeline_summary(found, result, _console())
    if checked is None or not checked.compiler:  # no compiler: the plan said what to install
        return
    from meshplan.cli._verify import verify_pipelines_for_plan
    from meshplan.pure.errors import PlanError
    from meshplan.pure.search import search_pipelines

    top = (args.verify or 3) if args.detail else 1
    try:
        runnable = search_pipelines(spec, result.request.cluster, batch=result.request.batch,
                                    seq=result.request.seq, recipe=_recipe(args), efficiency=args.efficiency,
                                    top_k=top, headroom=headroom, schedules=("circular",))
    except PlanError as err:
        _console().print(f"pipeline memory: not verified ({err})", markup=False)
        return
    if not runnable.candidates:
        _console().print("pipeline memory: not verified (no circular layout, the schedule meshplan's step "
                         "compiles, fits the budget)", markup=False)
        return
    verified = verify_pipelines_for_plan(runnable, result, spec, args, top=top, spent_s=checked.seconds)
    layouts = "layouts" if top > 1 else "layout"
    _console().print(f"Compiled: the best circular {layouts} (the schedule meshplan's pipelined step and MaxText "
                     "run; Megatron's 1F1B has no JAX step to compile):", markup=False)
    render_pipeline_verification(verified, _console())


def _user_params(args: argparse.Namespace) -> Any:
    """The tree ``--params`` names (the ``--model`` preset still gives the dims: activations, FLOPs)."""
    from meshplan.cli import _params

    if args.verify:
        raise _UserError("--verify compiles meshplan's reference step of the --model preset, not your "
                         "--params tree; run --verify without --params.")
    if args.unstack_experts:
        raise _UserError("--unstack-experts reshapes the preset's tree; with --params your tree is planned "
                         "as it is.")
    try:
        return _params.load_params(args.params)
    except _params.ParamsError as err:
        raise _UserError(str(err)) from None


def _recipe(args: argparse.Namespace) -> Any:
    """The training recipe the plan prices, from the reference-step flags (``--remat``, ``--attention``, ...)."""
    from meshplan.cli._verify import training_recipe

    return training_recipe(args)  # backend left to the search, which takes the cluster's compiler


def _check(args: argparse.Namespace) -> int:
    from meshplan.cli import _verify

    return _verify.run_check(args, _console())


def _show_mesh(args: argparse.Namespace) -> int:
    from meshplan.cli import _render
    from meshplan.pure import SearchResult, parse_cluster, reconcile_dcn
    from meshplan.pure.mesh import split_mesh_shape

    if args.png is not None and importlib.util.find_spec("matplotlib") is None:
        raise _UserError("--png needs matplotlib, which is not installed; install it with "
                         "pip install 'meshplan[png]' (or pip install matplotlib).")
    if args.plan is not None:
        try:
            with open(args.plan, "rb") as f:  # bytes: from_json reports a non-UTF-8 file as not JSON
                result = SearchResult.from_json(f.read())
        except OSError as err:
            raise _UserError(f"cannot read --plan {args.plan!r}: {err.strerror}") from None
        ranked = result.candidates
        if not 1 <= args.rank <= len(ranked):
            raise _UserError(f"--rank {args.rank}: the plan has {len(ranked)} ranked meshes.")
        cand = ranked[args.rank - 1]
        cluster = parse_cluster(args.cluster) if args.cluster else result.request.cluster
        names, hybrid = cand.axis_names, cand.hybrid
    else:
        if args.cluster is None or args.mesh is None:
            raise _UserError("show-mesh needs --cluster and --mesh (e.g. --mesh dp=2,tp=4), or --plan FILE.")
        cluster = parse_cluster(args.cluster)
        names, sizes = tuple(args.mesh), tuple(args.mesh.values())
        if args.dcn is not None:
            unknown = sorted(set(args.dcn) - set(names))
            if unknown:
                raise _UserError(f"--dcn names axes {unknown} that --mesh lacks ({list(names)}).")
            # The same reconciliation create_mesh applies to a user's dcn_mesh_dims.
            try:
                hybrid = reconcile_dcn(sizes, tuple(args.dcn.get(n, 1) for n in names),
                                       num_devices=cluster.num_devices, num_granules=cluster.num_ici_domains)
            except MeshplanError as err:
                given = ",".join(f"{n}={s}" for n, s in args.dcn.items())
                raise _UserError(f"--dcn {given} (axes {list(names)}): {err}") from None
        else:
            # The split create_mesh makes by default for this global shape.
            hybrid = split_mesh_shape(sizes, cluster.num_ici_domains, num_devices=cluster.num_devices)
    ids = _render.render_mesh(cluster, names, hybrid, _console())
    if args.html is not None:
        from meshplan.cli import _html

        try:
            _html.write_mesh_html(args.html, cluster, names, hybrid)
        except _html.HtmlWriteError as err:
            raise _UserError(str(err)) from None
    if args.png is not None:
        try:
            _render.write_png(args.png, cluster, names, ids)
        except ImportError as err:
            raise _UserError(str(err)) from None
        print(f"wrote {args.png}")
    return 0


def _cache(args: argparse.Namespace) -> int:
    from meshplan.facade import _compile_cache

    if args.action == "clear":
        removed = _compile_cache.clear_cache()
        print(f"removed {removed} compiled steps from {_compile_cache.cache_dir()}")
    else:
        print(_compile_cache.cache_info().describe())
    return 0


def _list_models(args: argparse.Namespace) -> int:
    from meshplan.cli import _models

    specs = _models.model_specs(list(args.files))
    if args.json:
        sys.stdout.write(json.dumps({"models": _models.model_rows(specs)}, indent=2) + "\n")
        return 0
    _models.render_models(specs, titled_files=bool(args.files), console=_console())
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from meshplan.cli import _demo as demo  # imports jax with simulated devices, so only on demand

    return demo.run(num_devices=args.devices)


class _UserError(Exception):
    """A problem with the user's files or options found by the CLI itself (exit 1)."""


def _error_json(kind: str, message: str) -> str:
    """The one error object a ``--json`` run prints on stdout: ``{"error": {"type": ..., "message": ...}}``."""
    return json.dumps({"error": {"type": kind, "message": message}}) + "\n"


def _wants_json(argv: Sequence[str]) -> bool:
    """Whether the command line asks for JSON output (read before parsing, so usage errors can answer in JSON)."""
    args = list(argv)
    pairs = zip(args, args[1:] + [""])
    return "--json" in args or "--format=json" in args or any(a == "--format" and b == "json" for a, b in pairs)


class _Parser(argparse.ArgumentParser):
    """argparse, plus a JSON error object on stdout for usage errors of ``--json`` runs (exit 2 either way)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            sys.stdout.write(_error_json("UsageError", f"{self.prog}: {message}"))
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for the ``meshplan`` command."""
    parser = _Parser(prog="meshplan", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="rank the meshes of a cluster for training a model preset",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("--model", required=True,
                      help="a preset (meshplan models lists them), a Hugging Face config.json (or its model "
                           "directory) or a MaxText model yml")
    plan.add_argument("--cluster", required=True, help="e.g. 8x8xH100, 2xH200, v5p-256, 2xv5e-256")
    plan.add_argument("--params", type=_params_ref, metavar="MODULE:ATTR",
                      help="plan your own tree: a function/class (called abstractly, no arguments) or value in "
                           "MODULE (dotted, or path/to/file.py) giving an nnx Module, linen variables, an "
                           "equinox module or a pytree of arrays; --model still gives the dims")
    plan.add_argument("--batch", type=_positive, help="global batch in sequences (default: one per device)")
    plan.add_argument("--seq", type=_positive, help="tokens per sequence (default 4096)")
    plan.add_argument("--axes", help="comma-separated subset of dp,fsdp,ep,sp,tp (default: all; ep for MoE only)")
    plan.add_argument("--fix", type=_sizes, action="append", metavar="AXIS=N[,AXIS=N]",
                      help="keep axis sizes fixed, e.g. --fix tp=8 (repeatable)")
    plan.add_argument("--rules", metavar="FILE",
                      help="JSON path rules [[regex, spec], ...] or a logical table {\"logical_axis_rules\": ...} "
                           "(see above)")
    plan.add_argument("--top", type=_positive, default=5, help="meshes to show (default 5)")
    plan.add_argument("--headroom", type=_args.fraction("HBM kept free", zero=True, one=False), default=None,
                      help="fraction of HBM kept free (default: 0.1 on TPU; on GPU 1 - --mem-fraction)")
    plan.add_argument("--efficiency", type=_args.fraction("peak FLOP/s"), metavar="F",
                      help="fraction of peak bf16 FLOP/s the matmuls sustain (default: 0.5 on TPU; on GPU "
                           "0.662 x h / (h + 2587), h the hidden size: 0.15 at 768, 0.41 at 4096, 0.50 at 8192)")
    from meshplan.cli import _verify
    from meshplan.pure.cost._matmul_dtype import FP8_EFFICIENCY_RATIO, MATMUL_DTYPES

    plan.add_argument("--matmul-dtype", default="bfloat16", choices=MATMUL_DTYPES,
                      help="what the weight matmuls run in: bfloat16 (default) or float8, priced at the device's "
                           f"FP8 peak at {FP8_EFFICIENCY_RATIO:g} x the bf16 efficiency (torchao Float8Linear, "
                           "DeepSeek-V3, Transformer Engine; attention and the output head stay bf16); a device "
                           "with no FP8 peak (A100, TPUs) refuses float8")
    _verify.add_moe_dispatch(plan)
    plan.add_argument("--rank", default="time", choices=("time", "comm"),
                      help="order meshes by predicted step time (default) or by communication seconds alone")
    plan.add_argument("--dtype", "--weight-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                      help="parameter (weight) dtype (default bfloat16; MaxText keeps float32 weights)")
    plan.add_argument("--master-weights", action="store_true", help="add an fp32 master copy of the weights")
    plan.add_argument("--no-activations", action="store_true", help="leave activation memory out of the fit")
    plan.add_argument("--allow-tp-dcn", action="store_true", help="let tp span hosts/slices")
    plan.add_argument("--ep-within-domain", action="store_true", help="keep ep inside one host/slice")
    plan.add_argument("--unstack-experts", action="store_true", help="one leaf per expert (MoE presets)")
    plan.add_argument("--format", default="table", choices=("table", "markdown", "json", "flax", "maxtext"),
                      help="table (default), markdown (the summary, for a pull request), json (the whole "
                           "result), flax (logical rule table and names of the best mesh) or maxtext "
                           "(ici_/dcn_*_parallelism and logical_axis_rules)")
    plan.add_argument("--html", metavar="FILE",
                      help="also write a self-contained HTML report: ranked table, memory and step-time bars, "
                           "the chosen mesh's device grid, the lines to type")
    plan.add_argument("--detail", action="store_true",
                      help="also print the assumptions in full, every verdict, the meshes over the budget and "
                           "left out, the collective table and the parameter groups")
    plan.add_argument("--json", dest="format", action="store_const", const="json",
                      help="print the result as JSON only (same as --format json)")
    plan.add_argument("--no-pipeline", action="store_true",
                      help="leave out the pipeline layouts (pp outermost) shown after the ranking")
    plan.add_argument("--verify", type=_positive, metavar="K",
                      help="compile the reference train step until the top K meshes (default 3) are verified "
                           "to fit, and show XLA's exact per-device peak (on by default where the target's "
                           "compiler is installed: meshplan[tpu], meshplan[gpu]; no TPU or GPU needed)")
    plan.add_argument("--no-verify", action="store_true", help="show the estimates only; compile nothing")
    plan.add_argument("--verify-time", type=_positive, default=300, metavar="S",
                      help="stop starting compiles after S seconds (default 300); the rest stay estimates")
    plan.add_argument("--executor", metavar="ADDRESS",
                      help="compile the verified meshes on the Dask cluster at ADDRESS (meshplan[dask]; default: "
                           "local workers); --executor-fallback: local workers if it cannot be reached")
    plan.add_argument("--executor-fallback", action="store_true", help=argparse.SUPPRESS)
    _verify.add_mem_fraction(plan)
    _verify.add_reference_flags(plan)
    plan.set_defaults(func=_plan)

    check = sub.add_parser("check", help="compile the reference train step for one mesh; XLA's memory per device")
    _verify.add_check_arguments(check, _sizes, _positive)
    check.set_defaults(func=_check)

    show = sub.add_parser("show-mesh", help="draw which host/slice each device of a mesh sits on")
    show.add_argument("--cluster", help="e.g. 2x4xH100 or v5e-16 (default with --plan: the plan's cluster)")
    show.add_argument("--mesh", type=_sizes, metavar="AXIS=N,...", help="e.g. dp=2,tp=4 (outermost first)")
    show.add_argument("--dcn", type=_sizes, metavar="AXIS=N,...",
                      help="DCN part of axes (default: create_mesh's split)")
    show.add_argument("--plan", metavar="FILE", help="a 'meshplan plan --json' result to draw instead")
    show.add_argument("--rank", type=_positive, default=1, help="which ranked mesh of --plan (default 1)")
    show.add_argument("--html", metavar="FILE", help="also write the device grid as a self-contained HTML page")
    show.add_argument("--png", metavar="FILE", help="also write a picture (needs matplotlib: meshplan[png])")
    show.set_defaults(func=_show_mesh)

    cache = sub.add_parser("cache", help="the compile cache of verified plans: where, how big; or clear it")
    cache.add_argument("action", choices=("info", "clear"),
                       help="info: directory, entries, size; clear: remove every entry (MESHPLAN_CACHE_DIR "
                            "overrides $XDG_CACHE_HOME/meshplan)")
    cache.set_defaults(func=_cache)

    models = sub.add_parser("models", help="list the model presets with exact parameter counts (or read config files)")
    models.add_argument("files", nargs="*", metavar="FILE",
                        help="Hugging Face config.json files or MaxText model ymls to read instead of the presets")
    models.add_argument("--json", action="store_true", help="print the rows as JSON")
    models.set_defaults(func=_list_models)

    from meshplan.cli import _compare
    _compare.add_parser(sub)

    demo = sub.add_parser("demo", help="plan a small model and place it on simulated CPU devices")
    demo.add_argument("--devices", type=_demo_devices, default=8,
                      help=f"simulated CPU devices (default 8, at most {_MAX_DEMO_DEVICES})")
    demo.set_defaults(func=_run_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meshplan`` console script; returns the exit code.

    Exit 0 on success, 1 for a request meshplan cannot answer (the message on
    stderr), 2 for bad usage (argparse). With ``--json``/``--format json`` an
    error also prints ``{"error": {"type": ..., "message": ...}}`` on stdout,
    so a script reading stdout always gets JSON.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = _wants_json(argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    finally:
        _Parser.json_errors = False
    try:
        code: int = args.func(args)
    except (MeshplanError, _UserError) as err:
        print(f"meshplan {args.command}: error: {err}", file=sys.stderr)
        if getattr(args, "format", None) == "json":
            kind = "UserError" if isinstance(err, _UserError) else type(err).__name__
            sys.stdout.write(_error_json(kind, str(err)))
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
