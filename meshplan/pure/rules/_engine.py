"""Plans: a rule applied to a whole pytree, with the reason for every spec.

:func:`plan_tree` walks the tree once. Rules that declare ``shape_only`` are
asked once per distinct ``(shape, dtype)`` and their answer is reused for
every leaf that shares it; other rules are asked per leaf. Leaf paths are
formatted only when something needs them (an error message, ``explain``,
a rule reading ``ctx.path``), because formatting 50k key paths costs more
than planning them.

What happens to each kind of leaf (see :mod:`meshplan.pure.specs._tree` for what
counts as an array):

* array-like leaves get the rule's spec, or ``P()`` when the rule has no
  opinion (their decision is then ``None``);
* ``None`` is an empty subtree in jax and stays ``None``;
* non-array leaves (strings, arbitrary objects) are copied unchanged into
  ``Plan.specs`` and have no decision.

A rule that reads paths but promises the same answer for every leaf of one
path template (``template_group``, e.g. :class:`~meshplan.pure.AxisKindRule`)
is asked once per (template, shape, dtype): the templates are read off the
tree's structure, each distinct subtree once, so a DeepSeek-V3 tree with one
leaf per expert (45k leaves, 23 groups) is asked 23 times, not 45k.
Where that rule refuses a leaf, the tree is planned leaf by leaf instead, so
the error lists every refused leaf as it always has.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import operator
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_str, canonical_axis_sizes
from meshplan.pure._types import PyTree, make_spec
from meshplan.pure.errors import MeshplanTypeError, PlanError, ShardingRuleError
from meshplan.pure.rules._base import (
    as_rule,
    LEAF_ERRORS,
    Decision,
    LeafContext,
    Rule,
    ask,
    declared_template_group,
    is_shape_only,
    rule_name,
)
from meshplan.pure.specs._tree import LeafInfo, TreeFacts, tree_facts

__all__ = ["Plan", "plan_from_specs", "plan_tree"]

_REPLICATED = make_spec()
_MAX_LISTED = 10
# A rule's errors about leaves (LEAF_ERRORS) are collected and raised once;
# type errors (a misconfigured rule) propagate at once.
_Failure = list[Any]  # [first leaf index, error, leaves sharing it]


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Plan:
    """A spec for every leaf of a tree, and why.

    Attributes:
      specs: the spec tree (same structure as the planned tree).
      facts: the planned tree's :class:`TreeFacts` (structure, leaf facts, paths).
      leaf_decisions: per flattened leaf, the :class:`Decision` (``None`` when
        the leaf is not an array or the rule had no opinion).
      leaf_specs: per flattened leaf, its entry in ``specs``.
      axis_sizes: the mesh axis sizes planned against.
      rule: the name of the rule that made the plan.

    Example:
      >>> import jax, numpy as np
      >>> from meshplan.pure import AutoRule
      >>> tree = {"w": jax.ShapeDtypeStruct((4096, 1024), np.float32), "b": np.zeros(3)}
      >>> plan = plan_tree(tree, AutoRule(), {"dp": 2, "tp": 4})
      >>> plan.specs
      {'b': P(), 'w': P('dp', 'tp')}
      >>> plan.explain("w")
      "w: (4096, 1024) float32 -> P('dp', 'tp') [auto] largest dims first: dim 0 (4096) <- 'dp'(2), dim 1 (1024) <- 'tp'(4)"
    """

    specs: PyTree
    facts: TreeFacts
    leaf_decisions: tuple[Decision | None, ...]
    leaf_specs: tuple[Any, ...]
    axis_sizes: Mapping[str, int]
    rule: str

    def __post_init__(self) -> None:
        # Cheap checks only: plan_tree builds one Plan per call, also for 50k-leaf trees.
        if not isinstance(self.facts, TreeFacts):
            raise MeshplanTypeError(f"Plan.facts={self.facts!r:.80} must be a TreeFacts (tree_facts(tree)).")
        n = len(self.facts.infos)
        for field in ("leaf_decisions", "leaf_specs"):
            value = getattr(self, field)
            if not isinstance(value, tuple) or len(value) != n:
                raise MeshplanTypeError(f"Plan.{field} must be a tuple of {n} entries (one per leaf), got "
                                        f"{value!r:.80}.")
        if not isinstance(self.rule, str):
            raise MeshplanTypeError(f"Plan.rule={self.rule!r:.80} must be a str (the rule's name).")
        object.__setattr__(self, "axis_sizes", canonical_axis_sizes(self.axis_sizes, "Plan.axis_sizes"))

    def __len__(self) -> int:
        return len(self.facts.infos)

    def __repr__(self) -> str:
        arrays = sum(info is not None for info in self.facts.infos)
        return f"Plan(rule={self.rule!r}, leaves={len(self)}, arrays={arrays}, axis_sizes={dict(self.axis_sizes)})"

    @property
    def treedef(self) -> Any:
        """The planned tree's structure."""
        return self.facts.treedef

    @property
    def infos(self) -> tuple[LeafInfo | None, ...]:
        """Per flattened leaf, its :class:`LeafInfo` (``None`` for non-array leaves)."""
        return self.facts.infos

    @property
    def decisions(self) -> PyTree:
        """The decisions as a tree of the planned tree's structure (``None`` where there is none)."""
        return self.facts.unflatten(self.leaf_decisions)

    def path(self, index: int) -> str:
        """The ``"a/b/0"`` path of flattened leaf ``index``."""
        return self.facts.path(index)

    def items(self) -> Iterator[tuple[str, Decision | None]]:
        """``(path, decision)`` for every array leaf, in flattened order."""
        for i, info in enumerate(self.facts.infos):
            if info is not None:
                yield self.facts.path(i), self.leaf_decisions[i]

    def counts(self) -> dict[str, int]:
        """How many array leaves each rule decided (``"none"``: no opinion, replicated)."""
        out: dict[str, int] = {}
        for info, decision in zip(self.facts.infos, self.leaf_decisions, strict=True):
            if info is not None:
                key = "none" if decision is None else decision.rule
                out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def explain(self, path: str) -> str:
        """One line saying which spec the leaf at ``path`` got and why.

        Raises:
          PlanError: no leaf has that path.
          MeshplanTypeError: ``path`` is not a str.
        """
        path = as_str(path, "path")
        for i in range(len(self)):
            if self.facts.path(i) == path:
                return self._explain_index(i)
        some = [self.facts.path(i) for i in range(min(len(self), 5))]
        raise PlanError(f"no leaf has path {path!r}; paths look like {some} (see Plan.items()).")

    def _explain_index(self, i: int) -> str:
        info, decision, path = self.facts.infos[i], self.leaf_decisions[i], self.facts.path(i)
        if info is None:
            return f"{path}: not an array leaf; kept as is"
        head = f"{path}: {info.shape} {info.dtype} -> "
        if decision is None:
            return head + f"P() [{self.rule}] no opinion; replicated"
        return head + f"{decision.spec!r} [{decision.rule}] {decision.reason}"


def _raise_failures(failures: dict[Hashable, _Failure], name: str) -> None:
    """Raise one error for every leaf a rule refused (grouped by shape for shape-only rules)."""
    items = list(failures.values())
    total = sum(count for _, _, count in items)
    first = items[0][1]
    if total == 1:
        raise first
    classes = {type(err) for _, err, _ in items}
    cls = type(first) if len(classes) == 1 else ShardingRuleError
    lines = []
    for _, err, count in items[:_MAX_LISTED]:
        more = f" (and {count - 1} more leaves with this shape and dtype)" if count > 1 else ""
        lines.append(f"{err}{more}")
    if len(items) > _MAX_LISTED:
        lines.append(f"... and {len(items) - _MAX_LISTED} more")
    raise cls(f"rule {name!r} could not plan {total} leaves:\n  - " + "\n  - ".join(lines)) from first


def plan_tree(tree: PyTree, rule: Rule, axis_sizes: Mapping[str, int], *, x64: bool = False) -> Plan:
    """Apply a pure rule to every leaf of ``tree``.

    Args:
      tree: any pytree; leaves are read for shape and dtype only.
      rule: a pure rule (``rule(ctx) -> Decision | None``); see
        :mod:`meshplan.pure.rules._base`.
      axis_sizes: ordered mapping mesh axis name -> size.
      x64: whether Python scalar leaves count as 64-bit.

    Returns:
      A :class:`Plan`. Leaves where the rule has no opinion are replicated.

    Raises:
      ShardingRuleError, MemoryBudgetError, SpecError: the rule refused some
        leaves; one error lists them all (with their paths).
      MeshplanTypeError: ``rule`` is not callable or returned something other
        than a Decision or None.

    Example:
      >>> import jax, numpy as np
      >>> from meshplan.pure import AutoRule
      >>> layer = {"w": jax.ShapeDtypeStruct((512, 512), np.float32)}
      >>> plan = plan_tree([layer] * 3, AutoRule(), {"tp": 4})
      >>> [spec["w"] for spec in plan.specs]
      [P('tp',), P('tp',), P('tp',)]
      >>> plan.counts()
      {'auto': 3}
    """
    rule = as_rule(rule)
    sizes = canonical_axis_sizes(axis_sizes)
    name = rule_name(rule)
    shape_only = is_shape_only(rule)
    facts = tree_facts(tree, x64=x64)
    infos = facts.infos
    # Leaves are matched to answers by the identity of their LeafInfo: tree_facts shares one between
    # equal array leaves (a 50k-leaf tree has a few dozen), and id() lookups in C-level map() calls
    # cost a fraction of a Python loop. (None, the non-array marker, is one object too.)
    ids = list(map(id, infos))
    failures: dict[Hashable, _Failure] = {}
    has_non_arrays = False
    decisions: Sequence[Decision | None]
    specs: Sequence[Any]
    if shape_only:
        decisions, specs, has_non_arrays = _plan_by_shape(rule, facts, sizes, ids, failures)
    elif (by_template := _plan_by_template(rule, facts, sizes, ids)) is not None:
        decisions, specs, has_non_arrays = by_template
    else:
        leaf_decisions: list[Decision | None] = []
        leaf_specs: list[Any] = []
        for i, info in enumerate(infos):
            if info is None:
                has_non_arrays = True
                decision, spec = None, None
            else:
                decision, spec = _decide(rule, LeafContext(info.shape, info.dtype, sizes, i, facts), i, failures)
            leaf_decisions.append(decision)
            leaf_specs.append(spec)
        decisions, specs = leaf_decisions, leaf_specs
    if failures:
        _raise_failures(failures, name)
    if has_non_arrays:
        # Non-array leaves are copied into the spec tree unchanged.
        filled = list(specs)
        leaves = facts.treedef.flatten_up_to(facts.source)
        for i, info in enumerate(infos):
            if info is None:
                filled[i] = leaves[i]
        specs = filled
    return Plan(facts.unflatten(specs), facts, tuple(decisions), tuple(specs), sizes, name)


def _lookup(table: dict[Any, Any], ids: Sequence[Hashable]) -> tuple[Any, ...]:
    """``tuple(table[i] for i in ids)``, in one C-level pass (itemgetter)."""
    if len(ids) < 2:
        return tuple(table[i] for i in ids)
    found: tuple[Any, ...] = operator.itemgetter(*ids)(table)
    return found


def _plan_by_shape(rule: Rule, facts: TreeFacts, sizes: Mapping[str, int], ids: list[int],
                   failures: dict[Hashable, _Failure]) -> tuple[tuple[Decision | None, ...], tuple[Any, ...], bool]:
    """Decisions and specs per leaf, asking ``rule`` once per distinct (shape, dtype), and whether the
    tree has non-array leaves; refusals go to ``failures`` with the number of leaves sharing each."""
    infos = facts.infos
    by_key: dict[Any, tuple[Decision | None, PartitionSpec]] = {}
    decision_of: dict[int, Decision | None] = {}
    spec_of: dict[int, Any] = {}
    key_of: dict[int, Any] = {}
    i = 0
    for uid in dict.fromkeys(ids):  # in the order of their first leaves, so each search goes on from the last
        i = ids.index(uid, i)  # the first leaf with this info (named in messages): one pass in all
        info = infos[i]
        if info is None:
            decision_of[uid], spec_of[uid] = None, None
            continue
        # Equal infos built separately (boxes, scalars) share one answer.
        key = key_of[uid] = (info.shape, info.dtype)
        if key not in by_key:
            by_key[key] = _decide(rule, LeafContext(info.shape, info.dtype, sizes, i, facts), key, failures)
        decision_of[uid], spec_of[uid] = by_key[key]
    if failures:  # how many leaves share each refused (shape, dtype), in one pass
        for entry in failures.values():
            entry[2] = 0
        for uid, count in collections.Counter(ids).items():
            if (refused := failures.get(key_of.get(uid))) is not None:
                refused[2] += count
    return _lookup(decision_of, ids), _lookup(spec_of, ids), id(None) in decision_of


def _plan_by_template(rule: Rule, facts: TreeFacts, sizes: Mapping[str, int], ids: list[int]
                      ) -> tuple[tuple[Decision | None, ...], tuple[Any, ...], bool] | None:
    """Decisions and specs per leaf, asking ``rule`` once per (template, shape, dtype) where its
    ``template_group`` allows (once per leaf elsewhere), and whether the tree has non-array leaves;
    None when the rule makes no such promise or refused a leaf (the caller then plans leaf by leaf)."""
    grouped = declared_template_group(rule)
    if grouped is None:
        return None
    table, codes = facts.template_codes()
    kinds = {uid: k for k, uid in enumerate(dict.fromkeys(ids))}  # a LeafInfo (or None) -> a small int
    n_kinds = len(kinds)
    # A leaf's key, an int: template * n_kinds + kind where the promise holds, else -1 - its index.
    keys: list[int] = list(map(operator.add, map(operator.mul, codes, itertools.repeat(n_kinds)),
                               map(kinds.__getitem__, ids)))
    ok = [grouped(t) is True for t in table]
    if not all(ok):
        keys = [key if ok[code] else -1 - i for i, (key, code) in enumerate(zip(keys, codes, strict=True))]
    # key -> its first leaf (named in messages; its path is the one the rule reads), in one C-level pass.
    first = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1), strict=True))
    decision_of: dict[int, Decision | None] = {}
    spec_of: dict[int, Any] = {}
    failures: dict[Hashable, _Failure] = {}
    infos = facts.infos
    for key in dict.fromkeys(keys):
        i = first[key]
        info = infos[i]
        if info is None:
            decision_of[key], spec_of[key] = None, None
        else:
            decision_of[key], spec_of[key] = _decide(
                rule, LeafContext(info.shape, info.dtype, sizes, i, facts), i, failures)
    if failures:
        return None
    return _lookup(decision_of, keys), _lookup(spec_of, keys), id(None) in kinds


def _decide(rule: Rule, ctx: LeafContext, key: Hashable,
            failures: dict[Hashable, _Failure]) -> tuple[Decision | None, PartitionSpec]:
    try:
        decision = ask(rule, ctx)
    except LEAF_ERRORS as err:
        failures[key] = [ctx.index, err, 1]
        return None, _REPLICATED
    return decision, _REPLICATED if decision is None else decision.spec


def plan_from_specs(
    tree: PyTree,
    specs: PyTree,
    *,
    rule: str = "given",
    reason: str = "given spec",
    axis_sizes: Mapping[str, int] | None = None,
    x64: bool = False,
) -> Plan:
    """A :class:`Plan` for specs decided elsewhere (a user's ``apply``, a saved plan).

    Args:
      tree: the pytree the specs are for.
      specs: a tree of the same structure with a PartitionSpec (or ``None``,
        read as ``P()``) at each array leaf.
      rule: the name recorded in each decision.
      reason: the reason recorded in each decision.
      axis_sizes: the mesh the specs are for, if known (recorded only; not validated).
      x64: whether Python scalar leaves count as 64-bit.

    Returns:
      A plan whose decisions all say ``reason``.

    Raises:
      ShardingRuleError: ``specs`` does not have the tree's structure.
      MeshplanTypeError: an array leaf's spec is not a PartitionSpec.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> plan = plan_from_specs({"w": np.zeros((4, 4))}, {"w": P("dp")}, rule="mine")
      >>> plan.explain("w")
      "w: (4, 4) float64 -> P('dp',) [mine] given spec"
    """
    facts = tree_facts(tree, x64=x64)
    try:
        given = facts.treedef.flatten_up_to(specs)
    except ValueError as err:
        raise ShardingRuleError(
            f"rule {rule!r} returned specs whose structure does not match the tree: {err}. "
            "Return one PartitionSpec per array leaf, in a tree of the same structure."
        ) from None
    decisions: list[Decision | None] = []
    out: list[Any] = []
    for i, (info, spec) in enumerate(zip(facts.infos, given, strict=True)):
        if info is None:
            decisions.append(None)
            out.append(spec)
            continue
        if spec is None:
            spec = _REPLICATED
        if not isinstance(spec, PartitionSpec):
            raise MeshplanTypeError(f"{facts.path(i)}: rule {rule!r} gave {spec!r}, not a PartitionSpec.")
        decisions.append(Decision(spec, reason, rule))
        out.append(spec)
    sizes = canonical_axis_sizes({} if axis_sizes is None else axis_sizes)
    return Plan(facts.unflatten(out), facts, tuple(decisions), tuple(out), sizes, rule)
