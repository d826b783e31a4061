"""``precguard bitwise``: are two runs bitwise identical, by the hashes they recorded?"""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app
from precguard.cli._out import print_json


@app.command()
def bitwise(
    golden: Path = typer.Argument(..., help="A recording made with hashes=True."),
    actual: Path = typer.Argument(..., help="The recording that should be bitwise identical."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the result as JSON to this file ('-' for stdout)."
    ),
    rank: int | None = typer.Option(None, "--rank", help="Compare only this rank."),
    step: int | None = typer.Option(None, "--step", help="Compare only this step."),
) -> None:
    """Compare two recordings by the tensor hashes they recorded (hashes=True): no tolerance.

    Names the first tensor whose bits differ. Exit 0 identical, 1 differs, 3 inconclusive
    (records without hashes, nothing paired), 2 unusable input. For two runs that should be
    bitwise identical: same code, seed, data and device (docs/watch.md).
    """
    run_bitwise(golden, actual, rank=rank, step=step, json_out=json_out)


def run_bitwise(
    golden: Path,
    actual: Path,
    *,
    rank: int | None,
    step: int | None,
    json_out: Path | None,
    note: str = "",
) -> None:
    """Compare by hashes, print or write the result, and exit with its code.

    ``note`` goes to stderr once there is a result (unusable input stays one line).
    """
    from precguard.compare.bitwise import compare_bitwise, render_bitwise
    from precguard.compare.runs import open_side, with_names
    from precguard.dump.atomic import write_atomic

    g, a = open_side(golden), open_side(actual)
    result = with_names(compare_bitwise(g.run, a.run, rank=rank, step=step), g, a)
    payload = result.model_dump_json(indent=2)
    if json_out is not None and str(json_out) == "-":
        print_json(payload)
    else:
        if json_out is not None:
            write_atomic(json_out, payload + "\n", what="--json")
        typer.echo(render_bitwise(result))
    if note:
        typer.echo(note, err=True)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
