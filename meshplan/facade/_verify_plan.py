"""The estimate screens, the compiler decides: verify a plan's top meshes by compiling them.

:func:`verify_plan` takes a :class:`~meshplan.pure.SearchResult` (the pure,
compiler-free ranking) and compiles meshplan's reference train step for its
top meshes in worker subprocesses (:mod:`meshplan.facade._worker`), with the
target's own compiler: libtpu for a TPU slice, the jax CUDA plugin for a GPU
cluster (no GPU needed), XLA:CPU for ``target="cpu"``. Which meshes:

1. the ``top`` best ranked, and every other ranked mesh whose stated range (the
   estimate scaled by its calibration's recorded spread) straddles the budget;
2. a compiled peak over the budget removes that mesh (XLA:GPU compiles a step
   too big for the GPU all the same, so the peak is compared here), and the
   next ranked mesh is compiled in its place;
3. until ``top`` meshes are verified to fit, the ranking runs out, or the time
   budget does (the rest keep their estimate and range).

Each :class:`VerifyRow` says which it is: ``exact`` (the compiler and its
versions in ``compiler``), ``estimate`` (with its range), ``over budget``
(removed) or ``not verified`` (a crash, a timeout: the reason). Figures are
cached (:mod:`meshplan.facade._compile_cache`), so a re-plan is instant.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, TextIO

from meshplan.facade._verify_row import PlanVerification, VerifyRow, compiled_fit, uncompiled_dispatch
from meshplan.facade._worker import CompileJob, CompileOutcome, run_jobs
from meshplan.pure._check import as_count, as_real
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.search import SearchResult

__all__ = ["compiler_problem", "verify_plan"]

def compiler_problem(cluster: Any, target: str = "auto") -> tuple[str, str | None]:
    """(the compiler that would compile for ``cluster``, why it cannot here with what to install, or None).

    Example:
      >>> from meshplan.pure import parse_cluster
      >>> compiler_problem(parse_cluster("1x8xH100"), "cpu")[1] is None
      True
    """
    from meshplan.facade._compiled import libtpu_available
    from meshplan.facade._gpu_targets import (ESTIMATE_ONLY, compiler_version, cuda_plugin_problem,
                                              known_gpu_targets)

    if target == "cpu":
        return compiler_version("cpu"), None
    if cluster.device.ici_scope == "slice":
        if not libtpu_available():
            return "XLA:TPU", "libtpu is not installed: pip install 'meshplan[tpu]' for exact figures"
        return compiler_version("tpu"), None
    # No look at local GPUs: that would start jax's backends (and the CUDA plugin) in the caller's
    # process. The workers run with JAX_PLATFORMS=cpu and compile from meshplan's shipped description.
    if cluster.device.name in ESTIMATE_ONLY:
        return "XLA:GPU", ESTIMATE_ONLY[cluster.device.name]
    problem = cuda_plugin_problem()
    if problem is not None:
        return "XLA:GPU", f"{problem}, for exact figures with no GPU"
    if cluster.device.name not in known_gpu_targets():
        return "XLA:GPU", (f"meshplan ships no target description for {cluster.device.name} (it has "
                           f"{list(known_gpu_targets())}); add one to get exact figures")
    return compiler_version("gpu"), None


def _range(cand: Any, recipe: Any) -> tuple[int | None, int | None]:
    from meshplan.pure.search import calibration_spread, peak_bounds

    found = calibration_spread(recipe)
    if found is None:
        return None, None
    return peak_bounds(cand.memory, found[1])


def _config_for(result: SearchResult) -> Any:
    """The reference step the plan's recipe describes."""
    from meshplan.facade._reference import ReferenceConfig

    req = result.request
    recipe = req.recipe
    dtype = req.param_dtype if req.param_dtype != "mixed" else "bfloat16"
    return ReferenceConfig(remat=recipe.remat, attention=recipe.attention, optimizer=recipe.optimizer,
                           micro_batches=recipe.micro_batches, vocab_tiles=recipe.vocab_tiles,
                           param_dtype=dtype, scan_layers=True)


def _row(cand: Any, result: SearchResult, config: Any, status: str, **figures: Any) -> VerifyRow:
    low, high = _range(cand, result.request.recipe)
    micro = config.micro_batches if cand.step is None else cand.step.micro_batches
    return VerifyRow(mesh=cand.text, rank=cand.rank,
                     analytic_bytes=cand.memory.total, budget_bytes=result.request.budget,
                     target=figures.pop("target", ""), status=status, range_low_bytes=low, range_high_bytes=high,
                     micro_batches=micro, **figures)


def _from_outcome(cand: Any, result: SearchResult, config: Any, outcome: CompileOutcome, compiler: str,
                  cached: bool) -> VerifyRow:
    budget = result.request.budget
    if outcome.oom:
        return _row(cand, result, config, "over budget", target=outcome.target, peak_bytes=outcome.oom_required_bytes,
                    peak_source="XLA's out-of-memory message", compile_seconds=outcome.seconds,
                    error=outcome.error, compiler=compiler, cached=cached)
    mem = outcome.memory
    if mem is None:
        return _row(cand, result, config, "not verified", target=outcome.target, compile_seconds=outcome.seconds,
                    error=f"not verified: {outcome.error}")
    over, run_high, why = compiled_fit(mem.peak_bytes, budget, outcome.target)
    return _row(cand, result, config, "over budget" if over else "exact", target=outcome.target,
                argument_bytes=mem.argument_bytes, temp_bytes=mem.temp_bytes, peak_bytes=mem.peak_bytes,
                peak_source=mem.peak_source, compile_seconds=mem.compile_seconds, largest=mem.largest,
                largest_note=mem.largest_note, compiler=compiler, cached=cached,
                run_high_bytes=run_high, error=why)


def _job(cand: Any, result: SearchResult, spec: Any, config: Any, target: str) -> CompileJob:
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
      config: the :class:`~meshplan.ReferenceConfig` (default: the one the plan's recipe describes).
      time_budget_s: stop starting compiles after this many seconds (the rest keep their estimate).
      timeout_s: the most one compile may take.
      parallel: compiles side by side (default: one per core).
      cache: read and write the compile cache (:func:`meshplan.facade._compile_cache.cache_dir`).
      stream: progress lines (default stderr).
      executor: where the compiles run: ``None`` (this machine's worker pool) or a
        ``concurrent.futures.Executor`` (a Dask cluster's: :func:`meshplan.facade._executor.dask_executor`).
        Outcomes come back here and are cached here.

    Returns:
      A :class:`PlanVerification`; with no compiler installed for the target, every row is an estimate
      and ``note`` says what to install. A plan of an MoE model priced with the dropless dispatch compiles
      nothing: the reference step runs the einsum dispatch only, so each row is ``not verified`` and says
      why (:func:`~meshplan.facade._verify_row.uncompiled_dispatch`).

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
    from meshplan.facade import _compile_cache

    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult (what search_meshes returns).")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise PlanError(f"top={top!r:.40} must be an int >= 1: how many meshes to verify.")
    if not isinstance(target, str) or target not in ("auto", "cpu"):
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
    if model is None:
        from meshplan.facade._model_file import resolve_model

        model = resolve_model(req.model)  # a preset name or the model file the plan read
    config = config if config is not None else _config_for(result)
    ranked = list(result.candidates)
    why = uncompiled_dispatch(model, req.recipe)
    if why:  # a dropless MoE plan: the reference step is another step (each row says so; installing won't help)
        rows = tuple(_row(c, result, config, "not verified", error=f"not verified: {why}") for c in ranked)
        return PlanVerification(rows, (), "", "", time.perf_counter() - start)
    compiler, problem = compiler_problem(req.cluster, target)
    if problem is not None:
        rows = tuple(_row(c, result, config, "estimate") for c in ranked)
        return PlanVerification(rows, (), "", f"estimates only: {problem}.", time.perf_counter() - start)

    budget = req.budget
    straddle = {i for i, c in enumerate(ranked)
                if (_range(c, req.recipe)[1] or 0) > budget}  # the stated range reaches past the budget
    decided: dict[int, VerifyRow] = {}
    note = ""
    next_i = 0
    while True:
        fitting = sum(1 for r in decided.values() if r.status == "exact")
        want: list[int] = []
        while next_i < len(ranked) and fitting + len(want) < top:
            want.append(next_i)
            next_i += 1
        want += [i for i in sorted(straddle) if i not in decided and i not in want]
        if not want:
            break
        left = time_budget_s - (time.perf_counter() - start)
        if left <= 0:
            note = f"the {time_budget_s:.0f} s verification budget ran out; the rest are estimates"
            break
        jobs = {i: _job(ranked[i], result, model, config, target) for i in want}
        keys = {i: _compile_cache.job_key(job) for i, job in jobs.items()} if cache else {}
        todo = []
        for i in want:
            hit = _compile_cache.load_outcome(keys[i]) if cache else None
            if hit is not None:
                decided[i] = _from_outcome(ranked[i], result, config, hit, compiler, cached=True)
                out.write(f"meshplan: {ranked[i].text}: {decided[i].describe()} (cached)\n")
            else:
                todo.append(i)
        for i in todo:
            out.write(f"meshplan: compiling the reference step of {model.name} on {ranked[i].text} "
                      f"(rank {ranked[i].rank}) for {req.cluster.text} ...\n")
        out.flush()

        def done(k: int, outcome: CompileOutcome, todo: list[int] = todo) -> None:
            i = todo[k]
            row = _from_outcome(ranked[i], result, config, outcome, compiler, cached=False)
            out.write(f"meshplan: {ranked[i].text}: {row.describe()} in {outcome.seconds:.1f} s\n")
            out.flush()

        outcomes = run_jobs([jobs[i] for i in todo], parallel=parallel, timeout_s=min(timeout_s, max(left, 1.0)),
                            on_done=done, executor=executor)
        for i, outcome in zip(todo, outcomes, strict=True):
            decided[i] = _from_outcome(ranked[i], result, config, outcome, compiler, cached=False)
            if cache:
                _compile_cache.store_outcome(keys[i], outcome)
    every = [decided.get(i) or _row(cand, result, config, "estimate") for i, cand in enumerate(ranked)]
    shown = tuple(r for r in every if r.status != "over budget")
    removed = tuple(r for r in every if r.status == "over budget")
    if removed and not any(r.status == "exact" for r in shown) and not note:
        note = "every compiled mesh is over the budget"
    return PlanVerification(shown, removed, compiler, note, time.perf_counter() - start)
