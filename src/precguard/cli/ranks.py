"""``precguard ranks``: within one recording, do the data-parallel replicas agree?"""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app
from precguard.cli._out import print_json

_RANKS_HELP = """Check the ranks of one multi-rank recording against each other.

Parameters of data-parallel replicas, and the outputs of all_reduce / all_gather /
broadcast across their process group, must be identical on every rank. Prints the
first record where they are not (and which rank differs), the first rank that held a
NaN/Inf, and the collective it spread through (finite input on some ranks, non-finite
output on all). For all-reduces saved as full tensors (--tensors 'dist.*'), says
whether the output is within the rounding of some summation order or beyond it.

Exit 0: replicas agree and every value is finite. Exit 1: they disagree, a rank held
NaN/Inf, or a reduction is beyond order noise. Exit 2: unusable input (one rank only,
a corrupt recording), one line on stderr. Exit 3: nothing that replicas must share was
recorded (no parameters, no collectives), so agreement is not shown.
See docs/distributed.md.
"""


@app.command(help=_RANKS_HELP)
def ranks(
    run: Path = typer.Argument(..., help="Recording of a multi-rank (torchrun) run."),
    group: list[str] = typer.Option(
        [],
        "--group",
        help="A data-parallel group as comma-separated ranks, e.g. '0,2' (repeatable); "
        "default: every rank is a replica of every other.",
        metavar="RANKS",
    ),
    step: int | None = typer.Option(None, "--step", help="Check only this step."),
    rtol: float = typer.Option(
        1e-6, "--rtol", help="Relative tolerance on order-dependent statistics (mean, std, l2)."
    ),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the report as JSON to this file ('-' for stdout)."
    ),
) -> None:
    from rich.console import Console

    from precguard.ranks import check_replicas
    from precguard.ranks.render import render

    report = check_replicas(run, groups=[_parse_group(g) for g in group] or None, step=step,
                            rtol=rtol)  # fmt: skip
    payload = report.model_dump_json(indent=2)
    if json_out is not None and str(json_out) == "-":
        print_json(payload)
    else:
        if json_out is not None:
            _write(json_out, payload)
        render(report, Console())
    from precguard.errors import ExitCode

    if report.verdict == "disagree":
        raise typer.Exit(ExitCode.FAIL)
    if report.verdict == "inconclusive":
        raise typer.Exit(ExitCode.INCONCLUSIVE)


def _parse_group(text: str) -> list[int]:
    from precguard.errors import UsageError

    parts = [part.strip() for part in text.split(",") if part.strip()]
    if len(parts) < 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise UsageError(f"--group: expected two or more comma-separated ranks like '0,1', "
                         f"got {text!r}")  # fmt: skip
    return [int(p) for p in parts]


def _write(path: Path, payload: str) -> None:
    from precguard.dump.atomic import write_atomic

    write_atomic(path, payload + "\n", what="--json")
