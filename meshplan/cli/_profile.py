"""``meshplan profile``: time this machine's matmuls, HBM and links, and write the profile plans are priced with.

``meshplan profile --out FILE`` runs short micro-benchmarks on the live devices (:func:`meshplan.profile_machine`:
a matmul sweep, and ``--model``'s own layer shapes at each tp split; an HBM copy; every collective a step runs,
over each link kind of the local topology) and writes a versioned JSON profile: the device kind and count, the
jax / jaxlib / plugin / libtpu versions, the date, every timing, how each was measured, and the fitted figures
for readers. Under ``jax.distributed`` (``--distributed``: one process per host, started as your cluster starts
jax) it also times the links between hosts, and process 0 writes the file. ``meshplan plan --profile FILE``
prices with it.

``meshplan profile --refine PROFILE --steps MEASURE.json`` runs nothing: it adds ``meshplan measure --profile
PROFILE --out MEASURE.json`` rows to the profile and refits its step factor (a fit of one parameter, shown with
its leave-one-out error as the check), writing ``--out`` (default: PROFILE itself, replaced atomically).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``meshplan profile`` on the CLI's subparsers."""
    p = subparsers.add_parser("profile", help="time this machine's matmuls, HBM and links into a profile",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="FILE", help="write the profile here (JSON)")
    p.add_argument("--model", help="also time this model's layer matmuls at each tp split")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats: a smoke run, not figures")
    p.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() first (its cluster auto-detection): one process per "
                        "host, so the links between hosts are timed too")
    p.add_argument("--refine", metavar="PROFILE", help="refit PROFILE with --steps files instead of timing anything")
    p.add_argument("--steps", nargs="+", metavar="FILE", help="meshplan measure --out files (with --refine)")
    p.add_argument("--json", dest="format", action="store_const", const="json", default="table",
                   help="print the profile's JSON document")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Profile (or refine), write, print."""
    import meshplan
    from meshplan.errors import ProfileError

    if args.refine is None and args.steps:
        raise ProfileError("--steps needs --refine PROFILE (the profile the measured rows refine).")
    if args.refine is not None:
        return _refine(args)
    if args.distributed:
        import jax

        jax.distributed.initialize()
    profile = meshplan.profile_machine(model=args.model, quick=args.quick, out=args.out)
    _show(profile, args, wrote=args.out)
    return 0


def _refine(args: argparse.Namespace) -> int:
    from pathlib import Path

    import meshplan
    from meshplan.errors import ProfileError
    from meshplan.pure.cluster import read_measure
    from meshplan.pure.cost import refine_profile

    if not args.steps:
        raise ProfileError("--refine needs --steps FILE ... (meshplan measure --profile PROFILE --out FILE).")
    profile = meshplan.load_profile(args.refine)
    rows = []
    for path in args.steps:
        try:
            text = Path(path).read_bytes()
        except OSError as err:
            raise ProfileError(f"cannot read --steps {path!r}: {err.strerror or err}.") from None
        rows += list(read_measure(text, source=path))
    refined = refine_profile(profile, rows)
    target = args.out or args.refine
    meshplan.save_profile(refined, target)
    _show(refined, args, wrote=target)
    return 0


def _show(profile: Any, args: argparse.Namespace, *, wrote: str | None) -> None:
    import jax

    from meshplan.pure.cluster import device_for_kind
    from meshplan.pure.cost import profile_document
    from meshplan.pure.errors import ClusterError

    if jax.process_index() != 0:
        return
    try:
        peak = device_for_kind(profile.device_kind, profile.platform)
    except ClusterError:
        peak = None
    document = profile_document(profile, peak_bf16_flops=None if peak is None else peak.peak_bf16_flops)
    if args.format == "json":
        sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
        return
    _render(profile, document["figures"], ici_scope="node" if peak is None else peak.ici_scope, wrote=wrote)


def _render(profile: Any, figures: dict[str, Any], *, ici_scope: str, wrote: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from meshplan.pure.cost._flops import default_efficiency

    console = Console(width=160)
    versions = ", ".join(f"{k} {v}" for k, v in profile.versions)
    console.print(f"meshplan profile {profile.id}: {profile.device_count} x {profile.device_kind} "
                  f"({profile.process_count} process{'es' if profile.process_count != 1 else ''}), measured "
                  f"{profile.measured_at}; {versions}", markup=False)
    links = Table(title="links (alpha-beta fit per link kind, the cost model's ring formulas)")
    for col in ("link", "collective", "bandwidth", "latency", "timings", "worst fit"):
        links.add_column(col, justify="left" if col in ("link", "collective") else "right")
    for fit in [f for f in (figures["intra"], figures["inter"]) if f] + figures["per_kind"]:
        links.add_row(fit["link"], fit["kind"], f"{fit['bandwidth'] / 1e9:.3g} GB/s", f"{fit['latency'] * 1e6:.3g} us",
                      str(fit["rows"]), f"{fit['max_error']:.0%}")
    console.print(links)
    if figures["inter"] is None:
        console.print("inter: no link between hosts timed (one process); plans keep the catalogue's network",
                      markup=False)
    matmul = figures["matmul"]
    if matmul:
        table = Table(title=f"bf16 matmul efficiency (of {matmul['peak'] / 1e12:.3g} TFLOP/s, {matmul['peak_source']})")
        for col in ("hidden", "measured", "meshplan's default curve"):
            table.add_column(col, justify="right")
        catalogue = matmul["peak_source"] == "catalogue"
        for h, e in matmul["points"]:
            table.add_row(str(h), f"{e:.3f}", f"{default_efficiency(ici_scope, h):.3f}" if catalogue else "n/a")
        console.print(table)
        console.print(f"curve through them: {matmul['e_max']:.3f} x h / (h + {matmul['w0']:.0f})"
                      + (f"; FP8 / bf16 rate {matmul['fp8_ratio']:.2f}" if matmul["fp8_ratio"] else ""), markup=False)
    if figures["hbm_bandwidth"]:
        console.print(f"HBM: {figures['hbm_bandwidth'] / 1e9:.3g} GB/s read + write", markup=False)
    steps = figures["steps"]
    if steps:
        loo = "" if steps["loo_max_error"] is None else f", leave-one-out within {steps['loo_max_error']:.0%}"
        console.print(f"steps: factor {steps['scale']:.3g} on the matmul efficiency, fitted to {steps['rows']} "
                      f"measured steps (within {steps['max_error']:.0%}{loo})", markup=False)
    if wrote:
        console.print(f"wrote {wrote}", markup=False)
