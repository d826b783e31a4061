"""``precguard watch-report``: a training run's watch directory as HTML and CSV."""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app

_HELP = """Render a watch directory (precguard.watch(..., out=DIR)) as HTML and/or CSV.

The page shows the loss and the global gradient norm along the steps with the
alerts and recorded steps marked, the alerts table, and per-layer small multiples
of the update/param ratio. The CSV has one row per step
(scalars, alert kinds, one column per layer and series). Without --html or --csv,
the alerts are printed.

Exit codes: 0 written (or no alerts), 1 alerts printed, 2 unusable input.
"""


@app.command("watch-report", help=_HELP)
def watch_report(
    directory: Path = typer.Argument(..., metavar="DIR", help="The watch directory (out=)."),
    html_out: Path | None = typer.Option(None, "--html", help="Write the HTML report here."),
    csv_out: Path | None = typer.Option(None, "--csv", help="Write one row per step here."),
) -> None:
    from precguard.report.page import ensure_writable, write_page
    from precguard.text import shown
    from precguard.training.report import load_watch, watch_csv, watch_html

    ensure_writable(html=html_out, csv=csv_out)
    run = load_watch(directory)
    if html_out is None and csv_out is None:
        for a in run.alerts:
            # the alert's text comes from the watch directory: escaped and cut, never raw
            typer.echo(f"step {a.step}: {a.kind}: {shown(a.message, 300)}")
        typer.echo(f"{len(run.scalars)} steps, {len(run.alerts)} alerts")
        stopped = _stopped_line(run.info)
        if stopped:
            typer.echo(stopped)
        if run.alerts:
            from precguard.errors import ExitCode

            raise typer.Exit(ExitCode.FAIL)
        return
    if csv_out is not None:
        write_page(csv_out, watch_csv(run), "--csv")
        typer.echo(f"wrote {len(run.scalars)} steps as CSV to {csv_out}")
    if html_out is not None:
        write_page(html_out, watch_html(run))
        typer.echo(f"wrote the watch report ({len(run.alerts)} alerts) as HTML to {html_out}")


def _stopped_line(info: dict) -> str | None:
    """The line saying the watch stopped writing (watch.json's ``error``), or None."""
    from precguard.text import shown

    error = info.get("error") if isinstance(info, dict) else None
    if not isinstance(error, dict):
        return None
    return (
        f"the watch stopped writing after {shown(info.get('steps_written'))} of "
        f"{shown(info.get('steps'))} steps: {shown(error.get('type'))}: "
        f"{shown(error.get('message'))}"
    )
