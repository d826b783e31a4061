"""``precguard record``: run a target on a device and write a recording."""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app, show_progress


@app.command()
def record(
    target: str | None = typer.Option(
        None,
        "--target",
        "-t",
        help="What to record (required): a built-in name (tiny-llama), path/file.py[:fn] or "
        "pkg.mod[:fn].",
        show_default=False,
    ),
    device: str = typer.Option("cpu", "--device", "-d", help="cpu, cuda[:N], npu, emu:PROFILE…"),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="float32, bfloat16 or float16 [default: float32, or the storage dtype of a "
        "mixed-precision emu: profile].",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Recording directory to create."),
    steps: int = typer.Option(1, "--steps", "-n", help="Number of steps."),
    train: bool = typer.Option(False, "--train", help="Forward, backward and optimizer step."),
    tensors: list[str] = typer.Option(
        [], "--tensors", help="Save full tensors of modules matching this glob ('*' for all)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing recording."),
    level: str = typer.Option(
        "module",
        "--level",
        help="module, op (every torch op, under its module: docs/ops.md) or both.",
    ),
) -> None:
    """Record a target's per-layer statistics (and chosen tensors) on one device."""
    from rich.console import Console
    from rich.progress import Progress

    from precguard.runner import record_target
    from precguard.target_run import Side

    if target is None:
        from precguard.errors import UsageError
        from precguard.target import BUILTIN_TARGETS

        # no default: a recording of the wrong model compares as "different models"
        # much later; say what to pass now
        raise UsageError(
            "record needs --target: a built-in name ("
            + ", ".join(BUILTIN_TARGETS)
            + "), path/file.py[:function] or package.module[:function]"
        )

    if level not in ("module", "op", "both"):
        from precguard.errors import UsageError

        raise UsageError(f"--level: expected module, op or both, got {level!r}")
    save: bool | list[str] = True if tensors == ["*"] else list(tensors)
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not show_progress()) as bar:
        task = bar.add_task(f"recording {target} on {device}", total=steps)
        path = record_target(
            Side(target, device, dtype),
            out=out,
            steps=steps,
            train=train,
            tensors=save,
            overwrite=overwrite,
            on_step=lambda _s: bar.advance(task),
            **({"level": level} if level != "module" else {}),
        )
    from precguard.dump.reader import load_run

    used = load_run(path).manifest.dtype
    typer.echo(f"recorded {steps} step(s) of {target} on {device} ({used}) -> {path}")
