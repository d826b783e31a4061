"""``precguard import-msprobe``: turn an msprobe dump into a precguard recording."""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app
from precguard.text import shown


@app.command("import-msprobe")
def import_msprobe_cmd(
    src: Path = typer.Argument(
        ..., help="msprobe dump: its dump_path, one step{N} folder, or one rank folder."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Recording directory to write."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an existing precguard recording at --out."
    ),
) -> None:
    """Convert an msprobe (mindstudio-probe) dump into a precguard recording.

    Module records (level L0 or mix) get the keys precguard's own capture gives;
    API records (L1, mix) go under msprobe_api.*. What msprobe does not measure
    (std, NaN/Inf/zero counts) stays unknown.

    Tensors (task "tensor") are copied into safetensors. .pt files are loaded
    only with torch.load(weights_only=True), .npy only with allow_pickle=False,
    anything else is refused (exit 2).

    `precguard compare` also reads a dump directly. See docs/msprobe.md.
    """
    from precguard.dump.reader import load_run
    from precguard.interop.msprobe import import_msprobe

    dest = import_msprobe(src, out, overwrite=overwrite)
    run = load_run(dest)
    records = sum(1 for _ in run.records())
    tensors = "yes" if run.manifest.options.get("tensors") else "no"
    typer.echo(
        f"imported {shown(src, 400)} -> {shown(dest, 400)}: {records} records, ranks {run.ranks}, "
        f"{run.manifest.steps} step(s), tensors: {tensors}"
    )
