"""What a compile decides, and which meshes to compile next: the verification's decisions, kept pure.

The facade (:mod:`meshplan.facade.verify`) compiles; everything it decides with the figures is here:

- :func:`compiled_fit`: whether a compiled peak is within the budget (a deviceless XLA:GPU peak is checked
  at the top of the range a run on the GPU peaks in);
- :func:`outcome_row`: one compile's outcome as a row of the plan (exact, over budget or not verified),
  the one conversion plan verification, pipeline verification and ``meshplan check`` share;
- :func:`uncompiled_dispatch`: why a plan's step is not the reference step's (a dropless MoE recipe);
- :func:`estimate_range` and :func:`next_to_compile`: which ranked meshes a plan compiles, in what order;
- :func:`near_misses`: which meshes the estimate put over the budget are compiled before they are reported so
  (those whose stated range reaches down to the budget: the estimate cannot say they do not fit).

Example:
  >>> gib = 2**30
  >>> compiled_fit(50 * gib, 52 * gib, deviceless=False)
  (False, None, '')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.pure._check import as_choice, as_count, as_flag, as_instance, as_sequence, as_str
from meshplan.pure._fields import MAX_COUNT, as_byte_count, as_size, optional
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cost import TrainingRecipe, calibration_spread, peak_bounds
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.presets._spec import as_model_spec
from meshplan.pure.search import MeshCandidate
from meshplan.pure.verify._outcome import CompileOutcome
from meshplan.pure.verify._rows import STATUSES, VerifyRow
from meshplan.pure.xla import deviceless_gpu_run_range

__all__ = ["OOM_SOURCE", "compiled_fit", "estimate_range", "estimate_row", "near_misses", "next_to_compile",
           "outcome_row", "uncompiled_dispatch"]

OOM_SOURCE = "XLA's out-of-memory message"
"""The ``peak_source`` of a row whose peak is the figure XLA's refusal states (XLA:TPU's out-of-memory)."""


def compiled_fit(peak_bytes: int, budget_bytes: int, *, deviceless: bool) -> tuple[bool, int | None, str]:
    """``(over the budget, the top of a GPU run's range or None, why it is over or "")`` for a compiled peak.

    A peak XLA:GPU compiled with no GPU (``deviceless``) is checked at the top of the range a run on the GPU
    peaked in (x 1.06, measured on an H100: the autotuner's gemm workspaces); any other compiled peak is the
    run's own.

    Example:
      >>> gib = 2**30
      >>> compiled_fit(50 * gib, 52 * gib, deviceless=True)
      (True, 56908316672, 'compiled peak 50.0 GiB, a run up to 53.0 GiB on the GPU, > the 52.0 GiB budget')
      >>> compiled_fit(50 * gib, 52 * gib, deviceless=False)
      (False, None, '')
    """
    peak_bytes, budget_bytes = as_byte_count(peak_bytes, "peak_bytes"), as_byte_count(budget_bytes, "budget_bytes")
    deviceless = as_flag(deviceless, "deviceless")
    high = deviceless_gpu_run_range(peak_bytes)[1] if deviceless else None
    needs = peak_bytes if high is None else high
    if needs <= budget_bytes:
        return False, high, ""
    run = "" if high is None else f", a run up to {fmt_bytes(high)} on the GPU,"
    return True, high, f"compiled peak {fmt_bytes(peak_bytes)}{run} > the {fmt_bytes(budget_bytes)} budget"


def uncompiled_dispatch(model: ModelSpec, recipe: TrainingRecipe) -> str:
    """Why the reference step cannot check a plan of ``model`` priced with ``recipe``, or ``""`` when it can.

    The reference step runs GShard's einsum dispatch only. A plan priced with the dropless dispatch
    (``recipe.moe_dispatch``) has none of that step's capacity padding or ``s x s`` routing tensors, so the
    einsum step's compiled peak is not its peak: comparing them, or dropping a mesh because the einsum step
    is over the budget, would check a different step. Such rows are not compiled and say so. A dense model
    has no dispatch: its step is the same either way.

    Example:
      >>> from meshplan.pure.presets import MODEL_SPECS
      >>> uncompiled_dispatch(MODEL_SPECS["mixtral-8x7b"], TrainingRecipe(moe_dispatch="dropless"))[:53]
      'not compiled: the plan priced the dropless MoE dispat'
      >>> uncompiled_dispatch(MODEL_SPECS["llama3-8b"], TrainingRecipe(moe_dispatch="dropless"))
      ''
    """
    model, recipe = as_model_spec(model, "model"), _recipe(recipe)
    if not model.num_moe_layers or recipe.moe_dispatch == "einsum":
        return ""
    return (f"not compiled: the plan priced the {recipe.moe_dispatch} MoE dispatch (grouped GEMMs over the routed "
            "tokens) and meshplan's reference step runs the einsum dispatch only (capacity padding, s x s routing "
            "tensors), whose compiled peak is not this plan's")


def estimate_range(cand: MeshCandidate, recipe: TrainingRecipe) -> tuple[int | None, int | None]:
    """Where the recorded compiles put ``cand``'s compiled peak, ``(low, high)`` bytes; ``(None, None)`` where
    no recorded compile checks the coefficients ``recipe`` is priced with.

    Example:
      >>> from meshplan.pure.search import search_meshes
      >>> cand = search_meshes("gpt2", "1x8xH100", batch=8, seq=1024, top_k=1).best
      >>> low, high = estimate_range(cand, TrainingRecipe(backend="gpu"))
      >>> low < cand.memory.total < high
      True
    """
    cand, recipe = _candidate(cand), _recipe(recipe)
    found = calibration_spread(recipe)
    if found is None:
        return None, None
    return peak_bounds(cand.memory, found[1])


def estimate_row(cand: MeshCandidate, budget_bytes: int, recipe: TrainingRecipe, *, status: str = "estimate",
                 micro_batches: int = 1, **fields: Any) -> VerifyRow:
    """The row of a ranked mesh before (or without) a compile: the estimate, its range, ``status``.

    Example:
      >>> from meshplan.pure.search import search_meshes
      >>> found = search_meshes("gpt2", "1x8xH100", batch=8, seq=1024, top_k=1)
      >>> estimate_row(found.best, found.request.budget, found.request.recipe).summary()[:10]
      'estimate: '
    """
    cand, budget_bytes, recipe = _candidate(cand), as_byte_count(budget_bytes, "budget_bytes"), _recipe(recipe)
    status = as_choice(status, "status", STATUSES, error=PlanError)
    micro_batches = as_size(micro_batches, "micro_batches")
    unknown = sorted(set(fields) - _ROW_FIELDS)
    if unknown:
        raise MeshplanTypeError(f"estimate_row got unknown fields {unknown}; the other fields of a VerifyRow are "
                                f"{sorted(_ROW_FIELDS)}.")
    low, high = estimate_range(cand, recipe)
    micro = micro_batches if cand.step is None else cand.step.micro_batches
    return VerifyRow(mesh=cand.text, rank=cand.rank, analytic_bytes=cand.memory.total, budget_bytes=budget_bytes,
                     target=fields.pop("target", ""), status=status, range_low_bytes=low, range_high_bytes=high,
                     micro_batches=micro, **fields)


def outcome_row(base: VerifyRow, outcome: CompileOutcome, *, compiler: str, cached: bool,
                compiled_schedule: str = "", note: str = "") -> VerifyRow:
    """``base`` (the mesh's estimate row) with what its compile gave: exact, over budget or not verified.

    XLA's refusal of a step too big for the device is ``over budget`` at the figure its message states; a
    compiled peak is held against the budget by :func:`compiled_fit`; no figures at all (a crash, a
    timeout) is ``not verified`` with the reason. ``compiled_schedule`` and ``note`` (a pipelined step's
    schedule, and what its peak checks) are kept only on rows with a compiled figure.

    Example:
      >>> base = VerifyRow("fsdp=8", 1, 100, 200, "")
      >>> outcome_row(base, CompileOutcome("8 x XLA:CPU", None, error="timed out after 9 s"),
      ...             compiler="XLA:CPU", cached=False).summary()
      'not verified: estimate 0.0 MiB; timed out after 9 s'
    """
    base = as_instance(base, "base", VerifyRow, example="estimate_row(cand, budget_bytes, recipe)")
    outcome = as_instance(outcome, "outcome", CompileOutcome)
    compiler, compiled_schedule, note = (as_str(v, name) for v, name in (
        (compiler, "compiler"), (compiled_schedule, "compiled_schedule"), (note, "note")))
    cached = as_flag(cached, "cached")
    if outcome.oom:
        return dataclasses.replace(
            base, status="over budget", target=outcome.target, peak_bytes=outcome.oom_required_bytes,
            peak_source=OOM_SOURCE, compile_seconds=outcome.seconds, error=outcome.error, compiler=compiler,
            cached=cached, deviceless=outcome.deviceless, compiled_schedule=compiled_schedule, note=note)
    mem = outcome.memory
    if mem is None:
        return dataclasses.replace(base, status="not verified", target=outcome.target,
                                   compile_seconds=outcome.seconds, error=f"not verified: {outcome.error}",
                                   deviceless=outcome.deviceless)
    over, run_high, why = compiled_fit(mem.peak_bytes, base.budget_bytes, deviceless=outcome.deviceless)
    return dataclasses.replace(
        base, status="over budget" if over else "exact", target=outcome.target, argument_bytes=mem.argument_bytes,
        temp_bytes=mem.temp_bytes, peak_bytes=mem.peak_bytes, peak_source=mem.peak_source,
        compile_seconds=mem.compile_seconds, largest=mem.largest, largest_note=mem.largest_note, compiler=compiler,
        cached=cached, run_high_bytes=run_high, error=why, deviceless=outcome.deviceless,
        compiled_schedule=compiled_schedule, note=note, compiled_step=outcome.step, step_note=outcome.step_note)


def next_to_compile(range_highs: Sequence[int | None], budget_bytes: int, decided: Mapping[int, str], *,
                    top: int, start: int) -> tuple[tuple[int, ...], int]:
    """The ranked meshes to compile next, and where the next round starts: ``(indices, start)``.

    A plan compiles its best ``top`` ranked meshes; a compiled peak over the budget removes one, so the next
    ranked mesh is taken in its place, until ``top`` are verified to fit or the ranking runs out. Every mesh
    whose stated range reaches past the budget (``range_highs[i] > budget_bytes``) is compiled too, whatever
    its rank: its estimate cannot say whether it fits.

    Args:
      range_highs: each ranked mesh's range top (``None``: no recorded range), best first.
      budget_bytes: the plan's budget.
      decided: the status of each mesh compiled so far, by index.
      top: how many meshes to verify as fitting.
      start: the first ranked mesh no round has taken yet.

    Example:
      >>> next_to_compile([10, 30, 10, 10], 20, {}, top=2, start=0)
      ((0, 1), 2)
      >>> next_to_compile([10, 30, 10, 10], 20, {0: "exact", 1: "over budget"}, top=2, start=2)
      ((2,), 3)
    """
    range_highs = tuple(optional(as_byte_count)(h, f"range_highs[{i}]")
                        for i, h in enumerate(as_sequence(range_highs, "range_highs")))
    budget_bytes, decided = as_byte_count(budget_bytes, "budget_bytes"), _decided(decided)
    top = as_count(top, "top", minimum=0, maximum=MAX_COUNT, error=PlanError)
    start = as_count(start, "start", minimum=0, maximum=MAX_COUNT, error=PlanError)
    fitting = sum(1 for status in decided.values() if status == "exact")
    want: list[int] = []
    while start < len(range_highs) and fitting + len(want) < top:
        if start not in decided:  # a straddling mesh further down may have been compiled already
            want.append(start)
        start += 1
    straddle = [i for i, high in enumerate(range_highs) if (high or 0) > budget_bytes]
    want += [i for i in straddle if i not in decided and i not in want]
    return tuple(want), start


def near_misses(range_lows: Sequence[int | None], budget_bytes: int, *, limit: int) -> tuple[int, ...]:
    """The rejected meshes a plan compiles before calling them over the budget: ``indices``, leanest first.

    The search rejects a mesh whose estimate is over the budget; its stated range (the estimate times its
    calibration's recorded spread) may still reach down to the budget, and then the estimate cannot say it does
    not fit: the compiler can. Of the rejected meshes (leanest first, as the search lists them), those whose
    range bottom is within the budget, at most ``limit``.

    Args:
      range_lows: each rejected mesh's range bottom (``None``: no recorded range, not compiled), leanest first.
      budget_bytes: the plan's budget.
      limit: how many to compile at most.

    Example:
      >>> near_misses([15, 19, None, 25, 18], 20, limit=2)
      (0, 1)
    """
    lows = tuple(optional(as_byte_count)(x, f"range_lows[{i}]") for i, x in enumerate(as_sequence(range_lows,
                                                                                                "range_lows")))
    budget_bytes = as_byte_count(budget_bytes, "budget_bytes")
    limit = as_count(limit, "limit", minimum=0, maximum=MAX_COUNT, error=PlanError)
    return tuple(i for i, low in enumerate(lows) if low is not None and low <= budget_bytes)[:limit]


# The VerifyRow fields estimate_row sets itself are not among the ``**fields`` it passes on.
_ROW_FIELDS = frozenset(f.name for f in dataclasses.fields(VerifyRow)) - {
    "mesh", "rank", "analytic_bytes", "budget_bytes", "status", "range_low_bytes", "range_high_bytes",
    "micro_batches"}


def _recipe(value: Any) -> TrainingRecipe:
    return as_instance(value, "recipe", TrainingRecipe, example="TrainingRecipe()")


def _candidate(value: Any) -> MeshCandidate:
    return as_instance(value, "cand", MeshCandidate, example="search_meshes(...).best")


def _decided(value: Any) -> dict[int, str]:
    """``decided`` of :func:`next_to_compile`: ranked mesh index -> its status (one of ``STATUSES``)."""
    if not isinstance(value, Mapping):
        raise MeshplanTypeError(f"decided={value!r:.80} must map ranked mesh indices to statuses, not "
                                f"{type(value).__name__}.")
    return {as_count(i, "decided index", minimum=0, maximum=MAX_COUNT, error=PlanError):
            as_choice(status, f"decided[{i!r:.20}]", STATUSES, error=PlanError) for i, status in value.items()}
