"""``meshplan check``: compile the reference train step for one layout and show XLA's figures beside the estimate.

The layout is named (``--mesh fsdp=8,tp=4``); its step compiles in a worker subprocess for the cluster's own
compiler (a TPU topology with libtpu, a GPU cluster with the CUDA plugin and no GPU) or on XLA:CPU
(``--target cpu``): :func:`meshplan.facade.verify.check_layout`. Exit 1 when nothing could be compiled; a
layout over the budget is an answer (exit 0), with XLA's figure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from meshplan.cli._args import positive, sizes
from meshplan.cli._flags import (
    add_mem_fraction,
    add_moe_dispatch,
    add_reference_flags,
    headroom_for,
    reference_config,
    training_recipe,
)
from meshplan.cli._console import make_console
from meshplan.errors import PlanError
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster import parse_cluster
from meshplan.pure.presets import scaled_model
from meshplan.pure.search import search_meshes
from meshplan.pure.verify import VerifyRow, uncompiled_dispatch

__all__ = ["add_parser", "render_largest", "render_rows", "run"]


def render_rows(rows: Sequence[VerifyRow], console: Any, *, title: str) -> None:
    """A table: mesh, the planner's estimate, XLA's argument / temp / peak, their ratio, the verdict."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("#", "mesh", "micro-batches", "target", "analytic", "XLA argument", "XLA temp", "XLA peak",
                "analytic/peak", "fits (XLA)", "compiled step", "compile"):
        table.add_column(col, justify="left" if col in ("mesh", "target", "fits (XLA)") else "right")
    for r in rows:
        run = "" if r.run_high_bytes is None else f" (a run <= {fmt_bytes(r.run_high_bytes)})"
        fits = r.error or (f"yes{run}" if r.fits else f"no{run}: over the {fmt_bytes(r.budget_bytes)} budget")
        table.add_row("" if r.rank is None else str(r.rank), r.mesh, str(r.micro_batches), r.target,
                      "-" if r.analytic_bytes is None else fmt_bytes(r.analytic_bytes),
                      _b(r.argument_bytes), _b(r.temp_bytes), _b(r.peak_bytes),
                      "-" if r.ratio is None else f"{r.ratio:.2f}", fits,
                      "-" if r.compiled_step is None else r.compiled_step.describe(), f"{r.compile_seconds:.1f} s")
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


def add_parser(sub: Any) -> None:
    """Register ``meshplan check`` on the command line's subparsers."""
    parser = sub.add_parser("check", help="compile the reference train step for one mesh; XLA's memory per device")
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
    from meshplan.cli._serve import add_check_serve_arguments

    add_check_serve_arguments(parser)  # --serve: the serving decode step instead of the train step
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``meshplan check``: one layout, compiled; the planner's estimate next to it (``--serve``: the serving
    decode step, :func:`meshplan.cli._serve.run_check_serve`)."""
    if getattr(args, "serve", False):
        from meshplan.cli._serve import run_check_serve

        return run_check_serve(args, make_console())
    from meshplan.cli._models import load  # lazily: reading a config file imports the facade (jax)
    from meshplan.facade.verify import check_layout

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
        found = search_meshes(spec, cluster, axes=list(mesh), fixed=mesh, batch=batch, seq=seq, headroom=headroom,
                              top_k=1, recipe=recipe, micro_batches=args.micro_batches or 1)
        cand = found.candidates[0]
        analytic, plan = cand.memory.total, cand
        recipe = found.request.recipe  # the search filled in the compiler and device it priced
        dcn = args.dcn if args.dcn is not None else dict(zip(cand.axis_names, cand.dcn_shape, strict=True))
    except PlanError as err:
        note = f"planner: {err}"
        dcn = args.dcn
    config = reference_config(args, args.dtype)
    names, axis_sizes = tuple(mesh), tuple(mesh.values())
    dcn_shape = tuple(dcn.get(n, 1) for n in names) if dcn else None
    row = check_layout(spec, cluster, names, axis_sizes, dcn_shape, plan, batch=batch, seq=seq, config=config,
                       target=args.target, analytic=analytic, budget=budget, stream=sys.stderr)
    if args.format == "json":
        sys.stdout.write(json.dumps({**row.to_dict(), "model": spec.name, "cluster": cluster.text, "batch": batch,
                                     "seq": seq, "config": config.text, "planner_note": note,
                                     "spread": None if plan is None else _spread_dict(plan.memory, recipe)})
                         + "\n")
        return 0 if row.status != "not verified" else 1
    console = make_console()
    render_rows([row], console, title=f"meshplan check: {spec.name} on {cluster.text}, batch {batch} x seq {seq} "
                                      f"({config.text})")
    render_largest(row, console)
    if plan is not None and row.peak_bytes is not None:
        console.print(_against_spread(plan.memory, row.peak_bytes, recipe))
    if note:
        console.print(note)
    return 0 if row.status != "not verified" else 1


def _spread_dict(memory: Any, recipe: Any) -> dict[str, Any] | None:
    """The recorded spread for ``recipe`` and the estimate's peak at both ends, JSON-ready (``None``: none
    recorded)."""
    from meshplan.pure.cost import attention_class, calibration_spread, peak_bounds

    found = calibration_spread(recipe)
    if found is None:
        return None
    key, s = found
    low, high = peak_bounds(memory, s)
    return {"calibration": key, "remat": recipe.remat, "attention": attention_class(recipe.attention),
            "low": s.low, "high": s.high, "rows": s.rows, "peak_low_bytes": low, "peak_high_bytes": high}


def _against_spread(memory: Any, peak: int, recipe: Any) -> str:
    """Where XLA's peak falls against the range the recorded spread gives the estimate."""
    from meshplan.pure.cost import calibration_spread, describe_spread, peak_bounds

    found = calibration_spread(recipe)
    if found is None:
        return f"spread: {describe_spread(recipe)}."
    low, high = peak_bounds(memory, found[1])
    where = "inside" if low <= peak <= high else "below" if peak < low else "above"
    return (f"spread: {describe_spread(recipe)}; for this estimate {fmt_bytes(low)} - {fmt_bytes(high)}, "
            f"and XLA's peak ({fmt_bytes(peak)}) is {where} it.")
