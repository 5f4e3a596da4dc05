"""``meshplan serve``: rank the serving layouts of a cluster for a model, and print the engine command.

    meshplan serve --model llama3.1-70b --cluster 1x8xH100 --context 32768 --max

prices every layout (replicas x tp, x ep for MoE models; tp inside a node or slice): the weights and KV cache per
device exactly, the KV cache the engine's own reserve rule leaves (--engine vllm, sglang, maxtext / jetstream,
vllm-tpu), the most sequences that fit at --context (or --concurrency N at once), the decode step and the
prefill with their calibrated range, and ranks the layouts that fit and meet --max-tpot-ms / --max-ttft-ms by
tokens per second per device. The best layout's command follows, every flag spelled out. Where the target's
compiler is installed, the top layouts' reference decode steps are compiled (no GPU or TPU needed) and XLA's
peak is shown; --no-verify (or MESHPLAN_VERIFY=0) skips that. --format markdown, --json and --html FILE give the
same plan for a pull request, another tool, a browser.

``meshplan check --serve --mesh tp=8 ...`` compiles one layout's decode step and a prefill chunk
(:func:`run_check_serve`). Exit codes: 0 success, 1 a request meshplan cannot answer, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, cast

from meshplan.errors import PlanError

__all__ = ["add_check_serve_arguments", "add_parser", "run", "run_check_serve"]

_VERIFY_OFF = ("0", "off", "no", "false")


def _count(text: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 13 or not 1 <= int(digits) <= 10**12:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer in [1, {10**12}]")
    return int(digits)


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of milliseconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be a positive number of milliseconds")
    return value


def _add_serving_flags(parser: Any, *, check: bool) -> None:
    from meshplan.cli._args import fraction
    from meshplan.pure.serve import ENGINES, KV_DTYPES, WEIGHT_DTYPES

    if not check:
        parser.add_argument("--model", required=True,
                            help="a preset or serving name (llama3.1-70b; meshplan models lists the presets), a "
                                 "Hugging Face config.json or a MaxText model yml")
        parser.add_argument("--cluster", required=True, help="e.g. 1x8xH100, 2x8xH200, v5e-8, v5p-64")
        parser.add_argument("--context", type=_count, required=True,
                            help="the longest sequence, prompt and output (the engine's max model length)")
    else:
        parser.add_argument("--context", type=_count, help="--serve: the cache length per sequence (default --seq)")
    parser.add_argument("--weight-dtype", default="bfloat16",
                        help=f"weights: one of {list(WEIGHT_DTYPES)} (int8 / float8 with per-output-channel float32 "
                             "scales; --weight-scales tensor for one per matrix)")
    parser.add_argument("--weight-scales", default="channel", choices=("channel", "tensor"),
                        help="a quantized weight's float32 scales: one per output channel (default) or per matrix")
    parser.add_argument("--kv-dtype", default="bfloat16", help=f"the KV cache: one of {list(KV_DTYPES)}")
    parser.add_argument("--engine", default=None,
                        help=f"one of {list(ENGINES)} (or jetstream); default vllm on GPUs, maxtext on TPUs")
    if not check:
        parser.add_argument("--mem-fraction", type=fraction("device memory"), metavar="F",
                            help="the share of each device's memory the engine takes (vLLM's --gpu-memory-"
                                 "utilization, SGLang's --mem-fraction-static); default the engine's own rule")


def add_parser(subparsers: Any) -> Any:
    """Register ``meshplan serve`` on ``subparsers`` (``build_parser``'s); returns the parser."""
    serve = subparsers.add_parser("serve", help="rank a cluster's serving layouts for a model: KV cache, time, "
                                               "engine flags", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_serving_flags(serve, check=False)
    many = serve.add_mutually_exclusive_group()
    many.add_argument("--concurrency", type=_count, metavar="N", help="sequences the cluster holds at once")
    many.add_argument("--max", action="store_true", help="the most sequences that fit at --context (the default)")
    serve.add_argument("--prompt-tokens", type=_count, metavar="P",
                       help="the prompt a prefill (time to first token) is priced for (default: --context)")
    serve.add_argument("--max-tpot-ms", type=_milliseconds, metavar="MS", help="a decode step's limit")
    serve.add_argument("--max-ttft-ms", type=_milliseconds, metavar="MS", help="a prefill's limit")
    serve.add_argument("--allow-long-context", action="store_true",
                       help="plan a context past the model's positions (the engine then needs rope scaling)")
    serve.add_argument("--top", type=_count, default=8, help="layouts shown (default 8)")
    serve.add_argument("--format", default="table", choices=("table", "markdown", "json"),
                       help="table (default), markdown (for a pull request) or json (every layout, for tools)")
    serve.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    serve.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    serve.add_argument("--verify", type=_count, metavar="K",
                       help="compile the reference decode step of the top K layouts (default 2 where the target's "
                            "compiler is installed) and show XLA's peak")
    serve.add_argument("--no-verify", action="store_true", help="show the estimates only; compile nothing")
    serve.add_argument("--verify-layers", type=_count, metavar="L",
                       help="compile a copy with L layers (faster; its figures are that copy's)")
    serve.add_argument("--target", choices=("auto", "cpu"), default="auto",
                       help="auto: the cluster's compiler (no TPU or GPU needed); cpu: simulated XLA:CPU devices")
    serve.set_defaults(func=run)
    return serve


def add_check_serve_arguments(parser: Any) -> None:
    """``meshplan check --serve``'s flags (the rest are check's own: --mesh, --batch, --seq, --layers, --target)."""
    parser.add_argument("--serve", action="store_true",
                        help="compile the serving decode step and a prefill chunk of --mesh (axes dp, ep, tp) instead "
                             "of the train step; --batch is the running sequences, --context (or --seq) their cache")
    _add_serving_flags(parser, check=True)


def _positions(text: str) -> int | None:
    """A Hugging Face config's ``max_position_embeddings`` (``None`` for a MaxText yml or none given)."""
    path = os.path.join(text, "config.json") if os.path.isdir(text) else text
    if not path.lower().endswith(".json"):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    inner = config.get("text_config", config) if isinstance(config, dict) else {}
    value = inner.get("max_position_embeddings") if isinstance(inner, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def load_serving_model(text: str) -> tuple[Any, int | None]:
    """``--model``: a serving name or preset (its positions known), or a config file (a config.json's read)."""
    from meshplan.facade._model_file import is_model_file, load_model
    from meshplan.pure.serve import serve_model

    if is_model_file(text):
        return load_model(text), _positions(text)
    return serve_model(text)


def _verification_wanted(args: Any) -> bool:
    if args.no_verify or args.format != "table":
        return False
    return bool(args.verify) or os.environ.get("MESHPLAN_VERIFY", "").strip().lower() not in _VERIFY_OFF


def _verify(plan: Any, spec: Any, args: Any) -> tuple[tuple[Any, ...], str]:
    """The top layouts compiled, or ``((), why not)``."""
    from meshplan.cli._progress import progress
    from meshplan.errors import ClusterError
    from meshplan.facade.verify._serve import verify_serving

    try:
        with progress(f"compiling the reference decode step of {plan.request.model}"):
            return verify_serving(plan, spec, top=args.verify or 2, target=args.target,
                                  layers=args.verify_layers), ""
    except ClusterError as err:
        return (), f"not compiled ({err})"


def run(args: argparse.Namespace) -> int:
    """``meshplan serve``."""
    from meshplan.pure.serve import WeightQuant, plan_serving

    spec, positions = load_serving_model(args.model)
    plan = plan_serving(spec, args.cluster, context=args.context,
                        concurrency=None if args.max else args.concurrency, prompt_tokens=args.prompt_tokens,
                        weight_dtype=WeightQuant(args.weight_dtype, args.weight_scales), kv_dtype=args.kv_dtype,
                        engine_name=args.engine, fraction=args.mem_fraction,
                        max_tpot_s=None if args.max_tpot_ms is None else args.max_tpot_ms / 1e3,
                        max_ttft_s=None if args.max_ttft_ms is None else args.max_ttft_ms / 1e3,
                        allow_long_context=args.allow_long_context, positions=positions)
    checks, why = _verify(plan, spec, args) if _verification_wanted(args) else ((), "")
    # A copy with fewer layers (--verify-layers) is that copy's peak, not the plan's: its rows stay estimates.
    compiled = {c.mesh: (c.peak_bytes, c.compiler) for c in checks
                if c.kind == "decode" and c.peak_bytes is not None and c.status in ("exact", "over budget")
                and args.verify_layers is None}
    if args.html is not None:
        from meshplan.pure.report import serve_html

        try:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(serve_html(plan, compiled=compiled))
        except OSError as err:
            raise PlanError(f"cannot write --html {args.html!r}: {err.strerror}") from None
    if args.format == "json":
        sys.stdout.write(plan.to_json() + "\n")
        return 0
    if args.format == "markdown":
        from meshplan.pure.report import serve_markdown

        sys.stdout.write(serve_markdown(plan, compiled=compiled))
        return 0
    from meshplan.cli._serve_render import render_serve

    from meshplan.cli._console import make_console

    render_serve(plan, make_console(), compiled=compiled, checks=checks, verify_note=why, top=args.top)
    return 0


def run_check_serve(args: Any, console: Any) -> int:
    """``meshplan check --serve``: one layout's decode step and prefill chunk compiled; XLA's figures against the
    planner's weights + KV + inputs."""
    from meshplan.pure.presets import scaled_model
    from meshplan.facade.verify._serve import check_row, replica_cluster
    from meshplan.facade.verify._serve_job import ServeJob
    from meshplan.facade.verify._worker import run_jobs
    from meshplan.pure.cluster import parse_cluster
    from meshplan.pure.serve import (
        ServeLayout,
        WeightQuant,
        check_layout,
        default_engine,
        engine,
        engine_cache_format,
        kv_dtype,
    )

    unknown = sorted(set(args.mesh) - {"dp", "ep", "tp"})
    if unknown:
        raise PlanError(f"--serve --mesh takes the serving axes dp, ep and tp; {unknown} are training axes.")
    layout = ServeLayout(args.mesh.get("dp", 1), args.mesh.get("tp", 1), args.mesh.get("ep", 1))
    cluster = parse_cluster(args.cluster)
    spec, _ = load_serving_model(args.model)
    check_layout(spec, layout, cluster)
    spec = scaled_model(spec, args.layers)
    context = args.context or args.seq or 4096
    sequences = args.batch or layout.ep
    eng = default_engine(cluster) if args.engine is None else engine(args.engine)
    quant, cache_dtype = WeightQuant(args.weight_dtype, args.weight_scales), kv_dtype(args.kv_dtype)
    fmt = engine_cache_format(eng, spec, cluster, context=context, max_num_seqs=sequences)
    sub = replica_cluster(cluster, layout)
    jobs = [ServeJob(spec, sub, layout, sequences, context, quant, cache_dtype, fmt, target=args.target, kind=kind,
                     chunk=min(context, 512)) for kind in ("decode", "prefill")]
    from meshplan.facade.verify._compilers import compiler_version

    tpu = cluster.device.ici_scope == "slice"
    platform = "cpu" if args.target == "cpu" else "tpu" if tpu else "gpu"
    budget = int((0.9 if tpu else eng.default_fraction or 0.75) * cluster.device.hbm_bytes)
    sys.stderr.write(f"meshplan: compiling the serving decode step and a prefill chunk of {spec.name} on "
                     f"{layout.text} ({sequences} sequences x {context} tokens, {fmt.layout} cache) ...\n")
    outcomes = run_jobs(cast(Any, jobs), parallel=1)  # run_jobs runs any job kind (the worker dispatches it)
    rows = [check_row(j, o, budget, compiler_version(platform)) for j, o in zip(jobs, outcomes, strict=True)]
    if getattr(args, "format", "table") == "json":
        sys.stdout.write(json.dumps({"model": spec.name, "cluster": cluster.text, "layout": layout.text,
                                     "sequences": sequences, "context": context, "engine": eng.name,
                                     "cache": fmt.layout, "page_size": fmt.page_size,
                                     "rows": [r.to_dict() for r in rows]}) + "\n")
    else:
        from meshplan.cli._serve_render import render_checks

        render_checks(rows, console, title=f"meshplan check --serve: {spec.name} on {cluster.text}, {layout.text}, "
                                          f"{sequences} sequences x {context} tokens ({eng.label}'s {fmt.layout} cache)")
    return 0 if all(r.peak_bytes is not None for r in rows) else 1

