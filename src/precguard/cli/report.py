"""``precguard report``: render a saved comparison or diagnosis as HTML (or CSV)."""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app
from precguard.text import shown

_HELP = """Render a saved result as a self-contained HTML page (and a comparison as CSV).

RESULT is the JSON written by `precguard compare --json` (a comparison) or
`precguard check --json` (a diagnosis); which one is read from the file. The page
holds everything inline (CSS, SVG plots, a few lines of script): it opens offline.
A comparison's per-layer statistics are read back from its two recordings only
when asked: --recordings reads the folders the result names (a result file that
travelled is untrusted: the paths in it are not opened otherwise), --golden and
--actual name them yourself. Without either the page says they were not drawn.

Exit codes: 0 written, 2 unusable input (not a result, cannot write).
"""


@app.command(help=_HELP)
def report(
    result_path: Path = typer.Argument(..., metavar="RESULT.json", help="compare/check --json."),
    html_out: Path | None = typer.Option(None, "--html", help="Write the HTML report here."),
    csv_out: Path | None = typer.Option(
        None, "--csv", help="Comparison only: write one row per record here."
    ),
    golden: Path | None = typer.Option(
        None, "--golden", help="Comparison only: the golden recording, if it has moved."
    ),
    actual: Path | None = typer.Option(
        None, "--actual", help="Comparison only: the actual recording, if it has moved."
    ),
    recordings: bool = typer.Option(
        False,
        "--recordings",
        help="Comparison only: read the recordings at the paths the result names.",
    ),
) -> None:
    from precguard.compare.report import Comparison
    from precguard.errors import UsageError
    from precguard.report.saved import load_result

    if html_out is None and csv_out is None:
        raise UsageError("nothing to write: give --html FILE (or --csv FILE for a comparison)")
    result = load_result(result_path)
    if isinstance(result, Comparison):
        from precguard.report.comparison import write_comparison_html
        from precguard.report.csv_table import write_comparison_csv

        if csv_out is not None:
            write_comparison_csv(result, csv_out)
        if html_out is not None:
            named = recordings or golden is not None or actual is not None
            g = golden or (Path(result.golden) if named else None)
            a = actual or (Path(result.actual) if named else None)
            write_comparison_html(
                result,
                html_out,
                g if g is not None and g.is_dir() else None,
                a if a is not None and a.is_dir() else None,
            )
        kind = "comparison"
    else:
        if csv_out is not None or golden is not None or actual is not None or recordings:
            raise UsageError(
                "--csv, --golden, --actual and --recordings apply to a comparison, not a diagnosis"
            )
        from precguard.report.diagnosis import write_html

        assert html_out is not None
        write_html(result, html_out)
        kind = "diagnosis"
    for what, path in (("HTML", html_out), ("CSV", csv_out)):
        if path is not None:
            typer.echo(f"wrote the {kind} as {what} to {shown(path, 400)}")
