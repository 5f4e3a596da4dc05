"""One plan as a reader gets it (:class:`PlanReport`): gathered once, then rendered by every renderer.

``meshplan plan`` searches the meshes, compiles the best of them, searches the pipeline layouts and compiles
the best of those, and puts all of it in one :class:`PlanReport`. The terminal, ``--format markdown``,
``--html`` and ``--json`` each render that one object, so they show the same facts: the ranked meshes, the
compiled peaks, the meshes the compiler removed and the rows it could not verify, the pipeline layouts and
their compiled peaks. A report reads back from its JSON (:meth:`PlanReport.from_json`); in a notebook,
:func:`~meshplan.pure.report.show` displays it.

Example:
  >>> from meshplan.pure.search import search_meshes
  >>> report = PlanReport(search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2))
  >>> report.compiled, PlanReport.from_json(report.to_json()) == report
  ({}, True)
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

from meshplan.pure._check import as_count
from meshplan.pure._fields import (
    as_text,
    as_texts,
    check_fields,
    fields_of,
    instance_of,
    nested,
    optional,
    records,
)
from meshplan.pure.errors import PlanError
from meshplan.pure.report._summary import default_budget_source
from meshplan.pure.search import MeshCandidate, PipelineSearch, SearchResult
from meshplan.pure.verify import CompiledStep, PlanVerification

__all__ = ["PlanReport", "as_report"]


@dataclasses.dataclass(frozen=True, slots=True)
class PlanReport:
    """A plan and everything gathered about it, for the renderers.

    Attributes:
      result: the ranked meshes (:func:`~meshplan.pure.search.search_meshes`).
      verification: the compiled rows of the ranked meshes (``None``: not verified).
      pipelines: the pipeline layouts for the same request (``None``: not searched; ``pipeline_note`` says why).
      pipeline_verification: the compiled rows of the best pipeline layouts (``None``: none compiled;
        ``pipeline_note`` says why where a reason is known).
      pipeline_note: why there are no pipeline layouts, or why none was compiled (``""``: nothing to say).
      budget_source: where the budget's headroom came from, as the header says it (``""``: the library's
        default where the request used it, :func:`~meshplan.pure.cluster.default_headroom`'s words, else
        ``"--headroom"``).
      notes: sentences about how the model is priced (sliding windows, ...), one header line each.
    """

    result: SearchResult
    verification: PlanVerification | None = None
    pipelines: PipelineSearch | None = None
    pipeline_verification: PlanVerification | None = None
    pipeline_note: str = ""
    budget_source: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.result, SearchResult) and self.budget_source == "":
            object.__setattr__(self, "budget_source", default_budget_source(self.result))
        check_fields(self, {
            "result": instance_of(SearchResult), "verification": optional(instance_of(PlanVerification)),
            "pipelines": optional(instance_of(PipelineSearch)),
            "pipeline_verification": optional(instance_of(PlanVerification)), "pipeline_note": as_text,
            "budget_source": as_text, "notes": as_texts,
        })

    @property
    def compiled(self) -> Mapping[str, tuple[int, str]]:
        """Mesh text -> (XLA's compiled peak, the compiler and its versions), for every ranked mesh the
        compiler gave a figure for (the removed ones included): what the renderers mark exact."""
        if self.verification is None:
            return {}
        return {r.mesh: (r.peak_bytes, r.compiler) for r in (*self.verification.rows, *self.verification.removed)
                if r.peak_bytes is not None and r.status in ("exact", "over budget")}

    @property
    def compiled_steps(self) -> Mapping[str, CompiledStep]:
        """Mesh text -> its compiled program's step (simulated from the schedule), for every ranked mesh the
        compiler gave one for."""
        if self.verification is None:
            return {}
        return {r.mesh: r.compiled_step for r in (*self.verification.rows, *self.verification.removed)
                if r.compiled_step is not None and r.status in ("exact", "over budget")}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the search result's, with the rest under ``report``."""
        pipes = None if self.pipelines is None else {
            "candidates": [c.to_dict() for c in self.pipelines.candidates],
            "left_out": list(self.pipelines.left_out)}
        return {**self.result.to_dict(), "report": {
            "verification": None if self.verification is None else self.verification.to_dict(),
            "pipelines": pipes,
            "pipeline_verification": (None if self.pipeline_verification is None
                                      else self.pipeline_verification.to_dict()),
            "pipeline_note": self.pipeline_note, "budget_source": self.budget_source, "notes": list(self.notes),
        }}

    @classmethod
    def from_dict(cls, data: Any) -> PlanReport:
        """Inverse of :meth:`to_dict`; a bare search result's dict reads as a report of that result alone.

        Raises:
          PlanError: not a plan report; the message names the field path.
        """
        result = SearchResult.from_dict(data)
        extra = data.get("report") if isinstance(data, Mapping) else None
        if extra is None:
            return cls(result)
        try:
            fields = nested("report", lambda: fields_of(_Fields, extra))
            for name in ("verification", "pipeline_verification"):
                if fields.get(name) is not None:
                    fields[name] = nested(f"report.{name}", functools.partial(PlanVerification.from_dict, fields[name]))
            pipes = fields.get("pipelines")
            if pipes is not None:
                found = nested("report.pipelines", lambda: fields_of(_PipelineFields, pipes))
                fields["pipelines"] = PipelineSearch(
                    records("report.pipelines.candidates", MeshCandidate.from_dict, found["candidates"]),
                    nested("report.pipelines.left_out", lambda: as_texts(found["left_out"], "left_out")))
            if "notes" in fields:
                fields["notes"] = nested("report.notes", lambda: as_texts(fields["notes"], "notes"))
            return nested("report", lambda: cls(result, **fields))
        except PlanError as err:
            raise PlanError(f"not a meshplan plan report: {err}") from None

    def to_json(self, *, indent: int | None = 2) -> str:
        """The report as JSON text; :meth:`from_json` reads it back to an equal report."""
        if indent is not None:
            indent = as_count(indent, "indent", minimum=0, maximum=64, error=PlanError)
        text = self.result.to_json(indent=None)  # the search result's own encoding (numpy scalars included)
        data = {**json.loads(text), "report": self.to_dict()["report"]}
        return json.dumps(data, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> PlanReport:
        """Read :meth:`to_json` output (or a search result's JSON).

        Raises:
          PlanError: not JSON text, or not a plan report; the message names the bad field's path.
        """
        result = SearchResult.from_json(text)  # every check of the result, and of the text being JSON
        data = json.loads(text)
        return cls.from_dict(data) if isinstance(data.get("report"), Mapping) else cls(result)


@dataclasses.dataclass(frozen=True, slots=True)
class _Fields:
    """The keys of a report's ``report`` object (for :func:`~meshplan.pure._fields.fields_of`)."""

    verification: Any = None
    pipelines: Any = None
    pipeline_verification: Any = None
    pipeline_note: str = ""
    budget_source: str = ""
    notes: Any = ()


@dataclasses.dataclass(frozen=True, slots=True)
class _PipelineFields:
    candidates: Any
    left_out: Any


def as_report(value: object) -> PlanReport:
    """``value`` as a report: a :class:`PlanReport` as it is, a bare search result as the report of it alone.

    Raises:
      MeshplanTypeError: anything else (the message names what was given).

    Example:
      >>> as_report("plan").result  # doctest: +IGNORE_EXCEPTION_DETAIL
      Traceback (most recent call last):
      meshplan.errors.MeshplanTypeError: ...
    """
    from meshplan.pure.errors import MeshplanTypeError

    if isinstance(value, PlanReport):
        return value
    if isinstance(value, SearchResult):
        return PlanReport(value)
    raise MeshplanTypeError(f"report={value!r:.80} must be a PlanReport or a SearchResult (search_meshes(...)), "
                            f"not {type(value).__name__}.")
