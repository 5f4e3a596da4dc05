"""``meshplan measure``'s rows as a document that ``meshplan profile --refine`` and the benchmarks read back.

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

import json
from collections.abc import Sequence
from typing import Any

from meshplan.pure._check import as_record, as_sequence, as_str
from meshplan.pure.cluster._profile import StepTiming
from meshplan.pure.errors import MeshplanError, MeshplanTypeError, ProfileError

__all__ = ["MEASURE_FORMAT", "measure_document", "rank_measured", "read_measure"]

MEASURE_FORMAT = 1
"""The measure document's format version."""

_KIND = "meshplan measure"


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
