"""``meshplan plan``'s facts, gathered once: the search, its verification, the pipeline layouts and theirs.

Everything slow happens here, before anything is shown: the mesh search, the compiles of the best meshes
(:func:`meshplan.facade.verify.verify_plan`), the pipeline search, and the compiles of the best circular
pipeline layouts, the schedule meshplan's pipelined step runs (Megatron's 1F1B has no JAX step to compile).
The result is one :class:`~meshplan.pure.report.PlanReport`; every format renders it and none searches or
compiles again.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from meshplan.cli._flags import headroom_for, reference_config, training_recipe, verification_wanted
from meshplan.cli._progress import progress
from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster import Cluster, parse_cluster
from meshplan.pure.errors import NothingFitsError, PlanError
from meshplan.pure.presets import ModelSpec, pricing_notes
from meshplan.pure.report import PlanReport
from meshplan.pure.search import PipelineSearch, SearchResult, search_meshes, search_pipelines
from meshplan.pure.verify import PlanVerification, admit_compiled, rank_by_compiled, rejected_under

__all__ = ["gather_plan"]

_NO_CIRCULAR = "not verified (no circular layout, the schedule meshplan's step compiles, fits the budget)"


def gather_plan(args: argparse.Namespace, spec: ModelSpec, params: Any, rule: Any,
                fixed: dict[str, int]) -> PlanReport:
    """Search, verify, search the pipeline layouts and verify the best of them, as the flags ask."""
    cluster = parse_cluster(args.cluster)
    headroom, budget_source = headroom_for(args, cluster)
    quiet = args.format == "json"
    recipe = training_recipe(args)  # backend left to the search, which takes the cluster's compiler
    verify = verification_wanted(args) and args.format not in ("flax", "maxtext")

    def search(on: Cluster) -> SearchResult:
        # A spinner on stderr (only on a terminal, never with --json): large clusters take seconds to search.
        with progress(f"searching meshes of {args.cluster} for {args.model}", quiet=quiet):
            return search_meshes(
                spec, on, params=params, axes=args.axes, fixed=fixed or None, rule=rule, batch=args.batch,
                seq=args.seq, headroom=headroom, activations=not args.no_activations,
                tp_within_domain=not args.allow_tp_dcn, ep_within_domain=args.ep_within_domain, top_k=args.top,
                recipe=recipe, efficiency=args.efficiency, rank=args.rank, micro_batches=args.micro_batches,
                profile=_load_profile(args.profile))

    refused: PlanError | None = None
    try:
        result = search(cluster)
    except NothingFitsError as err:
        # A layout the user pinned that the estimate puts over the budget is compiled before it is called so:
        # searched again with room for it, its meshes are near misses the verification compiles.
        if not (fixed and verify):
            raise
        refused = err
        try:
            roomy = search(cluster.with_more_hbm(16))
        except PlanError:
            raise err from None  # over even with 16 times the memory: the estimate's refusal stands
        result = rejected_under(roomy, dataclasses.replace(roomy.request, cluster=cluster))
    checked = _verify(result, spec, args) if verify else None
    if checked is not None:  # the compiler admits the near misses that fit; its schedule ranks what it timed
        result, checked = rank_by_compiled(*admit_compiled(result, checked))
    if refused is not None and not result.candidates:
        raise PlanError(f"{refused} {_compiled_over(checked)}") from None
    report = PlanReport(result, verification=checked, budget_source=budget_source,
                        notes=tuple(pricing_notes(spec, seq=result.request.seq)))
    if args.no_pipeline or args.format in ("flax", "maxtext"):
        return report
    found, why_none = _pipelines(result, spec, args, fixed, headroom, quiet=quiet)
    if found is None:
        return _replace(report, pipeline_note=why_none or "")
    report = _replace(report, pipelines=found)
    if checked is None or not checked.compiler:  # nothing compiled, or no compiler: the plan said what to install
        return report
    return _verify_pipelines(report, spec, args, headroom, spent_s=checked.seconds)


def _compiled_over(checked: PlanVerification | None) -> str:
    """What the compiler said of a pinned layout the estimate put over the budget and that stays over."""
    rows = [] if checked is None else [r for r in checked.removed if r.rank is None and r.peak_bytes is not None]
    if not rows:
        return ("Its stated range does not reach the budget, so it was not compiled (meshplan check compiles "
                "any layout).")
    return ("XLA's compiled peak agrees: " + ", ".join(f"{r.mesh} {fmt_bytes(r.peak_bytes or 0)}" for r in rows)
            + f" ({rows[0].compiler}).")


def _load_profile(path: str | None) -> Any:
    """``--profile FILE`` read (a typed ProfileError naming the file and field), or None."""
    from meshplan.facade._profile import load_profile  # lazily: the facade imports jax

    return None if path is None else load_profile(path)


def _replace(report: PlanReport, **changes: Any) -> PlanReport:
    return dataclasses.replace(report, **changes)


def _verify(result: SearchResult, spec: ModelSpec, args: argparse.Namespace) -> PlanVerification:
    """The top ``--verify K`` (default 3) meshes compiled: rows exact, estimates, removed or not verified."""
    import sys

    from meshplan.facade.verify import resolve_executor, verify_plan  # lazily: the facade imports jax

    req = result.request
    choice = resolve_executor(getattr(args, "executor", None), fallback=getattr(args, "executor_fallback", False))
    if choice.note:
        print(f"meshplan: {choice.note}", file=sys.stderr)
    return verify_plan(result, model=spec, top=args.verify or 3, target=args.target,
                       config=reference_config(args, req.param_dtype), time_budget_s=args.verify_time,
                       executor=choice.executor)


def _pipelines(result: SearchResult, spec: ModelSpec, args: argparse.Namespace, fixed: dict[str, int],
               headroom: float, *, quiet: bool) -> tuple[PipelineSearch | None, str | None]:
    """The pipeline layouts (``pp`` outermost) for the same model, cluster, batch, recipe and budget as the
    plan: ``(PipelineSearch, None)``, or ``(None, why there are none)``."""
    if fixed or args.axes or args.params is not None or args.rules is not None:
        return None, "not searched with --fix, --axes, --params or --rules (they constrain the unpipelined axes only)"
    try:
        with progress("searching pipeline layouts", quiet=quiet):
            found = search_pipelines(spec, result.request.cluster, batch=result.request.batch,
                                     seq=result.request.seq, recipe=training_recipe(args),
                                     efficiency=result.request.efficiency, top_k=args.top, headroom=headroom)
    except PlanError as err:
        return None, f"none ({err})"
    if not found.candidates and not found.left_out:
        return None, "none (no pp >= 2 divides the cluster's nodes or its devices per node)"
    return found, None


def _verify_pipelines(report: PlanReport, spec: ModelSpec, args: argparse.Namespace, headroom: float, *,
                      spent_s: float) -> PlanReport:
    """The best circular layouts compiled (the summary's one; the top ``--verify K`` under ``--detail``) in
    what is left of ``--verify-time`` after the unpipelined meshes."""
    from meshplan.facade.verify import verify_pipelines  # lazily: the facade imports jax

    req = report.result.request
    top = (args.verify or 3) if args.detail else 1
    try:
        runnable = search_pipelines(spec, req.cluster, batch=req.batch, seq=req.seq, recipe=training_recipe(args),
                                    efficiency=req.efficiency, top_k=top, headroom=headroom,
                                    schedules=("circular",))
    except PlanError as err:
        return _replace(report, pipeline_note=f"not verified ({err})")
    if not runnable.candidates:
        return _replace(report, pipeline_note=_NO_CIRCULAR)
    checked = verify_pipelines(runnable, report.result, model=spec, top=top, target=args.target,
                               config=reference_config(args, req.param_dtype),
                               time_budget_s=args.verify_time - spent_s)
    return _replace(report, pipeline_verification=checked)
