"""op-check results as a terminal table and as a log-log plot of error vs sequence length."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from precguard.errors import UsageError
from precguard.opcheck.sweep import OpCheckResult


def _num(value: float) -> str:
    return f"{value:.2e}" if math.isfinite(value) else str(value)


def render_table(result: OpCheckResult, console: Console) -> None:
    """One row per op (or module) and length, then the growth verdict of each."""
    table = Table(
        title=f"op-check on {result.device} ({result.compute_dtype}) vs fp64",
        title_justify="left",
    )
    for column in ("op", "seq_len", "max_abs", "mean_abs", "max_rel", "ulp", "allowed", "status"):
        table.add_column(column, justify="left" if column in ("op", "status") else "right")
    for p in result.results:
        colour = "green" if p.status == "pass" else "red"
        table.add_row(
            p.label,
            str(p.seq_len),
            _num(p.max_abs_err),
            _num(p.mean_abs_err),
            _num(p.max_rel_err),
            f"{p.ulp_err:.1f}" if math.isfinite(p.ulp_err) else "inf",
            _num(p.allowed),
            f"[{colour}]{p.status}[/]",
        )
    console.print(table)
    for name, g in result.growth.items():
        if g.verdict in ("flat", "grows"):
            colour = "yellow" if g.verdict == "grows" else "green"
            console.print(
                f"{name:16} [{colour}]{g.verdict}[/]: mean relative error x{g.factor:.3g} from "
                f"the shortest to the longest length (log-log slope {g.slope:.2f})"
            )
        else:
            console.print(f"{name:16} {g.verdict}")
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")


def plot(result: OpCheckResult, path: Path) -> Path:
    """Write a log-log plot of the mean relative error vs sequence length to ``path`` (PNG)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise UsageError("--plot needs matplotlib (pip install matplotlib)") from exc
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for name in result.growth:
            points = [p for p in result.results if p.label == name]
            xs = [p.seq_len for p in points if math.isfinite(p.mean_rel_err)]
            ys = [max(p.mean_rel_err, 1e-30) for p in points if math.isfinite(p.mean_rel_err)]
            if xs:
                ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("mean |device - fp64| / mean |fp64|")
        ax.set_title(f"op-check on {result.device} ({result.compute_dtype})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
        from precguard.text import plain_text

        plain_text(fig)  # op and module names are the user's text, never mathtext
        from precguard.dump.atomic import atomic_output

        with atomic_output(path, binary=True, what="--plot") as fh:  # whole or not at all
            fig.savefig(fh, format="png", dpi=100)
    finally:
        plt.close(fig)
    return path
