"""Pipeline layouts: a ``pp`` axis outermost, each stage searched as a smaller model on a smaller cluster.

:func:`search_pipelines` prices the layouts :func:`~meshplan.pure.search_meshes`
cannot express. A ``pp``-stage pipeline is ``pp`` copies of one *stage*: the
fullest stage's layers (:func:`~meshplan.pure.cost.stage_layers`; for MoE models,
all routed) with one of the embedding or the head (the stage model has tied
embeddings), trained on ``1/pp`` of the devices on the global batch. So:

1. **Where pp goes.** Over the network first: ``pp`` dividing the ICI domains
   (nodes for GPUs, slices for TPUs), each stage a block of whole nodes and
   every boundary on the slow link. Inside a node too (GPUs: ``pp`` dividing
   the devices per node), boundaries on NVLink and each stage spanning every
   node. Both are priced; the faster wins.
2. **The stage's mesh** is :func:`~meshplan.pure.search_meshes` of the stage
   model on the stage's cluster with the pipeline's ``m`` micro-batches (ranked
   by predicted step alone, the fastest that fits: the layouts are compared by
   their steps, so the stage's ties are not reordered), so its
   collectives (the gradient sync over the stage's data axes only, its fsdp
   gathers per micro-batch) and its compute for the whole batch are the
   existing model's. Its activation figure is one micro-batch's; the schedule
   adds what :func:`~meshplan.pure.cost.schedule_memory` says its fullest
   stage keeps besides: :func:`~meshplan.pure.cost.in_flight` micro-batches
   of saved activations (the ``saved`` part of
   :func:`~meshplan.pure.cost.step_memory`) less the one counted, and for the
   circular step its whole-batch and ring buffers, its weight copies and the
   backward's copy of the current iteration, less the fp32 gradient accumulator (its loop accumulates the stage's gradients in
   the weights' dtype); the logits, head and working set stay one
   micro-batch's. The mesh must still fit the budget.
3. **The schedule and m.** 1F1B (Megatron's; same bubble as GPipe, ``pp``
   instead of ``m`` micro-batches of activations, so GPipe is never chosen),
   circular (MaxText's and meshplan's pipelined step: GPipe order, so more
   memory for the same bubble, what a JAX user exporting to MaxText runs;
   when ``pp`` divides the layers) and,
   when ``2*pp`` divides the layers, interleaved 1F1B (Megatron's) and
   circular with ``v = 2`` (half the bubble, twice the sends, more activations); ``m = pp * k`` for
   ``k`` in 1, 2, 4, 8 where the batch allows. Step =
   ``stage step / (1 - bubble) + exposed stage-boundary sends``
   (:func:`~meshplan.pure.cost.pipeline_time`). The fastest that fits wins
   per placement, and its ``verdict`` says why.

:func:`price_pipeline` prices one given layout (a published run's) and takes two
things the search does not try: DualPipe (``schedule="dualpipe"``: two stages'
state per device, and the stage's exposed expert all-to-alls hidden under the
paired chunk's compute, up to that compute) and ZeRO over the stage's ``dp``
axis (``zero=1``: optimizer state split, ``zero=2``: gradients too; memory
only, the bytes moved are the ``dp`` all-reduce's). DualPipe needs
hand-written overlapped kernels, so the search does not offer it.

Every figure is an estimate (the stage's, from the same calibrated models as
the unpipelined search, plus the pipeline terms); the compiled memory of the
pipelined reference step is the check (``docs/pipeline.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.pure._check import as_count, as_real
from meshplan.pure.cluster._budget import default_headroom
from meshplan.pure.cluster._cluster import Cluster, parse_cluster
from meshplan.pure.cluster._link import Link
from meshplan.pure.cost._estimates import CommTerm, MemoryBreakdown, StepEstimate
from meshplan.pure.cost._pipeline import (
    FRAMEWORKS,
    bubble_fraction,
    in_flight,
    pipeline_time,
    plan_stages,
    schedule_memory,
    stage_layers,
)
from meshplan.pure.cost._matmul_dtype import fp8_peak
from meshplan.pure.cost._recipe import TrainingRecipe
from meshplan.pure.cost._step_memory import layer_dims, step_memory
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import ModelSpec, build_params, get_preset
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.search._result import SearchRequest
from meshplan.pure.search._search import fastest_stage_meshes
from meshplan.pure.search._space import divisors

__all__ = ["PipelineSearch", "price_pipeline", "search_pipelines"]

_KS = (1, 2, 4, 8)  # micro-batches per stage: m = pp * k


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineSearch:
    """Ranked pipeline layouts and what was left out.

    Attributes:
      candidates: the fastest layout per ``pp`` and placement that fits, fastest first
        (each a :class:`MeshCandidate` with ``pp`` outermost and its ``pipeline`` set).
      left_out: one line per ``pp`` and placement that has no fitting layout, with the reason.
    """

    candidates: tuple[MeshCandidate, ...]
    left_out: tuple[str, ...]


def _stage_model(spec: ModelSpec, pp: int) -> ModelSpec:
    """The fullest stage as a model: its layers (all routed for MoE) and one of embedding / head."""
    layers = max(stage_layers(spec.num_layers, pp))
    return dataclasses.replace(spec, name=f"{spec.name}[stage of pp={pp}]", num_layers=layers,
                               num_dense_layers=0, tied_embeddings=True, num_params=None)


def _placements(clus: Cluster, num_layers: int) -> list[tuple[int, str, Cluster, Link]]:
    """``(pp, "dcn" | "ici", stage cluster, boundary link)``: over the network first, then inside a node."""
    tpu = clus.device.ici_scope == "slice"
    sliced = clus.device.ici_scope in ("slice", "rack")  # stages over the network: between slices / NVLink racks
    out = []
    domains = clus.num_slices if sliced else clus.num_nodes
    for pp in divisors(domains):
        if 2 <= pp <= num_layers:
            sub = Cluster(clus.device, clus.num_nodes // pp, clus.devices_per_node,
                          clus.num_slices // pp if sliced else clus.num_slices)
            out.append((pp, "dcn", sub, clus.inter_link))
    if not tpu and clus.num_slices == 1:
        for pp in divisors(clus.devices_per_node):
            if 2 <= pp <= num_layers:
                out.append((pp, "ici", Cluster(clus.device, clus.num_nodes, clus.devices_per_node // pp),
                            clus.intra_link))
    return out


def _param_split(spec: ModelSpec) -> tuple[int, int, int]:
    """Bytes (bf16) of one average decoder layer, of the embedding, and of the final norm plus head."""
    tree = build_params(spec)
    top = "transformer" if spec.family == "gpt2" else "model"

    def size(t: Any) -> int:
        if isinstance(t, dict):
            return sum(size(v) for v in t.values())
        n = int(t.dtype.itemsize)
        for d in t.shape:
            n *= int(d)
        return n

    total = size(tree)
    embed = size({k: v for k, v in tree[top].items() if k in ("embed_tokens", "wte", "wpe")})
    layers = size(tree[top]["h" if spec.family == "gpt2" else "layers"])
    head = total - embed - layers
    return layers // spec.num_layers, embed, head


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
    """What every option of one search shares: the request and the stage search's constraints."""

    batch: int
    seq: int
    recipe: TrainingRecipe | None
    efficiency: float | None
    split: tuple[int, int, int]
    fixed: Mapping[str, int] | None = None
    axes: tuple[str, ...] | None = None
    activations: bool = True
    zero: int = 0
    headroom: float = 0.1


def _option(spec: ModelSpec, clus: Cluster, pp: int, where: str, sub: Cluster, link: Link, schedule: str, v: int,
            m: int, o: _Options) -> MeshCandidate | str:
    """The best fitting layout of one (pp, placement, schedule, m), or why there is none."""
    batch, seq, split = o.batch, o.seq, o.split
    stage = _stage_model(spec, pp)
    try:
        # A ZeRO run's state is split over dp after the stage search (_zero_memory): the search must not refuse
        # the unsplit state first, so it sees a device with room for it and the split is held to the real budget.
        room = sub if not o.zero else sub.with_more_hbm(16)
        found = fastest_stage_meshes(stage, room, batch=batch, seq=seq, micro_batches=m, recipe=o.recipe, top_k=3,
                                     headroom=o.headroom, efficiency=o.efficiency, fixed=o.fixed, axes=o.axes,
                                     activations=o.activations)
    except PlanError as err:
        return str(err).split(";")[0]
    flight = max(in_flight(pp, m, schedule=schedule, virtual=v))
    layers_here = stage.num_layers
    layer_b, embed_b, head_b = split
    for c in found.candidates:
        sizes = c.mesh_shape
        ways = 1
        for a in ("dp", "fsdp", "ep"):
            ways *= sizes.get(a, 1)
        nbytes = (batch // m) * seq * spec.hidden_size * 2 // (ways * sizes.get("sp", 1))
        hidden = _overlapped(c, schedule)
        # The stage's peak holds one micro-batch's step; the schedule keeps more (schedule_memory).
        parts = dict(step_memory(layer_dims(stage, capacity_factor=found.request.recipe.capacity_factor),
                                 c.mesh_shape, found.request.recipe, batch=batch, seq=seq,
                                 params=c.memory.params, grads=c.memory.grads, optimizer=0).parts)
        saved = parts["saved"]
        scale = c.memory.params / max(1, layers_here * layer_b + max(embed_b, head_b))
        kept = max(schedule_memory(pp, m, saved_bytes=saved, input_bytes=nbytes,
                                   weight_bytes=round(layers_here * layer_b * scale), schedule=schedule, virtual=v),
                   key=lambda k: k.total)
        # The circular loop accumulates the stage's gradients in the weights' dtype: no fp32 accumulator.
        backward = schedule == "circular" and c.memory.phase == "backward"
        accum = parts["accumulator"] if backward else 0
        # Its head and loss run once, after the pipeline, on the whole local batch (as MaxText's): the fp32
        # gradient of those logits (batch / batch ways x seq / sp x vocab / tp) stays live through the
        # pipeline's backward, where the stage's peak is (XLA:GPU, llama3-70b on 8x8xH100: f32[4,4096,64128]).
        logits = ((batch // ways) * (seq // sizes.get("sp", 1)) * -(-spec.vocab_size // sizes.get("tp", 1)) * 4
                  if backward else 0)
        # activations=False (the fit counts the state only) adds none.
        more = kept.total - saved - accum + logits if o.activations else 0
        mem = dataclasses.replace(c.memory, activations=max(0, c.memory.activations + more))
        mem = _schedule_state(_zero_memory(mem, stage, c.mesh_shape, found.request, o.zero,
                                           budget=int(sub.hbm_bytes * (1.0 - o.headroom))), schedule)
        if not mem.fits or c.step is None:
            continue
        t = pipeline_time(c.step.step_s, pp, m, boundary_bytes=nbytes, boundary_link=link, stage_grad_bytes=0,
                          data_ways=1, data_link=link, schedule=schedule, virtual=v, overlap=hidden)
        total = t.total
        state = c.memory.params + c.memory.grads + c.memory.optimizer
        plan = plan_stages(spec.num_layers, pp, micro_batches=m, layer_param_bytes=round(layer_b * scale),
                           embed_param_bytes=round(embed_b * scale), head_param_bytes=round(head_b * scale),
                           layer_activation_bytes=saved // layers_here,
                           state_factor=state / max(1, c.memory.params), schedule=schedule, virtual=v)
        balance = spec.num_layers / (pp * layers_here)  # 1 when pp divides the layers
        step = StepEstimate(compute_s=c.step.compute_s, exposed_s=total - c.step.compute_s,
                            tokens_per_s=batch * seq / total / clus.num_devices,
                            mfu=c.step.mfu * c.step.step_s / total * balance, flops=c.step.flops,
                            efficiency=c.step.efficiency, micro_batches=m)
        send = CommTerm(what="pipeline stage-boundary sends (activations forward, their gradients backward)",
                        kind="send", axes=("pp",), nbytes=nbytes, calls=2 * v * m,
                        link="inter" if where == "dcn" else "intra", seconds=t.sends_total, exposed=t.sends)
        v_text = f" v={v}" if v > 1 else ""
        why = (f"pp={pp} {'over the network (each stage a block of nodes)' if where == 'dcn' else 'inside each node'}"
               f"; {schedule}{v_text} ({FRAMEWORKS[schedule]}) with m={m} micro-batches ({_m_text(m, pp)}): bubble {t.bubble / total:.1%} of the "
               f"step; stage mesh {c.text}, {layers_here} layers on the fullest stage")
        ici = (1, *c.ici_shape) if where == "dcn" else (pp, *c.ici_shape)
        dcn = (pp, *c.dcn_shape) if where == "dcn" else (1, *c.dcn_shape)
        return MeshCandidate(("pp", *c.axis_names), (pp, *c.axis_sizes), ici, dcn, mem, (*_hide(c.comm, hidden), send), why,
                             None, c.groups, c.activations, step, plan)
    return (f"no stage mesh fits with {flight:g} micro-batches of activations in flight"
            if found.candidates else "no stage mesh fits")


def _zero_memory(mem: MemoryBreakdown, stage: ModelSpec, sizes: Mapping[str, int], req: SearchRequest, zero: int,
                 *, budget: int) -> MemoryBreakdown:
    """The stage's peak with ZeRO-1 (optimizer state) or ZeRO-2 (and gradients) split over its ``dp`` axis, held
    to ``budget``.

    The stage search shards a state array only where it shards the parameter (``fsdp``: ZeRO-3, the
    parameters gathered again per layer and micro-batch). ZeRO-1/2 keep the parameters whole and split
    what the update alone reads over the ``dp`` replicas (Rajbhandari et al. 2020, sec. 5): the moments, the
    update's fp32 temporaries (each replica updates its ``1/dp`` of the parameters) and, for ZeRO-2, the
    gradients. The peak is re-priced with the split state (:func:`~meshplan.pure.cost.step_memory`'s phases:
    the update may stop being the fullest) and moved by what that changes. The bytes moved are the ``dp``
    all-reduce's (a reduce-scatter of the gradients, an all-gather of the updated parameters), so the time
    is unchanged. Estimate: the state figures were exact per replica; the ``1/dp`` split is rounded up.
    """
    ways = sizes.get("dp", 1)
    if not zero or ways == 1:
        return dataclasses.replace(mem, budget=budget)
    dims = layer_dims(stage, capacity_factor=req.recipe.capacity_factor)
    kw: dict[str, Any] = dict(batch=req.batch, seq=req.seq, params=mem.params)
    whole = step_memory(dims, dict(sizes), req.recipe, grads=mem.grads, optimizer=mem.optimizer, **kw)
    grads = -(-mem.grads // ways) if zero >= 2 else mem.grads
    optimizer = -(-mem.optimizer // ways)
    split = step_memory(dims, dict(sizes), req.recipe, grads=grads, optimizer=optimizer, update_ways=ways, **kw)
    live = split.peak_phase != "forward"
    state = mem.params + optimizer + (grads if live else 0)
    total = mem.total + split.peak - whole.peak
    return dataclasses.replace(mem, grads=grads, optimizer=optimizer, activations=max(0, total - state),
                               budget=budget, phase=split.peak_phase, grads_live=live)


def _schedule_state(mem: MemoryBreakdown, schedule: str) -> MemoryBreakdown:
    """DualPipe's device holds two stages (``s`` and ``pp-1-s``): twice the fullest stage's state."""
    if schedule != "dualpipe":
        return mem
    return dataclasses.replace(mem, params=2 * mem.params, grads=2 * mem.grads, optimizer=2 * mem.optimizer)


def _overlapped(c: MeshCandidate, schedule: str) -> float:
    """Seconds of the stage step's exposed expert all-to-alls that DualPipe's paired chunks hide.

    DualPipe overlaps one micro-batch's dispatch / combine with another's attention and MLP compute
    (DeepSeek-V3 report sec. 3.2.1, "the all-to-all and PP communication can be fully hidden"); the
    stage search prices them on the critical path. Hidden up to the stage's compute: a longer
    all-to-all still waits. The 20 of 132 SMs DeepSeek gives the communication kernels are not priced.
    """
    if schedule != "dualpipe" or c.step is None:
        return 0.0
    a2a = sum(t.exposed or 0.0 for t in c.comm if t.kind == "all-to-all")
    return min(a2a, c.step.compute_s)


def _hide(comm: tuple[CommTerm, ...], hidden: float) -> tuple[CommTerm, ...]:
    """The stage's terms with ``hidden`` seconds of its all-to-alls' exposure taken off, in proportion."""
    a2a = sum(t.exposed or 0.0 for t in comm if t.kind == "all-to-all")
    if hidden <= 0 or a2a <= 0:
        return comm
    keep = max(0.0, 1.0 - hidden / a2a)
    return tuple(t.with_exposed((t.exposed or 0.0) * keep) if t.kind == "all-to-all" else t for t in comm)


def search_pipelines(
    model: str | ModelSpec,
    cluster: str | Cluster,
    *,
    batch: int | None = None,
    seq: int | None = None,
    recipe: TrainingRecipe | None = None,
    efficiency: float | None = None,
    top_k: int = 5,
    headroom: float | None = None,
    schedules: Sequence[str] | None = None,
) -> PipelineSearch:
    """Rank pipeline layouts (``pp`` outermost) of ``model`` on ``cluster`` (see the module docstring).

    Args:
      model: a preset name or a :class:`~meshplan.pure.ModelSpec`.
      cluster: a :class:`~meshplan.pure.Cluster` or its text.
      batch: global batch in sequences (default: one per device).
      seq: tokens per sequence (default 4096, or the model's position limit).
      recipe: the training step priced (as :func:`~meshplan.pure.search_meshes`).
      efficiency: fraction of peak FLOP/s (as :func:`~meshplan.pure.search_meshes`).
      top_k: how many layouts to return.
      headroom: fraction of HBM kept free, as :func:`~meshplan.pure.search_meshes` (default
        :func:`~meshplan.pure.cluster.default_headroom`: 0.25 for a default jax GPU process, 0.1 on a TPU),
        so a stage fits the budget the plan states.
      schedules: price only these of ``("1f1b", "interleaved", "circular")`` (default: all three). Only
        ``("circular",)`` gives the layouts meshplan's pipelined step and MaxText can run (and compile).

    Returns:
      A :class:`PipelineSearch`: the fastest fitting layout per ``pp`` and placement, fastest first.

    Raises:
      PlanError, ClusterError, MeshplanTypeError: bad options (an FP8 recipe on a device with no FP8 peak
        among them), as :func:`~meshplan.pure.search_meshes`.

    Example:
      >>> found = search_pipelines("llama3-8b", "4x8xH100", batch=64, seq=4096, top_k=2)
      >>> [c.text.split(",")[0] for c in found.candidates]
      ['pp=2', 'pp=2']
      >>> found.candidates[0].pipeline.schedule in ("1f1b", "interleaved", "circular")
      True
    """
    if isinstance(model, str):
        spec = get_preset(model).spec
    elif isinstance(model, ModelSpec):
        spec = model
    else:
        raise MeshplanTypeError(f"model={model!r:.80} must be a preset name or a ModelSpec.")
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(clus, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.80} must be a Cluster or a string such as '8x8xH100'.")
    b = clus.num_devices if batch is None else as_count(batch, "batch", maximum=10**12, error=PlanError)
    s = min(4096, spec.max_position_embeddings or 4096) if seq is None else as_count(
        seq, "seq", maximum=10**12, error=PlanError)
    k_top = as_count(top_k, "top_k", maximum=10**6, error=PlanError)
    if recipe is not None and not isinstance(recipe, TrainingRecipe):
        raise MeshplanTypeError(f"recipe={recipe!r:.80} must be a TrainingRecipe or None.")
    headroom = default_headroom(clus)[0] if headroom is None else headroom
    if as_real(headroom, "headroom", allow_zero=True, error=PlanError) >= 1:
        raise PlanError(f"headroom={headroom!r} must be a fraction in [0, 1).")
    _check_fp8(recipe, clus)
    opts = _Options(b, s, recipe, efficiency, _param_split(spec), headroom=float(headroom))
    wanted = _SEARCHED if schedules is None else _wanted(schedules)
    found: list[MeshCandidate] = []
    left: list[str] = []
    for pp, where, sub, link in _placements(clus, spec.num_layers):
        got = _best_of(spec, clus, pp, where, sub, link, [x for x in _schedules(spec, pp) if x[0] in wanted], opts)
        if isinstance(got, str):
            left.append(f"pp={pp} {'over the network' if where == 'dcn' else 'inside each node'}: {got}")
        else:
            found.append(got)
    found.sort(key=_key)
    ranked = tuple(dataclasses.replace(c, rank=i + 1) for i, c in enumerate(found[:k_top]))
    return PipelineSearch(ranked, tuple(left))


def _check_fp8(recipe: TrainingRecipe | None, clus: Cluster) -> None:
    """Refuse an FP8 recipe on a device with no FP8 peak up front: each stage search's PlanError would
    otherwise be read as "this option does not fit"."""
    if isinstance(recipe, TrainingRecipe):
        fp8_peak(clus.device, recipe.matmul_dtype)


def _m_text(m: int, pp: int) -> str:
    return f"m = pp x {m // pp}" if m % pp == 0 else f"m >= pp={pp}"


_SEARCHED = ("1f1b", "interleaved", "circular")  # DualPipe needs hand-written kernels: price_pipeline only


def _wanted(schedules: object) -> tuple[str, ...]:
    """``schedules`` checked: a non-empty sequence of searched schedule names."""
    if isinstance(schedules, str) or not isinstance(schedules, Sequence):
        raise MeshplanTypeError(f"schedules={schedules!r:.80} must be a sequence of names from {list(_SEARCHED)}.")
    bad = [x for x in schedules if x not in _SEARCHED]
    if bad or not schedules:
        raise PlanError(f"schedules={list(schedules)!r:.80}: search_pipelines prices {list(_SEARCHED)} (at least one)"
                        "; DualPipe is priced by price_pipeline only.")
    return tuple(schedules)


def _schedules(spec: ModelSpec, pp: int) -> list[tuple[str, int]]:
    """Megatron's 1F1B and interleaved 1F1B, MaxText's circular (the step meshplan and MaxText run)."""
    # The circular step stacks the layers evenly: pp * v must divide them.
    one, two = spec.num_layers % pp == 0, spec.num_layers % (2 * pp) == 0
    return ([("1f1b", 1)] + ([("circular", 1)] if one else [])
            + ([("interleaved", 2), ("circular", 2)] if two else []))


def _best_of(spec: ModelSpec, clus: Cluster, pp: int, where: str, sub: Cluster, link: Link,
             schedules: list[tuple[str, int]], o: _Options, ms: tuple[int, ...] | None = None) -> MeshCandidate | str:
    """The fastest fitting option over the schedules and micro-batch counts, or the last reason there is none."""
    best: MeshCandidate | None = None
    reasons: list[str] = []
    for schedule, v in schedules:
        for m in (tuple(pp * k for k in _KS) if ms is None else ms):
            if o.batch % m:
                reasons.append(f"batch={o.batch} does not divide by m={m}")
                continue
            got = _option(spec, clus, pp, where, sub, link, schedule, v, m, o)
            if isinstance(got, str):
                reasons.append(f"{schedule} m={m}: {got}")
            elif best is None or _key(got) < _key(best):
                best = got
    # Every option's reason: the smallest m usually fails on memory, the largest on the batch.
    return best if best is not None else ("; ".join(reasons) if reasons else "no schedule to price")


def price_pipeline(
    model: str | ModelSpec,
    cluster: str | Cluster,
    *,
    pp: int,
    stage_layout: Mapping[str, int],
    batch: int,
    seq: int,
    schedule: str = "1f1b",
    virtual: int = 1,
    micro_batches: int | None = None,
    recipe: TrainingRecipe | None = None,
    efficiency: float | None = None,
    activations: bool = True,
    zero: int = 0,
) -> MeshCandidate:
    """Price one given pipeline layout (a published run's): ``pp`` over the network, each stage ``stage_layout``.

    Args:
      model, cluster, batch, seq, recipe, efficiency: as :func:`search_pipelines`.
      pp: the stages; they must divide the cluster's ICI domains (nodes / slices), as published runs place them.
      stage_layout: every stage's mesh, e.g. ``{"dp": 64, "tp": 8}`` (axes left out are 1).
      schedule, virtual: the schedule (:data:`~meshplan.pure.cost.SCHEDULES`) and its virtual stages.
      micro_batches: ``m`` (``>= pp``; a multiple of it for the interleaved and circular schedules; even
        and ``>= 2 pp`` for DualPipe); ``None``: the fastest of ``pp x (1, 2, 4, 8)`` and, for 1F1B and
        DualPipe, of the batch's divisors in ``[pp, 8 pp]``.
      activations: include the activations in the fit (``False``: the state only).
      zero: 1: ZeRO-1, the optimizer state split over the stage's ``dp`` axis (DeepSeek-V3); 2: ZeRO-2, the
        gradients too (Llama 3's FSDP that keeps the parameters after the forward); 0: replicated over ``dp``.
        Memory only: the bytes moved are the ``dp`` all-reduce's either way.

    Returns:
      The priced :class:`MeshCandidate` (``pipeline`` set, ``rank`` None).

    Raises:
      PlanError: the layout does not fit, does not divide, or ``pp`` does not divide the domains; a
        ``zero`` other than 0, 1, 2; a DualPipe ``micro_batches`` that is odd or under ``2 pp``; an FP8
        recipe on a device with no FP8 peak.
      MeshplanTypeError: a ``zero`` that is not an int.

    Example:
      >>> c = price_pipeline("llama3-70b", "16x8xH100", pp=4, stage_layout={"fsdp": 4, "tp": 8}, batch=64,
      ...                    seq=4096)
      >>> c.text, c.pipeline.schedule, c.pipeline.micro_batches >= 4
      ('pp=4,fsdp=4,tp=8', '1f1b', True)
    """
    spec = get_preset(model).spec if isinstance(model, str) else model
    if not isinstance(spec, ModelSpec):
        raise MeshplanTypeError(f"model={model!r:.80} must be a preset name or a ModelSpec.")
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(clus, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.80} must be a Cluster or a string such as '8x8xH100'.")
    _check_fp8(recipe, clus)
    stages = as_count(pp, "pp", maximum=spec.num_layers, error=PlanError)
    options = [o for o in _placements(clus, spec.num_layers) if o[0] == stages and o[1] == "dcn"]
    if not options:
        raise PlanError(f"pp={stages} must divide the {clus.num_ici_domains} {clus.ici_domain_name}s of "
                        f"{clus.text} (and be <= num_layers={spec.num_layers}) to run over the network.")
    if not isinstance(stage_layout, Mapping):
        raise MeshplanTypeError(f"stage_layout={stage_layout!r:.80} must map axis names to sizes.")
    axes = tuple(a for a in ("dp", "fsdp", "ep", "sp", "tp") if a in stage_layout or a in ("dp", "fsdp", "sp", "tp"))
    fixed = {a: stage_layout.get(a, 1) for a in axes}
    if isinstance(zero, bool) or not isinstance(zero, int):
        raise MeshplanTypeError(f"zero={zero!r:.80} must be the int 0, 1 or 2.")
    if zero not in (0, 1, 2):
        raise PlanError(f"zero={zero!r} must be 0 (replicated), 1 (optimizer state split over dp) or 2 (and "
                        f"the gradients).")
    opts = _Options(as_count(batch, "batch", maximum=10**12, error=PlanError),
                    as_count(seq, "seq", maximum=10**12, error=PlanError), recipe, efficiency, _param_split(spec),
                    fixed, axes, activations, zero)
    if micro_batches is None:
        # A published run's per-replica batch may not divide by pp x k (DeepSeek-V3: 120 sequences over
        # pp=16): 1F1B runs any m >= pp and DualPipe any even m >= 2 pp, so the batch's divisors up to 8 pp
        # are tried too.
        extra = [d for d in divisors(opts.batch) if stages <= d <= 8 * stages] if schedule in (
            "1f1b", "dualpipe") else []
        ms = tuple(m for m in sorted({stages * k for k in _KS} | set(extra))
                   if schedule != "dualpipe" or (m % 2 == 0 and m >= 2 * stages))
    else:
        m = as_count(micro_batches, "micro_batches", maximum=10**12, error=PlanError)
        if m < stages or (schedule in ("interleaved", "circular") and m % stages):
            raise PlanError(f"micro_batches={m} must be >= pp={stages} (and a multiple of it for {schedule!r}).")
        bubble_fraction(stages, m, schedule=schedule, virtual=virtual)  # DualPipe's own refusals
        ms = (m,)
    _, where, sub, link = options[0]
    got = _best_of(spec, clus, stages, where, sub, link, [(schedule, virtual)], opts, ms)
    if isinstance(got, str):
        raise PlanError(f"pp={stages} x {dict(fixed)} on {clus.text}: {got}.")
    return got


def _key(c: MeshCandidate) -> tuple[float, int, tuple[int, ...], tuple[int, ...]]:
    """Fastest first, then leanest, then by sizes and placement: a total, deterministic order."""
    assert c.step is not None  # every pipeline candidate is priced
    return (c.step.step_s, c.memory.total, c.axis_sizes, c.dcn_shape)
