"""The mesh search's whole answer: the request, ranked and rejected meshes, and why others were left out.

JSON-ready like :mod:`meshplan.pure.search._candidate`: ``SearchResult.from_json(r.to_json()) == r``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshplan.pure._check import as_count, as_real, as_sequence
from meshplan.pure.errors import PlanError
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure._fields import fields_of as _fields, records as _records
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cost._profile_pricing import ProfilePricing
from meshplan.pure.cost._recipe import TrainingRecipe
from meshplan.pure._fields import (
    as_bool,
    as_efficiency,
    as_nonneg,
    as_text,
    as_texts,
    check_fields,
    instance_of,
    nested,
    optional,
    tuple_of,
)

__all__ = ["RANK_BY", "Rejection", "SearchRequest", "SearchResult"]


@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
    """Meshes left out for one reason: how many, and one example."""

    kind: str
    count: int
    example: str

    def __post_init__(self) -> None:
        check_fields(self, {"kind": as_text, "count": as_nonneg, "example": as_text})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"kind": self.kind, "count": self.count, "example": self.example}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rejection:
        """Inverse of :meth:`to_dict`."""
        return cls(**_fields(cls, data))


@dataclasses.dataclass(frozen=True, slots=True)
class SearchRequest:
    """What was asked: model, cluster, axes, constraints and the training step priced.

    ``moe_layers``: the model's MoE layers (0 for a dense model), so that a result says which of its
    recipe's choices it read (the MoE dispatch). ``optimizer_copies`` counts the recipe's master weights
    among the copies; they are priced in fp32, the other copies in ``optimizer_dtype``.
    """

    model: str
    cluster: Cluster
    axes: tuple[str, ...]
    fixed: tuple[tuple[str, int], ...]
    batch: int
    seq: int
    param_dtype: str
    grad_dtype: str
    optimizer_copies: int
    optimizer_dtype: str
    activations: bool
    headroom: float
    tp_within_domain: bool
    ep_within_domain: bool
    rule: str
    top_k: int
    recipe: TrainingRecipe = dataclasses.field(default_factory=TrainingRecipe)
    efficiency: float | None = None
    rank_by: str = "time"
    choose_micro_batches: bool = False  # True: micro-batches chosen per mesh (the recipe's count is the first try)
    moe_layers: int = 0
    profile: ProfilePricing | None = None  # the machine profile that priced the plan (None: the catalogue)

    def __post_init__(self) -> None:
        if not isinstance(self.rank_by, str) or self.rank_by not in RANK_BY:  # an array compares elementwise
            raise PlanError(f"rank={self.rank_by!r:.60}: use one of {list(RANK_BY)}.")
        check_fields(self, {
            "model": as_text, "cluster": instance_of(Cluster), "axes": as_texts, "fixed": tuple_of(_fixed_pair),
            "batch": _count, "seq": _count, "param_dtype": as_text, "grad_dtype": as_text,
            "optimizer_copies": as_nonneg, "optimizer_dtype": as_text, "activations": as_bool,
            "headroom": _headroom, "tp_within_domain": as_bool, "ep_within_domain": as_bool, "rule": as_text,
            "top_k": _count, "recipe": instance_of(TrainingRecipe), "efficiency": optional(as_efficiency),
            "choose_micro_batches": as_bool, "moe_layers": as_nonneg,
            "profile": optional(instance_of(ProfilePricing)),
        })

    @property
    def budget(self) -> int:
        """Bytes per device a mesh may use: HBM less the headroom."""
        return int(self.cluster.hbm_bytes * (1.0 - self.headroom))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the cluster nested)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["cluster"] = self.cluster.to_dict()
        out["axes"] = list(self.axes)
        out["fixed"] = [list(p) for p in self.fixed]
        out["recipe"] = self.recipe.to_dict()
        # Written only when a profile priced the plan: a catalogue plan's JSON stays what it was.
        if self.profile is None:
            del out["profile"]
        else:
            out["profile"] = self.profile.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchRequest:
        """Inverse of :meth:`to_dict`."""
        fields = _fields(cls, data)
        fields["cluster"] = nested("cluster", lambda: Cluster.from_dict(fields["cluster"]))
        if "recipe" in fields:
            fields["recipe"] = nested("recipe", lambda: TrainingRecipe.from_dict(fields["recipe"]))
        if fields.get("profile") is not None:
            fields["profile"] = nested("profile", lambda: ProfilePricing.from_dict(fields["profile"]))
        return cls(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class SearchResult:
    """The ranked meshes that fit, the closest that did not, and why others were left out.

    Attributes:
      request: what was asked.
      candidates: meshes that fit, best first (at most ``request.top_k``).
      rejected: meshes over the memory budget, leanest first (at most ``top_k``).
      rejections: every reason meshes were left out, with counts.
      num_candidates: meshes enumerated (after per-axis pruning).
      num_fitting: meshes that fit (``candidates`` may show fewer).
    """

    request: SearchRequest
    candidates: tuple[MeshCandidate, ...]
    rejected: tuple[MeshCandidate, ...]
    rejections: tuple[Rejection, ...]
    num_candidates: int
    num_fitting: int

    def __post_init__(self) -> None:
        check_fields(self, {
            "request": instance_of(SearchRequest), "candidates": tuple_of(instance_of(MeshCandidate)),
            "rejected": tuple_of(instance_of(MeshCandidate)), "rejections": tuple_of(instance_of(Rejection)),
            "num_candidates": as_nonneg, "num_fitting": as_nonneg,
        })

    @property
    def best(self) -> MeshCandidate:
        """The top-ranked mesh.

        Raises:
          PlanError: no mesh fits (the search raises before this can happen).
        """
        if not self.candidates:
            raise PlanError("no mesh fits; see .rejected and .rejections for why.")
        return self.candidates[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "request": self.request.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected": [c.to_dict() for c in self.rejected],
            "rejections": [r.to_dict() for r in self.rejections],
            "num_candidates": self.num_candidates,
            "num_fitting": self.num_fitting,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchResult:
        """Inverse of :meth:`to_dict`.

        Every field of the document is checked on load (by each record's
        ``__post_init__``), so a hand-edited file fails here, naming the
        field path, rather than later inside ``.best.memory.fits``. A
        ``meshplan plan --json`` document is a search result with one more
        key, ``report`` (the verification and the pipeline layouts:
        :meth:`meshplan.pure.report.PlanReport.from_json` reads it), which this
        reads past.

        Raises:
          PlanError: ``data`` is not a search result; the message names the
            field path (``plan field candidates[0].memory: ...``).
        """
        try:
            fields = nested("(document)", lambda: _fields(cls, data, ignore=("report",)))
            fields["request"] = nested("request", lambda: SearchRequest.from_dict(fields["request"]))
            for name, from_dict in (("candidates", MeshCandidate.from_dict), ("rejected", MeshCandidate.from_dict),
                                    ("rejections", Rejection.from_dict)):
                fields[name] = _records(name, from_dict, fields[name])
            return nested("(document)", lambda: cls(**fields))
        except PlanError as err:
            raise PlanError(f"not a meshplan search result: {err}") from None

    def to_json(self, *, indent: int | None = 2) -> str:
        """The result as JSON text; :meth:`from_json` reads it back to an equal result."""
        if indent is not None:
            indent = as_count(indent, "indent", minimum=0, maximum=64, error=PlanError)
        return json.dumps(self.to_dict(), indent=indent, default=_json_default)

    @classmethod
    def from_json(cls, text: str | bytes) -> SearchResult:
        """Read :meth:`to_json` output.

        Raises:
          PlanError: ``text`` is not JSON text (or is nested too deeply to
            read) or not a search result; the message names the bad field's path.
        """
        if not isinstance(text, (str, bytes, bytearray)):
            raise PlanError(f"not a meshplan search result: text={text!r:.80} must be the JSON text (str) of "
                            f"a search result, not {type(text).__name__}.")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise PlanError(f"not a meshplan search result: invalid JSON ({err}).") from None
        except RecursionError:
            raise PlanError("not a meshplan search result: the JSON is nested too deeply to read.") from None
        return cls.from_dict(data)


RANK_BY: tuple[str, ...] = ("time", "comm")
"""Orders of the ranked meshes: predicted step time (default), or communication seconds alone."""


def _count(value: Any, what: str) -> int:
    return as_count(value, what, error=PlanError)


def _headroom(value: Any, what: str) -> float:
    out = as_real(value, what, allow_zero=True, error=PlanError)
    if out >= 1:
        raise PlanError(f"{what}={value!r} must be in [0, 1) (the fraction of HBM kept free).")
    return out


def _fixed_pair(value: Any, what: str) -> tuple[str, int]:
    pair = as_sequence(value, what)
    if len(pair) != 2:
        raise PlanError(f"{what}={value!r:.80} must be an [axis, size] pair.")
    return as_text(pair[0], f"{what}[0]"), _count(pair[1], f"{what}[1]")


def _json_default(value: Any) -> Any:
    # numpy scalars sneak in through user-supplied DeviceSpecs.
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
