"""Training memory: parameters, gradients and optimizer state per device.

The optimizer state is best given as itself: ``jax.eval_shape(opt.init,
params)`` is free and exact for any optax chain. Its specs come from
:func:`optimizer_state_specs` unless you pass your own. Without a state,
``optimizer_copies`` models ``k`` parameter-shaped copies (Adam: 2, in
``optimizer_dtype``), sharded like the parameters.

:class:`TrainingLayout` holds every spec a training step places (parameters,
optimizer state, batch, activations); a plan makes one with
``MeshCandidate.training_layout``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from meshplan.pure._types import AxisSizes, PyTree, make_spec
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.specs._dtypes import array_bytes, canonical_dtype
from meshplan.pure.specs._memory import (
    MemoryEstimate,
    estimate_groups,
    estimate_memory,
    leaf_groups,
)
from meshplan.pure.specs._tree import flatten_with_path, leaf_info, tree_facts
from meshplan.pure.specs._validate import leaf_specs, raise_errors, resolve_specs

__all__ = ["TrainingLayout", "TrainingMemoryEstimate", "TrainingState", "estimate_training_memory",
           "optimizer_state_specs"]


_FLOAT0 = np.dtype(jax.dtypes.float0)


def _is_inexact(dtype: Any) -> bool:
    """Float or complex (bf16, fp8 ... included); PRNG keys and float0 are not."""
    return isinstance(dtype, np.dtype) and bool(jnp.issubdtype(dtype, np.inexact))


@dataclasses.dataclass(frozen=True, slots=True)
class TrainingState:
    """What a training step keeps per parameter: itself, a gradient and optimizer copies.

    Floating parameters get gradients in ``grad_dtype``, ``optimizer_copies``
    copies in ``optimizer_dtype`` (``None``: the parameter's own dtype) and
    ``master_copies`` fp32 master copies (a mixed-precision optimizer's master
    weights are fp32 whatever its moments are: DeepSeek-V3 keeps bf16 moments
    beside fp32 masters); integer/bool parameters get ``float0`` gradients and
    copies (0 bytes), as ``jax.grad(..., allow_int=True)`` does. Dtypes must be
    canonical.

    Example:
      >>> import numpy as np
      >>> state = TrainingState(optimizer_dtype=np.dtype("float32"), optimizer_copies=2)
      >>> state.element_bytes(np.dtype("float16")), state.element_bytes(np.dtype("int32"))
      ((2, 2, 8), (4, 0, 0))
      >>> TrainingState(optimizer_dtype=np.dtype("bfloat16"), optimizer_copies=2,
      ...               master_copies=1).element_bytes(np.dtype("bfloat16"))
      (2, 2, 8)
    """

    grad_dtype: Any = None
    optimizer_dtype: Any = None
    optimizer_copies: int = 0
    master_copies: int = 0
    # dtype -> element_bytes: the search asks once per leaf group per mesh, and
    # dtype_bits is slow next to a multiplication. A memo, not state.
    _units: dict[Any, tuple[int, int, int]] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def grad_of(self, dtype: Any) -> Any:
        """The gradient dtype of a parameter of ``dtype``."""
        if not _is_inexact(dtype):
            return _FLOAT0
        return dtype if self.grad_dtype is None else self.grad_dtype

    def optimizer_of(self, dtype: Any) -> Any:
        """The dtype of each optimizer copy of a parameter of ``dtype``."""
        if not _is_inexact(dtype):
            return _FLOAT0
        return dtype if self.optimizer_dtype is None else self.optimizer_dtype

    def element_bytes(self, dtype: Any) -> tuple[int, int, int]:
        """Bytes per parameter element of (the parameter, its gradient, all its optimizer copies).

        Unpacked storage (``jax.Array.nbytes``), where bytes are linear in the
        element count: ``array_bytes(shard, d) == prod(shard) * array_bytes((1,), d)``.
        """
        found = self._units.get(dtype)
        if found is None:
            found = self._units[dtype] = (
                array_bytes((1,), dtype), array_bytes((1,), self.grad_of(dtype)),
                self.optimizer_copies * array_bytes((1,), self.optimizer_of(dtype))
                + (self.master_copies * 4 if _is_inexact(dtype) else 0))
        return found


_VALUE = jax.tree_util.GetAttrKey("value")
_REPLICATED = make_spec()
_ARRAY_TYPES = (np.ndarray, jax.Array, jax.ShapeDtypeStruct)


def _state_key(keypath: tuple[Any, ...]) -> tuple[Any, ...]:
    """A leaf's key path without a trailing box ``.value``.

    flax's ``Variable`` boxes (nnx ``Param``, linen ``Partitioned``) end a
    path in the attribute ``value``; a parameter tree with boxes and a state
    without them (or boxed differently, as ``nnx.Optimizer`` boxes its state)
    then still name a leaf alike. jax's key entries compare by their key, so
    the tuples are dict keys as they are.
    """
    return keypath[:-1] if keypath and keypath[-1] == _VALUE else keypath


def _shape(leaf: Any) -> tuple[int, ...] | None:
    if isinstance(leaf, _ARRAY_TYPES):
        return tuple(leaf.shape)
    info = leaf_info(leaf)
    return None if info is None else info.shape


class _SuffixIndex:
    """Parameter specs by key path, for state leaves whose path *ends with* a parameter's path.

    Built on first use: formatting every parameter's key path costs more than
    the rest of the matching, and states made only of parameter-shaped
    subtrees and scalars never need it.
    """

    def __init__(self, facts: Any, per_leaf: tuple[Any, ...]) -> None:
        self.facts, self.per_leaf = facts, per_leaf
        self.shapes = {i.shape for i in facts.infos if i is not None}
        self.index: dict[tuple[Any, ...], int] | None = None
        self.lengths: list[int] = []

    def _build(self) -> dict[tuple[Any, ...], int]:
        index: dict[tuple[Any, ...], int] = {}
        for i, keypath in enumerate(self.facts.keypaths):
            if self.facts.infos[i] is not None and self.per_leaf[i] is not None:
                index.setdefault(_state_key(keypath), i)
        self.lengths = sorted({len(k) for k in index}, reverse=True)
        return index

    def spec(self, keypath: tuple[Any, ...], leaf: Any) -> Any:
        """The spec of the parameter whose path is the longest suffix of ``keypath``, if shapes agree."""
        shape = _shape(leaf)
        if shape is None or shape not in self.shapes:
            return _REPLICATED
        if self.index is None:
            self.index = self._build()
        key = _state_key(keypath)
        for n in self.lengths:  # longest parameter path first
            found = self.index.get(key[len(key) - n:]) if n <= len(key) else None
            if found is not None:
                param = self.facts.infos[found]
                return self.per_leaf[found] if param is not None and param.shape == shape else _REPLICATED
        return _REPLICATED


def optimizer_state_specs(params: PyTree, param_specs: PyTree, opt_state: PyTree) -> PyTree:
    """Specs for an optimizer state, derived from the parameters' specs.

    The rule: a state leaf whose key path *ends with* a parameter's key path
    (optax's ``mu/layer/w`` and ``nu/layer/w`` for the parameter ``layer/w``,
    at any depth of chains, ``masked``, ``multi_transform``,
    ``inject_hyperparams`` or ``nnx.Optimizer`` boxes) and has that
    parameter's shape takes the parameter's spec; the longest matching
    parameter path decides. Every other state leaf (step counts,
    hyperparameters, factored statistics of another shape) is replicated,
    ``P()``. A trailing box ``.value`` is ignored on both sides.

    Args:
      params: the parameter pytree (arrays or ShapeDtypeStructs).
      param_specs: its PartitionSpecs (same structure, or a prefix of it).
      opt_state: the state pytree, e.g. ``jax.eval_shape(opt.init, params)``.

    Returns:
      A pytree of PartitionSpecs with ``opt_state``'s structure.

    Raises:
      SpecError: ``param_specs`` does not match ``params``.
      MeshplanTypeError: ``opt_state`` is not a pytree jax can flatten.

    Example:
      >>> import jax, numpy as np
      >>> from typing import Any, NamedTuple
      >>> from jax.sharding import PartitionSpec as P
      >>> class AdamState(NamedTuple):  # what optax.adam(...).init returns, in short
      ...     count: Any
      ...     mu: Any
      ...     nu: Any
      >>> params = {"w": jax.ShapeDtypeStruct((8, 4), np.float32)}
      >>> state = AdamState(jax.ShapeDtypeStruct((), np.int32), params, params)
      >>> optimizer_state_specs(params, {"w": P("dp")}, state)
      AdamState(count=P(), mu={'w': P('dp',)}, nu={'w': P('dp',)})
    """
    facts = tree_facts(params)
    per_leaf, findings = leaf_specs(facts, param_specs)
    raise_errors(findings)
    target = facts.treedef
    mirrors: set[int] = set()

    def mirrors_params(node: Any) -> bool:
        # Fast path: a subtree with the parameters' very structure (optax's mu, nu, trace) is
        # matched leaf by leaf, without formatting a key path for each of its leaves.
        if isinstance(node, _ARRAY_TYPES) and target.num_leaves > 1:
            return False  # a leaf cannot mirror a tree of several leaves
        found: Any = jax.tree_util.tree_structure(node)  # the stub lacks num_leaves
        # Leaf counts first: comparing two PyTreeDefs in full costs a walk of the larger one.
        if found.num_leaves == target.num_leaves and found == target:
            mirrors.add(id(node))
            return True
        return False

    nodes, state_def = flatten_with_path(opt_state, "opt_state", is_leaf=mirrors_params)
    suffixes = _SuffixIndex(facts, per_leaf)
    out: list[Any] = []
    for keypath, node in nodes:
        if id(node) in mirrors:
            out.append(target.unflatten([
                spec if spec is not None and p is not None and _shape(leaf) == p.shape else _REPLICATED
                for spec, p, leaf in zip(per_leaf, facts.infos, target.flatten_up_to(node), strict=True)]))
        else:
            out.append(suffixes.spec(keypath, node))
    return jax.tree_util.tree_unflatten(state_def, out)


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class TrainingLayout:
    """Everything a training step places: the specs of the parameters, the optimizer state, the batch
    and the activations, for one mesh.

    Made by :meth:`meshplan.MeshCandidate.training_layout`; :meth:`shardings` turns every spec into a
    ``NamedSharding`` on a mesh.

    Attributes:
      params: the parameters' PartitionSpec tree.
      opt_state: the optimizer state's PartitionSpec tree (:func:`optimizer_state_specs`), or ``None``.
      batch: the spec of a ``(batch, seq)`` input: the batch dim over the batch axes.
      activations: ``"residual"`` (``(batch, seq, hidden)``) and ``"logits"``
        (``(batch, seq, vocab)``) specs, for ``jax.lax.with_sharding_constraint``.
      axis_sizes: the mesh the specs are for, ``{axis: size}`` in mesh order.

    Example:
      >>> import jax
      >>> from jax.sharding import AbstractMesh, PartitionSpec as P
      >>> layout = TrainingLayout({"w": P("dp")}, None, P("dp"), {"residual": P("dp")}, {"dp": 2})
      >>> layout.state
      ({'w': P('dp',)}, None)
      >>> layout.shardings(AbstractMesh((2,), ("dp",))).batch.spec
      P('dp',)
    """

    params: PyTree
    opt_state: PyTree
    batch: Any
    activations: Mapping[str, Any]
    axis_sizes: Mapping[str, int]

    @property
    def state(self) -> tuple[PyTree, PyTree]:
        """``(params, opt_state)``: the specs of a whole training state, for one ``device_put``."""
        return self.params, self.opt_state

    def shardings(self, mesh: Any) -> TrainingLayout:
        """The same layout with every PartitionSpec as a ``NamedSharding`` on ``mesh``.

        Args:
          mesh: a ``jax.sharding.Mesh`` or ``AbstractMesh`` with the axes and sizes this layout was
            planned for (nothing here touches its devices).

        Raises:
          PlanError: the mesh's axes or sizes differ from the plan's.
        """
        shape = getattr(mesh, "shape", None)
        got = dict(shape) if isinstance(shape, Mapping) else None
        if got != dict(self.axis_sizes):
            raise PlanError(f"this layout was planned for the mesh {dict(self.axis_sizes)}, got "
                            f"{got if got is not None else repr(mesh)}; build the mesh from the plan "
                            "(meshplan.create_mesh(best.axis_sizes, best.axis_names)).")

        def named(tree: PyTree) -> PyTree:
            return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), tree, is_leaf=_is_spec)

        return TrainingLayout(named(self.params), named(self.opt_state), named(self.batch),
                              {k: named(v) for k, v in self.activations.items()}, self.axis_sizes)


@dataclasses.dataclass(frozen=True, slots=True)
class TrainingMemoryEstimate:
    """Per-device bytes of parameters, gradients and optimizer state.

    ``per_device`` (row-major mesh order) is their sum, what a training step
    holds at least (activations come on top).
    """

    params: MemoryEstimate
    grads: MemoryEstimate
    opt_state: MemoryEstimate

    @property
    def total(self) -> MemoryEstimate:
        """The three together."""
        return self.params + self.grads + self.opt_state

    @property
    def per_device(self) -> tuple[int, ...]:
        """Total bytes per device position."""
        return self.total.per_device

    @property
    def max_per_device(self) -> int:
        """Total bytes on the fullest device."""
        return self.total.max_per_device

    def to_dict(self) -> dict[str, Any]:
        """Max bytes per device of each part and in total, plus the per-device totals."""
        return {
            "params": self.params.max_per_device,
            "grads": self.grads.max_per_device,
            "opt_state": self.opt_state.max_per_device,
            "total": self.max_per_device,
            "per_device": list(self.per_device),
        }


def estimate_training_memory(
    params: PyTree,
    param_specs: PyTree,
    axis_sizes: AxisSizes,
    *,
    opt_state: PyTree = None,
    opt_state_specs: PyTree = None,
    grad_dtype: Any = None,
    optimizer_copies: int = 0,
    optimizer_dtype: Any = None,
    packed_subbyte: bool = False,
    padding: str = "padded",
    x64: bool = False,
) -> TrainingMemoryEstimate:
    """Bytes per device for parameters, their gradients and the optimizer state.

    Gradients have the parameters' shapes and specs; floating parameters get
    ``grad_dtype`` (default: their own dtype), integer/bool parameters get
    ``float0`` gradients (0 bytes), as ``jax.grad(..., allow_int=True)`` does.

    Args:
      params: parameter pytree.
      param_specs: its PartitionSpecs.
      axis_sizes: ordered mapping mesh axis name -> size.
      opt_state: optimizer state pytree (``jax.eval_shape(opt.init, params)``).
      opt_state_specs: its specs; default :func:`optimizer_state_specs`.
      grad_dtype: gradient dtype for floating parameters.
      optimizer_copies: without ``opt_state``, this many parameter-shaped
        copies of each floating parameter (Adam: 2).
      optimizer_dtype: dtype of those copies (default: the parameter's).
      packed_subbyte, padding, x64: as in :func:`meshplan.pure.estimate_memory`.

    Returns:
      A :class:`TrainingMemoryEstimate`.

    Raises:
      SpecError: specs that do not fit (see :func:`meshplan.pure.estimate_memory`).
      MeshplanTypeError: both ``opt_state`` and ``optimizer_copies`` given, or a bad option.

    Example:
      >>> import numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> params = {"w": np.zeros((1024, 256), np.float32)}
      >>> est = estimate_training_memory(params, {"w": P("fsdp")}, {"fsdp": 8}, optimizer_copies=2)
      >>> est.to_dict()["params"], est.to_dict()["total"]
      (131072, 524288)
    """
    if isinstance(optimizer_copies, bool) or not isinstance(optimizer_copies, int) or optimizer_copies < 0:
        raise MeshplanTypeError(f"optimizer_copies={optimizer_copies!r} must be an int >= 0.")
    if opt_state is not None and optimizer_copies:
        raise MeshplanTypeError(
            f"pass opt_state or optimizer_copies={optimizer_copies}, not both; opt_state is exact."
        )
    facts, per_leaf, findings = resolve_specs(params, param_specs, axis_sizes, for_storage=False, x64=x64)
    raise_errors(findings)
    state = TrainingState(None if grad_dtype is None else canonical_dtype(grad_dtype, what="grad_dtype"),
                          None if optimizer_dtype is None else canonical_dtype(optimizer_dtype, what="optimizer_dtype"),
                          optimizer_copies)
    # One grouping and one shard_geometry per group; each kind of state is the same groups
    # counted in its own dtype.
    groups = leaf_groups(facts, per_leaf, axis_sizes)
    p_est = estimate_groups(groups, axis_sizes, packed_subbyte=packed_subbyte, padding=padding)
    g_est = estimate_groups(groups, axis_sizes, dtype_of=state.grad_of, packed_subbyte=packed_subbyte,
                            padding=padding)
    if opt_state is not None:
        if opt_state_specs is None:
            opt_state_specs = optimizer_state_specs(params, param_specs, opt_state)
        o_est = estimate_memory(opt_state, opt_state_specs, axis_sizes, packed_subbyte=packed_subbyte,
                                padding=padding, x64=x64)
    else:
        o_est = estimate_groups(groups, axis_sizes, dtype_of=state.optimizer_of, packed_subbyte=packed_subbyte,
                                padding=padding).scaled(optimizer_copies)
    return TrainingMemoryEstimate(p_est, g_est, o_est)
