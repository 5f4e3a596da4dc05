"""How a model config's values appear in error messages (shared by the config readers)."""

from __future__ import annotations

from typing import Any

__all__ = ["show_int", "show_value"]


def show_int(value: int) -> str:
    """A huge int, shown without converting it to a float or a 4,300-digit string (both fail).

    Example:
      >>> show_int(4096), show_int(10**400)
      ('4096', '<a 1329-bit int>')
    """
    return str(value) if value.bit_length() <= 64 else f"<a {value.bit_length()}-bit int>"


def show_value(value: Any) -> str:
    """``repr(value)`` cut to 60 characters; huge ints by their size (their repr may raise).

    Example:
      >>> show_value("llama" * 20)[:12], show_value(-3)
      ("'llamallamal", '-3')
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return show_int(value)
    try:
        return f"{value!r:.60}"
    except ValueError:  # a container holding an int past the 4,300-digit repr limit
        return f"<a {type(value).__name__}>"
