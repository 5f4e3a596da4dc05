"""What verification adds to a plan, as sentences every renderer shows: the terminal, markdown and HTML.

The ranked table marks compiled peaks exact (:func:`~meshplan.pure.report._summary.ranked_rows`); these
lines say the rest: the meshes the compiler removed, the rows it could not verify and why (once per shared
reason), how to get exact figures where no compiler is installed, why verification stopped early, and for
the pipeline layouts the compiled peak of each layout beside its estimate, or why none was compiled.

Example:
  >>> from meshplan.pure.search import search_meshes
  >>> from meshplan.pure.report import PlanReport
  >>> from meshplan.pure.verify import PlanVerification
  >>> result = search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=2)
  >>> none = PlanVerification((), (), "", "estimates only: the jax CUDA plugin is not installed.", 0.0)
  >>> verification_lines(PlanReport(result, verification=none))
  ('memory: estimates only: the jax CUDA plugin is not installed.',)
"""

from __future__ import annotations

from meshplan.pure._format import fmt_bytes
from meshplan.pure.report._report import PlanReport
from meshplan.pure.verify import ADMITTED, PlanVerification, VerifyRow

__all__ = ["lowering_line", "pipeline_verification_lines", "verification_lines"]


def verification_lines(report: PlanReport) -> tuple[str, ...]:
    """The ranked meshes' verification beyond the table's exact cells, one sentence a line (``()``: none)."""
    checked = report.verification
    if checked is None:
        return ()
    if checked.note and not checked.compiler:  # no compiler: one line says how to get exact figures
        return (f"memory: {checked.note}",)
    lines = []
    ranked = [r for r in checked.removed if r.rank is not None]
    if ranked:
        lines.append("removed (compiled peak over the budget): " + ", ".join(f"#{r.rank} {r.mesh}" for r in ranked))
    # Meshes the estimate rejected with a range reaching the budget, compiled before being called over it.
    near = [r for r in checked.removed if r.rank is None]
    if near:
        lines.append("compiled before calling them over the budget (their range reached it): "
                     + ", ".join(f"{r.mesh} {fmt_bytes(r.peak_bytes or 0)}" for r in near) + ": over, as estimated")
    admitted = [f"#{c.rank} {c.text}" for c in report.result.candidates if c.verdict == ADMITTED]
    if admitted:
        lines.append(f"admitted by the compiler (over the budget by the estimate, within it as compiled): "
                     f"{', '.join(admitted)}")
    # Rows that share a reason (a dropless plan: every row) say it once, after their ranks and meshes.
    why: dict[str, list[str]] = {}
    for r in checked.rows:
        if r.status == "not verified":
            why.setdefault(r.error.removeprefix("not verified: "), []).append(f"#{r.rank} {r.mesh}")
    lines += [f"{', '.join(rows)}: not verified ({reason})" for reason, rows in why.items()]
    if checked.note:
        lines.append(f"verification: {checked.note}")
    notes = sorted({r.step_note for r in (*checked.rows, *checked.removed) if r.step_note})
    lines += [f"compiled step: {note}" for note in notes]
    lowering = lowering_line(report)
    return (*lines, *((lowering,) if lowering else ()))


def lowering_line(report: PlanReport) -> str:
    """Where the plan was priced for one compiler and compiled on another (XLA:CPU for a GPU or TPU plan), the
    sentence that says the ratio measures the lowering too; ``""`` elsewhere."""
    checked = report.verification
    recipe = report.result.request.recipe
    if checked is None or not checked.compiler.startswith("XLA:CPU") or recipe.compiler == "cpu":
        return ""
    # The plan priced the cluster's compiler; XLA:CPU lowers the same step differently (fp32 matmul operands,
    # whole-gradient all-reduces), so the ratio measures the lowering as well as the model.
    return (f"analytic: priced for XLA:{recipe.compiler.upper()}, the plan's cluster, and compiled on XLA:CPU, "
            "which lowers the step differently: `meshplan check --target cpu` prices XLA:CPU's lowering.")


def _pipeline_row(r: VerifyRow) -> str:
    est = "-" if r.analytic_bytes is None else fmt_bytes(r.analytic_bytes)
    head = f"pipeline {r.mesh} ({r.schedule})"
    if r.status in ("exact", "over budget") and r.peak_bytes is not None:
        run = "" if r.run_high_bytes is None else f"; a run on the GPU up to {fmt_bytes(r.run_high_bytes)}"
        over = f"{run}; over the {fmt_bytes(r.budget_bytes)} budget" if r.fits is False else run
        # Name the compiled schedule only where it is not the row's own (a Megatron row compiled as circular).
        what = f" (compiled: {r.compiled_schedule}){over}; {r.note}" if r.note else over
        # The step as XLA scheduled the pipelined program: its bubble included, as the compiled loop runs it.
        step = "" if r.compiled_step is None else f"; step {r.compiled_step.describe()} as compiled"
        return (f"{head}: {r.status}: compiled peak {fmt_bytes(r.peak_bytes)} against the estimate {est}{what}"
                f"{step}")
    return f"{head}: {r.summary()}"


def pipeline_verification_lines(report: PlanReport) -> tuple[str, ...]:
    """The compiled pipeline layouts, one line each with XLA's peak beside the estimate, the compiler, and
    why none was compiled where that is what happened (``()``: nothing was asked)."""
    checked: PlanVerification | None = report.pipeline_verification
    if checked is None:
        return (f"pipeline memory: {report.pipeline_note}",) if report.pipeline_note and report.pipelines is not None \
            else ()
    if checked.note and not checked.compiler:  # no compiler: one line says how to get exact figures
        return (f"pipeline memory: {checked.note}",)
    layouts = "layouts" if len(checked.rows) > 1 else "layout"
    lines = [f"Compiled: the best circular {layouts} (the schedule meshplan's pipelined step and MaxText run; "
             "Megatron's 1F1B has no JAX step to compile):"]
    lines += [_pipeline_row(r) for r in checked.rows]
    if checked.compiler and any(r.peak_bytes is not None for r in checked.rows):
        lines.append(f"pipeline peaks: the pipelined step compiled by {checked.compiler}.")
    if checked.note:
        lines.append(f"pipeline note: {checked.note}")
    return tuple(lines)
