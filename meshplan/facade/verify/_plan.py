"""The estimate screens, the compiler decides: verify a plan's top meshes by compiling them.

:func:`verify_plan` takes a :class:`~meshplan.pure.SearchResult` (the pure,
compiler-free ranking) and compiles meshplan's reference train step for its
top meshes in worker subprocesses (:mod:`meshplan.facade.verify._driver`), with the
target's own compiler: libtpu for a TPU slice, the jax CUDA plugin for a GPU
cluster (no GPU needed), XLA:CPU for ``target="cpu"``. Which meshes:

1. the ``top`` best ranked, and every other ranked mesh whose stated range (the
   estimate scaled by its calibration's recorded spread) straddles the budget;
2. a compiled peak over the budget removes that mesh (XLA:GPU compiles a step
   too big for the GPU all the same, so the peak is compared here), and the
   next ranked mesh is compiled in its place;
3. until ``top`` meshes are verified to fit, the ranking runs out, or the time
   budget does (the rest keep their estimate and range);
4. then the meshes the search rejected whose stated range reaches down to the budget
   (:func:`~meshplan.pure.verify.near_misses`, at most ``top``): the estimate cannot say they do not fit. One
   whose compiled peak is within the budget is an ``exact`` row (unranked here:
   :func:`~meshplan.pure.verify.admit_compiled` ranks it among the meshes that fit), the others are removed.

Each :class:`VerifyRow` says which it is: ``exact`` (the compiler and its
versions in ``compiler``), ``estimate`` (with its range), ``over budget``
(removed) or ``not verified`` (a crash, a timeout: the reason). Figures are
cached (:mod:`meshplan.facade.verify._cache`), so a re-plan is instant. Which meshes to compile
next and what each compile decides are pure (:mod:`meshplan.pure.verify`).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, TextIO

from meshplan.facade._model_file import resolve_model
from meshplan.facade.verify._compilers import COMPILE_TARGETS, compiler_for
from meshplan.facade.verify._driver import Compile, compile_rows
from meshplan.facade.verify._jobs import CompileJob, reference_config
from meshplan.facade.verify._reference import ReferenceConfig
from meshplan.pure._check import as_count, as_real
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.search import MeshCandidate, SearchResult
from meshplan.pure.verify import (
    PlanVerification,
    VerifyRow,
    estimate_row,
    near_misses,
    next_to_compile,
    uncompiled_dispatch,
)

__all__ = ["verify_plan"]


def _job(cand: MeshCandidate, result: SearchResult, spec: ModelSpec, config: ReferenceConfig,
         target: str) -> CompileJob:
    req = result.request
    own = config if cand.step is None else dataclasses.replace(config, micro_batches=cand.step.micro_batches)
    return CompileJob(spec, req.cluster, tuple(cand.axis_names), tuple(cand.axis_sizes), tuple(cand.dcn_shape),
                      cand, batch=req.batch, seq=req.seq, config=own, target=target)


def verify_plan(result: SearchResult, *, model: Any = None, top: int = 3, target: str = "auto",
                config: Any = None, time_budget_s: float = 300.0, timeout_s: float = 600.0,
                parallel: int | None = None, cache: bool = True, stream: TextIO | None = None,
                executor: Any = None) -> PlanVerification:
    """Compile the reference step of a plan's top meshes; drop those whose compiled peak is over the budget.

    Args:
      result: what :func:`~meshplan.pure.search_meshes` returned.
      model: the :class:`~meshplan.pure.ModelSpec` searched (default: the preset or model file
        ``result.request.model`` names).
      top: how many meshes to verify as fitting (more are compiled when some are over the budget).
      target: ``"auto"`` (the cluster's compiler) or ``"cpu"`` (XLA:CPU, as many simulated devices).
      config: the :class:`~meshplan.ReferenceConfig` (default: the one the plan's recipe describes,
        :func:`~meshplan.facade.verify.reference_config`).
      time_budget_s: stop starting compiles after this many seconds (the rest keep their estimate).
      timeout_s: the most one compile may take.
      parallel: compiles side by side (default: one per core).
      cache: read and write the compile cache (:func:`meshplan.facade.verify.cache_dir`).
      stream: progress lines (default stderr).
      executor: where the compiles run: ``None`` (this machine's worker pool) or a
        ``concurrent.futures.Executor`` (a Dask cluster's: :func:`~meshplan.facade.verify.dask_executor`).
        Outcomes come back here and are cached here.

    Returns:
      A :class:`PlanVerification`; with no compiler installed for the target, every row is an estimate
      and ``note`` says what to install. A plan of an MoE model priced with the dropless dispatch compiles
      nothing: the reference step runs the einsum dispatch only, so each row is ``not verified`` and says
      why (:func:`~meshplan.pure.verify.uncompiled_dispatch`).

    Raises:
      MeshplanTypeError: ``result`` is not a SearchResult.
      PlanError: ``top`` below 1, a non-positive time budget, or an unknown target.

    Example:
      >>> import dataclasses, io
      >>> from meshplan.pure import search_meshes, get_preset
      >>> tiny = dataclasses.replace(get_preset("gpt2").spec, num_layers=1, num_params=None)
      >>> found = search_meshes(tiny, "1x8xH100", batch=8, seq=32, top_k=2)
      >>> checked = verify_plan(found, model=tiny, top=1, target="cpu", cache=False, stream=io.StringIO())
      >>> checked.rows[0].status, checked.rows[0].compiler.startswith("XLA:CPU")
      ('exact', True)
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult (what search_meshes returns).")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise PlanError(f"top={top!r:.40} must be an int >= 1: how many meshes to verify.")
    if not isinstance(target, str) or target not in COMPILE_TARGETS:
        raise PlanError(f"target={target!r:.40} must be 'auto' (the cluster's compiler) or 'cpu'.")
    try:
        time_budget_s = as_real(time_budget_s, "time_budget_s", error=PlanError)
        timeout_s = as_real(timeout_s, "timeout_s", error=PlanError)
        parallel = None if parallel is None else as_count(parallel, "parallel", error=PlanError)
    except (PlanError, MeshplanTypeError) as err:
        raise type(err)(f"{err} (time_budget_s and timeout_s are seconds > 0, parallel a count of workers)") from None
    if not isinstance(cache, bool):
        raise MeshplanTypeError(f"cache={cache!r:.40} must be True or False.")
    out = stream if stream is not None else sys.stderr
    start = time.perf_counter()
    req = result.request
    model = resolve_model(req.model) if model is None else model  # a preset name or the model file the plan read
    config = config if config is not None else reference_config(req.recipe, param_dtype=req.param_dtype)
    ranked = list(result.candidates)
    estimates = [estimate_row(c, req.budget, req.recipe, micro_batches=config.micro_batches) for c in ranked]
    why = uncompiled_dispatch(model, req.recipe)
    if why:  # a dropless MoE plan: the reference step is another step (each row says so; installing won't help)
        rows = tuple(dataclasses.replace(r, status="not verified", error=f"not verified: {why}") for r in estimates)
        return PlanVerification(rows, (), "", "", time.perf_counter() - start)
    compiler = compiler_for(req.cluster, target)
    if not compiler.ready:
        return PlanVerification(tuple(estimates), (), "", f"estimates only: {compiler.problem}.",
                                time.perf_counter() - start)
    highs = [r.range_high_bytes for r in estimates]
    decided: dict[int, VerifyRow] = {}
    note = ""
    next_i = 0
    while True:
        want, next_i = next_to_compile(highs, req.budget, {i: r.status for i, r in decided.items()}, top=top,
                                       start=next_i)
        if not want:
            break
        left = time_budget_s - (time.perf_counter() - start)
        if left <= 0:
            note = f"the {time_budget_s:.0f} s verification budget ran out; the rest are estimates"
            break
        items = [Compile(_job(ranked[i], result, model, config, target), estimates[i], ranked[i].text,
                         f"compiling the reference step of {model.name} on {ranked[i].text} (rank {ranked[i].rank}) "
                         f"for {req.cluster.text}") for i in want]
        compiled = compile_rows(items, compiler=compiler.name, stream=out, cache=cache, parallel=parallel,
                                timeout_s=min(timeout_s, max(left, 1.0)), executor=executor)
        decided.update(zip(want, compiled, strict=True))
    every = [decided.get(i, row) for i, row in enumerate(estimates)]
    left = time_budget_s - (time.perf_counter() - start)
    if left > 0 and not note:
        every += _near_misses(result, model, config, target, compiler.name, top=top, stream=out, cache=cache,
                              parallel=parallel, timeout_s=min(timeout_s, max(left, 1.0)), executor=executor)
    shown = tuple(r for r in every if r.status != "over budget")
    removed = tuple(r for r in every if r.status == "over budget")
    if removed and not any(r.status == "exact" for r in shown) and not note:
        note = "every compiled mesh is over the budget"
    return PlanVerification(shown, removed, compiler.name, note, time.perf_counter() - start)


def _near_misses(result: SearchResult, model: ModelSpec, config: ReferenceConfig, target: str, compiler: str, *,
                 top: int, stream: TextIO, cache: bool, parallel: int | None, timeout_s: float,
                 executor: Any) -> list[VerifyRow]:
    """The rows of the rejected meshes whose stated range reaches down to the budget, compiled (step 4 of the
    module docstring); those not compiled (a crash, a timeout) are dropped: the search's rejection stands."""
    req = result.request
    rejected = list(result.rejected)
    estimates = [estimate_row(c, req.budget, req.recipe, micro_batches=config.micro_batches) for c in rejected]
    want = near_misses([r.range_low_bytes for r in estimates], req.budget, limit=top)
    if not want:
        return []
    items = [Compile(_job(rejected[i], result, model, config, target), estimates[i], rejected[i].text,
                     f"compiling the reference step of {model.name} on {rejected[i].text} (over the budget by the "
                     f"estimate, its range reaching it) for {req.cluster.text}") for i in want]
    rows = compile_rows(items, compiler=compiler, stream=stream, cache=cache, parallel=parallel,
                        timeout_s=timeout_s, executor=executor)
    return [r for r in rows if r.status in ("exact", "over budget")]
