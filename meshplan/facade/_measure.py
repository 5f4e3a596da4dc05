"""The hardware decides: run a plan's top layouts on the live devices and time them beside the prediction.

:func:`measure_plan` takes a :class:`~meshplan.pure.SearchResult` made for the cluster these devices are
(:func:`~meshplan.facade._machine.live_cluster`) and, for each of its top layouts (or the ones named):

1. builds meshplan's reference train step (:func:`~meshplan.reference_step`) on the layout's mesh with the plan's
   specs, or the caller's own step (``step=``), compiles it (XLA's compiled peak for this device comes with it,
   :func:`~meshplan.compiled_memory`), and places a state: random weights, zero optimizer state, random tokens;
2. runs ``warmup`` steps, then ``steps`` timed ones, each to ``block_until_ready``, feeding each step's new state
   to the next (the reference step donates it): the median step and the fastest and slowest;
3. reads the device's peak bytes in use where the backend reports them (``device.memory_stats()``: GPUs and
   TPUs; XLA:CPU reports none, so the row's ``measured_peak_bytes`` is ``None`` and its note says so). The peak
   is a high-water mark jax cannot reset, so layouts run in order of their predicted memory, each freed before
   the next, and a layout's peak is its mark less the bytes in use before it was placed; one that does not
   raise the mark gets ``None`` with that reason.

Each layout is one :class:`~meshplan.pure.cluster.StepTiming` row: measured and predicted step, measured,
estimated and compiled peak, and their ratios, ranked by the measured step
(:func:`~meshplan.pure.cluster.rank_measured`). A layout that fails (out of memory when it runs, an XLA compile
error, a step that cannot be built for it, or its ``timeout_s`` spent: checked between steps, and a hung
compile or step is abandoned after it) is that row's ``error``; the rest still run, except after an abandoned
one, which may still hold the devices: the rows after it say so and do not run. An exception raised by the
caller's own ``step`` function passes through. A plan whose priced step is not the reference step (FP8 weight
matmuls, a dropless MoE dispatch) runs nothing without ``step=``: each row says why.

Devices that are not the plan's cluster (another kind, another count) are refused before anything runs
(:class:`~meshplan.errors.DeviceMismatchError`, saying what was found and what the plan expects).
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from meshplan.facade._machine import live_cluster, live_devices
from meshplan.facade._mesh import build_mesh
from meshplan.pure._check import as_count, as_real, as_sequence
from meshplan.pure.cluster._measured import measure_document, rank_measured
from meshplan.pure.cluster._profile import StepTiming
from meshplan.pure.errors import DeviceMismatchError, MeshplanError, MeshplanTypeError, PlanError
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.search._result import SearchResult

__all__ = ["Measurement", "measure_plan"]

StepFactory = Callable[[MeshCandidate, Mesh], tuple[Callable[..., Any], tuple[Any, ...]]]
"""``step(candidate, mesh) -> (fn, args)``: the caller's own step on one layout; ``fn(*args)`` returns
``(new_state, ...)``, and a new state with ``args[0]``'s structure replaces it for the next step (else every
step runs on the same arguments)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    """What :func:`measure_plan` measured: one row per layout, ranked by measured step, and the machine.

    Attributes:
      rows: :class:`~meshplan.pure.cluster.StepTiming`, fastest measured first, the failed ones last.
      machine: the cluster the devices are (``"1x8xXLA:CPU"``).
      device_kind, platform: jax's names for the devices.
      profile_id: the profile that priced the predictions (``""``: the catalogue's figures).
      notes: what a reader needs to weigh the figures (no peak on this backend, what priced the plan).
    """

    rows: tuple[StepTiming, ...]
    machine: str
    device_kind: str
    platform: str
    profile_id: str
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The measure document (:func:`~meshplan.pure.cluster.measure_document`), what ``--json`` prints."""
        return measure_document(self.rows, machine=self.machine, device_kind=self.device_kind,
                                platform=self.platform, profile_id=self.profile_id, notes=self.notes)

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON (``meshplan profile --refine`` and the benchmarks read it)."""
        return json.dumps(self.to_dict(), indent=1)


class _Timeout(Exception):
    """The layout's time ran out between two steps (becomes that row's error)."""


def _check_devices(result: SearchResult, devices: list[Any]) -> None:
    """Refuse devices that are not the plan's cluster, saying what was found and what the plan expects."""
    live = live_cluster(devices)
    want = result.request.cluster
    same = (live.device.name == want.device.name and live.num_devices == want.num_devices
            and live.num_nodes == want.num_nodes)
    if not same:
        first = devices[0]
        raise DeviceMismatchError(
            f"found {len(devices)} x {first.device_kind!r} ({live.device.name}, {live.num_nodes} process"
            f"{'es' if live.num_nodes != 1 else ''}: {live.text}); the plan expects {want.num_devices} x "
            f"{want.device.name} ({want.text}). Plan for this machine (meshplan measure plans it) or run on the "
            "plan's cluster.")


def _layouts(result: SearchResult, top: int, layouts: Sequence[Any] | None) -> list[MeshCandidate]:
    if layouts is None:
        return list(result.candidates[:top])
    known = {c.text: c for c in (*result.candidates, *result.rejected)}
    out = []
    for i, item in enumerate(as_sequence(layouts, "layouts")):
        if isinstance(item, MeshCandidate):
            out.append(item)
        elif isinstance(item, str) and item.replace(" ", "") in known:
            out.append(known[item.replace(" ", "")])
        else:
            raise PlanError(f"layouts[{i}]={item!r:.60} is not a mesh of this plan; its meshes: {sorted(known)}.")
    return out


def _materialize(abstract: tuple[Any, Any], vocab: int, seed: int) -> tuple[Any, Any]:
    """Arrays for a reference step's abstract ``(state, batch)``, placed as their shardings say, in one program:
    weights spread over ``+-0.02`` (a power-capped GPU draws less on zeros), optimizer state zeros, tokens
    spread over the vocabulary. The values come from an iota through the golden ratio, not an RNG: as varied
    for the timing, and a fraction of the compile (a threefry per leaf took seconds on XLA:CPU)."""
    state, batch = abstract
    leaves, treedef = jax.tree.flatten((state, batch))
    n_params = len(jax.tree.leaves(state[0]))
    n_state = len(jax.tree.leaves(state))

    def spread(shape: tuple[int, ...], salt: int) -> jax.Array:
        size = max(int(np.prod(shape)), 1)
        x = jax.lax.iota(jnp.float32, size) * 0.6180339887 + (seed + salt) * 0.1234567
        return (x - jnp.floor(x)).reshape(shape)

    def make() -> list[jax.Array]:
        out = []
        for i, s in enumerate(leaves):
            if i < n_params and jnp.issubdtype(s.dtype, jnp.floating):
                out.append(((spread(s.shape, i) - 0.5) * 0.04).astype(s.dtype))
            elif i >= n_state:  # the token ids
                out.append((spread(s.shape, i) * vocab).astype(s.dtype) % vocab)
            else:
                out.append(jnp.zeros(s.shape, s.dtype))
        return out

    arrays = jax.jit(make, out_shardings=[s.sharding for s in leaves])()
    return jax.tree.unflatten(treedef, arrays)  # type: ignore[no-any-return]


def _memory(devices: list[Any]) -> list[dict[str, Any] | None]:
    return [d.memory_stats() for d in devices]


def _peak(before: list[dict[str, Any] | None], after: list[dict[str, Any] | None], platform: str
          ) -> tuple[int | None, str]:
    """The layout's peak bytes in use on its fullest local device, and where it comes from (or why none)."""
    if any(s is None or "peak_bytes_in_use" not in s for s in after):
        if platform == "cpu":
            return None, "XLA:CPU reports no memory_stats(): no measured peak"
        return None, f"the {platform} backend reports no peak_bytes_in_use"
    raised = [a["peak_bytes_in_use"] > b["peak_bytes_in_use"] for a, b in zip(after, before, strict=True)]  # type: ignore[index]
    if not all(raised):
        return None, ("an earlier layout set the device's high-water mark (peak_bytes_in_use), which jax cannot "
                      "reset; measure this layout alone (--layouts) for its peak")
    peaks = [a["peak_bytes_in_use"] - b.get("bytes_in_use", 0) for a, b in zip(after, before, strict=True)]  # type: ignore[index, union-attr]
    return int(max(peaks)), "peak_bytes_in_use during the steps less the bytes in use before the layout was placed"


def _reference(result: SearchResult, model: Any, cand: MeshCandidate, mesh: Mesh, config: Any) -> tuple[Any, Any]:
    from meshplan.facade.verify import reference_config, reference_step

    req = result.request
    own = config if config is not None else reference_config(req.recipe, param_dtype=req.param_dtype)
    if cand.step is not None and config is None:
        own = dataclasses.replace(own, micro_batches=cand.step.micro_batches)
    ref = reference_step(model, mesh, batch=result.request.batch, seq=result.request.seq, plan=cand, config=own)
    return ref.fn, ref.args


def _run(fn: Any, args: tuple[Any, ...], *, steps: int, warmup: int, deadline: float, carry: bool
         ) -> list[float]:
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)  # type: ignore[no-untyped-call]  # unannotated in jax
        if i >= warmup:
            times.append(time.perf_counter() - start)
        if carry and _carries(out, args):
            args = (out[0], *args[1:])
        del out
        if time.monotonic() > deadline:
            done = max(i + 1 - warmup, 0)
            raise _Timeout(f"timed out after {done} of {steps} timed steps (and {min(i + 1, warmup)} warm-up)")
    return times


def _carries(out: Any, args: tuple[Any, ...]) -> bool:
    """Whether a step's first output is its next state: a tuple whose head has the first argument's structure."""
    return (isinstance(out, (tuple, list)) and len(out) > 0 and len(args) > 0
            and jax.tree.structure(out[0]) == jax.tree.structure(args[0]))  # type: ignore[operator]


def _layout_job(result: SearchResult, model: Any, cand: MeshCandidate, devices: list[Any], *, step: Any,
                config: Any, steps: int, warmup: int, deadline: float, seed: int) -> dict[str, Any]:
    """Build, compile, place and time one layout (runs in a worker thread)."""
    from meshplan.facade.verify import compiled_memory

    mesh = build_mesh(cand.axis_sizes, cand.axis_names, devices=devices, dcn_mesh_dims=cand.dcn_shape)
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    before = _memory(local)
    if step is None:
        fn, abstract = _reference(result, model, cand, mesh, config)
        compiled = fn.lower(*abstract).compile()
        peak = compiled_memory(fn, *abstract, top_buffers=0)  # the same program: jax's cache serves it
        if time.monotonic() > deadline:
            raise _Timeout("timed out while compiling")
        args = _materialize(abstract, model.vocab_size, seed)
        run, carry = compiled, True
    else:
        fn, args = step(cand, mesh)
        if not callable(fn) or not isinstance(args, tuple):
            raise MeshplanTypeError(f"step(candidate, mesh) must return (fn, args tuple); got ({fn!r:.40}, "
                                    f"{args!r:.40}).")
        run = fn if hasattr(fn, "lower") else jax.jit(fn)
        peak = compiled_memory(run, *args, top_buffers=0)
        carry = True
    times = _run(run, tuple(args), steps=steps, warmup=warmup, deadline=deadline, carry=carry)
    after = _memory(local)
    del args, run
    return {"times": times, "compiled": peak.peak_bytes, "before": before, "after": after}


# Layouts abandoned after their timeout whose thread still runs (a compile or a step in XLA). They are joined
# at interpreter exit: a thread torn down inside XLA's C++ code aborts the process ("terminate called ...").
_ABANDONED: list[threading.Thread] = []
_EXIT_WAIT_S = 300.0


def _join_abandoned() -> None:
    deadline = time.monotonic() + _EXIT_WAIT_S
    for thread in _ABANDONED:
        thread.join(max(deadline - time.monotonic(), 0.0))


atexit.register(_join_abandoned)


def _in_thread(job: Callable[[], dict[str, Any]], timeout_s: float) -> tuple[dict[str, Any] | None, Any, bool]:
    """``(result, error, abandoned)`` of ``job`` run in a daemon thread for at most ``timeout_s``."""
    box: dict[str, Any] = {}

    def target() -> None:
        # Carried to the caller, which re-raises what is not a layout's own failure: nothing is swallowed here.
        try:
            box["out"] = job()
        except BaseException as err:  # noqa: BLE001
            box["err"] = err

    thread = threading.Thread(target=target, name="meshplan-measure", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        _ABANDONED.append(thread)
        return None, None, True
    return box.get("out"), box.get("err"), False


def _why(err: BaseException) -> str | None:
    """The row's error for a layout's own failure, or ``None`` for anything else (re-raised)."""
    if isinstance(err, _Timeout):
        return str(err)
    if isinstance(err, jax.errors.JaxRuntimeError):
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
            return f"out of memory at run time: {text[:300]}"
        return f"XLA error: {text[:300]}"
    if isinstance(err, MeshplanError):
        return f"cannot build or compile the step for this layout: {str(err)[:300]}"
    return None


def _row(result: SearchResult, model: Any, cand: MeshCandidate, **measured: Any) -> StepTiming:
    req = result.request
    est = cand.step
    return StepTiming(
        model=model.name, hidden=model.hidden_size, mesh=cand.text, batch=req.batch, seq=req.seq,
        predicted_step_s=None if est is None else est.step_s,
        predicted_compute_s=None if est is None else est.compute_s,
        predicted_exposed_s=None if est is None else est.exposed_s,
        efficiency=None if est is None or not est.compute_s else est.efficiency,
        predicted_memory_bytes=cand.memory.total, profile_id="" if req.profile is None else req.profile.profile_id,
        predicted_rank=cand.rank, **measured)


def measure_plan(result: SearchResult, *, model: Any = None, top: int = 3, layouts: Sequence[Any] | None = None,
                 steps: int = 5, warmup: int = 1, step: StepFactory | None = None, config: Any = None,
                 timeout_s: float = 600.0, devices: Sequence[Any] | None = None, seed: int = 0) -> Measurement:
    """Time a plan's top layouts on the live devices (see the module docstring).

    Args:
      result: :func:`~meshplan.pure.search_meshes`'s answer for the cluster these devices are.
      model: the :class:`~meshplan.pure.ModelSpec` searched (default: the preset or file the plan names).
      top: how many of the plan's ranked layouts (when ``layouts`` is not given).
      layouts: mesh texts (``"dp=2,fsdp=4"``) or :class:`~meshplan.pure.MeshCandidate` of the plan to run instead.
      steps: timed steps per layout; ``warmup``: untimed steps before them (after the compile).
      step: your own ``step(candidate, mesh) -> (fn, args)`` instead of the reference step.
      config: the :class:`~meshplan.ReferenceConfig` (default: the one the plan's recipe describes).
      timeout_s: the most one layout may take, compile included.
      devices: the devices (default every device of every process).
      seed: for the random weights and tokens.

    Returns:
      A :class:`Measurement`.

    Raises:
      DeviceMismatchError: the devices are not the plan's cluster.
      PlanError: a layout that is not the plan's, or counts out of range. MeshplanTypeError: wrong types.

    Example:
      >>> import dataclasses, meshplan
      >>> from meshplan.pure import get_preset, search_meshes
      >>> from meshplan.pure.cost import TrainingRecipe
      >>> tiny = dataclasses.replace(get_preset("gpt2").spec, name="tiny", num_layers=1, hidden_size=32,
      ...     num_heads=2, num_kv_heads=2, head_dim=16, intermediate_size=64, vocab_size=128, num_params=None)
      >>> plan = search_meshes(tiny, meshplan.live_cluster(), batch=8, seq=16, top_k=2,
      ...                      recipe=TrainingRecipe(backend="cpu"))
      >>> m = measure_plan(plan, model=tiny, top=1, steps=2)
      >>> len(m.rows), m.rows[0].measured_peak_bytes, m.rows[0].measured_step_s > 0
      (1, None, True)
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.60} must be a SearchResult (what search_meshes returns).")
    top = as_count(top, "top", maximum=10**6, error=PlanError)
    steps = as_count(steps, "steps", maximum=10**6, error=PlanError)
    warmup = as_count(warmup, "warmup", minimum=0, maximum=10**6, error=PlanError)
    seed = as_count(seed, "seed", minimum=0, maximum=2**31 - 1, error=PlanError)
    timeout_s = as_real(timeout_s, "timeout_s", error=PlanError)
    if step is not None and not callable(step):
        raise MeshplanTypeError(f"step={step!r:.60} must be a function step(candidate, mesh) -> (fn, args).")
    if model is None:
        from meshplan.facade._model_file import resolve_model

        model = resolve_model(result.request.model)
    found = live_devices(devices)
    _check_devices(result, found)
    chosen = _layouts(result, top, layouts)
    platform = found[0].platform
    rows: list[StepTiming] = []
    abandoned = ""
    other = "" if step is not None else _other_step(model, result.request.recipe)
    # Ascending predicted memory: each layout can raise the device's high-water mark (see the module docstring).
    for cand in sorted(chosen, key=lambda c: (c.memory.total, c.rank or 0, c.text)):
        if other:  # the reference step is another step than the one priced: each row says so
            rows.append(_row(result, model, cand, steps=0, measured_step_s=None, measured_min_s=None,
                             measured_max_s=None, measured_peak_bytes=None, peak_note="", compiled_peak_bytes=None,
                             error=other))
            continue
        if abandoned:
            rows.append(_row(result, model, cand, steps=0, measured_step_s=None, measured_min_s=None,
                             measured_max_s=None, measured_peak_bytes=None, peak_note="",
                             compiled_peak_bytes=None, error=f"not run: {abandoned} was abandoned after its "
                             "timeout and may still hold the devices"))
            continue
        deadline = time.monotonic() + timeout_s
        job = lambda cand=cand: _layout_job(result, model, cand, found, step=step, config=config,  # noqa: E731
                                            steps=steps, warmup=warmup, deadline=deadline, seed=seed)
        out, err, hung = _in_thread(job, timeout_s)
        gc.collect()  # the layout's arrays go before the next is placed
        if hung:
            abandoned = cand.text
            rows.append(_row(result, model, cand, steps=0, measured_step_s=None, measured_min_s=None,
                             measured_max_s=None, measured_peak_bytes=None, peak_note="", compiled_peak_bytes=None,
                             error=f"timed out: still compiling or stepping after {timeout_s:g} s; abandoned"))
            continue
        if err is not None:
            why = _why(err)
            if why is None:
                raise err
            rows.append(_row(result, model, cand, steps=0, measured_step_s=None, measured_min_s=None,
                             measured_max_s=None, measured_peak_bytes=None, peak_note="", compiled_peak_bytes=None,
                             error=why))
            continue
        assert out is not None
        peak, note = _peak(out["before"], out["after"], platform)
        times = out["times"]
        rows.append(_row(result, model, cand, steps=len(times), measured_step_s=statistics.median(times),
                         measured_min_s=min(times), measured_max_s=max(times), measured_peak_bytes=peak,
                         peak_note=note, compiled_peak_bytes=out["compiled"]))
    return Measurement(rank_measured(rows), result.request.cluster.text, found[0].device_kind, platform,
                       "" if result.request.profile is None else result.request.profile.profile_id,
                       _notes(result, platform))


def _other_step(model: Any, recipe: Any) -> str:
    """Why meshplan's reference step is not the step a plan priced (``""``: it is), so timing it checks nothing."""
    from meshplan.pure.verify import uncompiled_dispatch

    why = uncompiled_dispatch(model, recipe)
    if why:
        return "not run: " + why.removeprefix("not compiled: ")
    if recipe.matmul_dtype == "float8":
        return ("not run: the plan priced FP8 weight matmuls and meshplan's reference step runs them in bf16; "
                "pass step= with your FP8 step to time it")
    return ""


def _notes(result: SearchResult, platform: str) -> tuple[str, ...]:
    req = result.request
    notes = []
    if req.profile is not None:
        notes.append(f"predicted with profile {req.profile.text}")
    else:
        notes.append("predicted with the catalogue's figures" + (
            " (XLA:CPU: nominal link figures and no peak FLOP/s, so the prediction is exposed communication only;"
            " meshplan profile measures them)" if req.cluster.device.peak_bf16_flops is None else ""))
    if platform == "cpu":
        notes.append("XLA:CPU reports no memory_stats(): measured_peak_bytes is null; compiled_peak_bytes is "
                     "XLA:CPU's compiled figure")
    notes.append("layouts ran in order of predicted memory, each timed over its own steps after a warm-up")
    return tuple(notes)
