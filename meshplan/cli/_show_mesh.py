"""``meshplan show-mesh``: draw which host or slice each device of a mesh sits on (terminal, HTML, PNG).

The mesh is given (``--cluster 2x4xH100 --mesh dp=2,tp=4``, with ``--dcn`` for its split across hosts), or
taken from a saved plan (``--plan FILE --rank K``: what ``meshplan plan --json`` wrote).
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from meshplan.cli._args import UserError, positive, sizes
from meshplan.errors import MeshplanError
from meshplan.pure.cluster import parse_cluster
from meshplan.pure.mesh import reconcile_dcn, split_mesh_shape
from meshplan.pure.search import SearchResult

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register ``meshplan show-mesh`` on the command line's subparsers."""
    show = sub.add_parser("show-mesh", help="draw which host/slice each device of a mesh sits on")
    show.add_argument("--cluster", help="e.g. 2x4xH100 or v5e-16 (default with --plan: the plan's cluster)")
    show.add_argument("--mesh", type=sizes, metavar="AXIS=N,...", help="e.g. dp=2,tp=4 (outermost first)")
    show.add_argument("--dcn", type=sizes, metavar="AXIS=N,...",
                      help="DCN part of axes (default: create_mesh's split)")
    show.add_argument("--plan", metavar="FILE", help="a 'meshplan plan --json' result to draw instead")
    show.add_argument("--rank", type=positive, default=1, help="which ranked mesh of --plan (default 1)")
    show.add_argument("--html", metavar="FILE", help="also write the device grid as a self-contained HTML page")
    show.add_argument("--png", metavar="FILE", help="also write a picture (needs matplotlib: meshplan[png])")
    show.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``meshplan show-mesh``: the grid in the terminal, and as HTML or PNG where asked."""
    from meshplan.cli import _render
    from meshplan.cli._console import make_console

    if args.png is not None and importlib.util.find_spec("matplotlib") is None:
        raise UserError("--png needs matplotlib, which is not installed; install it with "
                        "pip install 'meshplan[png]' (or pip install matplotlib).")
    if args.plan is not None:
        try:
            with open(args.plan, "rb") as f:  # bytes: from_json reports a non-UTF-8 file as not JSON
                result = SearchResult.from_json(f.read())
        except OSError as err:
            raise UserError(f"cannot read --plan {args.plan!r}: {err.strerror}") from None
        ranked = result.candidates
        if not 1 <= args.rank <= len(ranked):
            raise UserError(f"--rank {args.rank}: the plan has {len(ranked)} ranked meshes.")
        cand = ranked[args.rank - 1]
        cluster = parse_cluster(args.cluster) if args.cluster else result.request.cluster
        names, hybrid = cand.axis_names, cand.hybrid
    else:
        if args.cluster is None or args.mesh is None:
            raise UserError("show-mesh needs --cluster and --mesh (e.g. --mesh dp=2,tp=4), or --plan FILE.")
        cluster = parse_cluster(args.cluster)
        names, axis_sizes = tuple(args.mesh), tuple(args.mesh.values())
        if args.dcn is not None:
            unknown = sorted(set(args.dcn) - set(names))
            if unknown:
                raise UserError(f"--dcn names axes {unknown} that --mesh lacks ({list(names)}).")
            # The same reconciliation create_mesh applies to a user's dcn_mesh_dims.
            try:
                hybrid = reconcile_dcn(axis_sizes, tuple(args.dcn.get(n, 1) for n in names),
                                       num_devices=cluster.num_devices, num_granules=cluster.num_ici_domains)
            except MeshplanError as err:
                given = ",".join(f"{n}={s}" for n, s in args.dcn.items())
                raise UserError(f"--dcn {given} (axes {list(names)}): {err}") from None
        else:
            # The split create_mesh makes by default for this global shape.
            hybrid = split_mesh_shape(axis_sizes, cluster.num_ici_domains, num_devices=cluster.num_devices)
    ids = _render.render_mesh(cluster, names, hybrid, make_console())
    if args.html is not None:
        from meshplan.cli import _html

        try:
            _html.write_mesh_html(args.html, cluster, names, hybrid)
        except _html.HtmlWriteError as err:
            raise UserError(str(err)) from None
    if args.png is not None:
        try:
            _render.write_png(args.png, cluster, names, ids)
        except ImportError as err:
            raise UserError(str(err)) from None
        print(f"wrote {args.png}")
    return 0
