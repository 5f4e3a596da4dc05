"""``meshplan cache info|clear``: the compile cache of verified plans: where it is, how big; or empty it."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register ``meshplan cache`` on the command line's subparsers."""
    cache = sub.add_parser("cache", help="the compile cache of verified plans: where, how big; or clear it")
    cache.add_argument("action", choices=("info", "clear"),
                       help="info: directory, entries, size; clear: remove every entry (MESHPLAN_CACHE_DIR "
                            "overrides $XDG_CACHE_HOME/meshplan)")
    cache.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the cache's directory, entries and size, or clear it and say how many entries went."""
    from meshplan.facade.verify import cache_dir, cache_info, clear_cache  # lazily: the facade imports jax

    if args.action == "clear":
        removed = clear_cache()
        print(f"removed {removed} compiled steps from {cache_dir()}")
    else:
        print(cache_info().describe())
    return 0
