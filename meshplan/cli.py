"""The ``meshplan`` command line: ``meshplan demo`` (and, later, ``plan``, ``show-mesh``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from meshplan import demo

    return demo.run(num_devices=args.devices)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for the ``meshplan`` command."""
    parser = argparse.ArgumentParser(prog="meshplan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="build meshes and place a model on simulated CPU devices")
    demo.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meshplan`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
