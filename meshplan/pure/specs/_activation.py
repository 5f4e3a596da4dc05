"""The activation layout a training step assumes: the batch, the residual stream and the logits.

A memory model that divides the saved layer inputs by ``tp`` assumes they are
stored split over ``tp``; unless the step says so (``jax.lax.with_sharding_constraint``),
XLA may keep them whole and the step needs more memory than planned. This
module turns that assumption into PartitionSpecs, so the planner charges and
the step applies the very same split:

* the **batch** ``(batch, seq)`` of token ids: the batch dim over the batch
  axes, the sequence dim over the sequence axes;
* the **residual stream** ``(batch, seq, hidden)``: like the batch, and the
  hidden dim over the model axes (MaxText's ``activation_embed -> tensor``);
  a model axis that does not divide the hidden size splits the sequence
  instead (Megatron's sequence parallelism) when that divides. With
  ``residual_split=False`` (a step that constrains only the batch) the
  residual stream is whole on every model-axis shard;
* the **logits** ``(batch, seq, vocab)``: like the batch, and the vocabulary
  over the model axes where they divide it (what a column-parallel
  ``lm_head`` produces); otherwise the logits stay whole over them.

Every split divides its dim, so the layout is always valid for storage and
the bytes charged for it are exact; an axis that divides nothing is left out.
Axes of size 1 are left out (they split nothing). Axes go in mesh order,
outermost first, as jax reads a tuple entry.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from meshplan.pure._check import (
    as_count,
    as_flag,
    as_json_spec,
    as_record,
    as_sequence,
    as_shape,
    as_str,
    canonical_axis_sizes,
)
from meshplan.pure._types import AxisSizes, SpecEntry
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.specs._geometry import canonical_entries, shard_shape, spec_from_entries

__all__ = ["ACTIVATION_NAMES", "LAYER_ACTIVATION_NAMES", "ActivationLayout", "ActivationSpec", "activation_layout",
           "layer_activation_specs"]

ACTIVATION_NAMES: tuple[str, ...] = ("batch", "residual", "logits")
"""The tensors an :class:`ActivationLayout` places, in this order."""


@dataclasses.dataclass(frozen=True, slots=True)
class ActivationSpec:
    """One tensor of a training step: its global shape, element size and spec.

    Attributes:
      name: ``"batch"``, ``"residual"`` or ``"logits"``.
      shape: the global shape, e.g. ``(batch, seq, hidden)``.
      itemsize: bytes per element (logits are fp32: 4).
      spec: the PartitionSpec the step applies.

    Example:
      >>> a = ActivationSpec("residual", (8, 128, 64), 2, PartitionSpec("dp", None, "tp"))
      >>> a.shard_bytes({"dp": 2, "tp": 4})       # (4, 128, 16) elements of 2 bytes
      16384
    """

    name: str
    shape: tuple[int, ...]
    itemsize: int
    spec: PartitionSpec

    def __post_init__(self) -> None:
        as_str(self.name, "ActivationSpec.name")
        object.__setattr__(self, "shape", as_shape(self.shape, "ActivationSpec.shape"))
        object.__setattr__(self, "itemsize", as_count(self.itemsize, "ActivationSpec.itemsize", error=PlanError))
        if not isinstance(self.spec, PartitionSpec):
            raise MeshplanTypeError(f"ActivationSpec.spec must be a PartitionSpec, got {self.spec!r}.")
        canonical_entries(self.spec, len(self.shape), where=f"activation {self.name!r}")

    def shard_bytes(self, axis_sizes: AxisSizes) -> int:
        """Bytes of one device's shard on a mesh of ``axis_sizes``."""
        return math.prod(shard_shape(self.shape, self.spec, axis_sizes)) * self.itemsize

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the spec as one list per dim, as in the plan's groups)."""
        entries = [list(e) if isinstance(e, tuple) else e for e in self.spec]
        return {"name": self.name, "shape": list(self.shape), "itemsize": self.itemsize, "spec": entries}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActivationSpec:
        """Inverse of :meth:`to_dict`."""
        names = ("name", "shape", "itemsize", "spec")
        fields = as_record(data, "ActivationSpec", fields=names, required=names, error=PlanError)
        return cls(fields["name"], fields["shape"], fields["itemsize"],
                   as_json_spec(fields["spec"], f"ActivationSpec {fields['name']!r:.40} spec"))


@dataclasses.dataclass(frozen=True, slots=True)
class ActivationLayout:
    """The batch, residual-stream and logits specs of a training step (see the module docstring).

    Attributes:
      tensors: one :class:`ActivationSpec` per name in :data:`ACTIVATION_NAMES`.

    Example:
      >>> layout = activation_layout({"dp": 2, "tp": 4}, batch=8, seq=128, hidden=64, vocab=1000)
      >>> layout.specs
      {'batch': P('dp',), 'residual': P('dp', None, 'tp'), 'logits': P('dp', None, 'tp')}
    """

    tensors: tuple[ActivationSpec, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", as_sequence(self.tensors, "ActivationLayout.tensors"))
        if not all(isinstance(t, ActivationSpec) for t in self.tensors):
            raise MeshplanTypeError(f"ActivationLayout.tensors must hold ActivationSpec values, got {self.tensors!r}.")
        names = tuple(t.name for t in self.tensors)
        if names != ACTIVATION_NAMES:
            raise PlanError(f"ActivationLayout needs tensors named {list(ACTIVATION_NAMES)}, got {list(names)}.")

    def __getitem__(self, name: str) -> ActivationSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise PlanError(f"no activation {name!r}; the layout has {list(ACTIVATION_NAMES)}.")

    @property
    def specs(self) -> dict[str, PartitionSpec]:
        """Name -> PartitionSpec, in :data:`ACTIVATION_NAMES` order."""
        return {t.name: t.spec for t in self.tensors}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"tensors": [t.to_dict() for t in self.tensors]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActivationLayout:
        """Inverse of :meth:`to_dict`."""
        fields = as_record(data, "ActivationLayout", fields=("tensors",), required=("tensors",), error=PlanError)
        return cls(tuple(ActivationSpec.from_dict(t) for t in as_sequence(fields["tensors"], "tensors")))


def _split(size: int, axes: Sequence[str], sizes: AxisSizes) -> SpecEntry:
    """The axes, in the order given, that split ``size`` evenly together; size-1 axes left out.

    Greedy: an axis joins when the product so far times its size divides
    ``size``; one that does not is skipped for the next.
    """
    out: list[str] = []
    ways = 1
    for a in axes:
        n = sizes[a]
        if n > 1 and size % (ways * n) == 0:
            out.append(a)
            ways *= n
    return tuple(out)


def _in_mesh_order(axes: Sequence[str], sizes: AxisSizes) -> tuple[str, ...]:
    wanted = set(axes)
    return tuple(a for a in sizes if a in wanted)


def _feature_entries(batch_entry: SpecEntry, seq_entry: SpecEntry, seq: int, feature: int,
                     sizes: AxisSizes, model_axes: tuple[str, ...], *,
                     to_sequence: bool) -> tuple[SpecEntry, SpecEntry, SpecEntry]:
    f = _split(feature, model_axes, sizes)
    if not to_sequence:
        return batch_entry, seq_entry, f
    # Model axes the feature dim cannot take split the sequence instead (sequence parallelism),
    # so the residual stream is still stored 1/tp per device whenever a dim allows it.
    left = [a for a in model_axes if a not in f]
    taken = math.prod(sizes[a] for a in seq_entry)
    extra = _split(seq // taken, left, sizes)
    return batch_entry, _in_mesh_order(seq_entry + extra, sizes), f


def activation_layout(
    axis_sizes: AxisSizes,
    *,
    batch: int,
    seq: int,
    hidden: int,
    vocab: int,
    itemsize: int = 2,
    batch_axes: Sequence[str] = ("dp", "fsdp", "ep"),
    seq_axes: Sequence[str] = ("sp",),
    model_axes: Sequence[str] = ("tp",),
    residual_split: bool = True,
) -> ActivationLayout:
    """The specs of a step's batch, residual stream and logits on a mesh (see the module docstring).

    Args:
      axis_sizes: ordered mapping mesh axis -> size, in mesh order.
      batch: global batch in sequences; seq: tokens per sequence.
      hidden: the residual stream's width; vocab: the logits' width.
      itemsize: bytes per residual-stream element (logits count 4, token ids 4).
      batch_axes, seq_axes, model_axes: the mesh axes that split the batch,
        the sequence and the features (absent ones count as size 1). Defaults:
        the mesh search's axis kinds.
      residual_split: split the residual stream over the model axes (``False``:
        only over the batch and sequence axes).

    Returns:
      An :class:`ActivationLayout` whose every spec is valid for storage on
      the mesh (each split divides its dim).

    Raises:
      MeshplanTypeError / PlanError: a size that is not a positive int, an
        axis named in two roles.

    Example:
      >>> layout = activation_layout({"fsdp": 4, "tp": 2}, batch=8, seq=64, hidden=100, vocab=1001)
      >>> layout.specs["residual"]      # 100 divides by tp=2: the hidden dim takes it
      P('fsdp', None, 'tp')
      >>> layout.specs["logits"]        # 1001 does not: the logits stay whole over tp
      P('fsdp',)
      >>> activation_layout({"tp": 2}, batch=8, seq=64, hidden=99, vocab=8).specs["residual"]
      P(None, 'tp')
    """
    sizes = canonical_axis_sizes(axis_sizes)
    dims = {n: as_count(v, n, error=PlanError)
            for n, v in (("batch", batch), ("seq", seq), ("hidden", hidden), ("vocab", vocab),
                         ("itemsize", itemsize))}
    roles = {"batch_axes": as_sequence(batch_axes, "batch_axes"), "seq_axes": as_sequence(seq_axes, "seq_axes"),
             "model_axes": as_sequence(model_axes, "model_axes")}
    seen: dict[str, str] = {}
    twice = []
    for role, axes in roles.items():
        for a in axes:
            if not isinstance(a, str):
                raise MeshplanTypeError(f"{role} entry {a!r} must be an axis name (str).")
            if a in seen:
                twice.append(f"{a!r} in {seen[a]} and {role}")
            seen.setdefault(a, role)
    if twice:
        raise PlanError(f"an axis can split only one dim of an activation: {'; '.join(twice)}.")
    b_axes, s_axes, m_axes = (_in_mesh_order(roles[r], sizes) for r in roles)
    del axis_sizes, batch, seq, hidden, vocab, itemsize, batch_axes, seq_axes, model_axes

    b, s = _split(dims["batch"], b_axes, sizes), _split(dims["seq"], s_axes, sizes)
    tokens = (dims["batch"], dims["seq"])
    tensors = [ActivationSpec("batch", tokens, 4, spec_from_entries((b, s)))]
    as_flag(residual_split, "residual_split")
    residual_axes = m_axes if residual_split else ()
    for name, width, unit, axes in (("residual", dims["hidden"], dims["itemsize"], residual_axes),
                                    ("logits", dims["vocab"], 4, m_axes)):
        entries = _feature_entries(b, s, dims["seq"], width, sizes, axes, to_sequence=name == "residual")
        tensors.append(ActivationSpec(name, (*tokens, width), unit, spec_from_entries(entries)))
    return ActivationLayout(tuple(tensors))


LAYER_ACTIVATION_NAMES: tuple[str, ...] = ("heads", "kv_heads", "mlp", "dispatch", "experts", "expert_mlp")
"""The inner tensors of a layer :func:`layer_activation_specs` may place, in this order."""


def layer_activation_specs(
    axis_sizes: AxisSizes,
    batch_spec: PartitionSpec,
    *,
    heads: int,
    kv_heads: int,
    mlp: int,
    experts: int = 0,
    expert_mlp: int = 0,
    model_axes: Sequence[str] = ("tp",),
    expert_axes: Sequence[str] = ("ep",),
) -> dict[str, PartitionSpec]:
    """The specs a step puts on a layer's inner activations, as production steps (MaxText) do.

    A residual stream constrained at layer boundaries leaves XLA's partitioner
    free to pick the layout of everything in between; with tensor parallelism it
    then often moves whole activations where Megatron splits the heads and the
    MLP width. These specs pin the split Megatron (and MaxText's
    ``activation_heads`` / ``activation_mlp`` / ``activation_exp`` rules) use:

    * ``"heads"`` ``(batch, seq, heads, head_dim)``: queries and the attention
      output, heads over the model axes;
    * ``"kv_heads"`` ``(batch, seq, kv_heads, head_dim)``: keys and values, likewise;
    * ``"mlp"`` ``(batch, seq, mlp)``: the MLP's hidden activation, its width over the model axes;
    * ``"dispatch"`` ``(experts, batch, capacity, hidden)``: tokens dispatched where they are
      (GShard: each group of tokens is dispatched on its own devices), the batch as the batch spec
      splits it and the experts whole; only with expert axes;
    * ``"experts"`` ``(experts, batch, capacity, hidden)``: dispatched tokens on their experts' devices,
      experts over the expert axes and the batch over the remaining batch axes (from ``"dispatch"``
      to ``"experts"`` and back is the all-to-all of expert parallelism);
    * ``"expert_mlp"`` ``(experts, batch, capacity, expert_mlp)``: an expert's hidden
      activation, like ``"experts"`` with its width over the model axes.

    The batch and sequence dims keep ``batch_spec``'s entries (the step's token split).
    A name is left out when the axes it would use are all of size 1 (nothing to pin, so a
    step with no model or expert axis is constrained exactly as before) or when they do not
    divide its dim (heads that tp does not divide stay for XLA to place): a returned spec
    is always valid for storage. ``"experts"`` is the exception to the first rule: a
    MoE model always gets it (it keeps the dispatched tokens split like the batch).

    Args:
      axis_sizes: ordered mapping mesh axis -> size, in mesh order.
      batch_spec: the token batch's spec ``(batch, seq)`` (the plan's ``batch_spec``).
      heads, kv_heads: query and key/value heads; mlp: the dense MLP width.
      experts: routed experts (0: a dense model); expert_mlp: an expert's MLP width.
      model_axes: the axes that split heads and widths; expert_axes: those that split experts.

    Returns:
      ``{name: spec}`` in :data:`LAYER_ACTIVATION_NAMES` order, only the names to constrain.

    Raises:
      MeshplanTypeError / PlanError: a size that is not a positive int, a bad spec or axis.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> layer_activation_specs({"dp": 2, "tp": 4}, P("dp"), heads=8, kv_heads=2, mlp=256)
      {'heads': P('dp', None, 'tp'), 'mlp': P('dp', None, 'tp')}
      >>> layer_activation_specs({"fsdp": 8}, P("fsdp"), heads=8, kv_heads=8, mlp=256)
      {}
    """
    sizes = canonical_axis_sizes(axis_sizes)
    dims = {n: as_count(v, n, error=PlanError) for n, v in (("heads", heads), ("kv_heads", kv_heads), ("mlp", mlp))}
    for n, v in (("experts", experts), ("expert_mlp", expert_mlp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise PlanError(f"{n}={v!r} must be an int >= 0 (0: none).")
    if not isinstance(batch_spec, PartitionSpec):
        raise MeshplanTypeError(f"batch_spec={batch_spec!r:.80} must be a PartitionSpec (the token batch's).")
    b, s = (tuple(canonical_entries(batch_spec, 2, where="batch_spec")) + ((), ()))[:2]
    roles = {"model_axes": as_sequence(model_axes, "model_axes"), "expert_axes": as_sequence(expert_axes, "expert_axes")}
    for role, axes in roles.items():
        for a in axes:
            if not isinstance(a, str):
                raise MeshplanTypeError(f"{role} entry {a!r} must be an axis name (str).")
    used = set(b) | set(s)
    m = tuple(a for a in _in_mesh_order(roles["model_axes"], sizes) if sizes[a] > 1 and a not in used)
    e = tuple(a for a in _in_mesh_order(roles["expert_axes"], sizes) if sizes[a] > 1)
    tp = math.prod(sizes[a] for a in m)
    out: dict[str, PartitionSpec] = {}
    if m:
        for name, width, rank in (("heads", dims["heads"], 4), ("kv_heads", dims["kv_heads"], 4),
                                  ("mlp", dims["mlp"], 3)):
            if width % tp == 0:
                entries: list[SpecEntry] = [b, s, m] + [()] * (rank - 3)
                out[name] = spec_from_entries(tuple(entries))
    if experts:
        ep = e if e and experts % math.prod(sizes[a] for a in e) == 0 else ()
        other = tuple(a for a in b if a not in ep)
        if ep:
            out["dispatch"] = spec_from_entries(((), b, (), ()))
        out["experts"] = spec_from_entries((ep, other, (), ()))
        if m and expert_mlp and expert_mlp % tp == 0:
            out["expert_mlp"] = spec_from_entries((ep, other, (), m))
    return out
