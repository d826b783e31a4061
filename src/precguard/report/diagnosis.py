"""Render a checklist :class:`~precguard.checklist.Diagnosis` for the terminal and as HTML."""

from __future__ import annotations

import html
import json
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from precguard.checklist import Diagnosis
    from precguard.checks.base import Finding

STATUS_STYLE = {
    "pass": ("PASS", "green"),
    "warn": ("WARN", "yellow"),
    "fail": ("FAIL", "bold red"),
    "skip": ("skip", "dim"),
    "error": ("ERROR", "magenta"),
}
#: statuses whose remedy is shown: a pass or a skip has nothing to fix
_FLAGGED = frozenset({"warn", "fail", "error"})
_HTML_COLOR = {
    "pass": "#1a7f37",
    "warn": "#9a6700",
    "fail": "#cf222e",
    "skip": "#6e7781",
    "error": "#8250df",
}


def _header(d: Diagnosis) -> str:
    compute = f", computes in {d.compute_dtype}" if d.compute_dtype else ""
    golden = f", golden {d.golden}" if d.golden else ""
    return (
        f"checklist {d.checklist} · target {d.target} · device {d.device} ({d.dtype}{compute}) "
        f"vs {d.reference}{golden}"
    )


def _counts(d: Diagnosis) -> str:
    return " · ".join(f"{n} {s}" for s, n in d.counts.items() if n)


def _inconclusive(d: Diagnosis) -> str:
    what = f"all {len(d.findings)} checks were skipped" if d.findings else "no check was selected"
    return f"no check produced a result ({what}): nothing was shown to pass"


def _evidence_line(f: Finding, limit: int = 4) -> str:
    items = []
    for k, v in f.evidence.items():
        if v in (None, [], {}, ""):
            continue
        if isinstance(v, dict | list) and len(json.dumps(v, default=str)) > 80:
            continue
        items.append(f"{k}={v}")
        if len(items) >= limit:
            break
    return ", ".join(items)


def render_terminal(d: Diagnosis, console: Console, causes: int = 3) -> None:
    """Print the diagnosis: verdict, the most likely root causes with remedies, all findings."""
    from rich.table import Table

    from precguard.text import shown

    def escape(text: str) -> str:
        # findings quote recordings (device, module names): no escape codes, no markup
        return shown(text, 2000, markup=True)

    verdict = {
        "pass": "[bold green]PASS[/]",
        "fail": "[bold red]FAIL[/]",
        "inconclusive": "[bold yellow]INCONCLUSIVE[/]",
    }[d.verdict]
    console.print(f"[bold]precguard check[/] · {escape(_header(d))}")
    console.print(f"verdict: {verdict}   {_counts(d) or 'no check ran'}   ({d.duration_s:.1f} s)")
    if d.verdict == "inconclusive":
        console.print(f"[yellow]{escape(_inconclusive(d))}[/]")
    flagged = [f for f in d.root_causes if f.status in ("fail", "error")][:causes]
    if flagged:
        console.print()
        console.print("[bold]Most likely root cause first[/]")
        for i, f in enumerate(flagged, 1):
            label, style = STATUS_STYLE[f.status]
            console.print(f" {i}. [{style}]{label}[/] [bold]{f.id}[/]: {escape(f.summary)}")
            ev = _evidence_line(f)
            if ev:
                console.print(f"    [dim]evidence:[/] {escape(ev)}")
            if f.remedy:
                console.print(f"    [dim]remedy:[/] {escape(f.remedy)}")
    table = Table(title=None, show_lines=False, expand=False, pad_edge=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("summary")
    skipped: dict[str, list[str]] = defaultdict(list)
    for f in d.findings:
        if f.status == "skip":
            skipped[f.summary].append(f.id)
            continue
        label, style = STATUS_STYLE[f.status]
        table.add_row(f"[{style}]{label}[/]", f.id, escape(f.summary))
    if table.row_count:
        console.print()
        console.print(table)
    for reason, ids in skipped.items():
        console.print(f"[dim]skipped {', '.join(ids)}: {escape(reason)}[/]")


def render_html(d: Diagnosis) -> str:
    """A self-contained HTML page of the diagnosis (inline CSS, no scripts)."""
    e = html.escape
    rows = []
    for f in d.findings:
        color = _HTML_COLOR[f.status]
        evidence = e(json.dumps(f.evidence, indent=2, default=str))
        rows.append(
            f"<tr><td style='color:{color};font-weight:bold'>{e(f.status)}</td>"
            f"<td><code>{e(f.id)}</code></td><td>{e(f.summary)}"
            + (
                f"<div class='remedy'><b>Remedy:</b> {e(f.remedy)}</div>"
                if f.remedy and f.status in _FLAGGED  # a plugin's pass may carry one
                else ""
            )
            + (
                f"<details><summary>evidence</summary><pre>{evidence}</pre></details>"
                if f.evidence
                else ""
            )
            + "</td></tr>"
        )
    causes = "".join(
        f"<li><code>{e(f.id)}</code> ({e(f.status)}): {e(f.summary)}</li>"
        for f in d.root_causes
        if f.status in ("fail", "error")
    )
    verdict_color = {"pass": _HTML_COLOR["pass"], "fail": _HTML_COLOR["fail"]}.get(
        d.verdict, _HTML_COLOR["warn"]
    )
    note = f"<p>{e(_inconclusive(d))}</p>" if d.verdict == "inconclusive" else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>precguard check: {e(d.checklist)} on {e(d.device)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; color: #1f2328; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #d0d7de; padding: .4em .6em; vertical-align: top;
  text-align: left; }}
pre {{ background: #f6f8fa; padding: .6em; overflow-x: auto; font-size: 85%; }}
.remedy {{ margin-top: .3em; color: #57606a; }}
</style></head><body>
<h1>precguard check</h1>
<p>{e(_header(d))}</p>
<p>Verdict: <b style="color:{verdict_color}">{e(d.verdict.upper())}</b> &mdash; {e(_counts(d))}
({d.duration_s:.1f} s, {e(d.created)})</p>
{note}
{"<h2>Most likely root cause first</h2><ol>" + causes + "</ol>" if causes else ""}
<h2>Findings</h2>
<table><tr><th>status</th><th>check</th><th>summary</th></tr>
{"".join(rows)}
</table>
</body></html>
"""


def as_json(d: Diagnosis) -> str:
    """The diagnosis as indented JSON (non-finite numbers as strings)."""
    return d.model_dump_json(indent=2)
