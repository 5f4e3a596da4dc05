"""The mesh search's whole answer: the request, ranked and rejected meshes, and why others were left out.

JSON-ready like :mod:`meshplan.pure.search._candidate`: ``SearchResult.from_json(r.to_json()) == r``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.search._candidate import MeshCandidate, _fields
from meshplan.pure.search._cluster import Cluster

__all__ = ["Rejection", "SearchRequest", "SearchResult"]


@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
    """Meshes left out for one reason: how many, and one example."""

    kind: str
    count: int
    example: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"kind": self.kind, "count": self.count, "example": self.example}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rejection:
        """Inverse of :meth:`to_dict`."""
        return cls(**_fields(cls, data))


@dataclasses.dataclass(frozen=True, slots=True)
class SearchRequest:
    """What was asked: model, cluster, axes, constraints and the training step priced."""

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", tuple(self.axes))
        object.__setattr__(self, "fixed", tuple((str(a), int(n)) for a, n in self.fixed))
        if not isinstance(self.cluster, Cluster):
            raise MeshplanTypeError(f"SearchRequest.cluster must be a Cluster, got {self.cluster!r}.")

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
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchRequest:
        """Inverse of :meth:`to_dict`."""
        fields = _fields(cls, data)
        fields["cluster"] = Cluster.from_dict(fields["cluster"])
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
        for name in ("candidates", "rejected", "rejections"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

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

        Raises:
          PlanError: ``data`` is not a search result (unknown or missing keys, wrong kinds of values).
        """
        try:
            fields = _fields(cls, data)
            fields["request"] = SearchRequest.from_dict(fields["request"])
            fields["candidates"] = tuple(MeshCandidate.from_dict(c) for c in fields["candidates"])
            fields["rejected"] = tuple(MeshCandidate.from_dict(c) for c in fields["rejected"])
            fields["rejections"] = tuple(Rejection.from_dict(r) for r in fields["rejections"])
            return cls(**fields)
        except (TypeError, AttributeError, KeyError) as err:
            # A hand-edited or foreign file: say so instead of leaking a raw TypeError.
            raise PlanError(f"not a meshplan search result: {type(err).__name__}: {err}") from None

    def to_json(self, *, indent: int | None = 2) -> str:
        """The result as JSON text; :meth:`from_json` reads it back to an equal result."""
        return json.dumps(self.to_dict(), indent=indent, default=_json_default)

    @classmethod
    def from_json(cls, text: str) -> SearchResult:
        """Read :meth:`to_json` output.

        Raises:
          PlanError: the text is not JSON or not a search result.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise PlanError(f"not a meshplan search result: invalid JSON ({err}).") from None
        return cls.from_dict(data)


def _json_default(value: Any) -> Any:
    # numpy scalars sneak in through user-supplied DeviceSpecs.
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
