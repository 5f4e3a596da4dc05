"""meshplan plan --model llama3-70b --cluster 8x8xH100 ranks the meshes of a
cluster for training a model preset, or the model a Hugging Face config.json or
MaxText model yml describes (--model path/to/config.json; "meshplan models"
lists the presets), and prints a summary: the facts priced, the
ranked meshes, and the chosen mesh with the lines to type. Where the target's
compiler is installed (meshplan[tpu], meshplan[gpu]; no TPU or GPU needed), the
best meshes and the best circular pipeline layout are compiled first and their
figures are XLA's. --detail adds the workings (assumptions in full, the
collective table, parameter groups, meshes left out); --format markdown prints
the summary as markdown for a pull request; --html FILE writes a self-contained
report (memory and step-time bars, the device grid). --json prints the whole
report as JSON (the compiled rows and the pipeline layouts under "report"), which
"show-mesh --plan FILE" and SearchResult.from_json read back. --params
my_pkg.model:make_model (or path/to/model.py:make_model) plans your own tree
instead of the preset's: an nnx Module, linen variables, an equinox module or a
pytree of arrays, built under jax.eval_shape; the --model preset still gives the
dims (activations, FLOPs).

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
import json
import sys
from typing import Any

from meshplan.cli import _args
from meshplan.cli._args import UserError, params_ref, positive, sizes
from meshplan.cli._flags import add_mem_fraction, add_moe_dispatch, add_reference_flags

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register ``meshplan plan`` on the command line's subparsers."""
    from meshplan.pure.cost._matmul_dtype import FP8_EFFICIENCY_RATIO, MATMUL_DTYPES

    plan = sub.add_parser("plan", help="rank the meshes of a cluster for training a model preset",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("--model", required=True,
                      help="a preset (meshplan models lists them), a Hugging Face config.json (or its model "
                           "directory) or a MaxText model yml")
    plan.add_argument("--cluster", required=True, help="e.g. 8x8xH100, 2xH200, v5p-256, 2xv5e-256")
    plan.add_argument("--params", type=params_ref, metavar="MODULE:ATTR",
                      help="plan your own tree: a function/class (called abstractly, no arguments) or value in "
                           "MODULE (dotted, or path/to/file.py) giving an nnx Module, linen variables, an "
                           "equinox module or a pytree of arrays; --model still gives the dims")
    plan.add_argument("--batch", type=positive, help="global batch in sequences (default: one per device)")
    plan.add_argument("--seq", type=positive, help="tokens per sequence (default 4096)")
    plan.add_argument("--axes", help="comma-separated subset of dp,fsdp,ep,sp,tp (default: all; ep for MoE only)")
    plan.add_argument("--fix", type=sizes, action="append", metavar="AXIS=N[,AXIS=N]",
                      help="keep axis sizes fixed, e.g. --fix tp=8 (repeatable)")
    plan.add_argument("--rules", metavar="FILE",
                      help="JSON path rules [[regex, spec], ...] or a logical table {\"logical_axis_rules\": ...} "
                           "(see above)")
    plan.add_argument("--top", type=positive, default=5, help="meshes to show (default 5)")
    plan.add_argument("--headroom", type=_args.fraction("HBM kept free", zero=True, one=False), default=None,
                      help="fraction of HBM kept free (default: 0.1 on TPU; on GPU 1 - --mem-fraction)")
    plan.add_argument("--efficiency", type=_args.fraction("peak FLOP/s"), metavar="F",
                      help="fraction of peak bf16 FLOP/s the matmuls sustain (default: 0.5 on TPU; on GPU "
                           "0.662 x h / (h + 2587), h the hidden size: 0.15 at 768, 0.41 at 4096, 0.50 at 8192)")
    plan.add_argument("--matmul-dtype", default="bfloat16", choices=MATMUL_DTYPES,
                      help="what the weight matmuls run in: bfloat16 (default) or float8, priced at the device's "
                           f"FP8 peak at {FP8_EFFICIENCY_RATIO:g} x the bf16 efficiency (torchao Float8Linear, "
                           "DeepSeek-V3, Transformer Engine; attention and the output head stay bf16); a device "
                           "with no FP8 peak (A100, TPUs) refuses float8")
    add_moe_dispatch(plan)
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
                           "report), flax (logical rule table and names of the best mesh) or maxtext "
                           "(ici_/dcn_*_parallelism and logical_axis_rules)")
    plan.add_argument("--html", metavar="FILE",
                      help="also write a self-contained HTML report: ranked table, memory and step-time bars, "
                           "the compiled peaks, the pipeline layouts, the chosen mesh's device grid, the lines "
                           "to type")
    plan.add_argument("--detail", action="store_true",
                      help="also print the assumptions in full, every verdict, the meshes over the budget and "
                           "left out, the collective table and the parameter groups")
    plan.add_argument("--json", dest="format", action="store_const", const="json",
                      help="print the report as JSON only (same as --format json)")
    plan.add_argument("--no-pipeline", action="store_true",
                      help="leave out the pipeline layouts (pp outermost) shown after the ranking")
    plan.add_argument("--verify", type=positive, metavar="K",
                      help="compile the reference train step until the top K meshes (default 3) are verified "
                           "to fit, and show XLA's exact per-device peak (on by default where the target's "
                           "compiler is installed: meshplan[tpu], meshplan[gpu]; no TPU or GPU needed)")
    plan.add_argument("--no-verify", action="store_true", help="show the estimates only; compile nothing")
    plan.add_argument("--verify-time", type=positive, default=300, metavar="S",
                      help="stop starting compiles after S seconds (default 300); the rest stay estimates")
    plan.add_argument("--executor", metavar="ADDRESS",
                      help="compile the verified meshes on the Dask cluster at ADDRESS (meshplan[dask]; default: "
                           "local workers); --executor-fallback: local workers if it cannot be reached")
    plan.add_argument("--executor-fallback", action="store_true", help=argparse.SUPPRESS)
    add_mem_fraction(plan)
    add_reference_flags(plan)
    plan.add_argument("--profile", metavar="FILE",
                      help="price with this machine profile (meshplan profile --out FILE): its link figures and "
                           "matmul efficiency replace the catalogue's where it measured them; the header says so")
    plan.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``meshplan plan``: gather the report once (:func:`~meshplan.cli._gather.gather_plan`), then render it in
    the format asked for."""
    from meshplan.cli import _export, _models
    from meshplan.cli._gather import gather_plan

    preset = _models.load(args.model, dtype=args.dtype, unstack_experts=args.unstack_experts)
    params = preset.params if args.params is None else _user_params(args)
    rule = None
    if args.rules is not None:
        try:
            rule = _export.load_rules(args.rules, preset.spec)  # path rules or a logical table
        except _export.RulesFileError as err:
            raise UserError(str(err)) from None
    fixed: dict[str, int] = {}
    for group in args.fix or []:
        again = sorted(set(group) & set(fixed))
        if again:
            raise UserError(f"--fix gives {again} more than once.")
        fixed.update(group)
    if args.verify and args.format in ("flax", "maxtext"):
        raise UserError(f"--verify compiles the plan's meshes to check their memory; --format {args.format} "
                        "prints the best mesh's settings only. Use --verify with the table, markdown, --json or "
                        "--html.")
    report = gather_plan(args, preset.spec, params, rule, fixed)
    if args.html is not None:
        from meshplan.cli import _html

        try:
            _html.write_plan_html(args.html, report)
        except _html.HtmlWriteError as err:
            raise UserError(str(err)) from None
    if args.format == "json":
        sys.stdout.write(report.to_json() + "\n")
        return 0
    if args.format == "markdown":
        from meshplan.pure.report import plan_markdown

        sys.stdout.write(plan_markdown(report))
        return 0
    if args.format != "table":
        text = _export.render_export(report.result, args.format, params, rule)
        if args.format == "maxtext" and preset.maxtext_name is not None:
            text = f"model_name: {json.dumps(preset.maxtext_name)}\n" + text  # the yml MaxText loads by that name
        sys.stdout.write(text)
        return 0
    from meshplan.cli._console import make_console
    from meshplan.cli._render import render_plan

    render_plan(report, make_console(), detail=args.detail)
    return 0


def _user_params(args: argparse.Namespace) -> Any:
    """The tree ``--params`` names (the ``--model`` preset still gives the dims: activations, FLOPs)."""
    from meshplan.cli import _params

    if args.verify:
        raise UserError("--verify compiles meshplan's reference step of the --model preset, not your "
                        "--params tree; run --verify without --params.")
    if args.unstack_experts:
        raise UserError("--unstack-experts reshapes the preset's tree; with --params your tree is planned "
                        "as it is.")
    try:
        return _params.load_params(args.params)
    except _params.ParamsError as err:
        raise UserError(str(err)) from None
