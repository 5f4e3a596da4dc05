"""Logical-axis rules: per-dim logical names, an ordered table to mesh axes, resolved as flax resolves it.

A model names the dims of each parameter with *logical* axes (``("embed",
"mlp")``); a table maps each logical name to a mesh axis, a tuple of mesh
axes, or ``None``. The table is ordered and a name may repeat: later rows
are fallbacks. Resolution follows ``flax.linen.logical_to_mesh_axes``:

* rows are walked in table order (not dim order), so an earlier row takes a
  mesh axis before a later one can;
* a row applies to the dim carrying its logical name when that dim is still
  unassigned and none of the row's mesh axes is used by the array yet;
* a row mapping to ``None`` (or ``[]``) assigns "replicated", which also
  ends the search for that dim; a name no row applies to stays replicated.

Beyond flax, resolution is *divisibility-aware*: a row whose axes do not
divide the dim (``4096 % 24``) is skipped for the next fallback, and so is a
row naming an axis this mesh does not have (a table written for several
meshes); the reason says which rows were skipped and why. Where every row
divides its dim and names only mesh axes, the result is exactly flax's.

Where the names come from (the facade reads flax metadata into these):

* ``names``: path -> logical names, matched in :func:`~meshplan.pure.normalize_path`
  form on both sides (no ``params/`` prefix, no ``/value`` box tail);
* ``patterns``: ``(regex, names)`` rows searched in the path, first match wins.

Leaves with no names go to ``fallback`` (no opinion when it is ``None``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar, TypeAlias

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_sequence, as_shape, as_str, canonical_axis_sizes
from meshplan.pure._types import PyTree, Shape
from meshplan.pure.errors import MeshplanTypeError, ShardingRuleError
from meshplan.pure.rules._check_tree import _problems
from meshplan.pure.rules._conventions import normalize_path
from meshplan.pure.rules._base import (
    as_rule,
    Decision,
    LeafContext,
    Rule,
    as_context,
    group_key_fn,
    reads_axes,
    rule_name,
)
from meshplan.pure.specs._geometry import spec_from_entries
from meshplan.pure.specs._tree import flatten_with_path, path_str

__all__ = [
    "LogicalNames",
    "LogicalRule",
    "LogicalTable",
    "canonical_logical_names",
    "canonical_logical_table",
    "logical_names_by_path",
    "logical_rule_from_json",
    "logical_table_to_json",
    "resolve_logical_axes",
]

LogicalNames: TypeAlias = tuple[str | None, ...]
"""One logical name per dim of a leaf (``None``: the dim has no name)."""

LogicalTable: TypeAlias = tuple[tuple[str, tuple[str, ...]], ...]
"""Ordered ``(logical name, mesh axes)`` rows; ``()`` means replicated (flax's ``None``)."""

def _axes(raw: Any, where: str) -> tuple[str, ...]:
    """A table value (``None``, ``"tp"``, ``["fsdp", "tp"]``) as a tuple of axes."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, tuple | list) and all(isinstance(a, str) for a in raw):
        axes = tuple(raw)
        repeated = sorted({a for a in axes if axes.count(a) > 1})
        if repeated:
            raise ShardingRuleError(f"{where} uses mesh axes {repeated} twice; list each axis once.")
        return axes
    raise MeshplanTypeError(f"{where}: {raw!r} must be null, a mesh axis name or a list of axis names.")


def canonical_logical_table(table: Any) -> LogicalTable:
    """An ordered logical table from flax / MaxText form: ``[(name, axes), ...]`` or ``{name: axes}``.

    ``axes`` is ``None``, a mesh axis name or a sequence of names; ``[]`` is
    read as ``None``. Repeated names are kept in order (fallbacks).

    Raises:
      MeshplanTypeError: the table or a row is not of that form.
      ShardingRuleError: a row uses an axis twice.

    Example:
      >>> canonical_logical_table([("embed", "fsdp"), ("mlp", ["tp", "sp"]), ("norm", None)])
      (('embed', ('fsdp',)), ('mlp', ('tp', 'sp')), ('norm', ()))
    """
    rows = list(table.items()) if isinstance(table, Mapping) else table
    if isinstance(rows, str) or not isinstance(rows, Sequence):
        raise MeshplanTypeError(
            f"a logical table must be a list of (logical name, mesh axes) rows, e.g. "
            f"[('embed', 'fsdp'), ('mlp', 'tp')]; got {table!r}."
        )
    out = []
    for k, row in enumerate(rows):
        if not (isinstance(row, tuple | list) and len(row) == 2 and isinstance(row[0], str)):
            raise MeshplanTypeError(f"logical table row #{k} {row!r} is not a (logical name, mesh axes) pair.")
        out.append((row[0], _axes(row[1], f"logical table row #{k} {row[0]!r}")))
    return tuple(out)


def logical_table_to_json(table: LogicalTable) -> list[list[Any]]:
    """The table as flax / MaxText JSON rows: ``[name, axis]``, ``[name, [axes]]`` or ``[name, null]``.

    Example:
      >>> logical_table_to_json((("embed", ("fsdp",)), ("mlp", ("tp", "sp")), ("norm", ())))
      [['embed', 'fsdp'], ['mlp', ['tp', 'sp']], ['norm', None]]
    """
    table = canonical_logical_table(table)  # a hand-written table is checked like any other
    return [[name, None if not axes else axes[0] if len(axes) == 1 else list(axes)] for name, axes in table]


def canonical_logical_names(names: Any, where: str = "logical names") -> LogicalNames:
    """Per-dim logical names from a tuple / list / PartitionSpec of names and ``None``.

    Raises:
      MeshplanTypeError: an entry is neither a string nor ``None``.
      ShardingRuleError: a name repeats (flax refuses that too).

    Example:
      >>> canonical_logical_names(PartitionSpec("embed", None, "mlp"))
      ('embed', None, 'mlp')
    """
    if isinstance(names, str) or not isinstance(names, Sequence | PartitionSpec):
        raise MeshplanTypeError(f"{where}={names!r} must be a sequence of logical names (str or None), one per dim.")
    out = tuple(names)
    bad = [n for n in out if n is not None and not isinstance(n, str)]
    if bad:
        raise MeshplanTypeError(f"{where}={out!r} holds {bad}; each entry is a logical name (str) or None.")
    repeated = sorted({n for n in out if n is not None and out.count(n) > 1})
    if repeated:
        raise ShardingRuleError(f"{where}={out!r} names {repeated} on more than one dim; name each dim once.")
    return out


def logical_names_by_path(tree: PyTree) -> dict[str, LogicalNames]:
    """Path -> logical names, from a tree whose leaves are name tuples or PartitionSpecs.

    This is the form ``flax.linen.get_partition_spec`` and ``nnx.get_partition_spec``
    return (logical names in PartitionSpecs). Paths are in
    :func:`~meshplan.pure.normalize_path` form (``"Dense_0/kernel"`` for
    ``params/Dense_0/kernel/value``); ``None`` leaves (unnamed leaves) are left out.

    Example:
      >>> logical_names_by_path({"mlp": {"kernel": ("embed", "mlp"), "bias": None}})
      {'mlp/kernel': ('embed', 'mlp')}
    """
    def is_names(x: Any) -> bool:
        return isinstance(x, PartitionSpec) or (
            isinstance(x, tuple | list) and all(n is None or isinstance(n, str) for n in x))

    flat, _ = flatten_with_path(tree, "tree", is_leaf=is_names)
    out: dict[str, LogicalNames] = {}
    for keypath, leaf in flat:
        path = normalize_path(path_str(keypath))
        out[path] = canonical_logical_names(leaf, f"logical names of {path!r}")
    return out


def _fmt(axes: Sequence[str], sizes: Mapping[str, int]) -> str:
    return "*".join(f"{a!r}({sizes[a]})" for a in axes)


def _row_text(k: int, name: str, axes: tuple[str, ...]) -> str:
    target = "None" if not axes else repr(axes[0]) if len(axes) == 1 else repr(axes)
    return f"row #{k} {name!r}->{target}"


_UNASSIGNED = object()


def resolve_logical_axes(
    names: Sequence[str | None],
    shape: Sequence[int],
    table: LogicalTable,
    axis_sizes: Mapping[str, int],
) -> tuple[PartitionSpec, str]:
    """The PartitionSpec for one leaf's logical names, and why (see the module docstring).

    Args:
      names: one logical name (or ``None``) per dim of ``shape``; fewer leave the
        trailing dims unnamed.
      shape: the leaf's shape.
      table: a canonical logical table (:func:`canonical_logical_table`).
      axis_sizes: the mesh's axis sizes.

    Returns:
      ``(spec, reason)``: the spec (single axes bare, trailing ``None`` dropped)
      and one line naming the row that decided each dim and every row skipped.

    Raises:
      ShardingRuleError: ``names`` is longer than the rank, or repeats a name.

    Example:
      >>> table = canonical_logical_table([("mlp", "tp"), ("embed", "tp"), ("embed", "fsdp")])
      >>> resolve_logical_axes(("embed", "mlp"), (1024, 4096), table, {"fsdp": 2, "tp": 4})[0]
      P('fsdp', 'tp')
      >>> spec, reason = resolve_logical_axes(("embed", "mlp"), (1024, 1001), table, {"fsdp": 2, "tp": 8})
      >>> spec
      P('tp',)
      >>> for part in reason.split("; "): print(part)
      logical ('embed', 'mlp'): dim 0 'embed' <- 'tp'(8) (row #1)
      dim 1 'mlp' -> replicated (no row applies)
      skipped: row #0 'mlp'->'tp': 'tp'(8) does not divide dim 1 (1001)
      row #2 'embed'->'fsdp': dim 0 already decided
    """
    names = canonical_logical_names(names)
    shape = as_shape(shape, "shape")
    table = canonical_logical_table(table)
    axis_sizes = canonical_axis_sizes(axis_sizes)
    if len(names) > len(shape):
        raise ShardingRuleError(
            f"logical names {names} have {len(names)} entries but the leaf has shape {tuple(shape)} "
            f"(rank {len(shape)}); give at most one name (or None) per dim."
        )
    # Like a PartitionSpec, names may stop early: the trailing dims are unnamed (flax reads P() so).
    names = names + (None,) * (len(shape) - len(names))
    position = {n: d for d, n in enumerate(names) if n is not None}
    result: list[Any] = [None if n is None else _UNASSIGNED for n in names]
    decided_by: dict[int, int] = {}
    used: set[str] = set()
    skipped: list[str] = []
    for k, (name, axes) in enumerate(table):
        dim = position.get(name)
        if dim is None:
            continue
        row = _row_text(k, name, axes)
        if result[dim] is not _UNASSIGNED:
            skipped.append(f"{row}: dim {dim} already decided")
            continue
        missing = [a for a in axes if a not in axis_sizes]
        if missing:
            skipped.append(f"{row}: the mesh has no axis {missing[0]!r}")
            continue
        taken = [a for a in axes if a in used]
        if taken:
            skipped.append(f"{row}: {taken[0]!r} is already used by this array")
            continue
        split = math.prod(axis_sizes[a] for a in axes)
        if shape[dim] % split:
            skipped.append(f"{row}: {_fmt(axes, axis_sizes)} does not divide dim {dim} ({shape[dim]})")
            continue
        result[dim] = axes
        decided_by[dim] = k
        used.update(axes)
    parts = []
    for d, n in enumerate(names):
        if n is None:
            continue
        if result[d] is _UNASSIGNED:
            parts.append(f"dim {d} {n!r} -> replicated (no row applies)")
        elif not result[d]:
            parts.append(f"dim {d} {n!r} -> replicated (row #{decided_by[d]})")
        else:
            parts.append(f"dim {d} {n!r} <- {_fmt(result[d], axis_sizes)} (row #{decided_by[d]})")
    entries = [() if e is _UNASSIGNED or e is None else e for e in result]
    reason = f"logical {names}: " + ("; ".join(parts) or "no named dims")
    if skipped:
        reason += "; skipped: " + "; ".join(skipped)
    return spec_from_entries(entries), reason


def _canonical_patterns(patterns: Any) -> tuple[tuple[str, LogicalNames], ...]:
    rows = list(patterns.items()) if isinstance(patterns, Mapping) else patterns
    if isinstance(rows, str) or not isinstance(rows, Sequence):
        raise MeshplanTypeError(f"patterns={patterns!r} must be a sequence of (regex, logical names) pairs.")
    out, problems = [], []
    for k, row in enumerate(rows):
        if not (isinstance(row, tuple | list) and len(row) == 2 and isinstance(row[0], str)):
            problems.append(f"pattern #{k} {row!r} is not a (regex, logical names) pair")
            continue
        try:
            re.compile(row[0])
        except re.error as err:
            problems.append(f"pattern #{k} {row[0]!r} is not a valid regex ({err})")
            continue
        out.append((row[0], canonical_logical_names(row[1], f"pattern #{k} {row[0]!r} names")))
    if problems:
        raise ShardingRuleError("invalid logical-name patterns: " + "; ".join(problems) + ".")
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class LogicalRule:
    """Logical names per leaf, resolved through an ordered logical table (see the module docstring).

    Attributes:
      table: ordered ``(logical name, mesh axes)`` rows (flax / MaxText form;
        see :func:`canonical_logical_table`).
      names: path -> logical names (a tree of names goes through
        :func:`logical_names_by_path`).
      patterns: ``(regex, names)`` rows for leaves ``names`` lacks; the first
        row whose regex is found in the path wins.
      fallback: the rule for leaves with no names (no opinion when ``None``).
      mesh_axes: the mesh axes the table may name on any mesh, if known; a row
        naming another axis (a typo) is refused when the rule is built.
      name: the label on its decisions.

    Example:
      >>> import numpy as np
      >>> rule = LogicalRule([("embed", "fsdp"), ("mlp", "tp")], names={"w": ("embed", "mlp")})
      >>> from meshplan.pure import plan_tree
      >>> plan_tree({"w": np.zeros((8, 16))}, rule, {"fsdp": 2, "tp": 4}).specs
      {'w': P('fsdp', 'tp')}
    """

    table: LogicalTable
    names: Mapping[str, LogicalNames] = dataclasses.field(default_factory=dict)
    patterns: tuple[tuple[str, LogicalNames], ...] = ()
    fallback: Rule | None = None
    mesh_axes: tuple[str, ...] | None = None
    name: str = "logical"
    _compiled: tuple[re.Pattern[str], ...] = dataclasses.field(default=(), repr=False, compare=False)
    shape_only: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", canonical_logical_table(self.table))
        if not isinstance(self.names, Mapping):
            raise MeshplanTypeError(f"names={self.names!r} must map leaf paths to logical names; "
                                    "a tree of names goes through logical_names_by_path(tree).")
        names = {}
        for path, value in self.names.items():
            if not isinstance(path, str):
                raise MeshplanTypeError(f"names key {path!r} must be a leaf path string ('a/b/kernel').")
            names[normalize_path(path)] = canonical_logical_names(value, f"logical names of {path!r}")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "patterns", _canonical_patterns(self.patterns))
        object.__setattr__(self, "_compiled", tuple(re.compile(p) for p, _ in self.patterns))
        if self.fallback is not None:
            as_rule(self.fallback, "fallback")
        as_str(self.name, "name", error=ShardingRuleError)
        if self.mesh_axes is not None:
            known = tuple(as_str(a, f"mesh_axes[{i}]", error=ShardingRuleError)
                          for i, a in enumerate(as_sequence(self.mesh_axes, "mesh_axes")))
            object.__setattr__(self, "mesh_axes", known)
            unknown = [(k, n, a) for k, (n, axes) in enumerate(self.table) for a in axes if a not in known]
            if unknown:
                listed = ", ".join(f"row #{k} {n!r} names {a!r}" for k, n, a in unknown)
                raise ShardingRuleError(f"logical table: {listed}; the mesh axes are {list(known)}. "
                                        "Fix the axis names or drop those rows.")

    @property
    def reads_axes(self) -> tuple[str, ...] | None:
        """The axes the table names plus the fallback's (``None``: possibly all)."""
        fallback = () if self.fallback is None else reads_axes(self.fallback)
        if fallback is None:
            return None
        return tuple(dict.fromkeys([*(a for _, axes in self.table for a in axes), *fallback]))

    def names_for(self, path: str) -> LogicalNames | None:
        """The logical names of the leaf at ``path`` (``None``: it has none).

        Example:
          >>> LogicalRule([], patterns=[("q_proj", ("heads", "embed"))]).names_for("layers/0/q_proj/weight")
          ('heads', 'embed')
        """
        key = normalize_path(as_str(path, "path", error=ShardingRuleError))
        found = self.names.get(key)
        if found is not None:
            return found
        for (_, names), pattern in zip(self.patterns, self._compiled, strict=True):
            if pattern.search(key):
                return names
        return None

    def problems(self, leaves: Sequence[tuple[str, Shape]], axis_names: Sequence[str]) -> list[str]:
        """What is wrong with this rule for a tree, before any mesh (read by ``check_rule``).

        Rows naming an axis outside ``axis_names`` (unless ``mesh_axes`` declared
        the axes when the rule was built), names or patterns that match no leaf,
        and names longer than their leaf's rank; then the fallback's problems.
        """
        # A hook check_rule calls with checked values; called by hand, its arguments are checked here.
        axis_names = tuple(as_str(a, f"axis_names[{i}]") for i, a in enumerate(as_sequence(axis_names, "axis_names")))
        pairs = [as_sequence(leaf, f"leaves[{i}]") for i, leaf in enumerate(as_sequence(leaves, "leaves"))]
        bad = [i for i, pair in enumerate(pairs) if len(pair) != 2]
        if bad:
            raise MeshplanTypeError(f"leaves[{bad[0]}]={pairs[bad[0]]!r:.80} must be a (path, shape) pair.")
        leaves = [(as_str(p, f"leaves[{i}][0]"), as_shape(shape, f"leaves[{i}][1]"))
                  for i, (p, shape) in enumerate(pairs)]
        where = f"rule {self.name!r}"
        out = []
        if self.mesh_axes is None:
            for k, (name, axes) in enumerate(self.table):
                unknown = [a for a in axes if a not in axis_names]
                if unknown:
                    out.append(f"{where} row #{k} {name!r} -> {list(axes)}: {unknown} are not axes of the mesh; "
                               f"valid axes: {list(axis_names)} (a table for several meshes lists its axes "
                               "in mesh_axes=...)")
        paths = [normalize_path(p) for p, _ in leaves]
        shown = ", ".join(repr(p) for p in paths[:3])
        for path in self.names:
            if path not in paths:
                out.append(f"{where}: names for {path!r}, but no leaf has that path (paths such as {shown})")
        for k, ((regex, _), pattern) in enumerate(zip(self.patterns, self._compiled, strict=True)):
            if not any(pattern.search(p) for p in paths):
                out.append(f"{where} pattern #{k} {regex!r}: matches no leaf (re.search on paths such as {shown})")
        for (path, shape), key in zip(leaves, paths, strict=True):
            names = self.names_for(key)
            if names is not None and len(names) > len(shape):
                out.append(f"{where}: leaf {path!r} of shape {shape} has {len(names)} logical names {names}; "
                           f"give at most {len(shape)}")
        return out + _problems(self.fallback, leaves, axis_names)

    def group_key(self, ctx: LeafContext) -> Hashable:
        """Equal keys, equal decisions: the leaf's names and shape (or the fallback's key)."""
        ctx = as_context(ctx)
        names = self.names_for(ctx.path)
        if names is not None:
            return ("logical", names, ctx.shape)
        if self.fallback is None:
            return ("none",)
        return ("fallback", group_key_fn(self.fallback)(ctx))

    def __call__(self, ctx: LeafContext) -> Decision | None:
        names = self.names_for(ctx.path)
        if names is None:
            return None if self.fallback is None else self.fallback(ctx)
        try:
            spec, reason = resolve_logical_axes(names, ctx.shape, self.table, ctx.axis_sizes)
        except ShardingRuleError as err:
            raise ShardingRuleError(f"{ctx.path}: {err}") from None
        return Decision(spec, reason, self.name)

    def __repr__(self) -> str:
        fallback = "" if self.fallback is None else f", fallback={rule_name(self.fallback)!r}"
        return (f"LogicalRule({len(self.table)} rows, {len(self.names)} named leaves, "
                f"{len(self.patterns)} patterns{fallback})")


def logical_rule_from_json(data: Any, *, fallback: Rule | None = None,
                           mesh_axes: Sequence[str] | None = None) -> LogicalRule:
    """A :class:`LogicalRule` from its JSON form (``meshplan plan --rules FILE``).

    The form is an object with ``"logical_axis_rules"`` (MaxText's key: a list
    of ``[logical name, mesh axes]`` rows) and the names, as
    ``"logical_names"``: a list of ``[regex, [name or null, ...]]`` rows
    and/or an object ``{path: [name, ...]}``.

    Raises:
      MeshplanTypeError: the data is not of that form.
      ShardingRuleError: a bad row or regex, or (with ``mesh_axes``) an unknown axis.

    Example:
      >>> rule = logical_rule_from_json({"logical_axis_rules": [["embed", "fsdp"], ["mlp", "tp"]],
      ...                                "logical_names": [["down_proj", ["embed", "mlp"]]]})
      >>> rule.names_for("model/layers/0/mlp/down_proj/weight")
      ('embed', 'mlp')
    """
    if not isinstance(data, Mapping) or "logical_axis_rules" not in data:
        raise MeshplanTypeError(
            "a logical rules object needs 'logical_axis_rules' (a list of [logical name, mesh axes] rows) "
            f"and 'logical_names'; got {data!r}."
        )
    unknown = sorted(set(data) - {"logical_axis_rules", "logical_names"})
    if unknown:
        raise MeshplanTypeError(f"unknown keys {unknown} in a logical rules object; "
                                "expected 'logical_axis_rules' and 'logical_names'.")
    raw_names = data.get("logical_names", [])
    names: Mapping[str, Any] = raw_names if isinstance(raw_names, Mapping) else {}
    patterns: Any = [] if isinstance(raw_names, Mapping) else raw_names
    return LogicalRule(data["logical_axis_rules"], names=dict(names), patterns=patterns, fallback=fallback,
                       mesh_axes=None if mesh_axes is None else as_sequence(mesh_axes, "mesh_axes"))
