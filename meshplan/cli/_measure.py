"""``meshplan measure``: plan for the machine this runs on, then time the top layouts on its devices.

The cluster is read from the live devices (:func:`meshplan.live_cluster`: a catalogue GPU or TPU by its
``device_kind``; CPU devices are the ``XLA:CPU`` device, whose link figures are nominal and which has no peak
FLOP/s until a profile measures them: ``--profile FILE``). The plan is priced for that cluster (by the profile
where given), and its top ``--top`` layouts (or ``--layouts``) run ``--steps`` timed steps each
(:func:`meshplan.measure_plan`). ``--json`` prints the rows as JSON (one per layout: ``mesh``,
``measured_step_s``, ``predicted_step_s``, ``measured_peak_bytes``, null where the backend reports none, and
``error``); ``--out FILE`` writes the same document, which ``meshplan profile --refine PROFILE --steps FILE``
reads to refit the profile's step factor.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser"]


def _count(text: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 9 or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer >= 1")
    return int(digits)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds") from None
    if not 0 < value < 10**7:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be seconds > 0")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``meshplan measure`` on the CLI's subparsers."""
    from meshplan.cli import _args
    from meshplan.cli._flags import add_mem_fraction

    p = subparsers.add_parser("measure", help="time a plan's top layouts on the devices of this machine",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a preset, a Hugging Face config.json or a MaxText model yml")
    p.add_argument("--top", type=_count, default=3, help="how many of the plan's layouts to run (default 3)")
    p.add_argument("--layouts", nargs="+", metavar="MESH", help="run these meshes of the plan instead (dp=2,fsdp=4)")
    p.add_argument("--steps", type=_count, default=5, help="timed steps per layout (default 5)")
    p.add_argument("--warmup", type=_count, default=1, help="untimed steps after the compile (default 1)")
    p.add_argument("--batch", type=_count, help="global batch in sequences (default: one per device)")
    p.add_argument("--seq", type=_count, help="tokens per sequence (default 4096)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="parameter dtype")
    p.add_argument("--remat", choices=("none", "full", "dots"), default="full", help="remat policy (default full)")
    p.add_argument("--attention", choices=("plain", "dot_product", "flash"), default="dot_product",
                   help="attention kind (default dot_product; flash needs a GPU or TPU)")
    p.add_argument("--optimizer", choices=("adamw", "adafactor", "lion", "sgd"), default="adamw")
    p.add_argument("--profile", metavar="FILE", help="price the plan with this machine profile (meshplan profile)")
    p.add_argument("--headroom", type=_args.fraction("HBM kept free", zero=True, one=False), default=None,
                   help="fraction of HBM kept free (default: 0.1 on TPU and CPU; on GPU 1 - --mem-fraction)")
    add_mem_fraction(p)
    p.add_argument("--timeout", type=_seconds, default=600.0, metavar="S",
                   help="the most one layout may take, compile included (default 600)")
    p.add_argument("--out", metavar="FILE", help="also write the rows as JSON (what profile --refine reads)")
    p.add_argument("--json", dest="format", action="store_const", const="json", default="table",
                   help="print the rows as JSON only")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Plan for the live devices, measure, print (the command's body; errors are meshplan's typed ones)."""
    import meshplan
    from meshplan.cli import _models
    from meshplan.cli._flags import headroom_for
    from meshplan.pure import search_meshes
    from meshplan.pure.cost import TrainingRecipe

    cluster = meshplan.live_cluster()
    platform = "cpu" if cluster.device.name == "XLA:CPU" else "tpu" if cluster.device.ici_scope == "slice" else "gpu"
    profile = meshplan.load_profile(args.profile) if args.profile else None
    preset = _models.load(args.model, dtype=args.dtype)
    headroom, _ = headroom_for(args, cluster) if platform != "cpu" or args.headroom is not None else (0.1, "")
    recipe = TrainingRecipe(weight_dtype=args.dtype, optimizer=args.optimizer, remat=args.remat,
                            attention=args.attention, backend=platform)
    # With --layouts the plan must list them: rank every mesh that fits.
    top_k = 10**4 if args.layouts else args.top
    result = search_meshes(preset.spec, cluster, params=preset.params, batch=args.batch, seq=args.seq,
                           headroom=headroom, top_k=top_k, recipe=recipe, profile=profile)
    measured = meshplan.measure_plan(result, model=preset.spec, top=args.top, layouts=args.layouts,
                                     steps=args.steps, warmup=args.warmup, timeout_s=args.timeout)
    if args.out:
        _write(args.out, measured.to_json() + "\n")
    if args.format == "json":
        sys.stdout.write(measured.to_json() + "\n")
        return 0
    _render(measured, result)
    return 0


def _write(path: str, text: str) -> None:
    import os
    import tempfile
    from pathlib import Path

    from meshplan.errors import ProfileError

    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as err:
        raise ProfileError(f"cannot write --out {path!r}: {err.strerror or err}.") from None


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"


def _b(value: int | None) -> str:
    from meshplan.pure._format import fmt_bytes

    return "-" if value is None else fmt_bytes(value)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _render(measured: Any, result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(title=f"meshplan measure: {result.request.model} on {measured.machine} "
                        f"({measured.device_kind}), batch {result.request.batch} x {result.request.seq}")
    for col in ("#", "mesh", "plan #", "measured step", "min-max", "predicted", "measured/pred",
                "measured peak", "estimate", "compiled", "error"):
        table.add_column(col, justify="left" if col in ("mesh", "error") else "right")
    for i, r in enumerate(measured.rows, 1):
        spread = "-" if r.measured_min_s is None else f"{_s(r.measured_min_s)}-{_s(r.measured_max_s)}"
        table.add_row(str(i) if r.measured_step_s is not None else "-", r.mesh, str(r.predicted_rank or "-"),
                      _s(r.measured_step_s), spread, _s(r.predicted_step_s), _ratio(r.step_ratio),
                      _b(r.measured_peak_bytes), _b(r.predicted_memory_bytes), _b(r.compiled_peak_bytes),
                      r.error or "")
    console.print(table)
    for note in measured.notes:
        console.print(f"note: {note}", markup=False)
