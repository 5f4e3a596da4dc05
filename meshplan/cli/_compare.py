"""``meshplan compare``: one model on several clusters or sizes, ranked by time, cost or tokens per device.

meshplan compare --model llama3-70b --clusters "4x8xH100,8x8xH100,4x8xH200,v5p-128"
searches each cluster's meshes for the model (a preset, a Hugging Face config.json
or a MaxText model yml), compiles the top --verify K (default 3) of each where the
target's compiler is installed (meshplan[tpu], meshplan[gpu]; no TPU or GPU needed),
and prints one table: per option the best layout that fits, its memory per device
(exact = XLA's compiled peak), step time, tokens per second (cluster and per device),
MFU and the memory headroom. --price H100=2.49,v5p=4.20 (USD per device-hour: your
figures; meshplan ships no price list) adds the cost per million tokens, and --tokens
2T the time and cost of that many tokens. Rank with --by time|cost|tokens-per-device.
Under the table: the best option, the smallest option that fits, and per device kind
the knee where adding devices stops paying.

Sizes of one kind: --nodes 1,2,4,8,16 --device H100, or a brace range in --clusters
("v5p-{32..512}" doubles: v5p-32, -64, -128, -256, -512). GB200 racks: "GB200-NVL72",
"2xGB200-NVL72" (18 hosts of 4 GPUs in one NVLink domain each).

--executor ADDRESS sends the compiles to a Dask cluster (pip install 'meshplan[dask]'
here and on the workers); an unreachable address is an error unless
--executor-fallback. --format markdown, --json (one row per option) and --html FILE
(the table and two plots) as for plan. --no-verify or MESHPLAN_VERIFY=0: estimates
only.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
from typing import Any

from meshplan.cli._fit_table import fact_grid, fitted_table

__all__ = ["add_parser", "render_comparison", "run_compare"]


def add_parser(subparsers: Any) -> Any:
    """Add ``meshplan compare`` to ``subparsers`` (``build_parser``'s); returns the sub-parser."""
    from meshplan.cli._args import fraction
    from meshplan.pure.compare import CRITERIA

    p = subparsers.add_parser("compare", help="compare clusters and sizes for training a model: time, cost, fit",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="a preset (meshplan models lists them), a Hugging Face config.json or a MaxText model yml")
    p.add_argument("--clusters", metavar="LIST",
                   help="comma-separated clusters, e.g. '8x8xH100,4x8xH200,v5p-128,v6e-256'; braces expand: "
                        "'v5p-{32..512}' doubles, '{2,4}x8xB200' lists")
    p.add_argument("--nodes", metavar="N,N,...", help="node counts of --device, e.g. 1,2,4,8,16")
    p.add_argument("--device", help="the GPU kind --nodes sizes, e.g. H100")
    p.add_argument("--batch", type=int, metavar="N",
                   help="one global batch in sequences for every option (default: each its own, one per device)")
    p.add_argument("--seq", type=int, metavar="T", help="tokens per sequence (default 4096)")
    p.add_argument("--price", metavar="KIND=USD,...",
                   help="USD per device-hour per device kind, e.g. H100=2.49,v5p=4.20 (your figures)")
    p.add_argument("--price-source", default="", metavar="WHO",
                   help="whose prices they are, shown with them (default: 'the user')")
    p.add_argument("--tokens", metavar="COUNT", help="time and price a run of this many tokens, e.g. 2T, 500B")
    p.add_argument("--by", default="time", choices=CRITERIA,
                   help="rank by time (cluster tokens/s, default), cost (USD per million tokens) or "
                        "tokens-per-device")
    p.add_argument("--knee", type=fraction("ideal scaling"), default=None, metavar="E",
                   help="scaling efficiency below which adding devices stops paying (default 0.8)")
    p.add_argument("--verify", type=int, metavar="K", default=None,
                   help="meshes per cluster to verify as fitting by compiling them (default 3, where the compiler "
                        "is installed)")
    p.add_argument("--no-verify", action="store_true", help="estimates only; compile nothing")
    p.add_argument("--verify-time", type=int, default=900, metavar="S",
                   help="per cluster, stop starting compiles after S seconds (default 900)")
    p.add_argument("--target", choices=("auto", "cpu"), default="auto",
                   help="auto: each cluster's compiler; cpu: XLA:CPU with as many simulated devices")
    p.add_argument("--executor", metavar="ADDRESS",
                   help="compile on the Dask cluster at ADDRESS (e.g. tcp://10.0.0.5:8786); default: local workers")
    p.add_argument("--executor-fallback", action="store_true",
                   help="with an unreachable --executor, compile on local workers instead of failing")
    p.add_argument("--mem-fraction", type=fraction("GPU memory"), metavar="F",
                   help="GPU: the fraction of each GPU jax preallocates, the budget (default jax's 0.75)")
    p.add_argument("--headroom", type=fraction("HBM kept free", zero=True, one=False), default=None,
                   help="fraction of HBM kept free on every cluster (default: 0.1 on TPU; on GPU 1 - --mem-fraction)")
    p.add_argument("--format", default="table", choices=("table", "markdown", "json"),
                   help="table (default), markdown, or json (one row per option)")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page: the table and two plots")
    p.set_defaults(func=run_compare)
    return p


def _positive(value: int | None, flag: str) -> int | None:
    from meshplan.pure.errors import CompareError

    if value is not None and not 1 <= value <= 10**12:
        raise CompareError(f"{flag} {value} must be an integer in [1, 10**12].")
    return value


def run_compare(args: argparse.Namespace) -> int:
    """``meshplan compare``: compare, then print the table (or markdown / JSON) and write ``--html``."""
    from meshplan.cli._models import load
    from meshplan.facade._compare import compare_clusters
    from meshplan.pure.compare import DEFAULT_KNEE_THRESHOLD
    from meshplan.pure.errors import CompareError

    if args.clusters is None and args.nodes is None:
        raise CompareError("give --clusters LIST (e.g. '8x8xH100,v5p-128') or --nodes N,... --device KIND.")
    _positive(args.batch, "--batch")
    _positive(args.seq, "--seq")
    _positive(args.verify, "--verify")
    _positive(args.verify_time, "--verify-time")
    import os

    verify = not args.no_verify and (args.verify is not None
                                     or os.environ.get("MESHPLAN_VERIFY", "").strip().lower()
                                     not in ("0", "off", "no", "false"))
    model = load(args.model).spec
    quiet = args.format == "json"
    stream = io.StringIO() if quiet else sys.stderr
    comparison = compare_clusters(
        model, args.clusters, nodes=args.nodes, device=args.device, batch=args.batch, seq=args.seq,
        prices=args.price, price_source=args.price_source, tokens=args.tokens, by=args.by, verify=verify,
        top=args.verify or 3, target=args.target, executor=args.executor, executor_fallback=args.executor_fallback,
        time_budget_s=float(args.verify_time), headroom=args.headroom, mem_fraction=args.mem_fraction,
        knee_threshold=DEFAULT_KNEE_THRESHOLD if args.knee is None else args.knee, stream=stream)
    if args.html is not None:
        from meshplan.pure.report import compare_html

        try:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(compare_html(comparison))
        except OSError as err:
            raise CompareError(f"cannot write --html {args.html!r}: {err.strerror}") from None
        print(f"meshplan: wrote {args.html}", file=sys.stderr)
    if args.format == "json":
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=2) + "\n")
        return 0
    if args.format == "markdown":
        from meshplan.pure.report import compare_markdown

        sys.stdout.write(compare_markdown(comparison))
        return 0
    from rich.console import Console

    render_comparison(comparison, Console(width=shutil.get_terminal_size((160, 40)).columns))
    return 0


def _table(comparison: Any, width: int) -> Any:
    """The ranked table no wider than ``width``: cells never wrap; the highest-priority-number columns go first."""
    from meshplan.pure.report._compare_facts import compare_rows, shown_columns

    return fitted_table(compare_rows(comparison), shown_columns(comparison), width, right=lambda col: col.right)


def render_comparison(comparison: Any, console: Any) -> None:
    """Print the comparison: the header facts, the ranked table (no wider than the console), the verdicts."""
    from meshplan.pure.report import compare_header
    from meshplan.pure.report._compare_facts import compare_verdicts

    n = len(comparison.options)
    console.print(f"[bold]meshplan compare[/bold]: {comparison.model} on {n} option{'s' if n != 1 else ''}")
    console.print(fact_grid(compare_header(comparison)), crop=False)
    console.print()
    console.print(_table(comparison, console.width))
    for line in compare_verdicts(comparison):
        console.print(line, markup=False)
