"""``meshplan plan --detail``: everything the summary leaves out, for the reader who wants the workings.

The assumptions in full (the recipe, where the activation coefficients come from, the recorded spread),
the meshes over the budget, every reason meshes were left out, and for the chosen mesh: each axis's
ICI / DCN split, the batch and activation specs, the memory by part, the step time's terms, the
collective table and the parameter groups; and the verification table (every compiled row, the removed
ones, the note). Every figure comes from the :class:`~meshplan.pure.SearchResult` and its
:class:`~meshplan.pure.verify.PlanVerification`; nothing here decides anything.
"""

from __future__ import annotations

from typing import Any

from meshplan.pure._format import fmt_bytes
from meshplan.pure.cluster import Cluster
from meshplan.pure.cost import Spread, describe_spread, peak_bounds
from meshplan.pure.cost._step_memory import CALIBRATIONS, calibration_key
from meshplan.pure.report._summary import compute_rate, seconds, spread_of
from meshplan.pure.search import MeshCandidate, SearchResult
from meshplan.pure.verify import PlanVerification

__all__ = ["render_detail", "render_verification"]


def render_detail(result: SearchResult, console: Any) -> None:
    """Print the ``--detail`` sections of a plan after its summary."""
    from rich.table import Table

    req = result.request
    moments = req.optimizer_copies - int(req.recipe.master_weights)
    opt = f"{moments} {req.optimizer_dtype} optimizer copies" + (" + fp32 master weights"
                                                                  if req.recipe.master_weights else "")
    grads = req.param_dtype if req.grad_dtype == "param" else req.grad_dtype
    console.print("\n[bold]Assumptions[/bold]")
    _facts(console, (
        ("step", (f"batch {req.batch} x seq {req.seq}; {opt}; grads {grads}; axes {', '.join(req.axes)}; "
                 f"rule {req.rule}")),
        ("priced", (f"{req.recipe.describe()}; params, grads and optimizer exact, activations calibrated against "
                   f"{CALIBRATIONS[calibration_key(req.recipe)].source} (set with --remat, --attention, "
                   "--optimizer, --weight-dtype, --micro-batches, --vocab-tiles, --matmul-dtype)")),
        ("spread", describe_spread(req.recipe)),
    ))
    console.print("\n[bold]Verdicts[/bold]")
    _facts(console, tuple((f"{c.rank}. {c.text}", c.verdict) for c in result.candidates))
    found = spread_of(result)
    spread = None if found is None else found[1]
    if result.rejected:
        over = Table(title="Leanest meshes over the memory budget")
        for col in ("mesh", "memory/device", "verdict"):
            over.add_column(col)
        for cand in result.rejected:
            over.add_row(cand.text, fmt_bytes(cand.memory.total), cand.verdict)
        console.print(over)
    if result.rejections:
        console.print("[bold]Left out[/bold]:")
        for r in result.rejections:
            what = "mesh" if r.count == 1 else "meshes"
            console.print(f"  - {r.example} [dim]({r.count} {what}, {r.kind})[/dim]")
    _chosen_detail(result.best, req.cluster, console, spread, req.recipe.matmul_dtype)


def _facts(console: Any, rows: tuple[tuple[str, str], ...]) -> None:
    """Label and text in two columns: a long text wraps under itself, not under the label."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for label, text in rows:
        grid.add_row(f"  {label}", text)
    console.print(grid)


def _chosen_detail(best: MeshCandidate, cluster: Cluster, console: Any, spread: Spread | None,
                   matmul_dtype: str = "bfloat16") -> None:
    from rich.table import Table

    unit = cluster.ici_domain_name
    console.print(f"\n[bold]Chosen mesh in detail[/bold]: {best.text}")
    for name, size, i, d in zip(best.axis_names, best.axis_sizes, best.ici_shape, best.dcn_shape, strict=True):
        where = (f"inside one {unit}" if d == 1 else f"across {d} {unit}s" if i == 1
                 else f"{i} per {unit} x {d} {unit}s")
        console.print(f"  {name:<4} = {size:<5} ICI {i} x DCN {d}  ({where})")
    if best.activations is not None:  # the splits the activation memory assumed: the step applies them
        console.print("  batch and activation specs the memory assumes (best.training_layout; "
                      "apply with jax.lax.with_sharding_constraint):")
        for t in best.activations.tensors:
            console.print(f"    {t.name:<9} {t.shape!s:<20} {t.spec}")
    m = best.memory
    mem = Table(title="Memory per device (fullest device)")
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    grads = "grads" if m.grads_live else "grads (not yet live at the peak)"
    peak = f"peak, {m.phase} phase" if m.phase else "total"
    for label, value in (("params (exact)", m.params), (f"{grads} (exact)", m.grads),
                         ("optimizer (exact)", m.optimizer), (f"{m.label('activations')} (calibrated)", m.activations),
                         (peak, m.total)):
        mem.add_row(label, fmt_bytes(value))
    if spread is not None:
        low, high = peak_bounds(m, spread)
        mem.add_row(f"peak at the recorded spread ({spread.low:.2f}-{spread.high:.2f}x the calibrated part)",
                    f"{fmt_bytes(low)} - {fmt_bytes(high)}")
    mem.add_row("budget", fmt_bytes(m.budget))
    console.print(mem)
    if best.step is not None and cluster.device.peak_bf16_flops is None:
        console.print(f"Predicted step: {seconds(best.step.step_s)} of exposed communication; compute not priced "
                      f"(no peak FLOP/s for {cluster.device.name!r}: DeviceSpec(peak_bf16_flops=...))")
    elif best.step is not None:
        st = best.step
        rate = compute_rate(st.efficiency, matmul_dtype)
        console.print(f"Predicted step: {seconds(st.step_s)} = compute {seconds(st.compute_s)} "
                      f"({st.flops:.3g} FLOPs/device{rate}) + exposed communication "
                      f"{seconds(st.exposed_s)}; {st.tokens_per_s:,.0f} tokens/s/device, MFU {st.mfu:.1%} "
                      "(set with --efficiency; --rank comm orders by communication alone)")
    comm = Table(title=f"Step communication (alpha-beta estimate): {seconds(best.step_comm_s)}")
    cols = ("collective", "axes", "link", "bytes/call", "calls", "time", "hidden", "exposed")
    for col in cols:
        comm.add_column(col, justify="left" if col in cols[:3] else "right")
    for term in best.comm:
        comm.add_row(term.what, "+".join(term.axes), term.link, fmt_bytes(term.nbytes), str(term.calls),
                     seconds(term.seconds), "-" if term.hidden is None else seconds(term.hidden),
                     "-" if term.exposed is None else seconds(term.exposed))
    console.print(comm)
    groups = Table(title="Parameter groups")
    for col in ("pattern", "shape", "count", "spec", "reason"):
        groups.add_column(col)
    for g in best.groups:
        spec = "P(" + ", ".join(repr(e) for e in g.spec) + ")"
        groups.add_row(g.pattern, f"{g.shape} {g.dtype}", str(g.count), spec, g.reason)
    console.print(groups)


def render_verification(checked: PlanVerification, console: Any, *, title: str) -> None:
    """The verified rows (exact figures or estimates with their range), the removed ones, and the note.

    A minimal table: the plan's own rendering is :mod:`meshplan.cli._render`'s; these rows are data
    (:class:`~meshplan.VerifyRow`) that a richer renderer can take over.
    """
    from rich.table import Table

    if checked.note and not checked.compiler:  # no compiler: one line says how to get exact figures
        console.print(f"memory: {checked.note}", markup=False)
        return
    table = Table(title=title)
    for col in ("#", "mesh", "memory per device", "target", "compile"):
        table.add_column(col, justify="right" if col in ("#", "compile") else "left")
    for r in (*checked.rows, *checked.removed):
        seconds = "cached" if r.cached else f"{r.compile_seconds:.1f} s" if r.status != "estimate" else "-"
        table.add_row("" if r.rank is None else str(r.rank), r.mesh, r.summary(), r.target or "-", seconds)
    console.print(table)
    if checked.compiler:
        console.print(f"exact: peak per device from {checked.compiler}; estimate: the planner's figure and the "
                      "range its calibration's recorded spread gives.", markup=False)
    if checked.removed:
        console.print("removed (compiled peak over the budget): "
                      + ", ".join(f"#{r.rank} {r.mesh}" for r in checked.removed), markup=False)
    if checked.note:
        console.print(f"note: {checked.note}", markup=False)
