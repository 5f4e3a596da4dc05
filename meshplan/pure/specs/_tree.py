"""Pytrees as plain facts: each leaf's path, shape and dtype.

Planners never look at array *values*, only at ``(shape, dtype)``; this module
is the one place that decides what counts as an array-like leaf:

* anything with ``.shape`` and ``.dtype`` (``jax.Array``, ``numpy.ndarray``,
  ``jax.ShapeDtypeStruct``);
* a *box*: an object without ``.shape`` whose ``.value`` has both (flax's
  ``Partitioned``, ``nnx.Variable`` when not registered as a pytree node);
* Python scalars (``bool``, ``int``, ``float``, ``complex``) as 0-d arrays of
  jax's default dtypes (32-bit unless ``x64=True``);
* ``None`` is an empty subtree in jax and stays ``None`` in every output tree.

Anything else (strings, custom objects, numpy scalar *types* such as
``np.float32`` in a config-like tree, objects without both a ``.shape`` and a
``.dtype``) is a *non-array leaf*: it has no facts, and rules give it no spec.
A leaf with a ``.shape`` and a ``.dtype`` is an array whichever they are, so a
shape that is not a tuple of ints >= 0 (``"abc"``, ``(-4, 4)``) or a dtype
that is not one is an error (:class:`~meshplan.errors.MeshplanTypeError`,
naming the leaf), never a leaf kept as is.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import operator
import re
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np

from meshplan.pure._check import as_flag, as_shape
from meshplan.pure._types import PyTree, Shape
from meshplan.pure.errors import MeshplanError, MeshplanTypeError
from meshplan.pure.specs._dtypes import canonical_dtype, dtype_bits

__all__ = ["LeafInfo", "TreeFacts", "flatten", "flatten_with_path", "leaf_info", "tree_facts", "path_str",
           "path_strs", "path_template"]

_SCALAR_DTYPES_32 = {bool: np.dtype(bool), int: np.dtype(np.int32), float: np.dtype(np.float32),
                     complex: np.dtype(np.complex64)}
_SCALAR_DTYPES_64 = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64),
                     complex: np.dtype(np.complex128)}


@dataclasses.dataclass(frozen=True, slots=True)
class LeafInfo:
    """The facts a planner may use about one array-like leaf.

    ``dtype`` is a ``numpy.dtype``, or jax's extended dtype for PRNG-key
    arrays (``key<fry>``); size it with :func:`meshplan.pure.dtype_bits`.
    """

    shape: Shape
    dtype: Any


def _has_array_facts(x: Any) -> bool:
    # A class (np.float32, a config's dtype entry) has .shape and .dtype as
    # descriptors, not values: it is not an array.
    return not isinstance(x, type) and hasattr(x, "shape") and hasattr(x, "dtype")


def _array_info(x: Any) -> LeafInfo:
    # An object with a .shape and a .dtype is an array to planners: its shape must be one
    # (a string or a negative dim is a typed error naming it, not a leaf kept as is).
    shape = as_shape(x.shape, "shape")
    dtype = canonical_dtype(x.dtype)
    dtype_bits(dtype)  # an array of strings or objects is one jax cannot hold: a typed error, named by the caller
    return LeafInfo(shape, dtype)


def flatten(tree: PyTree, what: str, **kwargs: Any) -> tuple[list[Any], Any]:
    """``jax.tree_util.tree_flatten(tree, **kwargs)``, with jax's own failures as a typed error.

    jax refuses some trees with a bare ValueError or TypeError (a dict whose
    keys do not sort, ``{1: a, "w": b}``; a custom node whose flatten
    raises); this names the argument instead.

    Example:
      >>> flatten({1: 0, "w": 1}, "params")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.MeshplanTypeError: params is not a pytree jax can flatten (the keys [1, 'w'] of params do not sort); dict keys must be sortable (all str, or all int).
    """
    bad: list[Any] = []
    try:
        found = jax.tree_util.tree_flatten(tree, is_leaf=_guarded(tree, what, kwargs, bad), **kwargs)
    except MeshplanError:
        raise
    except (ValueError, TypeError) as err:
        raise _unflattenable(what, err) from None
    _refuse_unsortable(bad, what)
    return found


def flatten_with_path(tree: PyTree, what: str, **kwargs: Any) -> tuple[list[tuple[Any, Any]], Any]:
    """:func:`flatten` with key paths (``jax.tree_util.tree_flatten_with_path``)."""
    bad: list[Any] = []
    try:
        found = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_guarded(tree, what, kwargs, bad), **kwargs)
    except MeshplanError:
        raise
    except (ValueError, TypeError) as err:
        raise _unflattenable(what, err) from None
    _refuse_unsortable(bad, what)
    return found


def _guarded(tree: PyTree, what: str, kwargs: dict[str, Any], bad: list[Any]) -> Any:
    """The ``is_leaf`` to flatten ``tree`` with, such that jax never sorts a dict whose keys do not sort.

    jaxlib 0.10's flatten fails on such a dict with a ValueError, but leaks the
    interpreter's recursion budget by the dict's nesting depth each time; a
    long process (a fuzz run) then fails every deep-enough call with a
    RecursionError. Without a caller's ``is_leaf``, :func:`_unsortable_guard`
    keeps them from jax as it flattens; a caller's ``is_leaf`` may flatten the
    subtrees it is shown itself (before the guard sees their dicts), so the tree
    is walked for them first and the caller's ``is_leaf`` used as it is.
    """
    user = kwargs.pop("is_leaf", None)
    if user is None:
        return _unsortable_guard(bad)
    _refuse_unsortable_keys(tree, what)
    return user


def _unsortable_guard(bad: list[Any]) -> Any:
    """An ``is_leaf`` that calls a dict whose keys do not sort a leaf, so jax never sorts it, and
    notes it in ``bad`` for the caller to refuse once the flatten returns. Asked by jax at each
    node, it costs under half of walking the tree beforehand (a 45k-leaf tree: ~0.4x one
    ``tree_map`` against ~1.0x)."""
    defaultdict = collections.defaultdict

    def is_leaf(node: Any) -> bool:
        kind = type(node)
        # The dicts jax sorts (OrderedDict keeps its order; other subclasses are leaves to jax).
        # Keys of a one-key dict always sort (most dicts of a parameter tree hold one weight).
        if (kind is dict or kind is defaultdict) and len(node) > 1:
            try:
                sorted(node)
            except (TypeError, ValueError):
                bad.append(node)
                return True
        return False

    return is_leaf


def _refuse_unsortable_keys(tree: PyTree, what: str) -> None:
    """Refuse a dict whose keys do not sort before jax sees it.

    jaxlib 0.10's flatten fails on such a dict with a ValueError, but leaks the
    interpreter's recursion budget by the dict's nesting depth each time; a
    long process (a fuzz run) then fails every deep-enough call with a
    RecursionError. Builtin containers are walked iteratively, custom nodes left to jax.
    """
    stack, seen = [tree], set()
    while stack:
        node = stack.pop()
        if not isinstance(node, (dict, list, tuple)):  # a leaf or a custom node (most nodes: one test each)
            continue
        if id(node) in seen:  # a container holding itself: jax's own refusal names it
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            if type(node) is dict or isinstance(node, collections.defaultdict):  # the dicts jax sorts
                try:
                    sorted(node)
                except (TypeError, ValueError):
                    raise MeshplanTypeError(
                        f"{what} is not a pytree jax can flatten (the keys {list(node)!r:.80} of {what} do not "
                        "sort); dict keys must be sortable (all str, or all int).") from None
            stack.extend(node.values())
        else:
            stack.extend(node)


def _refuse_unsortable(bad: list[Any], what: str) -> None:
    if bad:
        raise MeshplanTypeError(
            f"{what} is not a pytree jax can flatten (the keys {list(bad[0])!r:.80} of {what} do not "
            "sort); dict keys must be sortable (all str, or all int).")


def _unflattenable(what: str, err: Exception) -> MeshplanTypeError:
    return MeshplanTypeError(f"{what} is not a pytree jax can flatten ({str(err).splitlines()[0][:200]}); "
                             "dict keys must be sortable (all str, or all int).")


def leaf_info(x: Any, *, x64: bool = False) -> LeafInfo | None:
    """Facts about one leaf, or ``None`` for a non-array leaf.

    Args:
      x: a pytree leaf.
      x64: whether Python scalars become 64-bit (jax's ``jax_enable_x64``);
        the facade passes the live setting.

    Example:
      >>> import numpy as np
      >>> leaf_info(np.zeros((2, 3), np.float16))
      LeafInfo(shape=(2, 3), dtype=dtype('float16'))
      >>> leaf_info(3)
      LeafInfo(shape=(), dtype=dtype('int32'))
      >>> leaf_info("not an array") is None
      True

    Raises:
      MeshplanTypeError: ``x`` has a ``.shape`` and a ``.dtype`` (it is an array to planners) but
        the shape is not a tuple of ints >= 0 or the dtype is not one.
    """
    if not _has_array_facts(x):
        value = None if isinstance(x, type) else getattr(x, "value", None)
        if value is not None and _has_array_facts(value):
            x = value
        else:
            table = _SCALAR_DTYPES_64 if as_flag(x64, "x64") else _SCALAR_DTYPES_32
            dtype = table.get(type(x))
            return None if dtype is None else LeafInfo((), dtype)
    return _array_info(x)


def path_str(keypath: Sequence[Any]) -> str:
    """A jax key path as ``"a/b/0"`` (the form used in every message).

    Example:
      >>> import jax
      >>> [path_str(k) for k, _ in jax.tree_util.tree_flatten_with_path({"w": [1, 2]})[0]]
      ['w/0', 'w/1']
    """
    if isinstance(keypath, (str, bytes)) or not isinstance(keypath, Sequence):
        raise MeshplanTypeError(f"keypath={keypath!r:.80} must be a sequence of jax path keys.")
    try:
        return jax.tree_util.keystr(tuple(keypath), simple=True, separator="/")
    except (TypeError, AttributeError, ValueError):
        # keystr reads each key's own fields; a key of another kind has none.
        return "/".join(str(k) for k in keypath)


def path_strs(keypaths: Sequence[Sequence[Any]]) -> list[str]:
    """``[path_str(k) for k in keypaths]``, formatting each distinct key entry once.

    A tree's paths repeat the same few entries (``model``, ``layers``, ``0``...): a 1,025-leaf
    tree has ~6,000 entries but ~100 distinct ones, and formatting every entry through jax was
    a quarter of grouping the leaves for a search. A path that is not a tuple, or holds an entry
    that cannot be hashed or formatted alone, is left to :func:`path_str` whole.

    Example:
      >>> import jax
      >>> keys = [k for k, _ in jax.tree_util.tree_flatten_with_path({"w": [1, 2], "b": (3,)})[0]]
      >>> path_strs(keys) == [path_str(k) for k in keys] == ['b/0', 'w/0', 'w/1']
      True
    """
    names: dict[tuple[type, Any], str] = {}
    out = []
    for keypath in keypaths:
        if type(keypath) is not tuple:
            out.append(path_str(keypath))
            continue
        try:
            parts = []
            for entry in keypath:
                # Keyed by type too: entries of two key classes may compare equal.
                key = (type(entry), entry)
                name = names.get(key)
                if name is None:
                    name = names[key] = jax.tree_util.keystr((entry,), simple=True, separator="/")
                parts.append(name)
        except (TypeError, AttributeError, ValueError):  # unhashable, or keystr refuses it: path_str decides
            out.append(path_str(keypath))
            continue
        out.append("/".join(parts))
    return out


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class TreeFacts:
    """A flattened pytree: per-leaf facts, the tree structure and (lazily) key paths.

    ``infos[i]`` is ``None`` for non-array leaves; leaves with equal shape and
    dtype share one :class:`LeafInfo` object. Key paths are computed only
    when asked for (``keypaths``, ``path(i)``), because flattening with paths
    costs about six times a plain flatten and planners only need them for
    messages.

    Attributes:
      infos: one entry per leaf, in ``jax.tree_util`` leaf order.
      treedef: the tree structure.
      source: the flattened tree itself (kept to recover key paths on demand).
    """

    infos: tuple[LeafInfo | None, ...]
    treedef: Any
    source: Any = dataclasses.field(default=None, repr=False)
    _memo: list[tuple[Any, ...]] = dataclasses.field(default_factory=list, repr=False)
    # The structure's nodes as read for path(i) and templates(): id(node) -> its kind, keys, children.
    _nodes: dict[int, _Node | None] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def keypaths(self) -> tuple[Any, ...]:
        """The jax key path of every leaf (computed once, on first use)."""
        if not self._memo:
            # Built by hand without a source: rebuild a stand-in tree from the structure.
            source = self.source if self.source is not None else self.treedef.unflatten(range(len(self.infos)))
            with_path, _ = jax.tree_util.tree_flatten_with_path(source)
            self._memo.append(tuple(k for k, _ in with_path))
        return self._memo[0]

    def paths(self) -> list[str]:
        """Every leaf's ``"a/b/0"`` path (``path(i)`` for each ``i``).

        A tree of plain dicts, lists and tuples with array leaves (every preset's, most parameter
        trees) is walked here in jax's order (dict keys sorted) without making its key paths: a
        DeepSeek-V3 tree has 1,025 of them holding ~3,300 objects, which a search then carried to
        its end. Any other node (a namedtuple, a custom pytree, a scalar leaf) leaves it to
        :attr:`keypaths`.

        Example:
          >>> import numpy as np
          >>> tree_facts({"w": [np.zeros(2), None, (np.zeros(3),)], "b": np.zeros(1)}).paths()
          ['b', 'w/0', 'w/2/0']
        """
        if not self._memo:
            walked = _plain_paths(self.source)
            if walked is not None and len(walked) == len(self.infos):
                return walked
        return path_strs(self.keypaths)

    def path(self, i: int) -> str:
        """The ``"a/b/0"`` path of leaf ``i``.

        Raises:
          MeshplanTypeError: ``i`` is not a leaf index.
        """
        n = len(self.infos)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= i < n:
            raise MeshplanTypeError(f"leaf index i={i!r} must be an int in [{-n}, {n}).")
        if not self._memo:
            # One leaf's path read off the structure: planners name a few leaves of a tree (the
            # first of each group, a refused leaf), and all the key paths cost ~6 flattens.
            found = self._descend(int(i) % n)
            if found is not None:
                return found
        return path_str(self.keypaths[i])

    def templates(self) -> list[str]:
        """Every leaf's path template (:func:`path_template` of ``path(i)`` for each ``i``).

        Example:
          >>> import numpy as np
          >>> tree_facts({"layers": [{"w": np.zeros(2)}] * 3, "3": np.zeros(1)}).templates()
          ['*', 'layers/*/w', 'layers/*/w', 'layers/*/w']
        """
        table, codes = self.template_codes()
        return [table[c] for c in codes]

    def template_codes(self) -> tuple[tuple[str, ...], list[int]]:
        """The distinct path templates, and per leaf the position of its template among them.

        Read off the structure, each distinct subtree once: a DeepSeek-V3 tree with one leaf per
        expert has 45k leaves but a few distinct layers, so this costs a fraction of one
        ``tree_map``, where templating every path costs more than one. Trees with other nodes
        (namedtuples, custom pytrees) template each path instead.

        Example:
          >>> import numpy as np
          >>> tree_facts({"layers": [{"w": np.zeros(2)}] * 3, "3": np.zeros(1)}).template_codes()
          (('*', 'layers/*/w'), [0, 1, 1, 1])
        """
        found = self._suffixes(self.treedef, {}, "")
        if found is not None and len(found[1]) == len(self.infos):
            return found
        index: dict[str, int] = {}
        codes = [index.setdefault(path_template(p), len(index)) for p in self.paths()]
        return tuple(index), codes

    def _read(self, node: Any) -> _Node | None:
        """``node``'s kind, keys and children, read once per node object (see :func:`_read_node`)."""
        read = self._nodes.get(id(node), _UNREAD)
        if read is _UNREAD:
            read = self._nodes[id(node)] = _read_node(node)
        return read

    def _suffixes(self, treedef: Any, memo: dict[Hashable, list[tuple[Any, _Codes | None]]],
                  sep: str) -> _Codes | None:
        """The templates of ``treedef``'s leaf paths below the node, each after ``sep`` (``""`` for
        the node itself when it is a leaf): the distinct ones, and per leaf the position of its own;
        None when some node is not a dict, list, tuple or OrderedDict.

        Equal subtrees (the layers of a model, the experts of a layer) are read once: ``memo``
        holds the answers by a cheap key (node and leaf counts, the node's own keys), and a
        structure is compared only with the few that share that key, never hashed (hashing a
        structure walks all of it, at every level of the tree). A child's codes are renumbered
        once per (template, distinct child) and in one C-level pass, so the cost follows the
        distinct subtrees, not the leaves."""
        data = treedef.node_data()
        cheap = (treedef.num_nodes, treedef.num_leaves, sep,
                 None if data is None else (data[0], tuple(data[1]) if type(data[1]) is list else None))
        same = memo.setdefault(cheap, [])
        for other, answer in same:
            if other == treedef:  # compared only with structures of the same cheap key
                return answer
        read = self._read(treedef)
        out: _Codes | None
        if read is None:
            out = None
        elif not read.children:
            out = (("",), [0]) if read.kind is None else ((), [])
        else:
            index: dict[str, int] = {}
            codes: list[int] = []
            renumbered: dict[tuple[str, int], list[int]] = {}
            for name, child in zip(read.keys, read.children, strict=True):
                sub = self._suffixes(child, memo, "/")
                if sub is None:
                    break
                head = sep + path_template(name)
                found = renumbered.get((head, id(sub)))
                if found is None:
                    ours = [index.setdefault(head + t, len(index)) for t in sub[0]]
                    found = renumbered[(head, id(sub))] = list(map(ours.__getitem__, sub[1]))
                codes.extend(found)
            out = None if sub is None else (tuple(index), codes)
        same.append((treedef, out))
        return out

    def _descend(self, i: int) -> str | None:
        """The path of leaf ``i`` read off the structure; None where a node is not a dict, list,
        tuple or OrderedDict (its keys are then jax's to format)."""
        parts: list[str] = []
        node = self.treedef
        while True:
            read = self._read(node)
            if read is None:
                return None
            if not read.children:  # a leaf
                return "/".join(parts)
            k = bisect.bisect_right(read.starts, i) - 1
            parts.append(read.keys[k])
            i -= read.starts[k]
            node = read.children[k]

    def unflatten(self, leaves: Sequence[Any]) -> PyTree:
        """A tree of the same structure holding ``leaves`` (one per leaf).

        Raises:
          MeshplanTypeError: ``leaves`` is not a sequence of ``len(infos)`` values.
        """
        if not isinstance(leaves, Sequence) or isinstance(leaves, str) or len(leaves) != len(self.infos):
            raise MeshplanTypeError(f"leaves must be a sequence of {len(self.infos)} values (one per leaf), "
                                    f"got {type(leaves).__name__}.")
        return self.treedef.unflatten(leaves)


_FAST_TYPES = (np.ndarray, jax.Array, jax.ShapeDtypeStruct)


def _plain_paths(tree: Any) -> list[str] | None:
    """The leaf paths of a tree of exactly dicts (str or int keys), lists, tuples and None with leaves
    of :data:`_FAST_TYPES`, in jax's flattening order; None for any other tree."""
    out: list[str] = []
    stack: list[tuple[str | None, Any]] = [(None, tree)]  # (path so far, None at the root; node)
    fast: dict[type, bool] = {}  # isinstance(v, jax.Array) is slow; ask once per type
    while stack:
        prefix, node = stack.pop()
        kind = type(node)
        if kind is dict:
            try:
                keys = sorted(node)  # jax's order for a dict
            except TypeError:
                return None
            if not all(type(k) is str or type(k) is int for k in keys):
                return None
            # Pushed in reverse, so walked in order.
            stack.extend((str(k) if prefix is None else f"{prefix}/{k}", node[k]) for k in reversed(keys))
        elif kind is list or kind is tuple:
            stack.extend((str(i) if prefix is None else f"{prefix}/{i}", node[i])
                         for i in range(len(node) - 1, -1, -1))
        elif node is None:
            continue  # an empty subtree
        else:
            leaf = fast.get(kind)
            if leaf is None:
                leaf = fast[kind] = isinstance(node, _FAST_TYPES) and not isinstance(node, (dict, list, tuple))
            if not leaf:
                return None
            out.append("" if prefix is None else prefix)
    return out


# An all-digit path component (``$`` in ``^[0-9]+$`` also allowed one trailing newline, kept so).
# One C-level substitution per path.
_DIGIT_PART = re.compile(r"(?<![^/])[0-9]+\n?(?![^/])")


def path_template(path: str) -> str:
    """``path`` with every all-digit component replaced by ``*`` (unchecked; the public,
    checked one is :func:`meshplan.pure.rules.path_template`).

    Example:
      >>> path_template("model/layers/12/mlp/experts/3/w1/weight")
      'model/layers/*/mlp/experts/*/w1/weight'
    """
    return _DIGIT_PART.sub("*", path)


@dataclasses.dataclass(frozen=True, slots=True)
class _Node:
    """One node of a structure: its kind (None for a leaf), its children, their keys as path text,
    and where each child's leaves start. ``node`` keeps the structure alive, so its id() stays its own."""

    node: Any
    kind: type | None
    keys: tuple[str, ...]
    children: tuple[Any, ...]
    starts: tuple[int, ...]


_UNREAD = _Node(None, None, (), (), ())

_Codes = tuple[tuple[str, ...], list[int]]
"""Distinct path templates, and per leaf the position of its template among them."""


def _read_node(treedef: Any) -> _Node | None:
    """``treedef``'s root as a :class:`_Node`, each child's key as jax's ``keystr(simple=True)``
    writes it; None for a node other than a dict, list, tuple, OrderedDict, None or leaf (its keys
    are jax's to format)."""
    data = treedef.node_data()
    if data is None:
        return _Node(treedef, None, (), (), ())
    kind, aux = data
    children = treedef.children()
    if kind is dict or kind is collections.OrderedDict:
        keys = tuple(str(k) for k in aux)
    elif kind is list or kind is tuple:
        keys = tuple(str(k) for k in range(len(children)))
    elif kind is type(None):
        keys = ()
    else:
        return None
    starts, at = [], 0
    for child in children:
        starts.append(at)
        at += child.num_leaves
    return _Node(treedef, kind, keys, tuple(children), tuple(starts))


_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")


class _InfoTable(dict[Any, LeafInfo]):
    """``(shape, dtype) -> LeafInfo``, each made (and checked) on its first lookup."""

    __slots__ = ()

    def __missing__(self, key: tuple[Any, Any]) -> LeafInfo:
        info = self[key] = _array_info(_Facts(*key))
        return info


def _fast_infos(leaves: list[Any], tree: PyTree) -> tuple[LeafInfo, ...] | None:
    """The infos of ``leaves`` when every one is a numpy array, jax array or ShapeDtypeStruct, in one
    C-level pass that builds each kind's info once (zip reuses its pair where the table holds it); else None."""
    # isinstance against jax.Array is slow: asked once per type.
    if not leaves or not all(issubclass(t, _FAST_TYPES) for t in set(map(type, leaves))):
        return None
    table = _InfoTable()
    try:
        return tuple(map(table.__getitem__, zip(map(_SHAPE, leaves), map(_DTYPE, leaves))))
    except MeshplanTypeError as err:  # a bad shape or dtype: name its first leaf, the first not in the table
        first = next(i for i, key in enumerate(zip(map(_SHAPE, leaves), map(_DTYPE, leaves))) if key not in table)
        where = path_str(jax.tree_util.tree_flatten_with_path(tree)[0][first][0])
        raise MeshplanTypeError(f"leaf {where!r}: {err}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class _Facts:
    """A leaf's ``shape`` and ``dtype`` without the leaf, for :func:`_array_info`."""

    shape: Any
    dtype: Any


def tree_facts(tree: PyTree, *, x64: bool = False) -> TreeFacts:
    """Flatten ``tree`` once into :class:`TreeFacts`.

    Args:
      tree: any pytree (see the module docstring for what counts as an array).
      x64: whether Python scalars become 64-bit.

    Returns:
      The tree's :class:`TreeFacts`.

    Raises:
      MeshplanTypeError: a leaf has a ``.shape`` and a ``.dtype`` but the shape is not a tuple of
        ints >= 0 or the dtype is not one (the message names the leaf).

    Example:
      >>> import jax, numpy as np
      >>> facts = tree_facts({"w": jax.ShapeDtypeStruct((4, 8), np.float32), "n": None, "s": "x"})
      >>> [facts.path(i) for i in range(len(facts.infos))], facts.infos[0] is None
      (['s', 'w'], True)
    """
    x64 = as_flag(x64, "x64")
    leaves, treedef = flatten(tree, "tree")
    found = _fast_infos(leaves, tree)
    if found is not None:
        return TreeFacts(found, treedef, tree)
    # Trees hold many leaves of few (shape, dtype) kinds: build one LeafInfo
    # per kind and skip leaf_info's probing for the common array types.
    cache: dict[Any, LeafInfo] = {}
    fast: dict[type, bool] = {}  # isinstance(v, jax.Array) is slow; ask once per type
    infos: list[LeafInfo | None] = []
    for v in leaves:
        t = type(v)
        is_fast = fast.get(t)
        if is_fast is None:
            is_fast = fast[t] = isinstance(v, _FAST_TYPES)
        try:
            if is_fast:
                key = (v.shape, v.dtype)
                info = cache.get(key)
                if info is None:
                    info = cache[key] = _array_info(v)
                infos.append(info)
            else:
                infos.append(leaf_info(v, x64=x64))
        except MeshplanTypeError as err:  # a bad shape or dtype: name the leaf
            where = path_str(jax.tree_util.tree_flatten_with_path(tree)[0][len(infos)][0])
            raise MeshplanTypeError(f"leaf {where!r}: {err}") from None
    return TreeFacts(tuple(infos), treedef, tree)
