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
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from jax.sharding import PartitionSpec

from meshplan.pure._check import as_positive_shape, as_sequence, as_shape
from meshplan.pure._format import fmt_bytes
from meshplan.pure._types import PyTree
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.mesh._hybrid import HybridMeshShape
from meshplan.pure.rules._base import Decision
from meshplan.pure.rules._engine import Plan, plan_tree
from meshplan.pure.rules._path import spec_from_json, spec_to_json
from meshplan.pure.presets import Preset
from meshplan.pure.search._match import GroupRule
from meshplan.pure.search._fields import (
    as_bool,
    as_nonneg,
    as_rank,
    as_seconds,
    as_text,
    as_texts,
    check_fields,
    instance_of,
    nested,
    optional,
    record,
    tuple_of,
)
from meshplan.pure.specs._activation import ActivationLayout
from meshplan.pure.specs._training import TrainingLayout, optimizer_state_specs

__all__ = ["CommTerm", "MemoryBreakdown", "MeshCandidate", "ParamGroup", "StepEstimate"]

R = TypeVar("R")


def _records(where: str, from_dict: Callable[[Any], R], items: Any) -> tuple[R, ...]:
    """``from_dict`` of every item of a JSON list, failures named ``where[i]``."""
    seq = nested(where, lambda: as_sequence(items, where))
    return tuple(nested(f"{where}[{i}]", functools.partial(from_dict, item)) for i, item in enumerate(seq))



def _unchecked(cls: type[R], values: tuple[Any, ...]) -> R:
    """A frozen record of ``cls`` holding ``values`` in field order, without ``__post_init__``'s checks:
    for figures the search built itself, already of the canonical types."""
    out = object.__new__(cls)
    for setter, value in zip(_slot_setters(cast(type, cls)), values, strict=True):
        setter(out, value)
    return out


# A search builds ~700 records through _unchecked; setting their slots through the slot descriptors takes
# half the time of object.__setattr__ by name. A class's slots never change, so the cache (one entry per
# record class) is pure.
@functools.lru_cache(maxsize=16)
def _slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    """The ``__set__`` of each slot of a slots dataclass, in field order (its ``__slots__``)."""
    return tuple(getattr(cls, name).__set__ for name in cls.__slots__)  # type: ignore[attr-defined]


def _fields(cls: type, data: Any, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    return record(cls, data, ignore=ignore)


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
        return _unchecked(cls, (pattern, shape, dtype, count, spec, rule, reason))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"pattern": self.pattern, "shape": list(self.shape), "dtype": self.dtype, "count": self.count,
                "spec": spec_to_json(self.spec), "rule": self.rule, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParamGroup:
        """Inverse of :meth:`to_dict`."""
        fields = _fields(cls, data)
        if "spec" in fields:
            fields["spec"] = nested("spec", lambda: spec_from_json(fields["spec"], where="spec"))
        return cls(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on the fullest device at the step's peak, by kind.

    ``params``, ``grads`` and ``optimizer`` are exact (what live arrays hold);
    ``activations`` is calibrated: what the peak phase holds beyond the state
    (see :mod:`meshplan.pure.search._step_memory`). ``phase`` names the peak
    phase (``"forward"``, ``"backward"``, ``"update"``; ``""`` in plans saved
    before phases existed) and ``grads_live`` says whether the gradients exist
    then (not at the end of the forward pass).
    """

    params: int
    grads: int
    optimizer: int
    activations: int
    budget: int
    phase: str = ""
    grads_live: bool = True

    def __post_init__(self) -> None:
        check_fields(self, dict.fromkeys(("params", "grads", "optimizer", "activations", "budget"), as_nonneg)
                     | {"phase": as_text, "grads_live": as_bool})

    @classmethod
    def trusted(cls, params: int, grads: int, optimizer: int, activations: int, budget: int, phase: str = "",
                grads_live: bool = True) -> MemoryBreakdown:
        """The record from figures the search computed itself (Python ints >= 0, a phase name, a
        bool), without :meth:`__post_init__`'s checks: a 4096-device search builds about a thousand
        and checking them again cost a tenth of it. Everything else (``from_dict``, a user's
        ``MemoryBreakdown(...)``) goes through the checks.

        Example:
          >>> MemoryBreakdown.trusted(1, 1, 1, 1, 10, "update") == MemoryBreakdown(1, 1, 1, 1, 10, "update")
          True
        """
        return _unchecked(cls, (params, grads, optimizer, activations, budget, phase, grads_live))

    @property
    def total(self) -> int:
        """The step's peak on the fullest device: the state live in the peak phase plus its activations."""
        return self.params + self.optimizer + self.activations + (self.grads if self.grads_live else 0)

    @property
    def fits(self) -> bool:
        """Whether the total fits the budget."""
        return self.total <= self.budget

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``total`` for readers; ignored by :meth:`from_dict`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["total"] = self.total
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryBreakdown:
        """Inverse of :meth:`to_dict`."""
        return cls(**_fields(cls, data, ignore=("total",)))

    def parts(self) -> str:
        """``'params 8.2 GiB, grads 8.2 GiB, optimizer 16.4 GiB, activations 8.4 GiB at the backward peak'``."""
        keys = ("params", "grads", "optimizer", "activations") if self.grads_live else (
            "params", "optimizer", "activations")
        text = ", ".join(f"{self.label(k)} {fmt_bytes(getattr(self, k))}" for k in keys)
        return text + (f" at the {self.phase} peak" if self.phase else "")

    def label(self, part: str) -> str:
        """The name of ``part`` as the peak phase holds it: at the update peak the bytes
        beyond the state are the optimizer's temporaries, not activations.

        Example:
          >>> MemoryBreakdown(1, 1, 1, 1, 10, phase="update").label("activations")
          'update temporaries'
        """
        if not isinstance(part, str):  # an array would compare elementwise below
            raise MeshplanTypeError(f"part={part!r:.60} must be a str naming a part (e.g. 'activations').")
        return "update temporaries" if part == "activations" and self.phase == "update" else part

    def describe(self) -> str:
        """``'41.2 GiB (params 8.2, grads 8.2, optimizer 16.4, activations 8.4 GiB)'``."""
        return f"{fmt_bytes(self.total)} ({self.parts()})"


@dataclasses.dataclass(frozen=True, slots=True)
class CommTerm:
    """One kind of collective a training step runs, priced by the alpha-beta model.

    Attributes:
      what: what moves, e.g. ``"fsdp all-gather of params"``.
      kind: the collective (see :data:`~meshplan.pure.COLLECTIVE_KINDS`).
      axes: the mesh axes of the device group.
      nbytes: the full buffer of one call (as :mod:`meshplan.pure.search._cost` defines it).
      calls: calls per step.
      link: ``"intra"`` (inside ICI domains), ``"inter"`` or ``"intra+inter"`` (two-level).
      seconds: the estimated time of all calls.
      exposed: of ``seconds``, those not hidden under compute (see
        :mod:`meshplan.pure.search._step_time`); ``None`` in plans saved before step times.
    """

    what: str
    kind: str
    axes: tuple[str, ...]
    nbytes: int
    calls: int
    link: str
    seconds: float
    exposed: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, {"what": as_text, "kind": as_text, "axes": as_texts, "nbytes": as_nonneg,
                            "calls": as_nonneg, "link": as_text, "seconds": as_seconds,
                            "exposed": optional(as_seconds)})

    def with_exposed(self, exposed: float) -> CommTerm:
        """This term with ``exposed`` seconds of it not hidden (a float in ``[0, seconds]``, from
        :func:`~meshplan.pure.search._step_time.step_time`): only ``exposed`` is checked, the other
        fields were when this term was made.

        Raises:
          PlanError: ``exposed`` is not a finite number >= 0 (MeshplanTypeError: not a number).

        Example:
          >>> CommTerm("x", "all-gather", ("fsdp",), 8, 1, "intra", 0.5).with_exposed(0.25).hidden
          0.25
        """
        return _unchecked(CommTerm, (self.what, self.kind, self.axes, self.nbytes, self.calls, self.link,
                                     self.seconds, as_seconds(exposed, "CommTerm.exposed")))

    @property
    def hidden(self) -> float | None:
        """Seconds hidden under compute (``None`` when not priced)."""
        return None if self.exposed is None else max(0.0, self.seconds - self.exposed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {f.name: list(self.axes) if f.name == "axes" else getattr(self, f.name)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommTerm:
        """Inverse of :meth:`to_dict`."""
        return cls(**_fields(cls, data))


@dataclasses.dataclass(frozen=True, slots=True)
class StepEstimate:
    """A mesh's predicted step time (see :mod:`meshplan.pure.search._step_time`).

    Attributes:
      compute_s: seconds of compute per device (FLOPs at peak x efficiency).
      exposed_s: seconds of communication not hidden under compute.
      tokens_per_s: tokens per second per device.
      mfu: model FLOPs utilisation (model FLOPs without recompute / (step x peak)); 0 when the peak is unknown.
      flops: executed FLOPs per device per step (recompute included).
      efficiency: the fraction of peak FLOP/s assumed.
      micro_batches: gradient-accumulation steps the step runs (chosen by the search or fixed; 1 = none).
    """

    compute_s: float
    exposed_s: float
    tokens_per_s: float
    mfu: float
    flops: float
    efficiency: float
    micro_batches: int = 1

    def __post_init__(self) -> None:
        check_fields(self, {**dict.fromkeys(("compute_s", "exposed_s", "tokens_per_s", "mfu", "flops", "efficiency"),
                                            as_seconds), "micro_batches": as_rank})

    @property
    def step_s(self) -> float:
        """Predicted seconds per step: compute plus exposed communication."""
        return self.compute_s + self.exposed_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``step_s`` for readers; ignored by :meth:`from_dict`)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["step_s"] = self.step_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepEstimate:
        """Inverse of :meth:`to_dict`."""
        return cls(**_fields(cls, data, ignore=("step_s",)))


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

    def __post_init__(self) -> None:
        check_fields(self, {"axis_names": as_texts, "axis_sizes": as_positive_shape, "ici_shape": as_positive_shape,
                            "dcn_shape": as_positive_shape, "memory": instance_of(MemoryBreakdown),
                            "comm": tuple_of(instance_of(CommTerm)), "verdict": as_text,
                            "rank": optional(as_rank), "groups": tuple_of(instance_of(ParamGroup)),
                            "activations": optional(instance_of(ActivationLayout)),
                            "step": optional(instance_of(StepEstimate))})
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
        """JSON-ready dict."""
        return {
            "axis_names": list(self.axis_names), "axis_sizes": list(self.axis_sizes),
            "ici_shape": list(self.ici_shape), "dcn_shape": list(self.dcn_shape),
            "step_comm_s": self.step_comm_s, "memory": self.memory.to_dict(),
            "comm": [t.to_dict() for t in self.comm], "verdict": self.verdict, "rank": self.rank,
            "groups": [g.to_dict() for g in self.groups],
            "activations": None if self.activations is None else self.activations.to_dict(),
            "step": None if self.step is None else self.step.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeshCandidate:
        """Inverse of :meth:`to_dict` (``step_comm_s`` is recomputed)."""
        fields = _fields(cls, data, ignore=("step_comm_s",))
        fields["memory"] = nested("memory", lambda: MemoryBreakdown.from_dict(fields["memory"]))
        fields["comm"] = _records("comm", CommTerm.from_dict, fields["comm"])
        fields["groups"] = _records("groups", ParamGroup.from_dict, fields.get("groups", ()))
        acts = fields.get("activations")
        fields["activations"] = None if acts is None else nested(
            "activations", lambda: ActivationLayout.from_dict(acts))
        step = fields.get("step")
        fields["step"] = None if step is None else nested("step", lambda: StepEstimate.from_dict(step))
        return cls(**fields)
