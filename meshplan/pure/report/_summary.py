"""A search result's summary as plain text facts: what the terminal, markdown and HTML renderers all show.

One place decides what a reader sees first (the header facts, the ranked table's cells, the lines to type)
so the three renderers cannot drift apart; each only lays the facts out. Every figure says how it was
obtained: the state's bytes are exact, the calibrated part of the peak is an estimate stated with the range
the recorded compiles put it in (:func:`~meshplan.pure.cost.peak_bounds`), step times are an alpha-beta and
FLOP-count estimate.

New facts a candidate carries (a compiled peak, a pipeline bubble) are shown by adding a :class:`Column`
to :data:`RANK_COLUMNS` and its cell to :func:`ranked_rows`.

Example:
  >>> from meshplan.pure import search_meshes
  >>> result = search_meshes("gpt2", "8xH100", batch=8, seq=1024, top_k=2)
  >>> [label for label, _ in header_facts(result)]
  ['model', 'cluster', 'budget', 'step', 'memory', 'time']
  >>> ranked_rows(result)[0]["verdict"]
  'best'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster import default_headroom
from meshplan.pure.cost import overlap_rule, resolution_percent
from meshplan.pure.cost._matmul_dtype import FP8_EFFICIENCY_RATIO
from meshplan.pure.cost._memory_spread import Spread, calibration_spread, peak_bounds
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MoeDispatch
from meshplan.pure.cost._step_memory import CALIBRATIONS, calibration_key
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.search import tied_count
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.verify import CompiledStep
from meshplan.pure.report._export import maxtext_settings
from meshplan.pure.search._result import SearchResult

__all__ = ["RANK_COLUMNS", "Column", "chosen_mesh", "compiled_step_line", "compiled_step_text", "default_budget_source", "shown_columns",
           "ties_line", "compute_rate", "create_mesh_call", "header_facts", "maxtext_flags",
           "memory_range", "moe_dispatch_text", "param_count", "range_text", "ranked_rows", "seconds", "spread_of"]


class Column(NamedTuple):
    """One column of the ranked table.

    Attributes:
      key: the cell's key in :func:`ranked_rows`' dicts.
      title: the header.
      priority: 1 is always shown; a narrow terminal drops the highest numbers first.
      numeric: right-aligned.
    """

    key: str
    title: str
    priority: int
    numeric: bool = False


RANK_COLUMNS: tuple[Column, ...] = (
    Column("rank", "#", 1, True),
    Column("mesh", "mesh", 1),
    Column("memory", "memory/device", 1, True),
    Column("range", "range or exact", 3, True),
    Column("step", "step", 1, True),
    Column("compiled", "compiled step", 2, True),
    Column("mfu", "MFU", 2, True),
    Column("exposed", "exposed comm", 2, True),
    Column("micro", "micro-batches", 5, True),
    Column("ici", "ICI split", 4),
    Column("dcn", "DCN split", 4),
    Column("verdict", "verdict", 1),
)
"""The ranked table's columns in display order; a narrow terminal drops priority 5, then 4, ... first. The
``compiled`` column (the compiled schedule's step) is shown only where some ranked mesh has one
(:func:`shown_columns`)."""


def shown_columns(rows: tuple[dict[str, str], ...]) -> tuple[Column, ...]:
    """:data:`RANK_COLUMNS` less the compiled step's where no row has one (a plan with nothing compiled).

    Example:
      >>> [c.key for c in shown_columns(({"compiled": "-"},))][:5]
      ['rank', 'mesh', 'memory', 'range', 'step']
    """
    if any(r.get("compiled", "-") != "-" for r in rows):
        return RANK_COLUMNS
    return tuple(c for c in RANK_COLUMNS if c.key != "compiled")

# MaxText's base.yml leaves these two at -1 ("fill in the rest"); they are written even when 1 so that
# MaxText infers nothing and builds exactly the mesh priced.
_MAXTEXT_INFERRED = ("ici_fsdp_parallelism", "dcn_data_parallelism")


def _check(result: object) -> SearchResult:
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.80} must be a SearchResult (search_meshes(...)), not "
                                f"{type(result).__name__}.")
    return result


def seconds(s: float) -> str:
    """A duration as the tables print it.

    Example:
      >>> seconds(0.0215), seconds(5.82)
      ('21.5 ms', '5.82 s')
    """
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def param_count(result: SearchResult) -> str:
    """The model's parameter count, from the best mesh's groups (``'70.55 B'``)."""
    n = sum(g.count * math.prod(g.shape) for g in _check(result).best.groups)
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def spread_of(result: SearchResult) -> tuple[str, Spread] | None:
    """The recorded spread the result's estimates are stated with, and where it was measured; ``None`` when
    no recorded compile checks the coefficients the recipe is priced with."""
    return calibration_spread(_check(result).request.recipe)


def memory_range(result: SearchResult, cand: MeshCandidate) -> tuple[int, int] | None:
    """Where the recorded compiles put ``cand``'s compiled peak (low, high bytes), or ``None`` without a
    recorded spread."""
    found = spread_of(result)
    return None if found is None else peak_bounds(cand.memory, found[1])


def range_text(bounds: tuple[int, int] | None) -> str:
    """A byte range as the tables print it, one unit where both ends share it.

    Example:
      >>> range_text((40 * 2**30, 54 * 2**30)), range_text((2**29, 2**31)), range_text(None)
      ('40.0-54.0 GiB', '512.0 MiB-2.0 GiB', 'no range')
    """
    if bounds is None:
        return "no range"
    low, high = bounds
    lo, hi = fmt_bytes(low), fmt_bytes(high)
    if lo.split()[1] == hi.split()[1]:  # one unit for both: "37.6-50.7 GiB"
        return f"{lo.split()[0]}-{hi}"
    return f"{lo}-{hi}"


def compute_rate(efficiency: float | None, matmul_dtype: str) -> str:
    """How the step's FLOPs were timed, to follow ``"FLOPs"``: the bf16 efficiency, and for an FP8 recipe the
    weight matmuls' share of the FP8 peak (:data:`~meshplan.pure.cost.FP8_EFFICIENCY_RATIO` times it).

    Example:
      >>> compute_rate(0.5, "bfloat16"), compute_rate(None, "bfloat16")
      (' at 50% of peak bf16', '')
      >>> compute_rate(0.5, "float8")
      ' at 50% of peak bf16, weight matmuls at 38% of peak fp8'
    """
    if efficiency is None:
        return " (weight matmuls in fp8)" if matmul_dtype == "float8" else ""
    at = f" at {efficiency:.0%} of peak bf16"
    if matmul_dtype == "float8":
        at += f", weight matmuls at {efficiency * FP8_EFFICIENCY_RATIO:.0%} of peak fp8"
    return at


def moe_dispatch_text(moe_dispatch: str) -> str:
    """How an MoE plan's header says the dispatch it priced (:class:`~meshplan.pure.cost.MoeDispatch`).

    Example:
      >>> moe_dispatch_text("einsum")
      'MoE einsum dispatch (capacity factor 1.25, as the reference step)'
      >>> moe_dispatch_text("dropless")
      'MoE dropless dispatch (grouped GEMMs over the routed tokens)'
    """
    if MoeDispatch(moe_dispatch).einsums:
        return f"MoE einsum dispatch (capacity factor {CAPACITY_FACTOR:g}, as the reference step)"
    return "MoE dropless dispatch (grouped GEMMs over the routed tokens)"


def default_budget_source(result: SearchResult) -> str:
    """Where a result's headroom came from when nobody said: the library's default in its own words where the
    request used it (:func:`~meshplan.pure.cluster.default_headroom`), else ``"--headroom"``.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> default_budget_source(search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=1))
      "jax's GPU allocator takes 75%: its default; --mem-fraction to change"
    """
    req = _check(result).request
    headroom, why = default_headroom(req.cluster)
    return why if req.headroom == headroom else "--headroom"


def header_facts(result: SearchResult, *, budget_source: str | None = None) -> tuple[tuple[str, str], ...]:
    """The summary's header, one fact per ``(label, text)``: model, cluster, budget, step, memory, time.

    ``budget_source`` says where the headroom came from (the CLI's GPU rule: jax's allocator fraction; default
    :func:`default_budget_source`)."""
    req = _check(result).request
    if budget_source is None:
        budget_source = default_budget_source(result)
    c, recipe = req.cluster, req.recipe
    hosts = f"{c.num_nodes} host{'s' if c.num_nodes != 1 else ''} x {c.devices_per_node}"
    hosts += f", {c.num_slices} slices" if c.num_slices > 1 else ""
    moments = req.optimizer_copies - int(recipe.master_weights)  # the master copy is said below, in fp32
    optimizer = recipe.optimizer + (f" ({moments} x {req.optimizer_dtype})" if moments else "")
    step = [f"batch {req.batch} x {req.seq} tokens", optimizer, f"remat {recipe.remat}",
            f"{recipe.attention} attention"]
    if recipe.micro_batches > 1:
        step.append(f"{recipe.micro_batches} micro-batches")
    if recipe.master_weights:
        step.append("fp32 master weights")
    if recipe.matmul_dtype == "float8":
        step.append("fp8 weight matmuls")
    if req.moe_layers:  # a dense model has no dispatch to state
        step.append(moe_dispatch_text(recipe.moe_dispatch))
    found = calibration_spread(recipe)
    source = CALIBRATIONS[calibration_key(recipe)].source.split(" (")[0].split(" peak_memory")[0]
    if found is None:
        memory = f"params/grads/optimizer exact; activations estimated (fitted to {source}; no range recorded)"
    else:
        s = found[1]
        memory = (f"params/grads/optimizer exact; activations estimated, {s.low:.2f}-{s.high:.2f}x on {s.rows} "
                  f"{source} compiles")
    if req.moe_layers and not MoeDispatch(recipe.moe_dispatch).einsums:
        # The coefficients and their spread come from compiles of the einsum step (the reference step's).
        memory += " of the einsum MoE step; dropless: its routing terms removed, not fitted to a dropless compile"
    if c.device.peak_bf16_flops is None:
        time = f"estimated: exposed communication only (no peak FLOP/s known for {c.device.name})"
    else:
        eff = result.best.step.efficiency if result.best.step is not None else req.efficiency
        fitted = overlap_rule(recipe.compiler) is not None
        time = f"estimated: FLOPs{compute_rate(eff, recipe.matmul_dtype)} + alpha-beta collectives not hidden " \
               "under compute" + (" (XLA:GPU's overlap, fitted to its compiled programs)" if fitted else "")
        if recipe.matmul_dtype == "float8":  # which of the two measured FP8 ratios the user gets
            time += ("; FP8 as a tuned stack runs it (torchao, Transformer Engine): a plain-JAX FP8 step measured "
                     "0.92-0.95x its bf16 step on an H100, not the 0.74-0.79x priced")
    budget = (f"{fmt_bytes(req.budget)} per device = HBM {fmt_bytes(c.hbm_bytes, style='exact')} less "
              f"{req.headroom:.0%} headroom ({budget_source})")
    facts = (
        ("model", f"{req.model}, {param_count(result)} parameters in {req.param_dtype}"),
        ("cluster", f"{c.text}: {c.num_devices} x {c.device.name}, {hosts}"),
        ("budget", budget),
        ("step", "; ".join(step)),
        ("memory", memory),
        ("time", time),
    )
    # A plan priced by a machine profile says which, when it was measured, and what it left at the catalogue's.
    return facts + ((("profile", req.profile.text),) if req.profile is not None else ())


def _tied(result: SearchResult) -> int:
    """How many ranked meshes (from the top) the step-time model cannot tell from the best (0: ranked by
    communication, where no resolution is stated)."""
    return tied_count(result.candidates) if result.request.rank_by == "time" else 0


def ties_line(result: SearchResult) -> str | None:
    """The sentence under the ranked table saying which meshes are tied with the best, or ``None``.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> ties_line(search_meshes("llama3-70b", "8x8xH100", top_k=5))[:40]
      '#1-#5 are tied: their predicted steps ar'
    """
    n = _tied(_check(result))
    if n < 2:
        return None
    return (f"#1-#{n} are tied: their predicted steps are within the step-time model's resolution of each "
            f"other ({resolution_percent():.0f}%, its median error against published runs), so they are "
            "ordered by what is surer: the compiled schedule where compiled, then fewer bytes over the network "
            "per step, then the predicted step.")


def _verdict(result: SearchResult, cand: MeshCandidate, bounds: tuple[int, int] | None) -> str:
    best = result.best
    if cand.rank == 1:
        text = "best"
    elif cand.rank is not None and cand.rank <= _tied(result):
        text = "~ best"
    elif cand.step is not None and best.step is not None and best.step.step_s > 0:
        text = f"{(cand.step.step_s / best.step.step_s - 1) * 100:+.1f}% time"
    else:
        text = f"{(cand.step_comm_s / best.step_comm_s - 1) * 100:+.0f}% comm" if best.step_comm_s > 0 else "-"
    if not cand.memory.fits:
        return "over budget"
    if bounds is not None and bounds[1] > cand.memory.budget:
        text += ", tight"  # fits at the estimate, not at the top of the recorded range
    return text


def _split(cand: MeshCandidate, parts: tuple[int, ...]) -> str:
    shown = [f"{n}={p}" for n, p in zip(cand.axis_names, parts, strict=True) if p > 1]
    return ",".join(shown) or "1"


def ranked_rows(result: SearchResult, compiled: Mapping[str, tuple[int, str]] | None = None,
                steps: Mapping[str, CompiledStep] | None = None) -> tuple[dict[str, str], ...]:
    """One dict of cell texts per ranked mesh, keyed by :data:`RANK_COLUMNS`' keys.

    The verdict is short: ``best``, the step time against the best (``+0.4% time``), and ``tight`` where the
    mesh fits at the estimate but not at the top of the recorded range. ``compiled`` maps a mesh's text to
    XLA's compiled peak and the compiler that gave it, for the meshes verified: their range cell reads
    ``exact 45.0 GiB`` and their verdict follows the compiled figure. ``steps`` maps a mesh's text to its
    compiled program's step, simulated from the schedule: the ``compiled`` cell (``-`` where none).

    Example:
      >>> from meshplan.pure import search_meshes
      >>> result = search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2)
      >>> best = result.best.text
      >>> ranked_rows(result, {best: (2**40, "XLA:GPU, jax 0.10.2")})[0]["range"]
      'exact 1024.0 GiB'
      >>> ranked_rows(result, {best: (2**40, "XLA:GPU, jax 0.10.2")})[0]["verdict"]
      'over budget (compiled)'
    """
    priced = _check(result).request.cluster.device.peak_bf16_flops is not None
    exact = dict(compiled or {})
    timed = dict(steps or {})
    rows = []
    for cand in result.candidates:
        st, bounds = cand.step, memory_range(result, cand)
        verdict = _verdict(result, cand, bounds)
        rng = range_text(bounds)
        if cand.text in exact:
            peak = exact[cand.text][0]
            rng = f"exact {fmt_bytes(peak)}"
            verdict = "over budget (compiled)" if peak > cand.memory.budget else verdict.replace(", tight", "")
        rows.append({
            "rank": str(cand.rank), "mesh": cand.text, "memory": fmt_bytes(cand.memory.total),
            "range": rng, "step": "-" if st is None else seconds(st.step_s),
            "compiled": seconds(timed[cand.text].step_s) if cand.text in timed else "-",
            "mfu": "-" if st is None or not priced else f"{st.mfu:.1%}",
            "exposed": "-" if st is None else seconds(st.exposed_s),
            "micro": "-" if st is None else str(st.micro_batches),
            "ici": _split(cand, cand.ici_shape), "dcn": _split(cand, cand.dcn_shape),
            "verdict": verdict,
        })
    return tuple(rows)


def compiled_step_line(result: SearchResult, steps: Mapping[str, CompiledStep]) -> str | None:
    """The sentence under the ranked table saying what the compiled step is and how it was priced, or ``None``
    when no ranked mesh has one.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> result = search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2)
      >>> compiled_step_line(result, {result.best.text: CompiledStep(1.0, 0.9, 0.1)})[:30]
      'compiled step (#1): the progra'
    """
    ranks = [f"#{c.rank}" for c in _check(result).candidates if c.text in steps]
    if not ranks:
        return None
    kind = "tpu" if result.request.cluster.device.ici_scope == "slice" else "gpu"
    how = ("each op at the matmul efficiency fitted on 5 recorded H200 steps (8 steps held out: 1.01-1.11x "
           "measured)" if kind == "gpu" else "each op at a flat efficiency, not fitted on TPU steps")
    return (f"compiled step ({', '.join(ranks)}): the program XLA compiled, simulated op by op in its schedule "
            f"({how}; memory-bound ops at 85% of HBM), each collective from its start to the done that waits "
            "for it on the link its devices cross; an estimate of the compiled program, not a measured step.")


def compiled_step_text(step: CompiledStep, estimate: float | None) -> str:
    """The chosen mesh's step as the summaries say it, compiled schedule first, the estimate beside it.

    Example:
      >>> compiled_step_text(CompiledStep(5.8, 5.6, 0.2), 4.82)
      '5.80 s (compiled schedule: compute 5.60 s + waiting 200.0 ms; the estimate 4.82 s)'
    """
    floor = "" if step.xla_floor_s is None else f"; XLA's floor {seconds(step.xla_floor_s)}"
    est = "" if estimate is None else f"; the estimate {seconds(estimate)}"
    return (f"{seconds(step.step_s)} (compiled schedule: compute {seconds(step.compute_s)} + waiting "
            f"{seconds(step.exposed_s)}{floor}{est})")


def chosen_mesh(result: SearchResult, compiled: Mapping[str, tuple[int, str]] | None = None
                ) -> tuple[MeshCandidate, tuple[MeshCandidate, ...]]:
    """``(the mesh a reader should build, the better-ranked ones the compiler put over the budget)``.

    The compiler decides: a ranked mesh whose compiled peak is over the budget is not chosen, the next one is;
    with every ranked mesh over, the best ranked stays chosen (and the list says so).

    Example:
      >>> from meshplan.pure import search_meshes
      >>> result = search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2)
      >>> first, second = result.candidates
      >>> chosen_mesh(result, {first.text: (2**40, "XLA:GPU")}) == (second, (first,))
      True
    """
    done = dict(compiled or {})
    over = tuple(c for c in _check(result).candidates if c.text in done and done[c.text][0] > c.memory.budget)
    return next((c for c in result.candidates if c not in over), result.best), over


def create_mesh_call(cand: MeshCandidate, *, width: int = 1000) -> tuple[str, ...]:
    """The ``meshplan.create_mesh(...)`` call that builds ``cand``, broken into lines of at most ``width``
    characters where it is longer (still valid Python).

    Example:
      >>> from meshplan.pure import search_meshes
      >>> best = search_meshes("llama3-8b", "2x8xH100", fixed={"dp": 2, "tp": 8}, top_k=1).best
      >>> for line in create_mesh_call(best, width=90):
      ...     print(line)
      meshplan.create_mesh(axis_dims=(2, 1, 1, 8), axis_names=('dp', 'fsdp', 'sp', 'tp'),
                           dcn_mesh_dims=(2, 1, 1, 1))
    """
    head = "meshplan.create_mesh("
    args = [f"axis_dims={cand.axis_sizes}", f"axis_names={cand.axis_names}", f"dcn_mesh_dims={cand.dcn_shape})"]
    lines = [head + ", ".join(args)]
    if len(lines[0]) <= width:
        return tuple(lines)
    lines = [head + args[0]]
    for arg in args[1:]:
        if len(lines[-1]) + 2 + len(arg) <= width:
            lines[-1] += ", " + arg
        else:
            lines[-1] += ","
            lines.append(" " * len(head) + arg)
    return tuple(lines)


def maxtext_flags(cand: MeshCandidate) -> str:
    """MaxText's command-line overrides for ``cand``'s mesh: every ``*_parallelism`` that is not 1, plus the
    two MaxText infers when left at its default ``-1``.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> maxtext_flags(search_meshes("llama3-8b", "2x8xH100", fixed={"dp": 2, "tp": 8}, top_k=1).best)
      'ici_fsdp_parallelism=1 ici_tensor_parallelism=8 dcn_data_parallelism=2'
    """
    settings = maxtext_settings(cand)
    return " ".join(f"{k}={v}" for k, v in settings.items() if v != 1 or k in _MAXTEXT_INFERRED)
