"""One priced mesh of the search, as plain, JSON-ready frozen dataclasses.

A :class:`~meshplan.pure.SearchResult` made on a laptop can be checked in (``to_json``) and
re-applied on the cluster (``SearchResult.from_json(text).best``): a
:class:`MeshCandidate` carries the mesh axis names and sizes, its ICI and DCN
shapes (pass them to ``meshplan.create_mesh(axis_dims, axis_names,
dcn_mesh_dims=...)``) and one :class:`ParamGroup` per parameter group, from
which :meth:`MeshCandidate.plan` rebuilds the specs of a parameter tree.

Every ``to_dict`` returns JSON types only (PartitionSpecs become lists, see
:func:`~meshplan.pure.rules._axis_kind.spec_to_json`) and ``from_dict`` inverts it
exactly: ``X.from_dict(x.to_dict()) == x``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_positive_shape, as_shape
from meshplan.pure._fields import (
    as_nonneg,
    as_rank,
    as_text,
    as_texts,
    check_fields,
    fields_of,
    instance_of,
    nested,
    optional,
    records,
    tuple_of,
    unchecked,
)
from meshplan.pure._types import PyTree
from meshplan.pure.cost._estimates import CommTerm, MemoryBreakdown, StepEstimate
from meshplan.pure.cost._pipeline import PipelinePlan
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.presets import Preset
from meshplan.pure.rules._base import Decision
from meshplan.pure.rules._engine import Plan, plan_tree
from meshplan.pure.rules._path import spec_from_json, spec_to_json
from meshplan.pure.search._match import GroupRule
from meshplan.pure.specs._activation import ActivationLayout
from meshplan.pure.specs._training import TrainingLayout, optimizer_state_specs

__all__ = ["MeshCandidate", "ParamGroup"]


def _spec(value: Any, what: str) -> PartitionSpec:
    if not isinstance(value, PartitionSpec):
        raise MeshplanTypeError(f"{what} must be a PartitionSpec, got {value!r:.80}.")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class ParamGroup:
    """Parameters that share a spec: same path pattern, shape and dtype.

    Attributes:
      pattern: the path template (layer/expert indices as ``*``) or, where
        leaves of one template got different specs, an exact path.
      shape: the leaves' shape.
      dtype: their dtype name (``"bfloat16"``).
      count: how many leaves the group holds.
      spec: the PartitionSpec they get.
      rule: the rule that decided.
      reason: why, in one line.
    """

    pattern: str
    shape: tuple[int, ...]
    dtype: str
    count: int
    spec: PartitionSpec
    rule: str
    reason: str

    def __post_init__(self) -> None:
        check_fields(self, {"pattern": as_text, "shape": as_shape, "dtype": as_text, "count": as_nonneg,
                            "spec": _spec, "rule": as_text, "reason": as_text})

    @classmethod
    def trusted(cls, pattern: str, shape: tuple[int, ...], dtype: str, count: int, spec: PartitionSpec, rule: str,
                reason: str) -> ParamGroup:
        """The record from values the search took from a checked tree and checked decisions (strs,
        a tuple of Python ints, an int >= 0, a PartitionSpec), without :meth:`__post_init__`'s
        checks: a shown search builds a few hundred. Everything else goes through the checks.

        Example:
          >>> ParamGroup.trusted("w", (4,), "float32", 1, PartitionSpec(), "r", "why") == ParamGroup(
          ...     "w", (4,), "float32", 1, PartitionSpec(), "r", "why")
          True
        """
        return unchecked(cls, (pattern, shape, dtype, count, spec, rule, reason))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"pattern": self.pattern, "shape": list(self.shape), "dtype": self.dtype, "count": self.count,
                "spec": spec_to_json(self.spec), "rule": self.rule, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParamGroup:
        """Inverse of :meth:`to_dict`."""
        fields = fields_of(cls, data)
        if "spec" in fields:
            fields["spec"] = nested("spec", lambda: spec_from_json(fields["spec"], where="spec"))
        return cls(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class MeshCandidate:
    """One mesh the search priced: its layout, memory, communication and verdict.

    Attributes:
      axis_names: mesh axis names, outermost first.
      axis_sizes: their sizes (multiplying to the device count).
      ici_shape: each axis's part inside one ICI domain (node / slice).
      dcn_shape: each axis's part across domains (multiplying to the domain count).
      memory: bytes on the fullest device.
      comm: the collectives of one training step.
      verdict: why it won, ranked where it did, or was rejected.
      rank: 1-based rank among meshes that fit; ``None`` when rejected.
      groups: the parameter groups and their specs.
      activations: the batch, residual-stream and logits specs the activation
        memory was charged for (``None`` in plans saved before they existed).
      step: the predicted step time (``None`` in plans saved before step times).
      pipeline: for a pipelined layout (a ``pp`` axis), its schedule, micro-batches,
        bubble and layers per stage (:class:`~meshplan.pure.cost.PipelinePlan`); ``None`` otherwise.
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    ici_shape: tuple[int, ...]
    dcn_shape: tuple[int, ...]
    memory: MemoryBreakdown
    comm: tuple[CommTerm, ...]
    verdict: str
    rank: int | None = None
    groups: tuple[ParamGroup, ...] = ()
    activations: ActivationLayout | None = None
    step: StepEstimate | None = None
    pipeline: PipelinePlan | None = None

    def __post_init__(self) -> None:
        check_fields(self, {"axis_names": as_texts, "axis_sizes": as_positive_shape, "ici_shape": as_positive_shape,
                            "dcn_shape": as_positive_shape, "memory": instance_of(MemoryBreakdown),
                            "comm": tuple_of(instance_of(CommTerm)), "verdict": as_text,
                            "rank": optional(as_rank), "groups": tuple_of(instance_of(ParamGroup)),
                            "activations": optional(instance_of(ActivationLayout)),
                            "step": optional(instance_of(StepEstimate)),
                            "pipeline": optional(instance_of(PipelinePlan))})
        lengths = {len(self.axis_names), len(self.axis_sizes), len(self.ici_shape), len(self.dcn_shape)}
        if len(lengths) != 1:
            raise PlanError(f"MeshCandidate: axis_names {self.axis_names}, axis_sizes {self.axis_sizes}, "
                            f"ici_shape {self.ici_shape} and dcn_shape {self.dcn_shape} differ in length.")
        bad = [n for n, s, i, d in zip(self.axis_names, self.axis_sizes, self.ici_shape, self.dcn_shape,
                                       strict=True) if i * d != s]
        if bad:
            raise PlanError(f"MeshCandidate: ici * dcn != size for axes {bad}.")

    @property
    def mesh_shape(self) -> dict[str, int]:
        """Axis name -> size, in mesh order."""
        return dict(zip(self.axis_names, self.axis_sizes, strict=True))

    @property
    def num_devices(self) -> int:
        """Devices in the mesh."""
        return math.prod(self.axis_sizes)

    @property
    def hybrid(self) -> HybridMeshShape:
        """The ICI x DCN shape, as ``create_mesh`` / ``MeshConfig`` take it."""
        return HybridMeshShape(self.ici_shape, self.dcn_shape)

    @property
    def step_comm_s(self) -> float:
        """Estimated seconds of communication per training step (all terms)."""
        return float(sum(t.seconds for t in self.comm))

    @property
    def fits(self) -> bool:
        """Whether it fits the memory budget."""
        return self.memory.fits

    @property
    def text(self) -> str:
        """``'dp=8,fsdp=8,tp=1'``: the axes that are not 1 (all of them if every one is)."""
        shown = [(n, s) for n, s in zip(self.axis_names, self.axis_sizes, strict=True) if s > 1]
        return ",".join(f"{n}={s}" for n, s in shown or zip(self.axis_names, self.axis_sizes, strict=True))

    def plan(self, tree: PyTree) -> Plan:
        """Specs for ``tree`` (the same model the search planned), with reasons.

        Raises:
          ShardingRuleError: a leaf matches no parameter group (another model).
        """
        if isinstance(tree, Preset):
            tree = tree.params
        records = ((g.pattern, g.shape, g.dtype, Decision(g.spec, g.reason, g.rule)) for g in self.groups)
        return plan_tree(tree, GroupRule(records, name="plan"), self.mesh_shape)

    def specs_for(self, tree: PyTree) -> PyTree:
        """The PartitionSpec tree for ``tree``; see :meth:`plan`.

        Leaves match the plan's groups by normalised path and shape (see
        :class:`~meshplan.pure.search._match.GroupRule`): ``{"params": tree}``, an
        nnx State's ``/value`` leaves, a :class:`~meshplan.pure.Preset` and fp32
        parameters against a bf16 plan all get the searched specs.
        """
        return self.plan(tree).specs

    def _activations(self) -> ActivationLayout:
        if self.activations is None:
            raise PlanError(f"the plan for {self.text} carries no batch or activation specs (it was saved "
                            "by an older meshplan); run the search again.")
        return self.activations

    @property
    def batch_spec(self) -> PartitionSpec:
        """The spec of a ``(batch, seq)`` input: the batch over ``dp, fsdp, ep``, the sequence over ``sp``."""
        return self._activations()["batch"].spec

    @property
    def activation_specs(self) -> dict[str, PartitionSpec]:
        """``{"residual": ..., "logits": ...}``: the splits the activation memory assumed.

        Apply them in the step (``jax.lax.with_sharding_constraint``) to the
        residual stream ``(batch, seq, hidden)`` and the logits ``(batch, seq, vocab)``.
        """
        return {k: v for k, v in self._activations().specs.items() if k != "batch"}

    def training_layout(self, params: PyTree, opt_state: PyTree = None) -> TrainingLayout:
        """Every spec a training step needs, for this model's ``params`` and optimizer state.

        Args:
          params: the parameter tree the search planned (arrays or ShapeDtypeStructs).
          opt_state: the optimizer state, e.g. ``jax.eval_shape(opt.init, params)``; its specs
            follow :func:`~meshplan.optimizer_state_specs`.

        Returns:
          A :class:`~meshplan.pure.specs.TrainingLayout`: ``.state`` places params and state in one
          ``device_put``, ``.shardings(mesh)`` gives NamedShardings.

        Raises:
          ShardingRuleError: a leaf matches no parameter group (another model).
          PlanError: the plan carries no activation specs.

        Example:
          >>> from meshplan.pure import get_preset, search_meshes
          >>> best = search_meshes("gpt2", "8xH100", batch=8, seq=1024).best
          >>> layout = best.training_layout(get_preset("gpt2").params)
          >>> layout.batch, layout.activations["residual"] == best.activation_specs["residual"]
          (P('dp', 'sp'), True)
        """
        specs = self.specs_for(params)
        state = None if opt_state is None else optimizer_state_specs(params, specs, opt_state)
        acts = self._activations().specs
        return TrainingLayout(specs, state, acts.pop("batch"), acts, self.mesh_shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``pipeline`` only for a pipelined layout)."""
        return {
            "axis_names": list(self.axis_names), "axis_sizes": list(self.axis_sizes),
            "ici_shape": list(self.ici_shape), "dcn_shape": list(self.dcn_shape),
            "step_comm_s": self.step_comm_s, "memory": self.memory.to_dict(),
            "comm": [t.to_dict() for t in self.comm], "verdict": self.verdict, "rank": self.rank,
            "groups": [g.to_dict() for g in self.groups],
            "activations": None if self.activations is None else self.activations.to_dict(),
            "step": None if self.step is None else self.step.to_dict(),
            # Only pipelined layouts carry the key: every other plan's JSON stays as it was.
            **({} if self.pipeline is None else {"pipeline": self.pipeline.to_dict()}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeshCandidate:
        """Inverse of :meth:`to_dict` (``step_comm_s`` is recomputed)."""
        fields = fields_of(cls, data, ignore=("step_comm_s",))
        fields["memory"] = nested("memory", lambda: MemoryBreakdown.from_dict(fields["memory"]))
        fields["comm"] = records("comm", CommTerm.from_dict, fields["comm"])
        fields["groups"] = records("groups", ParamGroup.from_dict, fields.get("groups", ()))
        acts = fields.get("activations")
        fields["activations"] = None if acts is None else nested(
            "activations", lambda: ActivationLayout.from_dict(acts))
        step = fields.get("step")
        fields["step"] = None if step is None else nested("step", lambda: StepEstimate.from_dict(step))
        pipe = fields.get("pipeline")
        fields["pipeline"] = None if pipe is None else nested("pipeline", lambda: PipelinePlan.from_dict(pipe))
        return cls(**fields)
