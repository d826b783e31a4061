"""``precguard replay``: one module alone on the golden's recorded inputs."""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app
from precguard.cli._out import write_json as _write


@app.command()
def replay(
    golden: Path = typer.Argument(..., help="Golden recording with full tensors of the module."),
    module: str = typer.Option(..., "--module", "-m", help="Qualified module name to replay."),
    target: str | None = typer.Option(
        None,
        "--target",
        "-t",
        help="Target to build the model from (required: a recording never chooses the code "
        "that runs; the error suggests the one the golden names).",
    ),
    device: str = typer.Option("cpu", "--device", "-d", help="Device to run the module on."),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="dtype to run in (default: the one `precguard record` uses on DEVICE).",
    ),
    call: int = typer.Option(0, "--call", help="Which call of the module (0-based)."),
    step: int = typer.Option(0, "--step", help="Which step's inputs to replay."),
    rank: int = typer.Option(0, "--rank", help="Which rank's inputs to replay."),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="Judge by this fixed tolerance profile instead of the error a correct module "
        "explains at the replay's precision.",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write the result as JSON."),
) -> None:
    """Run one module alone on DEVICE with the golden's recorded inputs: its local error.

    The golden must hold full tensors of the module's inputs and outputs
    (record it with --tensors 'NAME' or --tensors '*'). Exit 0 when the module's
    own output is within tolerance, 1 when it is not, 2 on unusable input.
    """
    from rich.console import Console

    from precguard.localize.replay import render_replay, replay_module
    from precguard.target_run import Side

    result = replay_module(
        golden,
        module,
        # no --target: replay_module says which target the golden names
        target=Side(target, device, dtype) if target else None,
        call=call,
        step=step,
        rank=rank,
        profile=profile,
    )
    if json_out is not None:
        _write(json_out, result.model_dump_json(indent=2))
    render_replay(result, Console())
    if result.verdict != "match":
        from precguard.errors import ExitCode

        raise typer.Exit(ExitCode.FAIL)
