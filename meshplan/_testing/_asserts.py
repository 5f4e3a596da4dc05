"""Sharding assertions for users' tests, built on chex's assertion machinery.

Each is a chex assertion (``chex_assertion`` from chex's internals, which every
``chex.assert_*`` is made with), so it behaves as chex users expect: it raises
``AssertionError`` with chex's ``[Chex] Assertion <name> failed:`` prefix, takes
chex's ``custom_message=`` / ``exception_type=`` keywords, and does nothing
while ``chex.disable_asserts()`` is in force. Leaves are named as chex names
them (``Tree leaf 'a/b/0'``); every problem is collected and raised once.

A mistake in the arguments (a mesh that is not one, a negative budget) is
meshplan's typed error (:class:`~meshplan.errors.MeshplanTypeError`, also a
``TypeError``), passed through chex's wrapper unchanged; like everything else
in a chex assertion it is skipped while assertions are disabled.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
from chex._src import asserts_internal as _chex  # chex's assertion machinery (chex_assertion, format_tree_path)
from jax.sharding import PartitionSpec

from meshplan.pure.errors import MeshplanError, MeshplanTypeError
from meshplan.pure.specs import array_bytes, estimate_memory, path_str, shard_shape, validate_specs

__all__ = ["assert_fits", "assert_sharded_as", "assert_specs_valid"]

_SHOWN = 20  # problems listed in one message; the count says how many more
F = TypeVar("F", bound=Callable[..., None])


class _Carried(Exception):
    """A meshplan error carried through chex's wrapper, which turns any ValueError into a plain one."""

    def __init__(self, error: MeshplanError) -> None:
        super().__init__(str(error))
        self.error = error


def _chex_assertion(check: F) -> F:
    """``check`` as a chex assertion (see the module docstring); meshplan's typed errors pass unchanged."""

    def carried(*args: Any, **kwargs: Any) -> None:
        try:
            check(*args, **kwargs)
        except MeshplanError as err:
            raise _Carried(err) from None

    assertion = _chex.chex_assertion(carried, jittable_assert_fn=None, name=check.__name__)

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            assertion(*args, **kwargs)
        except _Carried as carrier:
            raise carrier.error from None

    return wrapper  # type: ignore[return-value]  # same signature, plus chex's keywords


def _leaf_name(keypath: tuple[Any, ...]) -> str:
    """A leaf as chex names it in its tree assertions: ``Tree leaf 'a/b/0'``."""
    try:
        return f"Tree leaf '{_chex.format_tree_path(_chex.convert_jax_path_to_dm_path(keypath))}'"
    except ValueError:  # a key kind chex does not know: meshplan's own path text
        return f"Tree leaf '{path_str(keypath)}'"


def _axis_sizes(mesh: Any) -> dict[str, int]:
    if hasattr(mesh, "axis_names") and hasattr(mesh, "shape"):
        return dict(mesh.shape)
    if hasattr(mesh, "as_dict"):
        return dict(mesh.as_dict())
    if isinstance(mesh, dict):
        return dict(mesh)
    raise MeshplanTypeError(f"mesh={mesh!r:.80} must be a Mesh, AbstractMesh, MeshShape or dict of axis sizes.")


def _fail(title: str, problems: list[str]) -> None:
    if problems:
        shown = "\n".join(f"  - {p}" for p in problems[:_SHOWN])
        more = f"\n  ... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise AssertionError(f"{len(problems)} {title}:\n{shown}{more}")


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def _pairs(tree: Any, specs: Any) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """(chex leaf name, leaf, spec) for every leaf, the spec tree read as a prefix of the tree."""
    spec_leaves, spec_def = jax.tree_util.tree_flatten(specs, is_leaf=_is_spec)
    try:
        subtrees = spec_def.flatten_up_to(tree)  # type: ignore[attr-defined]  # PyTreeDef's stub omits it
    except (ValueError, TypeError) as err:
        return [], [f"the spec tree does not match the tree's structure: {err}"]
    spec_paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(specs, is_leaf=_is_spec)[0]]
    out = []
    for prefix, sub, spec in zip(spec_paths, subtrees, spec_leaves):
        for path, leaf in jax.tree_util.tree_flatten_with_path(sub)[0]:
            out.append((_leaf_name(tuple(prefix) + tuple(path)), leaf, PartitionSpec() if spec is None else spec))
    return out, []


@_chex_assertion
def assert_sharded_as(tree: Any, specs: Any, mesh: Any) -> None:
    """Every leaf of ``tree`` is a live ``jax.Array`` sharded as ``NamedSharding(mesh, spec)``.

    Shardings are compared with ``is_equivalent_to``, so ``P("dp")`` and
    ``P("dp", None)`` match. ``specs`` may be a prefix of ``tree``.

    Args:
      tree: a pytree of ``jax.Array``.
      specs: the matching pytree of PartitionSpecs (``None`` = replicated).
      mesh: the ``jax.sharding.Mesh`` the arrays should live on.

    Raises:
      AssertionError: listing every leaf that is not an array or is sharded
        otherwise, with the expected and the actual sharding.

    Example:
      >>> import jax, numpy as np
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("dp",))
      >>> x = jax.device_put(np.zeros(4), NamedSharding(mesh, P("dp")))
      >>> assert_sharded_as({"w": x}, {"w": P("dp")}, mesh)
    """
    from jax.sharding import NamedSharding

    pairs, problems = _pairs(tree, specs)
    for path, leaf, spec in pairs:
        if not isinstance(leaf, jax.Array):
            problems.append(f"{path} is a {type(leaf).__name__}, not a live jax.Array; "
                            f"expected one sharded as {spec}")
            continue
        expected = NamedSharding(mesh, spec)
        if not leaf.sharding.is_equivalent_to(expected, leaf.ndim):
            got = getattr(leaf.sharding, "spec", leaf.sharding)
            problems.append(f"{path} (shape {leaf.shape}) is sharded as {got}, expected {spec}")
    _fail("leaf(s) not sharded as specified", problems)


@_chex_assertion
def assert_specs_valid(tree: Any, specs: Any, mesh: Any, *, for_storage: bool = True) -> None:
    """``specs`` can place ``tree`` on ``mesh`` (see :func:`meshplan.pure.validate_specs`).

    Args:
      tree: arrays or ShapeDtypeStructs.
      specs: PartitionSpecs mirroring ``tree`` (or a prefix of it).
      mesh: a Mesh, AbstractMesh, MeshShape or dict of axis sizes.
      for_storage: uneven splits are errors (True) or padding inside jit (False).

    Raises:
      AssertionError: listing every error finding, each naming its leaf.

    Example:
      >>> import jax, numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> assert_specs_valid({"w": jax.ShapeDtypeStruct((8, 4), np.float32)}, {"w": P("dp")}, {"dp": 2})
    """
    findings = validate_specs(tree, specs, _axis_sizes(mesh), for_storage=for_storage)
    # validate_specs' messages name the leaf first ("leaf 'a/b': ..."): named as chex names leaves.
    _fail("invalid partition spec(s)", [f"Tree {f}" if str(f).startswith("leaf '") else str(f)
                                        for f in findings if f.severity == "error"])


@_chex_assertion
def assert_fits(tree: Any, specs: Any, mesh: Any, budget_bytes: int) -> None:
    """No device holds more than ``budget_bytes`` of ``tree`` placed with ``specs``.

    Uses :func:`meshplan.pure.estimate_memory` (exact bytes per device,
    padded as XLA pads). On failure it lists the largest leaves per device,
    the usual culprits.

    Args:
      tree: arrays or ShapeDtypeStructs.
      specs: PartitionSpecs mirroring ``tree``.
      mesh: a Mesh, AbstractMesh, MeshShape or dict of axis sizes.
      budget_bytes: the most bytes one device may hold.

    Raises:
      AssertionError: the fullest device is over budget (the message lists
        the largest leaves by per-device bytes).

    Example:
      >>> import jax, numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> assert_fits({"w": jax.ShapeDtypeStruct((1024,), np.float32)}, {"w": P("dp")}, {"dp": 4}, 1024)
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise MeshplanTypeError(f"budget_bytes={budget_bytes!r:.80} must be an int >= 0.")
    sizes = _axis_sizes(mesh)
    estimate = estimate_memory(tree, specs, sizes)
    if estimate.max_per_device <= budget_bytes:
        return
    pairs, _ = _pairs(tree, specs)
    per_leaf = []
    for path, leaf, spec in pairs:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            shard = shard_shape(tuple(leaf.shape), spec, sizes)
            per_leaf.append((array_bytes(shard, leaf.dtype), path, tuple(leaf.shape), spec))
    per_leaf.sort(key=lambda t: (-t[0], t[1]))
    problems = [f"the fullest device holds {estimate.max_per_device} bytes, over "
                f"budget_bytes={budget_bytes} by {estimate.max_per_device - budget_bytes}"]
    problems += [f"{path} {shape} {spec}: {nbytes} bytes per device"
                 for nbytes, path, shape, spec in per_leaf[:10]]
    _fail("memory problem(s) (largest leaves listed)", problems)
