"""The compiled schedule decides among the meshes it timed: verified meshes ranked by their compiled step.

A plan's ranking is its estimate's. Once the best meshes are compiled, each has its program's step simulated
from the schedule XLA made (:class:`~meshplan.pure.verify.CompiledStep`), a surer figure than the estimate.
:func:`rank_by_compiled` reorders the meshes with a compiled step among the places they hold, fastest compiled
step first; every other mesh keeps its place, since an estimate and a compiled step are not priced alike and
are not compared. Ranks are renumbered and the verification's rows follow their meshes.

:func:`rejected_under` turns a search run with room to spare (a layout the user pinned that the estimate
puts over the budget: the search found no mesh at all) into one whose meshes are all rejected at the real
budget, so a plan compiles them like any other near miss. :func:`admit_compiled` does the same for the meshes
the search rejected: one whose compiled peak is within the
budget (its row ``exact``) is ranked among the meshes that fit, at the place its predicted step gives it.

Example:
  >>> from meshplan.pure.search import search_meshes
  >>> from meshplan.pure.verify import PlanVerification, VerifyRow, CompiledStep
  >>> result = search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=3)
  >>> a, b = result.candidates[:2]
  >>> rows = (VerifyRow(a.text, 1, 1, 2, "", compiled_step=CompiledStep(2.0, 2.0, 0.0)),
  ...         VerifyRow(b.text, 2, 1, 2, "", compiled_step=CompiledStep(1.0, 1.0, 0.0)))
  >>> ranked, checked = rank_by_compiled(result, PlanVerification(rows, (), "XLA", "", 0.0))
  >>> [c.text for c in ranked.candidates[:2]] == [b.text, a.text], [r.rank for r in checked.rows]
  (True, [2, 1])
"""

from __future__ import annotations

import dataclasses
import math

from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.search import MeshCandidate, SearchRequest, SearchResult
from meshplan.pure.verify._rows import PlanVerification

__all__ = ["admit_compiled", "rank_by_compiled", "rejected_under"]

ADMITTED = "fits as compiled: the estimate put it over the budget, XLA's peak is within it"
"""The verdict of a mesh the search rejected and the compiler admitted (:func:`admit_compiled`)."""


def rank_by_compiled(result: SearchResult, checked: PlanVerification) -> tuple[SearchResult, PlanVerification]:
    """``result`` with its compiled meshes reordered by compiled step among their places, and ``checked`` with
    its rows' ranks following them (see the module docstring).

    Raises:
      MeshplanTypeError: ``result`` or ``checked`` of the wrong type.
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult.")
    if not isinstance(checked, PlanVerification):
        raise MeshplanTypeError(f"checked={checked!r:.80} must be a PlanVerification.")
    steps = {r.mesh: r.compiled_step.step_s for r in checked.rows
             if r.compiled_step is not None and r.status == "exact"}
    cands = list(result.candidates)
    places = [i for i, c in enumerate(cands) if c.text in steps]
    timed = sorted((cands[i] for i in places), key=lambda c: (steps[c.text], c.rank or 0))
    for i, c in zip(places, timed, strict=True):
        cands[i] = c
    renumbered = tuple(c if c.rank == i else dataclasses.replace(c, rank=i) for i, c in enumerate(cands, start=1))
    rank_of = {c.text: c.rank for c in renumbered}

    def follow(rows: tuple) -> tuple:  # type: ignore[type-arg]
        return tuple(r if r.rank is None or r.mesh not in rank_of else dataclasses.replace(r, rank=rank_of[r.mesh])
                     for r in rows)

    return (dataclasses.replace(result, candidates=renumbered),
            dataclasses.replace(checked, rows=follow(checked.rows), removed=follow(checked.removed)))


def admit_compiled(result: SearchResult, checked: PlanVerification) -> tuple[SearchResult, PlanVerification]:
    """``result`` with the rejected meshes the compiler found within the budget ranked among those that fit, and
    ``checked`` with its rows' ranks following them.

    A rejected mesh whose row in ``checked.rows`` is ``exact`` (compiled, its peak within the budget) moves from
    ``result.rejected`` to ``result.candidates``, in front of the first ranked mesh with a slower predicted step
    (every other mesh keeps its order), with the verdict :data:`ADMITTED`. Ranks are renumbered from 1 and
    ``num_fitting`` counts the admitted meshes.

    Raises:
      MeshplanTypeError: ``result`` or ``checked`` of the wrong type.

    Example:
      >>> from meshplan.pure.search import search_meshes
      >>> from meshplan.pure.verify import PlanVerification, VerifyRow
      >>> result = search_meshes("llama3-8b", "1x8xH100", batch=32, seq=4096, top_k=3)
      >>> lean = result.rejected[0]
      >>> row = VerifyRow(lean.text, None, 1, 2**40, "", status="exact", peak_bytes=2**30)
      >>> admitted, checked = admit_compiled(result, PlanVerification((row,), (), "XLA:GPU", "", 1.0))
      >>> lean.text in [c.text for c in admitted.candidates], lean.text in [c.text for c in admitted.rejected]
      (True, False)
      >>> checked.rows[0].rank == next(c.rank for c in admitted.candidates if c.text == lean.text)
      True
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult.")
    if not isinstance(checked, PlanVerification):
        raise MeshplanTypeError(f"checked={checked!r:.80} must be a PlanVerification.")
    fit = {r.mesh for r in checked.rows if r.status == "exact"}
    admitted = [c for c in result.rejected if c.text in fit]
    if not admitted:
        return result, checked

    def step_of(c: MeshCandidate) -> float:
        return math.inf if c.step is None else c.step.step_s

    cands = list(result.candidates)
    for c in admitted:  # each in front of the first ranked mesh it is faster than
        at = next((i for i, o in enumerate(cands) if step_of(o) > step_of(c)), len(cands))
        cands.insert(at, dataclasses.replace(c, verdict=ADMITTED))
    renumbered = tuple(c if c.rank == i else dataclasses.replace(c, rank=i) for i, c in enumerate(cands, start=1))
    rank_of = {c.text: c.rank for c in renumbered}
    rows = tuple(r if r.mesh not in rank_of else dataclasses.replace(r, rank=rank_of[r.mesh]) for r in checked.rows)
    kept = tuple(c for c in result.rejected if c.text not in fit)
    return (dataclasses.replace(result, candidates=renumbered, rejected=kept,
                                num_fitting=result.num_fitting + len(admitted)),
            dataclasses.replace(checked, rows=rows))


def rejected_under(result: SearchResult, request: SearchRequest) -> SearchResult:
    """``result`` (searched with more room than ``request`` allows) with every mesh it found rejected at
    ``request``'s budget: no ranked meshes, its meshes leanest first, each verdict the rejection's.

    A search that finds no mesh under the budget raises; a layout the user pins may still fit as compiled
    (its stated range reaching the budget). Searched again on devices with room for it, the result here is
    what the plan verifies: its near misses are compiled (:func:`~meshplan.pure.verify.near_misses`) and those
    that fit admitted (:func:`admit_compiled`).

    Raises:
      MeshplanTypeError: ``result`` not a SearchResult, ``request`` not a SearchRequest.

    Example:
      >>> from meshplan.pure.search import search_meshes
      >>> loose = search_meshes("gpt2", "1x8xH100", batch=8, seq=1024, fixed={"dp": 8}, top_k=1)
      >>> out = rejected_under(loose, dataclasses.replace(loose.request, headroom=0.9999))
      >>> out.candidates, [c.text for c in out.rejected], out.rejected[0].memory.fits
      ((), ['dp=8'], False)
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult.")
    if not isinstance(request, SearchRequest):
        raise MeshplanTypeError(f"request={request!r:.80} must be a SearchRequest.")
    budget = request.budget
    over = []
    for c in sorted((*result.candidates, *result.rejected), key=lambda c: (c.memory.total, c.axis_sizes)):
        mem = dataclasses.replace(c.memory, budget=budget)
        verdict = (f"rejected: {fmt_bytes(mem.total)}/device > {fmt_bytes(budget)} budget ({mem.parts()})"
                   if not mem.fits else c.verdict)
        over.append(dataclasses.replace(c, memory=mem, verdict=verdict, rank=None))
    return dataclasses.replace(result, request=request, candidates=(), rejected=tuple(over), num_fitting=0)
