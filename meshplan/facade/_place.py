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
from jax.sharding import NamedSharding, PartitionSpec

from meshplan.facade._context import require_mesh, x64_enabled
from meshplan.pure._types import PyTree
from meshplan.pure.specs._validate import check_specs

__all__ = ["place"]


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec | NamedSharding)


def _spec_of(x: Any) -> Any:
    return x.spec if isinstance(x, NamedSharding) else x


def place(tree: PyTree, specs: PyTree, mesh: jax.sharding.Mesh | None = None) -> PyTree:
    """Put every array of ``tree`` on ``mesh`` as ``specs`` say, in one ``jax.device_put``.

    Args:
      tree: arrays (jax or numpy), e.g. ``(params, opt_state)``; boxes that are
        pytree nodes (flax ``nnx.Variable``) are kept.
      specs: a PartitionSpec (or NamedSharding) tree of the same structure,
        e.g. ``layout.state`` from :meth:`meshplan.MeshCandidate.training_layout`.
      mesh: the mesh to place on (default: the one set with ``jax.set_mesh``).

    Returns:
      ``tree`` with every array sharded on ``mesh``.

    Raises:
      SpecError: some spec does not fit its leaf or the mesh (every problem listed by leaf path).
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
    assert live is not None  # concrete=True never returns None
    plain = jax.tree_util.tree_map(_spec_of, specs, is_leaf=_is_spec)
    check_specs(tree, plain, dict(live.shape), x64=x64_enabled())
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(live, s), plain,
                                       is_leaf=lambda x: isinstance(x, PartitionSpec))
    return jax.device_put(tree, shardings)
