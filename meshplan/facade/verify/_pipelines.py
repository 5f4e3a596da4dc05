"""Verify pipeline layouts as the unpipelined rows are: compile the pipelined step, show XLA's peak.

:func:`verify_pipelines` takes the layouts :func:`~meshplan.pure.search.search_pipelines`
ranked and compiles :func:`~meshplan.facade.verify._pipeline_step.pipeline_step` for the
best ``top`` of them in worker subprocesses (:mod:`meshplan.facade.verify._worker`): the
mesh ``(pp, *stage axes)`` on the cluster's own compiler (a TPU topology, GPUs
described with no GPU) or on XLA:CPU devices, with the row's ``m`` micro-batches
and, for the interleaved and circular schedules, its ``v`` as the circular repeats.

What it checks. The compiled step runs MaxText's circular schedule, whose memory
under autodiff is GPipe's: every stage keeps all ``m`` micro-batches' inputs. A
``gpipe`` or ``circular`` row is checked as priced. A ``1f1b`` or ``interleaved``
row (Megatron's schedules, which keep fewer micro-batches in flight) is compiled as
the circular schedule with the same ``m`` and ``v``, and its row says so: the
compiled peak bounds that layout's memory from above, it does not check the 1F1B
estimate. The stage's parameters are laid out by the default rule for the stage
mesh (the search's stage plan is made for the stage model, whose tree differs).

What cannot compile is that row's "not verified: <reason>", found before any
worker starts (a dropless MoE recipe, which the reference step cannot run;
MoE models that mix layer kinds, ``pp * v`` not dividing the
layers, flash attention, remat offload, a batch the stage axes and ``m`` do not
divide); a crash or a timeout is that row's reason too. None is fatal to the plan.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from meshplan.facade._model_file import resolve_model
from meshplan.facade.verify._compilers import COMPILE_TARGETS, compiler_for
from meshplan.facade.verify._driver import Compile, compile_rows
from meshplan.facade.verify._jobs import CompileJob, reference_config
from meshplan.facade.verify._pipeline_step import check_pipeline_layout
from meshplan.facade.verify._reference import BATCH_AXES, ReferenceConfig
from meshplan.pure._check import as_real
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.search import MeshCandidate, SearchResult
from meshplan.pure.verify import PlanVerification, VerifyRow, uncompiled_dispatch

__all__ = ["compiled_schedule", "pipeline_problem", "verify_pipelines"]


def compiled_schedule(pipe: Any) -> tuple[int, str, str]:
    """(circular repeats, the compiled schedule's text, what the compiled figure checks) for a PipelinePlan.

    Example:
      >>> from types import SimpleNamespace
      >>> compiled_schedule(SimpleNamespace(schedule="interleaved", virtual=2, micro_batches=8))[:2]
      (2, 'circular v=2 m=8')
      >>> compiled_schedule(SimpleNamespace(schedule="1f1b", virtual=1, micro_batches=8))[2]
      "compiled as the circular schedule (GPipe memory); the row's 1F1B estimate is for Megatron's schedule"
    """
    v = pipe.virtual if pipe.schedule in ("interleaved", "circular") else 1
    text = f"circular v={v} m={pipe.micro_batches}"
    if pipe.schedule == "1f1b":
        return v, text, ("compiled as the circular schedule (GPipe memory); the row's 1F1B estimate is for "
                         "Megatron's schedule")
    if pipe.schedule == "interleaved":
        return v, text, ("compiled as the circular schedule (GPipe memory); the row's interleaved 1F1B estimate "
                         "is for Megatron's schedule")
    return v, text, ""  # gpipe (the circular order with one repeat) and circular: the schedule priced


def _schedule_text(pipe: Any) -> str:
    return f"{pipe.schedule}{f' v={pipe.virtual}' if pipe.virtual > 1 else ''} m={pipe.micro_batches}"


def pipeline_problem(spec: Any, cand: Any, batch: int, config: Any) -> str | None:
    """Why the pipelined step cannot compile ``cand`` (its every reason in one line), or ``None``.

    Example:
      >>> import dataclasses
      >>> from meshplan.pure import get_preset
      >>> from meshplan.pure.search import search_pipelines
      >>> from meshplan.facade.verify._reference import ReferenceConfig
      >>> mix = get_preset("mixtral-8x7b").spec
      >>> cand = search_pipelines(mix, "4x8xH100", batch=32, seq=1024, top_k=1).candidates[0]
      >>> "dense models only" in pipeline_problem(mix, cand, 32, ReferenceConfig())
      True
    """
    pipe = cand.pipeline
    if pipe is None:
        return f"{cand.text} is not a pipeline layout (its pipeline field is empty)"
    sizes = dict(zip(cand.axis_names, cand.axis_sizes, strict=True))
    if cand.axis_names[0] != "pp":
        return f"{cand.text}: the pipelined step needs pp as the outermost axis"
    v, _, _ = compiled_schedule(pipe)
    ways = math.prod(sizes[a] for a in BATCH_AXES if sizes.get(a, 1) > 1)
    try:
        check_pipeline_layout(spec, sizes, "pp", batch, ways, pipe.micro_batches, v,
                              dataclasses.replace(config, micro_batches=1))
    except PlanError as err:
        return str(err).rstrip(".")
    return None


def _row(cand: MeshCandidate, budget: int, status: str, **figures: Any) -> VerifyRow:
    pipe = cand.pipeline
    assert pipe is not None  # a pipeline search's candidates all carry their pipeline
    return VerifyRow(mesh=cand.text, rank=cand.rank, analytic_bytes=cand.memory.total, budget_bytes=budget,
                     target="", status=status, micro_batches=pipe.micro_batches, schedule=_schedule_text(pipe),
                     **figures)


def verify_pipelines(found: Any, result: SearchResult, *, model: ModelSpec | None = None, top: int = 1,
                     target: str = "auto", config: ReferenceConfig | None = None, time_budget_s: float = 300.0,
                     timeout_s: float = 600.0, parallel: int | None = None, cache: bool = True,
                     stream: TextIO | None = None) -> PlanVerification:
    """Compile the pipelined step of the best ``top`` pipeline layouts; XLA's peak next to each estimate.

    Args:
      found: what :func:`~meshplan.pure.search.search_pipelines` returned (a ``PipelineSearch``), or
        its candidates.
      result: the unpipelined plan of the same model, cluster, batch and recipe (its request gives the
        budget, the batch, the sequence and the recipe).
      model: the :class:`~meshplan.pure.ModelSpec` (default: the one ``result.request.model`` names).
      top: how many layouts to compile, best first (no replacement: a layout over the budget stays shown).
      target, config, timeout_s, parallel, cache, stream: as :func:`~meshplan.facade.verify.verify_plan`.
      time_budget_s: the seconds left for these compiles; at 0 or below nothing compiles (rows are estimates).

    Returns:
      A :class:`PlanVerification` whose ``rows`` are the compiled layouts in rank order: each
      ``exact``/``over budget`` (the compiled peak; ``compiled_schedule`` and ``note`` say which
      schedule it is the peak of), ``not verified`` (``error`` says why) or ``estimate``. ``removed``
      is empty: the compiled peak of a 1F1B row's circular step is not that row's peak.

    Raises:
      MeshplanTypeError: ``result`` is not a SearchResult.
      PlanError: ``top`` below 1, a negative timeout, or an unknown target.

    Example:
      >>> import dataclasses, io
      >>> from meshplan.pure import get_preset, search_meshes
      >>> from meshplan.pure.search import search_pipelines
      >>> moe = dataclasses.replace(get_preset("mixtral-8x7b").spec, num_layers=4, num_params=None)
      >>> plan = search_meshes(moe, "1x8xH100", batch=8, seq=64, top_k=1)
      >>> found = search_pipelines(moe, "1x8xH100", batch=8, seq=64, top_k=1)
      >>> rows = verify_pipelines(found, plan, model=moe, target="cpu", cache=False, stream=io.StringIO()).rows
      >>> rows[0].status, "dense models only" in rows[0].error
      ('not verified', True)
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult (what search_meshes returns).")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise PlanError(f"top={top!r:.40} must be an int >= 1: how many pipeline layouts to verify.")
    if not isinstance(target, str) or target not in COMPILE_TARGETS:
        raise PlanError(f"target={target!r:.40} must be 'auto' (the cluster's compiler) or 'cpu'.")
    timeout_s = as_real(timeout_s, "timeout_s", error=PlanError)
    out = stream if stream is not None else sys.stderr
    start = time.perf_counter()
    req = result.request
    model = resolve_model(req.model) if model is None else model
    config = config if config is not None else reference_config(req.recipe, param_dtype=req.param_dtype)
    config = dataclasses.replace(config, micro_batches=1)
    cands: Sequence[MeshCandidate] = tuple(getattr(found, "candidates", found))[:top]
    budget = req.budget
    dispatch = uncompiled_dispatch(model, req.recipe)
    if dispatch:  # a dropless MoE plan: the reference step is another step, whatever compiler is installed
        return PlanVerification(tuple(_row(c, budget, "not verified", error=f"not verified: {dispatch}")
                                      for c in cands), (), "", "", time.perf_counter() - start)
    compiler = compiler_for(req.cluster, target)
    if not compiler.ready:
        return PlanVerification(tuple(_row(c, budget, "estimate") for c in cands), (), "",
                                f"estimates only: {compiler.problem}.", time.perf_counter() - start)
    if time_budget_s <= 0:
        return PlanVerification(tuple(_row(c, budget, "estimate") for c in cands), (), compiler.name,
                                "the verification time budget ran out before the pipeline layouts; they are "
                                "estimates", time.perf_counter() - start)
    rows: dict[int, VerifyRow] = {}
    items: dict[int, Compile] = {}
    for i, cand in enumerate(cands):
        why = pipeline_problem(model, cand, req.batch, config)
        if why is not None:
            rows[i] = _row(cand, budget, "not verified", error=f"not verified: {why}")
            out.write(f"meshplan: pipeline {cand.text}: {rows[i].summary()}\n")
            continue
        pipe = cand.pipeline
        assert pipe is not None  # a pipeline search's candidates all carry their pipeline
        v, schedule, note = compiled_schedule(pipe)
        job = CompileJob(model, req.cluster, tuple(cand.axis_names), tuple(cand.axis_sizes), tuple(cand.dcn_shape),
                         None, batch=req.batch, seq=req.seq, config=config, target=target,
                         pipeline=(pipe.micro_batches, v))
        items[i] = Compile(job, _row(cand, budget, "estimate"), f"pipeline {cand.text}",
                           f"compiling the pipelined step of {model.name} on {cand.text} ({schedule}) for "
                           f"{req.cluster.text}", compiled_schedule=schedule, note=note)
    left = time_budget_s - (time.perf_counter() - start)
    order = sorted(items)
    compiled = compile_rows([items[i] for i in order], compiler=compiler.name, stream=out, cache=cache,
                            parallel=parallel, timeout_s=min(timeout_s, max(left, 1.0)))
    rows.update(zip(order, compiled, strict=True))
    return PlanVerification(tuple(rows[i] for i in range(len(cands))), (), compiler.name, "",
                            time.perf_counter() - start)
