"""Human-readable byte counts for reprs and messages: the one byte formatter.

Two styles, because two kinds of text need them:

* ``"exact"`` (reprs of device figures): ``'95 GiB'`` when the count is a
  whole number of GiB, else decimal GB (``'80 GB'``), so a datasheet figure
  reads back as the datasheet prints it;
* ``"binary"`` (planner messages): one decimal in GiB, or MiB below 1 GiB
  (``'12.3 GiB'``, ``'27.1 MiB'``), so budgets and estimates line up.

Example:
  >>> fmt_bytes(80 * 10**9, style="exact"), fmt_bytes(95 * 2**30, style="exact")
  ('80 GB', '95 GiB')
  >>> fmt_bytes(3 * 2**30 + 2**29), fmt_bytes(5 * 2**20)
  ('3.5 GiB', '5.0 MiB')
"""

from __future__ import annotations

from typing import Literal, TypeAlias

__all__ = ["ByteStyle", "fmt_bytes"]

ByteStyle: TypeAlias = Literal["binary", "exact"]
"""How :func:`fmt_bytes` writes a count (see the module docstring)."""

_GB = 10**9
_MIB = 2**20
_GIB = 2**30


def fmt_bytes(nbytes: float, *, style: ByteStyle = "binary") -> str:
    """``nbytes`` as text, in the given style (see the module docstring).

    Args:
      nbytes: a byte count (a float for estimates; negative for a shortfall).
      style: ``"binary"`` (one decimal, GiB or MiB) or ``"exact"`` (whole GiB, else GB).

    Returns:
      The count with its unit, e.g. ``'1.5 GiB'``.

    Example:
      >>> fmt_bytes(2**31), fmt_bytes(2**31, style="exact"), fmt_bytes(1.5e9, style="exact")
      ('2.0 GiB', '2 GiB', '1.5 GB')
    """
    if style == "exact":
        return f"{int(nbytes) // _GIB} GiB" if nbytes % _GIB == 0 else f"{nbytes / _GB:g} GB"
    if abs(nbytes) < _GIB:
        return f"{nbytes / _MIB:.1f} MiB"
    return f"{nbytes / _GIB:.1f} GiB"
