"""Which cluster to rent: search (and verify) one model on several clusters, then compare them.

:func:`compare_clusters` runs :func:`~meshplan.pure.search_meshes` on each cluster
and, where the target's compiler is installed, :func:`meshplan.verify_plan` on its
top meshes (the compiled peak decides what fits); the option is the best layout
that fits. The comparison itself -- ranking, the smallest fit, the knee, the costs --
is :mod:`meshplan.pure.compare`'s, from plain figures.

Compiles go to this machine's worker pool, or to a Dask cluster
(``executor="tcp://host:8786"``, :mod:`meshplan.facade.verify._executor`): then every
cluster's compiles are submitted at once, so a cluster of workers runs them side by
side; results come back here and are cached here.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from meshplan.pure._check import as_count, as_real
from meshplan.pure.cluster import Cluster, default_headroom
from meshplan.pure.compare import (
    CRITERIA,
    DEFAULT_KNEE_THRESHOLD,
    Comparison,
    CompareOption,
    Verified,
    build_comparison,
    check_prices,
    node_range,
    option_from_search,
    parse_cluster_list,
    parse_prices,
    parse_tokens,
    unfit_option,
)
from meshplan.pure.cost import TrainingRecipe
from meshplan.pure.errors import CompareError, MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec
from meshplan.pure.search import SearchResult, search_meshes

__all__ = ["compare_clusters"]

_VERIFY_OFF = ("0", "off", "no", "false")


def _headroom(cluster: Cluster, *, headroom: float | None, mem_fraction: float | None) -> float:
    """The headroom a plan of ``cluster`` keeps, as ``meshplan plan`` chooses it: ``headroom`` when given, else
    :func:`~meshplan.pure.cluster.default_headroom` of this process's GPU memory fraction (``mem_fraction``, else
    ``$XLA_PYTHON_CLIENT_MEM_FRACTION``, else jax's default; TPUs keep their 10%)."""
    if headroom is not None:
        return headroom
    if mem_fraction is None and cluster.device.ici_scope != "slice":
        env = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")  # the facade reads the environment, pure does not
        try:
            mem_fraction = float(env) if env else None
        except ValueError:
            raise PlanError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={env!r:.40} must be a fraction in (0, 1].") from None
        if mem_fraction is not None and not 0 < mem_fraction <= 1:
            raise PlanError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={env!r:.40} must be a fraction in (0, 1].")
    return default_headroom(cluster, mem_fraction=mem_fraction)[0]


def _clusters(clusters: Any, nodes: Any, device: Any) -> tuple[Cluster, ...]:
    out: list[Cluster] = []
    if clusters is not None:
        if isinstance(clusters, Cluster):
            out.append(clusters)
        elif isinstance(clusters, Sequence) and not isinstance(clusters, str) and clusters and all(
                isinstance(c, Cluster) for c in clusters):
            out.extend(clusters)
        else:
            out.extend(parse_cluster_list(clusters))
    if nodes is not None or device is not None:
        if nodes is None or device is None:
            raise CompareError("--nodes and --device go together: --nodes 1,2,4,8 --device H100.")
        out.extend(c for c in node_range(device, nodes) if c not in out)
    if not out:
        raise CompareError("nothing to compare: give clusters ('8x8xH100,v5p-128') or --nodes 1,2,4 --device H100.")
    return tuple(out)


def _verified(checked: Any) -> Verified:
    """The verification's verdict on the option: its first exact row, else what it says instead."""
    rows = list(checked.rows)
    for r in rows:
        if r.status == "exact":
            note = "" if r.run_high_bytes is None else (
                f"compiled with no GPU (no autotuning): a run on the GPU may peak up to {r.run_high_bytes / 2**30:.1f} "
                "GiB")
            return Verified(r.mesh, "exact", peak_bytes=r.peak_bytes, compiler=r.compiler or checked.compiler,
                            note=note, run_high_bytes=r.run_high_bytes)
    if rows:
        r = rows[0]
        if r.status == "not verified":
            return Verified(r.mesh, "not verified", note=r.error or checked.note)
        return Verified(r.mesh, "estimate", note=checked.note or "not compiled (the verification stopped first)")
    lean = min(checked.removed, key=lambda r: r.peak_bytes or 0)
    return Verified(lean.mesh, "over budget", peak_bytes=lean.peak_bytes, compiler=lean.compiler or checked.compiler,
                    note=f"every compiled layout is over the budget (the leanest, {lean.mesh}, peaks at "
                         f"{(lean.peak_bytes or 0) / 2**30:.1f} GiB)")


def _search(spec: ModelSpec, cluster: Cluster, *, batch: int | None, seq: int | None, headroom: float,
            recipe: TrainingRecipe | None, efficiency: float | None, top_k: int) -> SearchResult | str:
    try:
        return search_meshes(spec, cluster, batch=batch, seq=seq, headroom=headroom, recipe=recipe,
                             efficiency=efficiency, top_k=top_k)
    except PlanError as err:  # nothing fits, or no mesh of this cluster divides the batch: the row says why
        return str(err)


def compare_clusters(model: str | ModelSpec, clusters: str | Sequence[str] | Sequence[Cluster] | None = None, *,
                     nodes: Sequence[int] | str | None = None, device: str | None = None,
                     batch: int | None = None, seq: int | None = None,
                     prices: str | Mapping[str, float] | None = None, price_source: str = "",
                     tokens: str | int | None = None, by: str = "time", verify: bool | None = None, top: int = 3,
                     target: str = "auto", executor: Any = None, executor_fallback: bool = False,
                     time_budget_s: float = 900.0, timeout_s: float = 600.0, parallel: int | None = None,
                     cache: bool = True, headroom: float | None = None, mem_fraction: float | None = None,
                     recipe: TrainingRecipe | None = None, efficiency: float | None = None,
                     knee_threshold: float = DEFAULT_KNEE_THRESHOLD, stream: TextIO | None = None) -> Comparison:
    """Compare training ``model`` on several clusters: the best layout on each, ranked by time, cost or
    per-device throughput, verified by the compiler where it is installed.

    Args:
      model: a preset name, a model file (``config.json``, MaxText yml) or a :class:`~meshplan.ModelSpec`.
      clusters: ``"8x8xH100,4x8xH200,v5p-128"``, brace ranges (``"v5p-{32..512}"``), a list of texts or
        of :class:`~meshplan.Cluster`.
      nodes, device: sizes of one GPU kind (``nodes="1,2,4,8", device="H100"``), added to ``clusters``.
      batch: one global batch (sequences) for every option (default: each option's own, one per device).
      seq: tokens per sequence (default 4096, or the model's position limit).
      prices: USD per device-hour per kind (``"H100=2.49,v5p=4.20"``); meshplan ships none.
      price_source: whose prices they are (shown with them; default "the user's").
      tokens: a token budget to time and price (``"2T"``).
      by: ``"time"``, ``"cost"`` or ``"tokens-per-device"``.
      verify: compile the top meshes (default: yes, unless ``MESHPLAN_VERIFY=0``).
      top: meshes per cluster to verify as fitting.
      target: ``"auto"`` (each cluster's compiler) or ``"cpu"`` (XLA:CPU with as many simulated devices).
      executor: ``None`` (local workers), a Dask scheduler address, or a ``concurrent.futures.Executor``.
      executor_fallback: with an unreachable address, compile on local workers (and say so).
      time_budget_s, timeout_s, parallel, cache: as :func:`meshplan.verify_plan` (the time budget per cluster).
      headroom, mem_fraction: the memory budget as ``meshplan plan`` takes it
        (:func:`~meshplan.pure.cluster.default_headroom`).
      recipe, efficiency: the training recipe and matmul efficiency priced (as :func:`~meshplan.search_meshes`).
      knee_threshold: the scaling efficiency below which adding devices stops paying.
      stream: progress lines (default stderr).

    Returns:
      A :class:`~meshplan.pure.compare.Comparison`: ``options`` ranked, ``smallest``, ``scaling`` (the knees),
      and ``notes`` saying what is estimated and where the compiles ran.

    Raises:
      CompareError: nothing to compare, a bad cluster list / price / token count / criterion, a price for a
        kind not compared.
      ClusterError: an unknown device or malformed cluster (naming the item and the known devices).
      ExecutorError: an unreachable executor address (without ``executor_fallback``).

    Example:
      >>> import dataclasses, io
      >>> from meshplan.pure import get_preset
      >>> tiny = dataclasses.replace(get_preset("gpt2").spec, num_layers=1, num_params=None)
      >>> c = compare_clusters(tiny, "1x8xH100,2x8xH100", seq=256, verify=False, prices="H100=2.5",
      ...                      stream=io.StringIO())
      >>> [o.cluster for o in c.options], c.smallest.cluster, c.options[0].cost_per_million_tokens > 0
      (['2x8xH100', '1x8xH100'], '1x8xH100', True)
    """
    from meshplan.facade.verify import resolve_executor
    from meshplan.facade._model_file import resolve_model

    start = time.perf_counter()
    if stream is not None and not callable(getattr(stream, "write", None)):
        raise MeshplanTypeError(f"stream={stream!r:.60} must be a text stream (with .write) or None.")
    out = stream if stream is not None else sys.stderr
    if mem_fraction is not None:
        mem_fraction = as_real(mem_fraction, "mem_fraction", error=CompareError)
    if headroom is not None:
        headroom = as_real(headroom, "headroom", allow_zero=True, error=CompareError)
    spec = resolve_model(model)
    options_in = _clusters(clusters, nodes, device)
    if by not in CRITERIA:
        raise CompareError(f"by={by!r:.40} must be one of {list(CRITERIA)}.")
    priced = {} if prices is None else parse_prices(prices)
    check_prices(priced, options_in)
    budget = None if tokens is None else parse_tokens(tokens)
    if batch is not None:
        batch = as_count(batch, "batch", error=CompareError)
    top = as_count(top, "top", error=CompareError)
    as_real(knee_threshold, "knee_threshold", error=CompareError)
    if not isinstance(price_source, str):
        raise MeshplanTypeError(f"price_source={price_source!r:.40} must be a str (whose prices these are).")
    if verify is None:
        verify = os.environ.get("MESHPLAN_VERIFY", "").strip().lower() not in _VERIFY_OFF
    if not isinstance(verify, bool):
        raise MeshplanTypeError(f"verify={verify!r:.40} must be True, False or None.")
    notes: list[str] = []
    choice = resolve_executor(executor, fallback=executor_fallback) if verify else None
    if choice is not None and choice.note:
        notes.append(choice.note)

    searched: list[tuple[Cluster, SearchResult | str]] = []
    for cluster in options_in:
        h = _headroom(cluster, headroom=headroom, mem_fraction=mem_fraction)
        out.write(f"meshplan: searching meshes of {cluster.text} for {spec.name} ...\n")
        out.flush()
        searched.append((cluster, _search(spec, cluster, batch=batch, seq=seq, headroom=h, recipe=recipe,
                                          efficiency=efficiency, top_k=max(top + 2, 5))))

    checks: dict[int, Any] = {}
    if verify:
        from meshplan.facade.verify import verify_plan

        todo = [i for i, (_, r) in enumerate(searched) if isinstance(r, SearchResult) and r.candidates]

        def one(i: int) -> Any:
            result = searched[i][1]
            assert isinstance(result, SearchResult)
            return verify_plan(result, model=spec, top=top, target=target, time_budget_s=time_budget_s,
                               timeout_s=timeout_s, parallel=parallel, cache=cache, stream=out,
                               executor=None if choice is None else choice.executor)

        if choice is not None and choice.executor is not None and len(todo) > 1:
            # A cluster of workers: every cluster's compiles at once (each verify_plan waits on its own).
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(todo)) as pool:
                for i, checked in zip(todo, pool.map(one, todo), strict=True):
                    checks[i] = checked
        else:
            for i in todo:  # local workers: one cluster at a time, each using every core
                checks[i] = one(i)
        if choice is not None:
            notes.append(f"compiles ran on {choice.where}")

    options: list[CompareOption] = []
    for i, (cluster, result) in enumerate(searched):
        price = priced.get(cluster.device.name)
        if isinstance(result, str):
            h = _headroom(cluster, headroom=headroom, mem_fraction=mem_fraction)
            tokens_step = (batch or cluster.num_devices) * (seq or min(4096, spec.max_position_embeddings or 4096))
            options.append(unfit_option(cluster, budget_bytes=max(1, int(cluster.hbm_bytes * (1 - h))),
                                        tokens_per_step=tokens_step, note=result, price_per_device_hour=price))
            continue
        verdict = _verified(checks[i]) if i in checks else None
        options.append(option_from_search(result, verdict, price_per_device_hour=price))
    notes.append("step time, tokens/s and MFU are the planner's estimates (FLOPs at the assumed matmul efficiency "
                 "plus the collectives not hidden under compute); a compiled peak decides only what fits")
    seq_used = next((r.request.seq for _, r in searched if isinstance(r, SearchResult)),
                    seq or min(4096, spec.max_position_embeddings or 4096))
    return build_comparison(spec.name, batch, seq_used, options, by=by, tokens=budget,
                            price_source=price_source if priced else "", notes=notes,
                            seconds=time.perf_counter() - start, threshold=knee_threshold)
