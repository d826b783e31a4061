"""Terminal rendering of a :class:`~precguard.ranks.report.RanksReport`."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from precguard.ranks.report import RanksReport


def render(report: RanksReport, console: Console) -> None:
    """Print the verdict first, then each finding on one line."""
    for warning in report.warnings:
        console.print(Text.assemble(("warning: ", "bold yellow"), warning))
    head = {
        "agree": Text("REPLICAS AGREE", style="bold green"),
        "disagree": Text("RANKS DISAGREE", style="bold red"),
        "inconclusive": Text("NOTHING COMPARED", style="bold yellow"),
    }[report.verdict]
    console.print(
        Text.assemble(
            head,
            f"  {report.run}: ranks {report.ranks}, {report.steps} step(s), "
            f"{report.compared} replica record(s) checked",
        )
    )
    d = report.first_disagreement
    if d is not None:
        console.print(
            Text.assemble(
                ("first disagreement: ", "bold"),
                f"{d.key} (step {d.step}): rank(s) {d.differing_ranks} differ within group "
                f"{d.group} ({d.level}: {d.detail})",
            )
        )
    n = report.first_nonfinite
    if n is not None:
        console.print(
            Text.assemble(
                ("first non-finite: ", "bold"),
                f"rank {n.rank} at {n.key} (step {n.step}; {n.nan} NaN, {n.inf} Inf)",
            )
        )
    s = report.spread
    if s is not None:
        console.print(
            Text.assemble(
                ("spread through: ", "bold"),
                f"{s.module} call {s.call} (step {s.step}, group {s.group}): input non-finite "
                f"on rank(s) {s.from_ranks}, output non-finite on rank(s) {s.to_ranks}",
            )
        )
    for o in report.order:
        style = "green" if o.verdict == "order_noise" else "bold red"
        console.print(
            Text.assemble(
                ("reduction order: ", "bold"),
                f"{o.module} call {o.call} step {o.step}: ",
                (o.verdict.replace("_", " "), style),
                f" (error {o.error:.3g}, order noise {o.order_noise:.3g} over {o.orders} "
                f"orders, {o.bound_ratio:.3g}x the rounding bound)",
            )
        )
    if report.incomplete_ranks:
        console.print(f"incomplete ranks: {report.incomplete_ranks}")
