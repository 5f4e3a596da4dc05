"""Argument types the subcommands share: a fraction in a stated interval, refused in argparse's words."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["fraction"]


def fraction(what: str, *, zero: bool = False, one: bool = True) -> Callable[[str], float]:
    """An argparse ``type=``: a number in ``(0, 1]`` (``zero=True`` admits 0, ``one=False`` refuses 1).

    Example:
      >>> fraction("peak FLOP/s")("0.4")
      0.4
      >>> fraction("HBM", zero=True, one=False)("1")
      Traceback (most recent call last):
      ...
      argparse.ArgumentTypeError: '1' must be a fraction of HBM in [0, 1)
    """
    interval = f"{'[' if zero else '('}0, 1{']' if one else ')'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value >= 0 if zero else value > 0
        high_ok = value <= 1 if one else value < 1
        if not (low_ok and high_ok):
            raise argparse.ArgumentTypeError(f"{text!r} must be a fraction of {what} in {interval}")
        return value

    return parse
