"""The ``meshplan`` command line's parser: one subcommand per module, each registering its own arguments.

``plan``, ``check``, ``serve``, ``show-mesh``, ``cache``, ``models``, ``demo``, ``measure`` and ``profile`` live in
their own modules
(:mod:`meshplan.cli._plan`, ...), each with an ``add_parser(subparsers)`` and a ``run(args)``; this module
only puts them under one parser, and makes a ``--json`` run's usage errors JSON too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["Parser", "build_parser", "error_json", "wants_json"]

_DESCRIPTION = ("Plan JAX device meshes and parameter shardings: meshplan plan | check | serve | show-mesh | cache | "
                "models | demo | measure | profile.")


def error_json(kind: str, message: str) -> str:
    """The one error object a ``--json`` run prints on stdout: ``{"error": {"type": ..., "message": ...}}``.

    Example:
      >>> error_json("PlanError", "no mesh fits")
      '{"error": {"type": "PlanError", "message": "no mesh fits"}}\\n'
    """
    return json.dumps({"error": {"type": kind, "message": message}}) + "\n"


def wants_json(argv: Sequence[str]) -> bool:
    """Whether the command line asks for JSON output (read before parsing, so usage errors can answer in JSON).

    Example:
      >>> wants_json(["plan", "--format", "json"]), wants_json(["plan"])
      (True, False)
    """
    args = list(argv)
    pairs = zip(args, args[1:] + [""])
    return "--json" in args or "--format=json" in args or any(a == "--format" and b == "json" for a, b in pairs)


class Parser(argparse.ArgumentParser):
    """argparse, plus a JSON error object on stdout for usage errors of ``--json`` runs (exit 2 either way)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            sys.stdout.write(error_json("UsageError", f"{self.prog}: {message}"))
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for the ``meshplan`` command.

    Example:
      >>> build_parser().parse_args(["cache", "info"]).action
      'info'
    """
    from meshplan.cli import (_cache, _check, _compare, _demo, _measure, _models, _plan, _profile, _serve,
                              _show_mesh)

    parser = Parser(prog="meshplan", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (_plan, _check, _compare, _serve, _show_mesh, _cache, _models, _demo, _measure, _profile):
        command.add_parser(sub)
    return parser
