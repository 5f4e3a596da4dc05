"""Mesh strings: ``"dp:2,tp:4"`` (named) or ``"2,4"`` (positional).

Named form keeps the **string's** axis order, as the reference
(``parse_mesh_from_string``) does: ``parse_mesh_string("tp:4,dp:2", ["dp",
"tp"])`` gives ``("tp", "dp")``. The string is the more specific statement
of intent, and axis order is not cosmetic -- it decides which devices are
neighbours (the last axis varies fastest over devices) -- so code ported
from eformer must get the same mesh. ``names`` only says which axes must
appear: the named string must mention every one of them exactly once
(the reference likewise requires the two to match); a missing axis is an
error rather than a silent size 1, because a forgotten axis usually means
a typo in a launch script.

Positional form maps sizes to ``names`` by position; the counts must match.

Sizes are ASCII integers >= 1, or ``-1`` (at most once) for "the remaining
devices"; the ``-1`` is returned unresolved (see
:func:`meshplan.pure.infer_axis_dims`). Whitespace around entries, names and
sizes is ignored. Axis names containing ``,`` or ``:`` or surrounding
whitespace cannot be written in the named form; use the positional form.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from meshplan.pure._check import as_flag, as_int_tuple
from meshplan.pure.errors import MeshplanTypeError, MeshStringError
from meshplan.pure.mesh._axes import validate_axis_names

__all__ = ["format_mesh_string", "parse_mesh_string"]

# ASCII digits only: str.isdigit/int() also accept "²", "٣" and "1_000".
_SIZE = re.compile(r"-?[0-9]+", re.ASCII)


def _valid_forms(names: tuple[str, ...]) -> str:
    """The two accepted forms, spelled with the caller's own axis names."""
    example = names if names else ("dp", "tp")
    named = ",".join(f"{n}:<size>" for n in example)
    positional = ",".join("<size>" for _ in example)
    return (
        f'Expected "{named}" (named, every axis once) or "{positional}" (positional), with '
        "integer sizes >= 1 or a single -1, e.g. \"dp:2,tp:4\" or \"2,4\"."
    )


def _parse_size(size: str, token: str, problems: list[str]) -> int | None:
    """The integer in ``size`` (from ``token``), or None after recording why not."""
    if not size:
        problems.append(f"entry {token!r} has no size")
        return None
    if not _SIZE.fullmatch(size):
        problems.append(f"entry {token!r}: size {size!r} is not an integer")
        return None
    value = int(size)
    if value == 0 or value < -1:
        problems.append(f"entry {token!r}: size {value} must be >= 1, or -1")
        return None
    return value


def parse_mesh_string(text: str, names: Sequence[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Parses a mesh string into axis names and sizes (``-1`` left unresolved).

    Args:
      text: ``"name:size,..."`` (named) or ``"size,..."`` (positional).
      names: the mesh's axis names; a named string must mention each exactly
        once, a positional string must give one size per name.

    Returns:
      ``(axis_names, dims)``: in the string's order for the named form, in
      ``names`` order for the positional form.

    Raises:
      MeshplanTypeError: ``text`` is not a string, or ``names`` is invalid in type.
      MeshShapeError: ``names`` repeat or are empty.
      MeshStringError: the string is malformed; every problem is listed with
        the offending entry, followed by the valid forms.

    Example:
      >>> parse_mesh_string("dp:2,tp:4", ["dp", "tp"])
      (('dp', 'tp'), (2, 4))
      >>> parse_mesh_string(" tp : -1 , dp:2 ", ["dp", "tp"])
      (('tp', 'dp'), (-1, 2))
      >>> parse_mesh_string("2,4", ["data", "model"])
      (('data', 'model'), (2, 4))
    """
    if not isinstance(text, str):
        raise MeshplanTypeError(
            f"mesh string text={text!r} has type {type(text).__name__}; expected a str such "
            'as "dp:2,tp:4" or "2,4".'
        )
    axis_names = validate_axis_names(names)
    forms = _valid_forms(axis_names)
    if not text.strip():
        raise MeshStringError(f"mesh string {text!r} is empty. {forms}")

    problems: list[str] = []
    named: list[tuple[str, int | None]] = []
    positional: list[int | None] = []
    for i, raw in enumerate(text.split(",")):
        token = raw.strip()
        if not token:
            problems.append(f"entry {i} is empty (stray or trailing comma?)")
        elif ":" in token:
            parts = token.split(":")
            if len(parts) != 2:
                problems.append(f"entry {token!r} has {len(parts) - 1} colons; use name:size")
                named.append(("", None))  # still a named entry, but its axis is unknown
                continue
            name, size = parts[0].strip(), parts[1].strip()
            if not name:
                problems.append(f"entry {token!r} has no axis name before ':'")
            named.append((name, _parse_size(size, token, problems)))
        else:
            positional.append(_parse_size(token, token, problems))

    if named and positional:
        problems.append("the string mixes named (name:size) and positional (size) entries")
    elif named:
        seen: list[str] = []
        for name, _ in named:
            if not name:
                continue
            if name not in axis_names:
                problems.append(f"unknown axis name {name!r} (names are {list(axis_names)})")
            elif name in seen:
                problems.append(f"axis {name!r} is given more than once")
            else:
                seen.append(name)
        missing = [n for n in axis_names if n not in seen]
        # An entry whose name could not be read may be the missing axis: say nothing then.
        if missing and all(name for name, _ in named):
            problems.append(f"axes {missing} are not mentioned (name each axis exactly once)")
    elif len(positional) != len(axis_names):
        problems.append(
            f"{len(positional)} positional size(s) for {len(axis_names)} axis names "
            f"{list(axis_names)}"
        )
    sizes = [s for _, s in named] if named else positional
    if sizes.count(-1) > 1:
        problems.append(f"-1 appears {sizes.count(-1)} times; at most one axis can be inferred")

    if problems:
        raise MeshStringError(f"invalid mesh string {text!r}: {'; '.join(problems)}. {forms}")
    if named:
        return tuple(n for n, _ in named), tuple(s for _, s in named)  # type: ignore[misc]
    return axis_names, tuple(positional)  # type: ignore[arg-type]


def format_mesh_string(
    names: Sequence[str], dims: Sequence[int], *, named: bool = True
) -> str:
    """Writes names and sizes as a mesh string that :func:`parse_mesh_string` reads back.

    Args:
      names: axis names, in mesh order.
      dims: one size per name (>= 1, or a single -1).
      named: write ``"dp:2,tp:4"`` (default) or positional ``"2,4"``.

    Returns:
      The mesh string.

    Raises:
      MeshplanTypeError: wrong types.
      MeshShapeError: invalid names.
      MeshStringError: counts differ, a size is invalid, or a name cannot be
        written in the named form (contains ``,``/``:`` or outer whitespace).

    Example:
      >>> format_mesh_string(("dp", "tp"), (2, -1))
      'dp:2,tp:-1'
      >>> format_mesh_string(("dp", "tp"), (2, 4), named=False)
      '2,4'
    """
    axis_names = validate_axis_names(names)
    sizes = as_int_tuple(dims, "dims")
    named = as_flag(named, "named")
    problems = []
    if len(axis_names) != len(sizes):
        problems.append(f"{len(sizes)} sizes {sizes} for {len(axis_names)} names {axis_names}")
    problems += [f"size {d} for axis {n!r} must be >= 1, or -1" for n, d in zip(axis_names, sizes)
                 if d == 0 or d < -1]
    if named:
        problems += [f"axis name {n!r} cannot be written in a named mesh string"
                     for n in axis_names if "," in n or ":" in n or n != n.strip()]
    if problems:
        raise MeshStringError(f"cannot format a mesh string: {'; '.join(problems)}.")
    if named:
        return ",".join(f"{n}:{d}" for n, d in zip(axis_names, sizes))
    return ",".join(str(d) for d in sizes)
