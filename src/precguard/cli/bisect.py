"""``precguard bisect``: which modules must run at reference precision to fix the output."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from precguard.cli._app import app, show_progress
from precguard.cli._out import print_json

_HELP = (
    "Find the smallest set of modules that must run at reference precision on DEVICE.\n\n"
    "The target's model runs on the reference (default: the CPU in float32) for the trusted "
    "output, then on DEVICE; each probe reruns the device forward with some modules run at "
    "reference precision instead (outside the emu: emulation, on the reference device) and "
    "measures the error of each floating output (a loss and its logits alike; the worst "
    "decides). A binary search over the module tree (blocks first, "
    "then their children) and a last linear pass find a minimal set in O(k log L) probes for "
    "k culprits among L blocks. No golden recording is needed.\n\n"
    "Exit codes: 0 the device output is already within the threshold, 1 culprits found, 2 "
    "unusable input."
)


@app.command(help=_HELP)
def bisect(
    target: str | None = typer.Option(
        None,
        "--target",
        "-t",
        help="What to bisect (required): a built-in name, path/file.py[:fn] or pkg.mod[:fn].",
        show_default=False,
    ),
    device: str = typer.Option(..., "--device", "-d", help="Device under test: emu:fp16, npu…"),
    reference: str = typer.Option("cpu", "--reference", help="Trusted reference device."),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="Model dtype on the device (default: float32, or the storage dtype of a "
        "mixed-precision emu: profile).",
    ),
    reference_dtype: str = typer.Option(
        "float32", "--reference-dtype", help="Model dtype on the reference."
    ),
    metric: str = typer.Option(
        "rel_l2",
        "--metric",
        help="Output error: rel_l2, max_abs, mean_abs, max_rel (max|e|/max|ref|), cosine (1-cos).",
    ),
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        help="Largest acceptable output error [default for rel_l2: 16 x eps of the device's "
        "compute dtype].",
    ),
    step: int = typer.Option(0, "--step", help="Which of the target's batches to run."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the result as JSON to this file ('-' for stdout)."
    ),
) -> None:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from precguard.localize.bisect import Probe
    from precguard.localize.bisect import bisect as run_bisect
    from precguard.target_run import Side

    if target is None:
        from precguard.errors import UsageError
        from precguard.target import BUILTIN_TARGETS

        # no default, as record: a bisect of the wrong model answers a question nobody asked
        raise UsageError(
            "bisect needs --target: a built-in name ("
            + ", ".join(BUILTIN_TARGETS)
            + "), path/file.py[:function] or package.module[:function]"
        )

    to_stdout = json_out is not None and str(json_out) == "-"
    out = Console(stderr=to_stdout, highlight=False, soft_wrap=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed} probe(s)"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not show_progress(),
    )

    def show(probe: Probe) -> None:
        names = probe.at_reference
        which = "none (all on the device)" if not names else _short(names)
        verdict = "[green]pass[/]" if probe.passed else "[red]fail[/]"
        out.print(
            f"probe {probe.index:>3}  {_fmt(probe.error):>10}  {verdict}  at reference: {which}"
        )
        progress.update(task, completed=probe.index + 1)

    with progress:
        task = progress.add_task(f"bisecting {target} on {device}", total=None)
        result = run_bisect(
            Side(target, device, dtype),
            golden=Side(target, reference, reference_dtype),
            metric=metric,
            threshold=threshold,
            step=step,
            on_probe=show,
        )
    out.print(
        f"\n{result.metric} error of the output on {device}: {_fmt(result.baseline_error)} "
        f"(threshold {_fmt(result.threshold)}); {result.probe_count} probe(s) over "
        f"{result.units} top-level module(s)"
    )
    if len(result.output_errors) > 1:
        # every floating output is judged: say which one decided
        for name, err in result.output_errors.items():
            limit = result.thresholds.get(name, result.threshold)
            mark = "[green]pass[/]" if err <= limit else "[red]fail[/]"
            out.print(f"  {name:<24} {_fmt(err):>10}  {mark}  (threshold {_fmt(limit)})")
    if result.culprits:
        out.print(
            f"[bold red]{len(result.culprits)} module(s) must run at reference precision[/] "
            f"(error then {_fmt(result.fixed_error)}):"
        )
        for name in result.culprits:
            out.print(f"  {name}")
    elif result.overflow is None:
        out.print("[green]the device output is already within the threshold: no culprits[/]")
    from precguard.text import shown

    if result.overflow is not None:
        out.print(f"[bold red]overflow:[/] {shown(result.overflow.describe(), 600, markup=True)}")
    if result.note:
        out.print(f"[yellow]note:[/] {shown(result.note, 400, markup=True)}")
    if json_out is not None:
        payload = result.model_dump_json(indent=2)
        if to_stdout:
            print_json(payload)
        else:
            from precguard.cli._out import write_json as _write

            _write(json_out, payload)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _fmt(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else str(value)


def _short(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")
