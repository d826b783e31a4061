"""``precguard op-check``: ops and modules on the device vs fp64 over sequence lengths."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from precguard.cli._app import app, show_progress
from precguard.cli._out import print_json, wrote

_HELP = (
    "Sweep the ops that cause most cross-chip trouble on DEVICE against an fp64 oracle.\n\n"
    "Built-in ops: rope, rmsnorm, layernorm, softmax, attention (SDPA), matmul, "
    "cross_entropy, each at every --seq-lens length, on the device in its dtype vs the same "
    "inputs in fp64. With --target T --module NAME: that module of the model, on inputs "
    "captured from a real forward at each length; a rotary module is swept over positions up "
    "to the model's maximum length. Reports max/mean absolute, relative and ULP error per "
    "point and how the error grows with length (log-log slope; verdict flat or grows).\n\n"
    "Exit codes: 0 every point within tolerance, 1 a point fails (or is not finite), 2 "
    "unusable input."
)


@app.command("op-check", help=_HELP)
def op_check(
    device: str = typer.Option("cpu", "--device", "-d", help="Device under test: emu:bf16, npu…"),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="Activation dtype on the device (default: float32, or the storage dtype of a "
        "mixed-precision emu: profile).",
    ),
    ops: str | None = typer.Option(
        None, "--ops", help="Comma-separated built-in ops (default: all)."
    ),
    seq_lens: str | None = typer.Option(
        None,
        "--seq-lens",
        help="Comma-separated sequence lengths (default: 128,1024,4096; for a rotary module "
        "x4 steps up to the model's maximum length).",
    ),
    target: str | None = typer.Option(
        None, "--target", "-t", help="Model whose --module to sweep: built-in or file.py[:fn]."
    ),
    module: str | None = typer.Option(
        None, "--module", "-m", help="Qualified name of the module to sweep (with --target)."
    ),
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        help="Largest max_rel_err that passes (default: 8 eps of the compute dtype + "
        "sqrt(n) fp32 roundoffs; rotary: the angle allowance).",
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="With --target and --module, when the module fails: re-run the model with it "
        "at reference precision and with each mechanical remedy applied; its share of the "
        "output error and each remedy verified or not (docs/impact.md).",
    ),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the results as JSON to this file ('-' for stdout)."
    ),
    plot_out: Path | None = typer.Option(
        None, "--plot", help="Write a log-log plot of error vs sequence length (PNG)."
    ),
) -> None:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from precguard.opcheck.render import plot, render_table
    from precguard.opcheck.sweep import OpPoint
    from precguard.opcheck.sweep import op_check as run_op_check
    from precguard.target_run import Side

    if verify and (target is None or module is None):
        from precguard.errors import UsageError

        # refused before the sweep runs: --verify re-runs the model the module belongs to
        raise UsageError(
            "op-check --verify needs --target and --module (it re-runs that module's model)"
        )
    to_stdout = json_out is not None and str(json_out) == "-"
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not show_progress(),
    )

    with progress:
        task = progress.add_task(f"op-check on {device}", total=None)

        def seen(point: OpPoint) -> None:
            progress.update(task, description=f"{point.op or point.module} at {point.seq_len}")

        # a module's sweep runs one side of a target; the built-in ops only need the device
        side = Side(target, device, dtype) if target else None
        result = run_op_check(
            side=side,
            device=None if side else device,
            dtype=None if side else dtype,
            ops=[o.strip() for o in ops.split(",") if o.strip()] if ops else None,
            seq_lens=seq_lens,
            module=module,
            tolerance=tolerance,
            on_point=seen,
        )
    stream = sys.stderr if to_stdout else sys.stdout
    # a pipe or a file gets the whole table, not one cut to 80 columns
    width = None if stream.isatty() else 120
    console = Console(stderr=to_stdout, highlight=False, width=width)
    render_table(result, console)
    budget = None
    if verify and target is not None and module is not None and result.exit_code:
        from precguard.localize.impact_render import render_budget
        from precguard.localize.verify import verify as verify_opcheck

        assert side is not None  # --target given: the sweep's Side, re-run against the CPU
        budget = verify_opcheck(result, side, golden=Side(target, "cpu", "float32"))
        render_budget(budget, console)
    if json_out is not None:
        payload = result.model_dump_json(indent=2, exclude_none=True)
        if budget is not None:
            import json

            merged = json.loads(payload)
            merged["impact"] = json.loads(budget.model_dump_json())
            payload = json.dumps(merged, indent=2)
        if to_stdout:
            print_json(payload)
        else:
            from precguard.cli._out import write_json as _write

            _write(json_out, payload)
    if plot_out is not None:
        plot(result, plot_out)
        wrote(plot_out)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
