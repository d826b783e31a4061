"""``precguard compare``: parse the options, run the one compare job, print and write."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from precguard.cli import replay as _replay  # noqa: F401  (registers `precguard replay`)
from precguard.cli._app import app, show_progress
from precguard.cli.compare_help import COMPARE_HELP

if TYPE_CHECKING:
    from precguard.compare.report import Comparison


@app.command(help=COMPARE_HELP)
def compare(
    golden: Path = typer.Argument(..., help="Golden (reference) recording, or an msprobe dump."),
    actual: Path = typer.Argument(..., help="Recording under test, or an msprobe dump."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the Comparison as JSON ('-': stdout)."
    ),
    html_out: Path | None = typer.Option(
        None, "--html", help="Write a self-contained HTML report here."
    ),
    csv_out: Path | None = typer.Option(
        None, "--csv", help="Write one row per record as CSV here."
    ),
    junit_out: Path | None = typer.Option(
        None, "--junit-xml", metavar="FILE", help="Write JUnit XML here (docs/guard.md)."
    ),
    profile: str = typer.Option(
        "default", help="default (expected error), fixed, strict or msprobe."
    ),
    rtol: float | None = typer.Option(
        None, help="Relative tolerance: a fixed tolerance in every dtype."
    ),
    atol: float | None = typer.Option(
        None, help="Absolute tolerance: a fixed tolerance in every dtype."
    ),
    rank: int | None = typer.Option(None, help="Compare only this rank."),
    step: int | None = typer.Option(None, help="Compare only this step."),
    top: int = typer.Option(10, help="Rows in the top-N table by error."),
    tolerance_dtype: str = typer.Option(
        "auto", help="auto (the less precise side's), golden, or a dtype name."
    ),
    rename: list[str] = typer.Option(
        [], "--map", metavar="OLD=NEW", help="Modules named OLD (a glob) are called NEW."
    ),
    layout: str | None = typer.Option(
        None, metavar="SPEC", help="Layout spec of a TP/PP recording (docs/layouts.md)."
    ),
    replay: bool = typer.Option(False, help="Re-run each failing module alone (needs --target)."),
    replay_top: int = typer.Option(3, help="With --replay: how many failing modules to replay."),
    target: str | None = typer.Option(
        None, "--target", "-t", help="The code the actual side ran: impact (docs/impact.md)."
    ),
    device: str | None = typer.Option(
        None, "--device", "-d", help="With --target: re-run it here."
    ),
    verify: bool = typer.Option(False, help="With --target: re-run each finding's remedies."),
    workers: int = typer.Option(
        1, "--workers", "-w", help="Processes comparing units in parallel."
    ),
    calibration: Path | None = typer.Option(None, help="A perturbed golden: measured sensitivity."),
    allow_partial: bool = typer.Option(False, help="Exit 0 on a match that covers only part."),
    bitwise: bool = typer.Option(False, help="Moved to `precguard bitwise GOLDEN ACTUAL`."),
) -> None:
    from precguard.cli.compare_steps import (
        check_usage,
        run_bitwise_spelling,
        then_steps,
        write_files,
    )

    given: dict[str, Any] = {"--html": html_out, "--csv": csv_out, "--layout": layout}
    given |= {"--map": rename, "--junit-xml": junit_out, "--replay": replay, "--target": target}
    given |= {"--rtol": rtol, "--atol": atol, "--verify": verify, "--device": device}
    if bitwise:
        run_bitwise_spelling(golden, actual, given, rank=rank, step=step, json_out=json_out)
        return
    from rich.progress import Progress

    from precguard.compare.jobs import job
    from precguard.compare.options import CompareOptions
    from precguard.text import safe_console, shown

    options = CompareOptions(
        profile=profile, rtol=rtol, atol=atol, rank=rank, step=step,
        tolerance_dtype=tolerance_dtype, rename=tuple(rename), workers=workers,
        calibration=calibration,
    )  # fmt: skip
    check_usage(top=top, replay_top=replay_top, actual=actual, **given)
    from precguard.report.page import ensure_writable

    ensure_writable(html=html_out, csv=csv_out, **{"junit-xml": junit_out})
    gather = None
    if layout is not None:
        from precguard.layout.compare import gathered

        gather = gathered(layout)
    steps = then_steps(target=target, device=device, verify=verify, replay=replay, top=replay_top)
    err = safe_console(stderr=True)  # the paths may hold control characters: escaped
    with Progress(console=err, transient=True, disable=not show_progress()) as bar:
        task = bar.add_task(f"comparing {shown(actual)} with {shown(golden)}", total=None)
        result = job(
            options, golden, actual, gather=gather, then=steps,
            on_total=lambda n: bar.update(task, total=n),
            on_step=lambda r, s: bar.update(task, advance=1, description=f"rank {r} step {s}"),
        )  # fmt: skip
    write_files(result, golden, actual, html_out, csv_out, junit_out, json_out, allow_partial)
    if json_out is None or str(json_out) != "-":
        _print(result, top=top, replay=replay, layout=layout)
    code = result.exit_code
    if code == 3 and allow_partial:  # ExitCode.INCONCLUSIVE
        code = 0
    if code:
        raise typer.Exit(code)


def _print(result: Comparison, *, top: int, replay: bool, layout: str | None) -> None:
    from precguard.compare.render import render
    from precguard.text import safe_console

    console = safe_console()
    render(result, console, top=top)
    if replay:
        from precguard.localize.confirm import render_replays

        render_replays(result, console)
    if result.verdict != "match" and layout is None:
        from precguard.compare.findings import recordings_only
        from precguard.localize.impact_render import render_budget

        render_budget(result.impact or recordings_only(result, reason="no --target"), console)
