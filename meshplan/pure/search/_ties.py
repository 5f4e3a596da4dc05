"""Layouts the step-time model cannot tell apart: tied with the best, in a stated order.

A ranked search sorts fitting meshes by predicted step time. Many of them lie closer to the best than the
model's own error (:data:`~meshplan.pure.cost.STEP_TIME_RESOLUTION`, its median error against published runs):
ranking those to a tenth of a percent would state a difference the model cannot see. :func:`order_ties` keeps
the best and every ranked mesh whose predicted step is within that resolution of it as one tied group, and
orders the group deterministically by what the estimate knows more surely than its step time:

1. the compiled schedule's step, for the meshes compiled (``compiled_steps``), faster first, ahead of the
   meshes not compiled;
2. fewer bytes over the network (DCN / InfiniBand) per step, where the model's overlap is least certain;
3. the predicted step, then the memory per device, then the axis sizes (a total order: no tie is left to
   chance or to hash order).

The meshes beyond the resolution keep their order after the group. Ranks are renumbered from 1.

Example:
  >>> from meshplan.pure.search import search_meshes
  >>> result = search_meshes("llama3-8b", "2x8xH100", batch=16, seq=4096, top_k=5)
  >>> ordered = order_ties(result.candidates)
  >>> [c.rank for c in ordered] == list(range(1, len(ordered) + 1)), tied_count(ordered) >= 1
  (True, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from meshplan.pure.cost import STEP_TIME_RESOLUTION
from meshplan.pure.search._candidate import MeshCandidate

__all__ = ["dcn_bytes", "order_ties", "tied_count"]


def dcn_bytes(cand: MeshCandidate) -> int:
    """Bytes per step in collectives whose device group crosses ICI domains (over DCN / InfiniBand), counting
    each such call's whole buffer (an upper bound for a two-level collective, whose network part is smaller).

    Example:
      >>> from meshplan.pure.search import search_meshes
      >>> dcn_bytes(search_meshes("gpt2", "1x8xH100", batch=8, seq=1024, top_k=1).best)
      0
    """
    return sum(t.nbytes * t.calls for t in cand.comm if "inter" in t.link)


def _step(cand: MeshCandidate) -> float:
    return math.inf if cand.step is None else cand.step.step_s


def tied_count(candidates: Sequence[MeshCandidate], *, resolution: float = STEP_TIME_RESOLUTION) -> int:
    """How many of the ranked ``candidates`` (best first) are within ``resolution`` of the best's predicted step
    (the best included; 0 for no candidates, 1 when nothing is tied with it).

    Example:
      >>> tied_count(())
      0
    """
    if not candidates:
        return 0
    best = min(_step(c) for c in candidates)
    if not math.isfinite(best):
        return 1
    limit = best * math.exp(resolution)
    return sum(1 for c in candidates if _step(c) <= limit)


def order_ties(candidates: Sequence[MeshCandidate], *, resolution: float = STEP_TIME_RESOLUTION,
               compiled_steps: Mapping[str, float] | None = None) -> tuple[MeshCandidate, ...]:
    """``candidates`` (ranked by predicted step) with the group tied with the best ordered as the module
    docstring says, and ranks renumbered from 1.

    Args:
      candidates: ranked meshes that fit, by predicted step time.
      resolution: the model's resolution in log space (default :data:`~meshplan.pure.cost.STEP_TIME_RESOLUTION`).
      compiled_steps: mesh text -> the compiled schedule's step, for the meshes compiled.
    """
    ranked = sorted(candidates, key=lambda c: (_step(c), c.memory.total, c.axis_sizes))
    n = tied_count(ranked, resolution=resolution)
    done = dict(compiled_steps or {})

    def key(c: MeshCandidate) -> tuple[int, float, int, float, int, tuple[int, ...]]:
        compiled = done.get(c.text)
        return (0 if compiled is not None else 1, compiled if compiled is not None else 0.0, dcn_bytes(c),
                _step(c), c.memory.total, c.axis_sizes)

    ordered = sorted(ranked[:n], key=key) + ranked[n:]
    return tuple(c if c.rank == i else dataclasses.replace(c, rank=i) for i, c in enumerate(ordered, start=1))
