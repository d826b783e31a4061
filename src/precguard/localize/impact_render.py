"""The error budget in the terminal: findings ranked by impact, remedies, device switches.

compare --target and check --verify print it after their own report
(docs/impact.md); the HTML pages show the same in ``report/comparison.py``.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from precguard.compare.impact_report import ErrorBudget, RemedyCheck, judge_remedy
from precguard.compare.render import format_number
from precguard.text import shown


def render_budget(budget: ErrorBudget, console: Console) -> None:
    """Print the error budget: findings ranked by impact, their remedies, the device switches."""
    if budget.measured == "recordings":
        console.print(Text(f"impact: {shown(budget.note, 4000)}", style="dim"))
        return
    if budget.output_error is None:
        console.print(Text(f"impact: {budget.note or 'nothing measured'}", style="dim"))
        return
    console.print(
        Text.assemble(
            ("impact", "bold"),
            f": output error {budget.output_error:.3g} ({budget.metric} of the logits), "
            f"{shown(budget.target or '?')} re-run on {shown(budget.device or '?')} "
            f"({budget.dtype}) against {budget.reference} ({budget.reference_dtype})"
            + (
                f"; in the recordings {budget.recorded_output_error:.3g}"
                if budget.recorded_output_error is not None
                else ""
            ),
        ),
    )  # wrapped at the terminal's width by rich, never cut (issue 39)
    table = Table(title_justify="left")
    for col in ("#", "module", "found by", "with it at reference", "share"):
        table.add_column(col, overflow="fold")
    for rank, impact in enumerate(budget.impacts, 1):
        table.add_row(
            str(rank),
            shown(impact.module, markup=True),
            ", ".join(impact.found_by),
            format_number(impact.after) if impact.after is not None else "-",
            f"{impact.share:.0%}" if impact.share is not None else shown(impact.note, markup=True),
        )
    console.print(table)
    if budget.together is not None and len(budget.impacts) > 1:
        verdict = judge_remedy(budget.output_error, budget.together, budget.floor)
        console.print(f"  all of them at reference ({verdict}): {budget.together:.3g}")
    # the floor is a correct run's error, its own line: never counted as unexplained
    if budget.floor is None:
        console.print("  floor of a correct run: unknown")
    else:
        share = f" ({budget.floor_share:.0%} of the output error)" if budget.floor_share else ""
        within = "; the output is within it" if budget.within_floor else ""
        console.print(f"  floor of a correct run: {budget.floor:.3g}{share}{within}")
    if budget.unexplained is not None and budget.unexplained > 0:
        console.print(f"  no single module nor the floor explains {budget.unexplained:.0%}")
    for impact in budget.impacts:
        for check in impact.remedies:
            _print_remedy(check, console)
    for check in budget.switches:
        _print_remedy(check, console)
    if budget.note:
        console.print(Text(f"  note: {shown(budget.note, 4000)}", style="dim"))


_VERDICT_STYLE = {
    "verified": "bold green",
    "not needed": "green",
    "partial": "yellow",
    "did not help": "red",
    "not run": "dim",
}


def _print_remedy(check: RemedyCheck, console: Console) -> None:
    console.print(
        Text("  " + shown(check.describe(), 4000), style=_VERDICT_STYLE[check.verdict]),
    )


__all__ = ["render_budget"]
