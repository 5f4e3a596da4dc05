"""``meshplan measure``'s rows (:class:`StepTiming`) and their document, which ``meshplan profile --refine`` and the
benchmarks read back.

A measurement is a list of :class:`~meshplan.pure.cluster.StepTiming` rows (one per layout: measured beside
predicted), ranked by :func:`rank_measured`, in a small versioned JSON document (:func:`measure_document`)
that also says on which machine it ran and which profile priced the predictions; :func:`read_measure` reads it
strictly (a :class:`~meshplan.pure.errors.ProfileError` naming the file and the field).

Example:
  >>> ran = StepTiming("m", 64, "dp=8", 8, 32, 2, 0.3, 0.29, 0.31, None, "none", 0.2, 0.2, 0.0, 0.5, 10, None)
  >>> failed = StepTiming("m", 64, "tp=8", 8, 32, 0, None, None, None, None, "", 0.1, 0.1, 0.0, 0.5, 10, None,
  ...                     error="out of memory")
  >>> [r.mesh for r in rank_measured([failed, ran])]
  ['dp=8', 'tp=8']
  >>> doc = measure_document([ran], machine="1x8xXLA:CPU", device_kind="cpu", platform="cpu")
  >>> read_measure(__import__("json").dumps(doc))[0] == ran
  True
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.pure._check import as_count, as_record, as_sequence, as_str
from meshplan.pure.cluster._profile_fields import (
    MAX_BYTES,
    MAX_DIM,
    checked,
    count,
    name,
    optional,
    positive,
    record_fields,
    seconds,
    text,
)
from meshplan.pure.errors import MeshplanError, MeshplanTypeError, ProfileError

__all__ = ["MEASURE_FORMAT", "StepTiming", "measure_document", "rank_measured", "read_measure"]

MEASURE_FORMAT = 1
"""The measure document's format version."""

_KIND = "meshplan measure"


@dataclasses.dataclass(frozen=True, slots=True)
class StepTiming:
    """One layout's measured training step beside what the plan predicted (a row of ``meshplan measure``).

    Attributes:
      model: the model's name.
      hidden: its hidden size.
      mesh: the mesh text (``"dp=2,fsdp=4"``).
      batch, seq: the global batch (sequences) and tokens per sequence.
      steps: timed steps (after the warm-up); 0 when the layout did not run.
      measured_step_s: the median step (``None``: it did not run; ``error`` says why).
      measured_min_s, measured_max_s: the fastest and slowest timed step.
      measured_peak_bytes: the device's peak bytes in use during the steps (``None``: the backend reports
        none, as XLA:CPU, or it could not be read; ``peak_note`` says which).
      peak_note: where ``measured_peak_bytes`` comes from, or why there is none.
      predicted_step_s: the plan's step (compute + exposed communication).
      predicted_compute_s, predicted_exposed_s: its two parts.
      efficiency: the matmul efficiency the compute was priced at; ``predicted_compute_s x efficiency`` is the
        compute at the peak, what a refit rescales.
      predicted_memory_bytes: the plan's estimate of the peak per device.
      compiled_peak_bytes: XLA's compiled peak for this device (``None``: not compiled).
      profile_id: the :attr:`MachineProfile.id` that priced the prediction (``""``: the catalogue's figures).
      error: why the layout has no measurement (``""``: it ran).
      predicted_rank: its rank in the plan.
    """

    model: str
    hidden: int
    mesh: str
    batch: int
    seq: int
    steps: int
    measured_step_s: float | None
    measured_min_s: float | None
    measured_max_s: float | None
    measured_peak_bytes: int | None
    peak_note: str
    predicted_step_s: float | None
    predicted_compute_s: float | None
    predicted_exposed_s: float | None
    efficiency: float | None
    predicted_memory_bytes: int | None
    compiled_peak_bytes: int | None
    profile_id: str = ""
    error: str = ""
    predicted_rank: int | None = None

    def __post_init__(self) -> None:
        opt_s = optional(seconds)
        opt_b = optional(lambda v, w: as_count(v, w, minimum=0, maximum=MAX_BYTES, error=ProfileError))
        checked(self, {
            "model": name, "hidden": count, "mesh": name, "batch": count, "seq": count,
            "steps": lambda v, w: as_count(v, w, minimum=0, maximum=MAX_DIM, error=ProfileError),
            "measured_step_s": opt_s, "measured_min_s": opt_s, "measured_max_s": opt_s,
            "measured_peak_bytes": opt_b, "peak_note": text, "predicted_step_s": opt_s,
            "predicted_compute_s": opt_s, "predicted_exposed_s": opt_s,
            "efficiency": optional(positive), "predicted_memory_bytes": opt_b, "compiled_peak_bytes": opt_b,
            "profile_id": text, "error": text, "predicted_rank": optional(count)})
        ran = self.measured_step_s is not None
        if ran == bool(self.error):
            raise ProfileError(f"StepTiming {self.mesh!r}: a row has a measured step or an error, not both or "
                               f"neither (measured_step_s={self.measured_step_s}, error={self.error!r:.60}).")
        low, mid, high = self.measured_min_s, self.measured_step_s, self.measured_max_s
        if mid is not None and not (low is not None and high is not None and low <= mid <= high and self.steps):
            raise ProfileError(f"StepTiming {self.mesh!r}: measured_min_s <= measured_step_s <= measured_max_s "
                               f"must hold over steps >= 1 (got {self.measured_min_s}, {self.measured_step_s}, "
                               f"{self.measured_max_s} over {self.steps}).")

    @property
    def step_ratio(self) -> float | None:
        """Measured over predicted step (``None`` where either is missing or the prediction is 0)."""
        if self.measured_step_s is None or not self.predicted_step_s:
            return None
        return self.measured_step_s / self.predicted_step_s

    @property
    def memory_ratio(self) -> float | None:
        """Measured peak over the plan's estimate."""
        if self.measured_peak_bytes is None or not self.predicted_memory_bytes:
            return None
        return self.measured_peak_bytes / self.predicted_memory_bytes

    @property
    def compiled_ratio(self) -> float | None:
        """Measured peak over XLA's compiled peak."""
        if self.measured_peak_bytes is None or not self.compiled_peak_bytes:
            return None
        return self.measured_peak_bytes / self.compiled_peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the three ratios for readers (ignored by :meth:`from_dict`)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(step_ratio=self.step_ratio, memory_ratio=self.memory_ratio, compiled_ratio=self.compiled_ratio)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTiming:
        """Inverse of :meth:`to_dict`."""
        return cls(**record_fields(cls, data, ignore=("step_ratio", "memory_ratio", "compiled_ratio")))




def rank_measured(rows: Sequence[StepTiming]) -> tuple[StepTiming, ...]:
    """Rows that ran by measured median step (ties by mesh text), then those that did not, by predicted rank.

    Raises:
      MeshplanTypeError: rows that are not StepTiming records.
    """
    items = as_sequence(rows, "rows")
    if not all(isinstance(r, StepTiming) for r in items):
        raise MeshplanTypeError("rows must be StepTiming records (meshplan measure rows).")
    ran = sorted((r for r in items if r.measured_step_s is not None), key=lambda r: (r.measured_step_s, r.mesh))
    failed = sorted((r for r in items if r.measured_step_s is None),
                    key=lambda r: (r.predicted_rank is None, r.predicted_rank or 0, r.mesh))
    return (*ran, *failed)


def measure_document(rows: Sequence[StepTiming], *, machine: str, device_kind: str, platform: str,
                     profile_id: str = "", notes: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON document of a measurement: ``{"kind", "format", "machine", ..., "rows": [...]}``, rows ranked."""
    for name, value in (("machine", machine), ("device_kind", device_kind), ("platform", platform),
                        ("profile_id", profile_id)):
        as_str(value, name, error=ProfileError)
    texts = [as_str(n, f"notes[{i}]", error=ProfileError) for i, n in enumerate(as_sequence(notes, "notes"))]
    return {"kind": _KIND, "format": MEASURE_FORMAT, "machine": machine, "device_kind": device_kind,
            "platform": platform, "profile_id": profile_id, "notes": texts,
            "rows": [r.to_dict() for r in rank_measured(rows)]}


def read_measure(text: str | bytes, *, source: str = "measurement") -> tuple[StepTiming, ...]:
    """The rows of a :func:`measure_document` (its JSON text), checked field by field.

    Raises:
      ProfileError: not JSON, another kind or format version, or a bad row (naming ``source`` and the field).
    """
    if not isinstance(text, (str, bytes)):
        raise MeshplanTypeError(f"text={text!r:.60} must be the measurement's JSON text.")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ProfileError(f"{source}: not a complete JSON document: {err}.") from None
    fields = ("kind", "format", "machine", "device_kind", "platform", "profile_id", "notes", "rows")
    try:
        doc = as_record(data, source, fields=fields, required=("kind", "format", "rows"), error=ProfileError)
    except MeshplanError as err:
        raise ProfileError(str(err)) from None
    if doc["kind"] != _KIND or doc["format"] != MEASURE_FORMAT:
        raise ProfileError(f"{source}: field kind/format: {doc['kind']!r:.40} format {doc['format']!r:.10} is not "
                           f"a {_KIND!r} document of format {MEASURE_FORMAT} (meshplan measure --out FILE writes one).")
    try:
        items = as_sequence(doc["rows"], "rows")
    except MeshplanError as err:
        raise ProfileError(f"{source}: field rows: {err}") from None
    out = []
    for i, item in enumerate(items):
        try:
            out.append(StepTiming.from_dict(item))
        except MeshplanError as err:
            raise ProfileError(f"{source}: field rows[{i}]: {err}") from None
    return tuple(out)
