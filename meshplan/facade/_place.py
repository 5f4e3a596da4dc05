"""``place``: put a whole training state on a mesh with one ``jax.device_put``.

A training state is a tree of trees (parameters and optimizer state, often
more); placing it leaf by leaf starts one transfer per array. This checks the
specs against the tree first (pure :func:`~meshplan.pure.check_specs`: every
problem, named by leaf, in one error, instead of jax's first failure) and
then hands the whole tree and its sharding tree to one ``device_put``.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshplan.facade._context import require_mesh, x64_enabled
from meshplan.pure._types import PyTree
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.specs._tree import flatten, tree_facts
from meshplan.pure.specs._validate import check_specs, leaf_specs

__all__ = ["place"]


# What device_put takes as data: arrays, numpy scalars and Python scalars (which become 0-d arrays).
_PLACEABLE = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec | NamedSharding)


def _spec_of(x: Any) -> Any:
    return x.spec if isinstance(x, NamedSharding) else x


def place(tree: PyTree, specs: PyTree, mesh: jax.sharding.Mesh | None = None) -> PyTree:
    """Put every array of ``tree`` on ``mesh`` as ``specs`` say, in one ``jax.device_put``.

    Args:
      tree: arrays (jax or numpy) and Python scalars, e.g. ``(params, opt_state)``; boxes that are
        pytree nodes (flax ``nnx.Variable``) are kept; ``None`` stays ``None``.
      specs: a PartitionSpec (or NamedSharding) tree of the same structure,
        e.g. ``layout.state`` from :meth:`meshplan.MeshCandidate.training_layout`.
      mesh: the mesh to place on (default: the one set with ``jax.set_mesh``).

    Returns:
      ``tree`` with every array sharded on ``mesh``.

    Raises:
      SpecError: some spec does not fit its leaf or the mesh (every problem listed by leaf path).
      MeshplanTypeError: a leaf that is not an array (a ``ShapeDtypeStruct``: nothing to place), a tree
        jax cannot flatten, or a mesh that is not a concrete ``Mesh``.
      NoMeshError: no ``mesh`` given and none is current.

    Example:
      >>> import jax, numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> mesh = jax.make_mesh((2, 4), ("dp", "tp"))
      >>> state = ({"w": np.zeros((8, 4), np.float32)}, {"mu": {"w": np.zeros((8, 4), np.float32)}})
      >>> params, opt = place(state, ({"w": P("dp", "tp")}, {"mu": {"w": P("dp", "tp")}}), mesh)
      >>> params["w"].sharding.spec, opt["mu"]["w"].addressable_shards[0].data.shape
      (P('dp', 'tp'), (4, 1))
    """
    live = require_mesh(mesh, "place", concrete=True)
    if not isinstance(live, Mesh):  # concrete=True returns a Mesh or raises
        raise MeshplanTypeError(f"place: mesh={mesh!r} must be a jax.sharding.Mesh with devices.")
    spec_leaves, spec_def = flatten(specs, "specs", is_leaf=_is_spec)
    plain = spec_def.unflatten([_spec_of(s) for s in spec_leaves])
    check_specs(tree, plain, dict(live.shape), x64=x64_enabled())
    facts = tree_facts(tree, x64=x64_enabled())
    per_leaf, _ = leaf_specs(facts, plain)  # also pairs a spec prefix tree with the leaves below it
    leaves = facts.treedef.flatten_up_to(tree)
    bad = [i for i, leaf in enumerate(leaves) if not isinstance(leaf, _PLACEABLE)]
    if bad:
        shown = ", ".join(f"{facts.path(i)!r} ({type(leaves[i]).__name__})" for i in bad[:5])
        raise MeshplanTypeError(f"place needs arrays; {len(bad)} leaves are not: {shown}"
                                f"{', ...' if len(bad) > 5 else ''}. Pass arrays (jax.Array, numpy) or Python "
                                "scalars; a ShapeDtypeStruct has no data to place.")
    shardings = [NamedSharding(live, s) for s in per_leaf]
    return facts.unflatten(jax.device_put(leaves, shardings))
