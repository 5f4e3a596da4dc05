"""``meshplan serve`` in a terminal: the summary's facts, the ranked layouts (no wider than the console: columns
of lower priority are dropped, never wrapped), the notes, the compiled rows and the command. Every figure comes
from :mod:`meshplan.pure.report._serve_summary`, so the terminal, markdown and HTML say the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.cli._fit_table import fact_grid, fitted_table
from meshplan.pure.report import SERVE_COLUMNS, serve_header, serve_headline, serve_notes, serve_rows

__all__ = ["render_checks", "render_serve", "serve_table"]


def serve_table(plan: Any, width: int, compiled: Mapping[str, tuple[int, str]] | None = None,
                top: int | None = None) -> Any:
    """The ranked layouts as a rich table no wider than ``width`` (layout, memory, sequences, step, tokens/s and
    verdict always stay)."""
    return fitted_table(serve_rows(plan, compiled)[:top], SERVE_COLUMNS, width)


def render_serve(plan: Any, console: Any, *, compiled: Mapping[str, tuple[int, str]] | None = None,
                 checks: Sequence[Any] = (), verify_note: str = "", top: int | None = None) -> None:
    """Print a serving plan, summary first."""
    console.print(f"[bold]{serve_headline(plan)}[/bold]")
    console.print(fact_grid(serve_header(plan)), crop=False)
    fitting = sum(r.meets_limits for r in plan.rows)
    shown = len(plan.rows) if top is None else min(top, len(plan.rows))
    console.print(f"\n[bold]Ranked layouts[/bold]: {fitting} of {len(plan.rows)} fit and meet the limits, by tokens/s "
                  f"per device" + (f"; top {shown}" if shown < len(plan.rows) else ""))
    console.print(serve_table(plan, console.width, compiled, top))
    for check in checks:
        console.print(f"compiled {check.mesh} ({check.kind}, {check.layers} layers, {check.target}): {check.summary()}",
                      markup=False)
    if checks:
        console.print(f"exact: XLA's compiled peak of meshplan's reference decode step, {checks[0].compiler}",
                      markup=False)
    if verify_note:
        console.print(f"memory: {verify_note}", markup=False)
    for note in serve_notes(plan):
        console.print(note, markup=False)
    best = plan.best
    if best is not None:
        console.print(f"\n[bold]Serve {best.mesh}[/bold] ({best.layout.replicas} "
                      f"{'replica' if best.layout.replicas == 1 else 'replicas'}; the command for one):")
        for line in best.command:
            console.print(line, markup=False, soft_wrap=True)


def render_checks(rows: Sequence[Any], console: Any, *, title: str) -> None:
    """``meshplan check --serve``'s table: XLA's argument / temp / peak against the planner's count."""
    from rich.table import Table

    from meshplan.pure._format import fmt_bytes

    table = Table(title=title)
    for col in ("step", "target", "plan: weights+KV+inputs", "XLA argument", "XLA temp", "XLA peak", "budget",
                "verdict", "compile"):
        table.add_column(col, justify="left" if col in ("step", "target", "verdict") else "right")
    for r in rows:
        b = (lambda n: "-" if n is None else fmt_bytes(n))
        verdict = r.error or ("arguments = plan" if r.arguments_match else
                              f"arguments {r.argument_bytes - r.expected_argument_bytes:+,} B vs plan") + (
            f"; {r.status}" if r.status != "exact" else "")
        table.add_row(r.kind, r.target or "-", fmt_bytes(r.expected_argument_bytes), b(r.argument_bytes),
                      b(r.temp_bytes), b(r.peak_bytes), fmt_bytes(r.budget_bytes), verdict, f"{r.seconds:.1f} s")
    console.print(table)
    if rows and rows[0].compiler:
        console.print(f"XLA: {rows[0].compiler}; plan: meshplan.pure.serve's weights, KV cache and step inputs per "
                      "device.", markup=False)
