"""Which mesh axis holds the pipeline stages: ``pp`` (meshplan), ``pipeline`` (loadax), ``stage`` (MaxText).

loadax's ``MeshConfig`` docs name the axis ``pipeline`` and MaxText's mesh names it ``stage``; meshplan's search
and exports call it ``pp``. :func:`pipeline_axis` finds it among a mesh's axis names, so a mesh built from a
loadax or MaxText config runs the pipelined step without renaming.

Example:
  >>> pipeline_axis(("pipeline", "data", "model"))
  'pipeline'
"""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.pure._check import as_sequence
from meshplan.pure.errors import MeshplanTypeError, MeshShapeError

__all__ = ["PIPELINE_AXIS_NAMES", "pipeline_axis"]

PIPELINE_AXIS_NAMES: tuple[str, ...] = ("pp", "pipeline", "stage")
"""The names a pipeline-stage axis goes by: meshplan's, loadax's, MaxText's."""


def pipeline_axis(axis_names: Sequence[str]) -> str | None:
    """The pipeline-stage axis among ``axis_names`` (one of :data:`PIPELINE_AXIS_NAMES`), or ``None``.

    Args:
      axis_names: a mesh's axis names.

    Returns:
      The one name in :data:`PIPELINE_AXIS_NAMES`, or ``None`` when the mesh has none.

    Raises:
      MeshShapeError: more than one of them (``pp`` and ``stage``): which holds the stages is ambiguous.
      MeshplanTypeError: names that are not strings.

    Example:
      >>> pipeline_axis(("pp", "dp")), pipeline_axis(("stage", "fsdp")), pipeline_axis(("dp", "tp"))
      ('pp', 'stage', None)
    """
    names = as_sequence(axis_names, "axis_names")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise MeshplanTypeError(f"axis_names holds non-strings {bad!r:.80}; give axis names.")
    found = [n for n in names if n in PIPELINE_AXIS_NAMES]
    if len(found) > 1:
        raise MeshShapeError(f"axis_names={tuple(names)} has several pipeline axes {found}; keep one of "
                             f"{list(PIPELINE_AXIS_NAMES)}.")
    return found[0] if found else None
