"""Render a checklist :class:`~precguard.checklist.Diagnosis` for the terminal and as HTML."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from precguard.report.models import Diagnosis, Finding

STATUS_STYLE = {
    "pass": ("PASS", "green"),
    "warn": ("WARN", "yellow"),
    "fail": ("FAIL", "bold red"),
    "skip": ("skip", "dim"),
    "error": ("ERROR", "magenta"),
}
#: statuses whose remedy is shown: a pass or a skip has nothing to fix
_FLAGGED = frozenset({"warn", "fail", "error"})


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
    """A self-contained HTML page of the diagnosis: root causes first, then every family.

    Inline CSS, SVG plots where the evidence has a curve, and a few lines of
    script for sorting tables; every string a check reports is escaped.
    """
    from precguard.report.evidence import render_evidence
    from precguard.report.page import STATUS_COLOR, document, esc, status_span

    def cause_html(f: Finding) -> str:
        ev = _evidence_line(f)
        return (
            f"<li>{status_span(f.status, STATUS_STYLE[f.status][0])} "
            f"<a href='#{esc(f.id)}'><code>{esc(f.id)}</code></a>: {esc(f.summary)}"
            + (f"<div class=note>evidence: {esc(ev)}</div>" if ev else "")
            + (f"<div class=remedy><b>Remedy:</b> {esc(f.remedy)}</div>" if f.remedy else "")
            + "</li>"
        )

    def finding_html(f: Finding, open_evidence: bool) -> str:
        remedy = (
            f"<div class=remedy><b>Remedy:</b> {esc(f.remedy)}</div>"
            if f.remedy and f.status in _FLAGGED  # a plugin's pass may carry one
            else ""
        )
        evidence = render_evidence(f.evidence)
        folded = (
            f"<details{' open' if open_evidence else ''}><summary>evidence</summary>"
            f"{evidence}</details>"
            if evidence
            else ""
        )
        took = d.durations.get(f.id)
        secs = f" <span class=note>{took:.1f} s</span>" if took is not None else ""
        return (
            f"<div class=finding id='{esc(f.id)}' "
            f"style='border-left-color:{STATUS_COLOR[f.status]}'>"
            f"{status_span(f.status, STATUS_STYLE[f.status][0])} <code>{esc(f.id)}</code>{secs}"
            f"<div>{esc(f.summary)}</div>{remedy}{folded}</div>"
        )

    causes = [f for f in d.root_causes if f.status in ("fail", "error")]
    causes_html = "".join(cause_html(f) for f in causes)
    families: dict[str, list[Finding]] = defaultdict(list)
    skipped: dict[str, list[str]] = defaultdict(list)
    for f in d.findings:
        if f.status == "skip":
            skipped[f.summary].append(f.id)
        else:
            families[f.family].append(f)
    family_html = []
    for family, found in families.items():
        counts = " · ".join(
            status_span(s, f"{sum(1 for f in found if f.status == s)} {s}")
            for s in ("fail", "error", "warn", "pass")
            if any(f.status == s for f in found)
        )
        family_html.append(
            f"<h3>{esc(family)} <span class=note>{counts}</span></h3>"
            + "".join(finding_html(f, open_evidence=f.status in _FLAGGED) for f in found)
        )
    skipped_html = ""
    if skipped:
        items = "".join(
            f"<li>{', '.join(f'<code>{esc(i)}</code>' for i in ids)}: {esc(reason)}</li>"
            for reason, ids in skipped.items()
        )
        total = sum(len(ids) for ids in skipped.values())
        skipped_html = (
            f"<details><summary>{total} check(s) skipped (not applicable here)</summary>"
            f"<ul>{items}</ul></details>"
        )
    verdict_key = {"pass": "pass", "fail": "fail"}.get(d.verdict, "inconclusive")
    note = (
        f"<div class='box warn'>{esc(_inconclusive(d))}</div>"
        if d.verdict == "inconclusive"
        else ""
    )
    body = (
        "<h1>precguard check</h1>"
        f"<p class=sub>{esc(_header(d))}</p>"
        f"<p><span class=verdict style='color:{STATUS_COLOR[verdict_key]}'>"
        f"{esc(d.verdict.upper())}</span> &nbsp; {esc(_counts(d) or 'no check ran')} "
        f"<span class=note>({d.duration_s:.1f} s, {esc(d.created)})</span></p>{note}"
        + (
            f"<div class=box id=root-causes><h2 style='margin-top:0'>Most likely root cause "
            f"first</h2><ol>{causes_html}</ol></div>"
            if causes_html
            else ""
        )
        + _impact(d)
        + "<h2>Findings by family</h2>"
        + "".join(family_html)
        + skipped_html
    )
    return document(f"precguard check: {d.checklist} on {d.device}", body)


def _impact(d: Diagnosis) -> str:
    """check --verify's error budget (docs/impact.md), as compare's page shows it."""
    if d.impact is None:
        return ""
    from precguard.report.comparison import impact_section

    return impact_section(d.impact)


def write_html(d: Diagnosis, path: Path) -> Path:
    """Write :func:`render_html` to ``path`` (a path that cannot be written: exit 2)."""
    from precguard.report.page import write_page

    return write_page(path, render_html(d))


def as_json(d: Diagnosis) -> str:
    """The diagnosis as indented JSON (non-finite numbers as strings)."""
    return d.model_dump_json(indent=2)
