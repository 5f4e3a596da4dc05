"""Spec validation: does a tree of PartitionSpecs fit a value tree and a mesh?

Every problem becomes a :class:`Finding` naming the leaf path. Checks, in
the order findings are reported:

* ``structure``: a value leaf with no spec, or a spec with no value. The spec
  tree may be a *prefix* of the value tree (one spec for a whole subtree, as
  ``device_put`` allows); ``None`` value leaves are empty subtrees and are
  skipped; a ``None`` spec means replicated (``P()``).
* ``not_a_spec``: a spec leaf that is not a ``PartitionSpec``.
* ``bad_entry``: a spec entry that is not None, an axis name, a tuple of
  names or ``P.UNCONSTRAINED``.
* ``non_array``: a non-array leaf (a string, an object) with a spec that
  shards something.
* ``rank``: a spec longer than the array's rank.
* ``unknown_axis`` / ``repeated_axis``: a name not in the mesh, or used twice.
* ``indivisible``: a dim that is not a multiple of its split. jax refuses to
  store such arrays (``device_put`` raises), so it is an error with
  ``for_storage=True``; inside ``jit`` XLA pads it, so ``for_storage=False``
  reports it as a warning.
* ``unconstrained``: ``P.UNCONSTRAINED`` in a spec for a stored array (only
  ``with_sharding_constraint`` inside ``jit`` can honour it).

Each distinct ``(shape, spec)`` pair is checked once and paths are formatted
only for leaves with findings, so a 50k-leaf tree costs about one walk.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import jax
from jax.sharding import PartitionSpec

from meshplan.pure.specs._geometry import UNCONSTRAINED, canonical_entries
from meshplan.pure.specs._tree import LeafInfo, TreeFacts, flatten, flatten_with_path, path_str, tree_facts
from meshplan.pure._check import as_choice, as_flag, as_str, canonical_axis_sizes
from meshplan.pure._types import AxisSizes, PyTree
from meshplan.pure.errors import MeshplanTypeError, SpecError

__all__ = [
    "FINDING_KINDS", "Finding", "leaf_specs", "validate_specs", "check_specs", "raise_errors",
    "resolve_specs", "group_leaves",
]

FINDING_KINDS = (
    "structure", "not_a_spec", "bad_entry", "non_array", "rank", "unknown_axis", "repeated_axis",
    "indivisible", "unconstrained",
)
_SEVERITIES = ("error", "warning")
# Messages are built once per distinct (shape, spec) with this placeholder for
# the leaf path, then filled in per leaf (replace, not format: reprs of bad
# entries may hold braces).
_P = "\x00"


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One problem with one leaf's spec; ``str(finding)`` is the message.

    Attributes:
      path: the leaf path (``"a/b/0"``; ``""`` for the root).
      kind: one of :data:`FINDING_KINDS`.
      message: a full sentence naming the path, the values and a fix.
      severity: ``"error"`` (jax would refuse it) or ``"warning"`` (works, but
        costs padding).
    """

    path: str
    kind: str
    message: str
    severity: str = "error"

    def __post_init__(self) -> None:
        as_choice(self.kind, "kind", FINDING_KINDS)
        as_choice(self.severity, "severity", _SEVERITIES)
        for field in ("path", "message"):
            as_str(getattr(self, field), field)

    def __str__(self) -> str:
        return self.message


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def _match_by_path(facts: TreeFacts, specs: PyTree) -> tuple[list[Any], list[Finding]]:
    """Slow path: pair value leaves with specs by key path, allowing a spec prefix tree."""
    spec_items, _ = flatten_with_path(specs, "specs", is_leaf=_is_spec_leaf)
    by_path = {tuple(k): s for k, s in spec_items}
    value_items, _ = jax.tree_util.tree_flatten_with_path(facts.source, is_leaf=lambda x: x is None)
    findings: list[Finding] = []
    out: list[Any] = []
    covered: set[tuple[Any, ...]] = set()
    for keypath, value in value_items:
        keypath = tuple(keypath)
        for n in range(len(keypath) + 1):
            covered.add(keypath[:n])
        if value is None:  # an empty subtree: nothing to place
            continue
        for n in range(len(keypath), -1, -1):
            if keypath[:n] in by_path:
                out.append(by_path[keypath[:n]])
                break
        else:
            p = path_str(keypath)
            out.append(None)
            findings.append(Finding(p, "structure", f"leaf {p!r} has no spec in the spec tree; add one "
                                    "(the spec tree must mirror the value tree, or be a prefix of it)."))
    for keypath, _ in spec_items:
        if tuple(keypath) not in covered:
            p = path_str(keypath)
            findings.append(Finding(p, "structure", f"spec at {p!r} matches no leaf of the value tree; "
                                    "remove it or fix the key."))
    return out, findings


def leaf_specs(facts: TreeFacts, specs: PyTree) -> tuple[tuple[Any, ...], list[Finding]]:
    """The spec of every leaf of ``facts`` (``None`` where there is none) and structure findings.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> facts = tree_facts({"a": np.zeros(4), "b": {"c": np.zeros(2), "d": np.zeros(2)}})
      >>> leaf_specs(facts, {"a": P("x"), "b": P()})
      ((P('x',), P(), P()), [])
    """
    spec_leaves, spec_def = flatten(specs, "specs")
    if spec_def == facts.treedef:  # the common case: the same structure, PartitionSpec leaves
        return tuple(spec_leaves), []
    out, findings = _match_by_path(facts, specs)
    return tuple(out), findings


def _raw_entries(spec: PartitionSpec, where: str) -> tuple[tuple[Any, ...] | None, str | None]:
    try:
        return canonical_entries(spec, where=where), None
    except MeshplanTypeError as err:
        return None, str(err)


def _check_pair(
    shape: tuple[int, ...], spec: PartitionSpec, axis_sizes: AxisSizes, for_storage: bool
) -> tuple[tuple[str, str, str], ...]:
    """Problems of one (shape, spec) pair as (kind, severity, text), ``_P`` standing for the path."""
    entries, bad = _raw_entries(spec, _P)
    if entries is None:
        return (("bad_entry", "error", f"leaf {bad}"),)
    out: list[tuple[str, str, str]] = []
    rank = len(shape)
    if len(entries) > rank:
        out.append(("rank", "error", f"leaf {_P} has shape {shape} (rank {rank}) but spec {spec} has "
                    f"{len(entries)} entries; drop the extra entries."))
    seen: set[str] = set()
    axes_ok = True
    for dim, entry in enumerate(entries):
        if entry is UNCONSTRAINED:
            if for_storage:
                out.append(("unconstrained", "error", f"leaf {_P}: spec {spec} has P.UNCONSTRAINED at "
                            f"dim {dim}, which a stored array cannot honour; name the axes or use None "
                            "(UNCONSTRAINED only works in with_sharding_constraint inside jit)."))
            continue
        for axis in entry:
            if axis not in axis_sizes:
                axes_ok = False
                out.append(("unknown_axis", "error", f"leaf {_P}: spec {spec} uses mesh axis {axis!r} "
                            f"at dim {dim}, which is not in the mesh; mesh axes are {list(axis_sizes)}."))
            elif axis in seen:
                axes_ok = False
                out.append(("repeated_axis", "error", f"leaf {_P}: spec {spec} uses mesh axis {axis!r} "
                            f"more than once (again at dim {dim}); each mesh axis may shard one dim."))
            seen.add(axis)
    if not axes_ok or len(entries) > rank:
        return tuple(out)
    for dim, entry in enumerate(entries):
        if entry is UNCONSTRAINED or not entry:
            continue
        n = math.prod(axis_sizes[a] for a in entry)
        d = shape[dim]
        if d % n:
            axes = entry[0] if len(entry) == 1 else entry
            if for_storage:
                out.append(("indivisible", "error", f"leaf {_P}: dim {dim} (size {d}) of shape {shape} "
                            f"does not divide by {n} (mesh axes {axes!r}) under spec {spec}; jax cannot "
                            f"store it: use None or another axis there, or pad the dim to a multiple of {n}."))
            else:
                out.append(("indivisible", "warning", f"leaf {_P}: dim {dim} (size {d}) of shape {shape} "
                            f"does not divide by {n} (mesh axes {axes!r}) under spec {spec}; inside jit XLA "
                            f"pads it to {-(-d // n) * n}."))
    return tuple(out)


def _trivial(spec: Any) -> bool:
    """True for a spec that shards nothing (None, or only None entries)."""
    return spec is None or (isinstance(spec, PartitionSpec) and all(e is None for e in spec))


def _leaf_problems(
    info: LeafInfo | None, spec: Any, axis_sizes: AxisSizes, for_storage: bool
) -> tuple[tuple[str, str, str], ...]:
    if spec is not None and not isinstance(spec, PartitionSpec):
        return (("not_a_spec", "error", f"leaf {_P}: spec {spec!r} ({type(spec).__name__}) is not a "
                 "PartitionSpec; use jax.sharding.PartitionSpec(...) (for a NamedSharding, its .spec)."),)
    if info is None:
        if _trivial(spec):
            return ()
        return (("non_array", "error", f"leaf {_P} is not an array (no shape/dtype) but has spec {spec}; "
                 "give it P() or None."),)
    if spec is None:
        return ()
    return _check_pair(info.shape, spec, axis_sizes, for_storage)


def group_leaves(
    infos: tuple[LeafInfo | None, ...], per_leaf: tuple[Any, ...]
) -> tuple[collections.Counter[tuple[int, Any]], dict[int, LeafInfo | None]] | None:
    """Count leaves per distinct (leaf kind, spec): ``(Counter[(id(info), spec)], {id: info})``.

    Keyed by ``id(info)``: tree_facts shares one LeafInfo per (shape, dtype),
    and hashing the dataclass per leaf would cost more than the checks. No
    per-leaf list is built: 50k live tuples would wake the cyclic GC, which
    then walks the whole tree. ``None`` when a spec leaf is unhashable.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> counts, by_id = group_leaves(tree_facts([np.zeros(2)] * 3).infos, (P("x"),) * 3)
      >>> list(counts.values())
      [3]
    """
    try:
        counts = collections.Counter(zip(map(id, infos), per_leaf, strict=True))
    except TypeError:  # an unhashable spec leaf (a list, a dict)
        return None
    return counts, dict(zip(map(id, infos), infos))


def _resolve(
    tree: PyTree | TreeFacts, specs: PyTree, axis_sizes: Any, *, for_storage: bool, x64: bool
) -> tuple[TreeFacts, tuple[Any, ...], list[Finding], Any]:
    """resolve_specs plus the leaf groups (for memory estimation to reuse)."""
    sizes = canonical_axis_sizes(axis_sizes)
    for_storage = as_flag(for_storage, "for_storage")
    facts = tree if isinstance(tree, TreeFacts) else tree_facts(tree, x64=x64)
    per_leaf, findings = leaf_specs(facts, specs)
    infos = facts.infos
    groups = group_leaves(infos, per_leaf)
    if groups is not None:
        counts, by_id = groups
        checked = {k: _leaf_problems(by_id[k[0]], k[1], sizes, for_storage) for k in counts}
        if not any(checked.values()):
            return facts, per_leaf, findings, groups
    # Some pair has problems: walk the leaves to name their paths.
    for i, (info, spec) in enumerate(zip(infos, per_leaf, strict=True)):
        if groups is not None:
            problems = checked[(id(info), spec)]
        else:
            problems = _leaf_problems(info, spec, sizes, for_storage)
        if problems:
            p = facts.path(i)
            findings.extend(Finding(p, kind, text.replace(_P, repr(p)), sev) for kind, sev, text in problems)
    return facts, per_leaf, findings, groups


def resolve_specs(
    tree: PyTree | TreeFacts, specs: PyTree, axis_sizes: Any, *, for_storage: bool, x64: bool = False
) -> tuple[TreeFacts, tuple[Any, ...], list[Finding]]:
    """Facts, per-leaf specs and findings in one pass (shared by validation and memory).

    Each distinct (leaf kind, spec) pair is checked once; leaves are walked
    in Python only when some pair has problems, to name their paths.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> facts, per_leaf, findings = resolve_specs([np.zeros(4)], [P("x")], {"x": 2}, for_storage=True)
      >>> per_leaf, findings
      ((P('x',),), [])
    """
    return _resolve(tree, specs, axis_sizes, for_storage=for_storage, x64=x64)[:3]


def validate_specs(
    tree: PyTree | TreeFacts,
    specs: PyTree,
    axis_sizes: AxisSizes,
    *,
    for_storage: bool = True,
    x64: bool = False,
) -> list[Finding]:
    """Every problem with ``specs`` for ``tree`` on a mesh of ``axis_sizes``.

    Args:
      tree: the value pytree (arrays, ShapeDtypeStructs ...) or its :class:`TreeFacts`.
      specs: a pytree of PartitionSpecs mirroring ``tree`` (or a prefix of it).
      axis_sizes: ordered mapping mesh axis name -> size.
      for_storage: True for arrays jax stores (``device_put``, jit in/out
        shardings): uneven dims and ``UNCONSTRAINED`` are errors. False for
        values inside ``jit``: uneven dims become padding warnings.
      x64: whether Python-scalar leaves are 64-bit.

    Returns:
      The findings, structure problems first, then per leaf in tree order
      (empty when every spec fits).

    Raises:
      MeshplanTypeError: ``axis_sizes`` is not a mapping of names to sizes >= 1.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> params = {"w": np.zeros((6, 8)), "b": np.zeros(8)}
      >>> for f in validate_specs(params, {"w": P("dp", "tp"), "b": P("mp")}, {"dp": 4, "tp": 2}):
      ...     print(f.kind, "|", f)
      unknown_axis | leaf 'b': spec P('mp',) uses mesh axis 'mp' at dim 0, which is not in the mesh; ...
      indivisible | leaf 'w': dim 0 (size 6) of shape (6, 8) does not divide by 4 (mesh axes 'dp') ...
    """
    return resolve_specs(tree, specs, axis_sizes, for_storage=for_storage, x64=x64)[2]


def check_specs(
    tree: PyTree | TreeFacts,
    specs: PyTree,
    axis_sizes: AxisSizes,
    *,
    for_storage: bool = True,
    x64: bool = False,
) -> list[Finding]:
    """Strict :func:`validate_specs`: raise once listing every error.

    Returns:
      The warnings (padding inside jit), if any.

    Raises:
      SpecError: at least one error finding; all are in the message and in
        the exception's ``findings`` attribute.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> check_specs({"w": np.zeros((5, 8))}, {"w": P("dp")}, {"dp": 2})
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.SpecError: 1 partition spec problem(s): ...
      >>> [f.kind for f in check_specs({"w": np.zeros((5, 8))}, {"w": P("dp")}, {"dp": 2}, for_storage=False)]
      ['indivisible']
    """
    findings = validate_specs(tree, specs, axis_sizes, for_storage=for_storage, x64=x64)
    raise_errors(findings)
    return findings


def raise_errors(findings: list[Finding], *, limit: int = 50) -> None:
    """Raise one SpecError listing every error finding (the first ``limit`` in the message)."""
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        shown = [f"  - {f}" for f in errors[:limit]]
        if len(errors) > limit:
            shown.append(f"  ... and {len(errors) - limit} more (see the exception's .findings)")
        err = SpecError(f"{len(errors)} partition spec problem(s):\n" + "\n".join(shown))
        err.findings = errors  # type: ignore[attr-defined]
        raise err
