"""The ``meshplan`` command line: ``plan``, ``check``, ``show-mesh``, ``cache``, ``models`` and ``demo``.

Each command is a module of its own (its arguments and its ``run``); :mod:`meshplan.cli._parser` puts them
under one parser. ``meshplan plan --help`` prints the planning command's whole description.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from meshplan.cli._args import UserError
from meshplan.cli._parser import Parser, build_parser, error_json, wants_json
from meshplan.errors import MeshplanError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meshplan`` console script; returns the exit code.

    Exit 0 on success, 1 for a request meshplan cannot answer (the message on
    stderr), 2 for bad usage (argparse). With ``--json``/``--format json`` an
    error also prints ``{"error": {"type": ..., "message": ...}}`` on stdout,
    so a script reading stdout always gets JSON.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    Parser.json_errors = wants_json(argv)
    try:
        args = build_parser().parse_args(argv)
    finally:
        Parser.json_errors = False
    try:
        code: int = args.func(args)
    except (MeshplanError, UserError) as err:
        print(f"meshplan {args.command}: error: {err}", file=sys.stderr)
        if getattr(args, "format", None) == "json":
            kind = "UserError" if isinstance(err, UserError) else type(err).__name__
            sys.stdout.write(error_json(kind, str(err)))
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
