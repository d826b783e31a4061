"""The HTML report of a comparison (``compare --html``, ``precguard report``).

Top to bottom, in the order a reader asks: the verdict and what was not
compared; the first divergence with its reason, measured against expected
error, and the command that confirms it; the error of every record along
execution order; the other suspects (and replays); the suspects'
statistics across layers; the records table (sortable, filterable);
unmatched records; environment differences.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from precguard.report.page import (
    STATUS_COLOR,
    document,
    esc,
    filter_box,
    num_cell,
    number,
    status_span,
    table,
)

if TYPE_CHECKING:
    from precguard.compare.impact_report import ErrorBudget
    from precguard.compare.report import Comparison
    from precguard.report.suspect_stats import SuspectStats

#: records table rows at most; beyond it passing records are left out (the CSV has all)
MAX_TABLE_ROWS = 5000
#: unmatched keys listed per side
MAX_UNMATCHED = 200

_LOCAL = {True: "local", False: "propagated", None: ""}


def verdict_word(result: Comparison) -> tuple[str, str]:
    """('MATCH' | 'PARTIAL MATCH' | 'DIVERGED', its status colour key): the terminal's words."""
    from precguard.compare.coverage import headline

    word = headline(result.verdict, result.coverage).plain
    return word, {"DIVERGED": "diverged", "PARTIAL MATCH": "partial"}.get(word, "match")


def _side(result: Comparison, i: int) -> str:
    path = result.golden if i == 0 else result.actual
    device = result.devices[i] if len(result.devices) > i else "?"
    dtype = result.dtypes[i] if len(result.dtypes) > i else None
    compute = result.compute_dtypes[i] if len(result.compute_dtypes) > i else None
    dt = (dtype or "?") + (f", computes in {compute}" if compute else "")
    return f"<code>{esc(path)}</code> ({esc(device)}, {esc(dt)})"


def _header(result: Comparison) -> str:
    word, key = verdict_word(result)
    c = result.counts
    counts = (
        f"{c.passed} pass · {c.failed} fail · {c.nonfinite} nonfinite · {c.missing} missing · "
        f"{c.full} on full tensors · {c.stats_only} on statistics only"
    )
    gaps = ""
    if result.coverage is not None and result.coverage.gaps:
        items = "".join(f"<li>not compared: {esc(g)}</li>" for g in result.coverage.gaps)
        gaps = (
            "<div class='box warn'><b>Part of the recordings was not compared</b>"
            f"<ul>{items}</ul></div>"
        )
    return (
        "<h1>precguard compare</h1>"
        f"<p><span class=verdict style='color:{STATUS_COLOR[key]}'>{esc(word)}</span> "
        f"&nbsp; actual {_side(result, 1)} vs golden {_side(result, 0)} · profile "
        f"<code>{esc(result.profile)}</code></p><p class=sub>{esc(counts)}</p>{gaps}"
    )


def _nav(result: Comparison) -> str:
    """Links to the sections this page has (a long report is read by jumping)."""
    has = [
        ("first-divergence", "first divergence", result.first_divergence is not None),
        ("error-plot", "error plot", True),
        ("suspects", "suspects", bool(result.suspects)),
        ("replays", "replays", bool(result.replays)),
        ("impact", "impact", result.impact is not None),
        ("layers", "across layers", result.first_divergence is not None or bool(result.suspects)),
        ("records-section", "records", True),
        (
            "unmatched",
            "unmatched",
            bool(result.unmatched.golden_only or result.unmatched.actual_only),
        ),
        ("environment", "environment", True),
        ("warnings", "warnings", bool(result.warnings)),
    ]
    links = " · ".join(f"<a href='#{ident}'>{label}</a>" for ident, label, shown in has if shown)
    return f"<nav class=note>Jump to: {links}</nav>"


def _first_divergence(result: Comparison) -> str:
    from precguard.compare.hints import replay_hint
    from precguard.compare.render import metric_line

    fd = result.first_divergence
    if fd is None:
        if result.verdict == "match":
            return (
                "<div class='box ok'>No divergence: every paired record is within tolerance.</div>"
            )
        return (
            "<div class=box><b>Diverged, but no module was named as the first to make "
            "error</b> (see the records table and the warnings).</div>"
        )
    stats_only = fd.confidence == "statistics"
    local = {
        True: "likely (statistics only, not conclusive)" if stats_only else "yes: made it itself",
        False: "no: the error came from upstream",
        None: "undecided",
    }[fd.local]
    rows = [
        ("module", f"<b>{esc(fd.module)}</b> ({esc(fd.module_type)})"),
        (
            "record",
            f"<code>{esc(fd.key)}</code> · step {fd.step} · rank {fd.rank} · {esc(fd.phase)}",
        ),
        ("local", esc(local)),
        ("measured error", f"{esc(number(fd.metrics.error))} ({esc(metric_line(fd.metrics))})"),
    ]
    if fd.expected_error is not None:
        amp = f", amplification {number(fd.amplification)}x" if fd.amplification else ""
        rows.append(
            (
                "expected error",
                f"{esc(number(fd.expected_error))}: what {esc(fd.metrics.dtype)} precision and "
                f"the input error ({esc(number(fd.input_error))}) explain{esc(amp)}",
            )
        )
    rows.append(("why", esc(fd.reason)))
    nxt: list[str] = []
    if fd.settle_with is not None:
        nxt.append(
            "Judged on statistics only; record both runs again with full tensors of this "
            f"module to settle it:<code class=cmd>precguard record ... --tensors "
            f"'{esc(fd.settle_with)}'</code>"
        )
    hint = replay_hint(result)
    if hint is not None and hint.command is not None:
        nxt.append(f"Confirm it alone:<code class=cmd>{esc(hint.command)}</code>")
    elif hint is not None:
        nxt.append(f"No replay command: {esc(hint.reason)}")
    if nxt:
        rows.append(("next", "<br>".join(nxt)))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return (
        "<div class=box id=first-divergence><h2 style='margin-top:0'>First divergence</h2>"
        f"<dl>{dl}</dl></div>"
    )


def _suspects(result: Comparison) -> str:
    if not result.suspects:
        return ""
    rows = []
    for s in result.suspects:
        amp = "weights differ" if s.amplification is None else f"{number(s.amplification)}x"
        rows.append(
            f"<tr><td>{esc(s.module)}{' [stats]' if s.confidence == 'statistics' else ''}</td>"
            f"<td>{esc(s.module_type)}</td><td>{esc(s.phase)}</td>"
            f"<td class=n{'' if s.amplification is None else f' data-v={s.amplification!r}'}>"
            f"{esc(amp)}</td>{num_cell(s.error)}{num_cell(s.expected_error)}"
            f"{num_cell(s.scale, 5)}<td class=n>{s.step}</td><td>{esc(s.reason)}</td></tr>"
        )
    head = ("module", "type", "phase", "amplification", "error", "expected", "scale", "step", "why")
    return "<h2 id=suspects>Other suspects (made error of their own)</h2>" + table(
        head, rows, sortable=True
    )


def _replays(result: Comparison) -> str:
    if not result.replays:
        return ""
    rows = [
        f"<tr><td>{esc(p.module)}</td><td>{esc(_LOCAL[p.inferred_local] or 'undecided')}</td>"
        f"{num_cell(p.inferred_error)}<td>{esc(p.verdict or 'not replayed')}</td>"
        f"{num_cell(p.local_error)}<td>{esc(p.device)}</td><td>{esc(p.note)}</td></tr>"
        for p in result.replays
    ]
    head = (
        "module",
        "inferred",
        "inferred error",
        "replay",
        "measured local error",
        "device",
        "note",
    )
    return "<h2 id=replays>Replayed alone on the actual's device</h2>" + table(head, rows)


def _impact(result: Comparison) -> str:
    return "" if result.impact is None else impact_section(result.impact)


def impact_section(budget: ErrorBudget) -> str:
    """The error budget as HTML: findings ranked by their share of the output error, each
    remedy's before/after (docs/impact.md); compare's and check's pages show it."""
    if budget.output_error is None:
        return f"<h2 id=impact>Impact on the output error</h2><p class=note>{esc(budget.note)}</p>"
    rows = []
    for rank, i in enumerate(budget.impacts, 1):
        remedies = "<br>".join(
            f"<b>{esc(r.verdict)}</b>: {esc(r.summary)}: "
            + (f"{r.before:.3g} &rarr; {r.after:.3g}" if r.after is not None and r.before else "")
            + (f" ({esc(r.note)})" if r.note else "")
            for r in i.remedies
        )
        share = f"{i.share:.0%}" if i.share is not None else esc(i.note)
        rows.append(
            f"<tr><td>{rank}</td><td>{esc(i.module)}</td><td>{esc(', '.join(i.found_by))}</td>"
            f"{num_cell(i.before)}{num_cell(i.after)}<td>{share}</td><td>{remedies}</td></tr>"
        )
    head = ("#", "module", "found by", "output error", "with it at reference", "share", "remedies")
    summary = [f"output error {budget.output_error:.3g} ({esc(budget.metric)} of the logits)"]
    if budget.together is not None:
        summary.append(f"all findings at reference: {budget.together:.3g}")
    if budget.unexplained is not None:
        summary.append(f"no single module explains {budget.unexplained:.0%}")
    summary.append(
        f"floor of a correct run: {budget.floor:.3g} ({esc(budget.floor_how)})"
        if budget.floor is not None
        else "floor unknown"
    )
    switches = "".join(
        f"<li><b>{esc(r.verdict)}</b>: {esc(r.describe())}</li>" for r in budget.switches
    )
    return (
        "<h2 id=impact>Impact on the output error</h2>"
        f"<p class=note>{esc(budget.target or '')} re-run on {esc(budget.device or '')} "
        f"({esc(budget.dtype or '')}): {'; '.join(summary)}</p>"
        + table(head, rows)
        + (f"<p>Device switches:</p><ul>{switches}</ul>" if switches else "")
        + (f"<p class=note>{esc(budget.note)}</p>" if budget.note else "")
    )


def _error_plot(result: Comparison) -> str:
    """Error of every record along execution order (log scale), first divergence marked."""
    from precguard.report.plots import RASTER_ABOVE, figure, log_floor, positive, to_svg

    scored = [(i, r) for i, r in enumerate(result.records) if r.metrics is not None]
    if not scored:
        return "<p class=note>No record was measured: nothing to plot.</p>"
    errors = [r.metrics.error for _, r in scored]  # type: ignore[union-attr]
    expected = [r.expected_error for _, r in scored]
    floor = log_floor([*errors, *expected])
    finite = [e for e in positive([*errors, *expected], floor) if not math.isnan(e)]
    top = max(finite, default=1.0) * 10
    fig = figure(11, 3.8)
    ax = fig.add_subplot()
    ax.set_yscale("log")
    # backward records sit on a shaded band: gradients, read right to left in the model
    start = None
    for i, r in enumerate([*result.records, None]):
        back = r is not None and r.phase == "backward"
        if back and start is None:
            start = i
        elif not back and start is not None:
            ax.axvspan(start - 0.5, i - 0.5, color="#ddf4ff", zorder=0, lw=0)
            start = None
    groups: dict[str, tuple[list[int], list[float], str, str, bool]] = {}

    def add(name: str, x: int, y: float, color: str, marker: str, hollow: bool = False) -> None:
        groups.setdefault(name, ([], [], color, marker, hollow))
        groups[name][0].append(x)
        groups[name][1].append(y)

    for i, r in scored:
        m = r.metrics
        assert m is not None
        y = m.error if math.isfinite(m.error) else top
        y = max(y, floor)
        stats = m.level == "stats"
        if r.status == "nonfinite" or not math.isfinite(m.error):
            add("nonfinite", i, top, STATUS_COLOR["nonfinite"], "X")
        elif r.status == "pass":
            add("pass" + (" (stats)" if stats else ""), i, y, "#8c959f", "o", stats)
        elif r.local is True:
            add("fail: local" + (" (stats)" if stats else ""), i, y, "#cf222e", "D", stats)
        elif r.local is False:
            add("fail: propagated" + (" (stats)" if stats else ""), i, y, "#fb8f44", "o", stats)
        else:
            # inputs, gradients of inputs, or undecidable: failing, not judged local
            add("fail: not judged" + (" (stats)" if stats else ""), i, y, "#a40e26", "s", stats)
    raster = len(scored) > RASTER_ABOVE  # one image inside the SVG instead of many shapes
    # markers shrink as records multiply, so thousands of them stay readable
    size = min(1.0, math.sqrt(1500 / len(scored)))
    for name, (xs, ys, color, marker, hollow) in groups.items():
        ax.scatter(
            xs,
            ys,
            s=(14 if name.startswith("pass") else 26) * size,
            marker=marker,
            label=name,
            facecolors="none" if hollow else color,
            edgecolors=color,
            linewidths=size,
            zorder=3,
            rasterized=raster,
        )
    exp = [(i, r.expected_error) for i, r in scored if r.expected_error is not None]
    if exp:
        ax.scatter(
            [i for i, _ in exp],
            positive([e for _, e in exp], floor),
            marker="_",
            s=80 * size,
            color="#1f2328",
            label="expected (precision + input error)",
            zorder=4,
            rasterized=raster,
        )
    fd = result.first_divergence
    if fd is not None:
        at = next(
            (
                i
                for i, r in enumerate(result.records)
                if (r.key, r.step, r.rank, r.phase) == (fd.key, fd.step, fd.rank, fd.phase)
            ),
            None,
        )
        if at is not None:
            ax.axvline(at, color="#cf222e", ls="--", lw=1, zorder=2)
            ax.annotate(
                f"first divergence: {fd.module}",
                (at, top),
                xytext=(4, -12),
                textcoords="offset points",
                color="#cf222e",
                fontsize=9,
            )
    ax.set_xlim(-1, len(result.records))
    ax.set_ylim(floor / 2, top * 2)
    backward = any(r.phase == "backward" for r in result.records)
    ax.set_xlabel("record, in execution order" + (" (shaded: backward)" if backward else ""))
    ax.set_ylabel("error (log; exact 0 at the bottom)")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncols=7, frameon=False)
    label = "error of every record along execution order, log scale"
    return f"<div class=plot role=img aria-label='{label}'>{to_svg(fig)}</div>"


def _stats_multiples(stats: list[SuspectStats], note: str) -> str:
    from precguard.report.plots import figure, to_svg
    from precguard.report.suspect_stats import PANEL_STATS

    if not stats:
        return (
            f"<h2 id=layers>Suspects across layers</h2><p class=note>{esc(note)}</p>"
            if note
            else ""
        )
    panels = []
    for entry in stats:
        fig = figure(9, 2.4)
        axes = fig.subplots(1, len(PANEL_STATS))
        xs = list(range(len(entry.labels)))
        for ax, stat in zip(axes, PANEL_STATS, strict=True):
            g = [math.nan if v is None else v for v in entry.golden[stat]]
            a = [math.nan if v is None else v for v in entry.actual[stat]]
            ax.plot(xs, g, "o-", color="#0969da", ms=3, lw=1, label="golden")
            ax.plot(xs, a, "s--", color="#cf222e", ms=3, lw=1, label="actual")
            if entry.marked is not None:
                ax.axvline(entry.marked, color="#cf222e", alpha=0.3, lw=6, zorder=0)
            ax.set_title(stat, fontsize=9)
            ax.set_xticks(xs, entry.labels, fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=7)
        axes[0].set_xlabel("layer", fontsize=8)
        panels.append(
            f"<div><h3><code>{esc(entry.family)}</code> <span class=sub>{esc(entry.record)} · "
            f"step {entry.step} · rank {entry.rank}</span></h3>"
            f"<div class=plot role=img aria-label='mean, std and absmax per layer, golden and "
            f"actual, of {esc(entry.family)}'>{to_svg(fig)}</div></div>"
        )
    extra = f"<p class=note>{esc(note)}</p>" if note else ""
    return (
        "<h2 id=layers>Suspects across layers: statistics, golden vs actual</h2><p class=note>Each "
        "suspect's record in every layer (the suspect's own layer shaded): a layer that "
        "stands out made the error, a gap that widens with depth is accumulation.</p>"
        f"<div class=multiples>{''.join(panels)}</div>{extra}"
    )


def _records_table(result: Comparison) -> str:
    from precguard.compare.levels import FullMetrics, MeasuredMetrics

    records = list(enumerate(result.records))
    left_out = 0
    if len(records) > MAX_TABLE_ROWS:
        # the earliest failures are the ones that explain the rest: keep those first
        rank = {"nonfinite": 0, "fail": 0, "missing": 1, "pass": 2}
        kept = sorted(records, key=lambda ir: (rank[ir[1].status], ir[0]))[:MAX_TABLE_ROWS]
        left_out = len(records) - len(kept)
        records = sorted(kept, key=lambda ir: ir[0])
    rows = []
    for i, r in records:
        m = r.metrics
        # measured on full tensors only; the scale on statistics' samples too
        full = m if isinstance(m, FullMetrics) else None
        scale = m.scale if isinstance(m, MeasuredMetrics) else None
        dtypes = r.golden_dtype + (
            f" → {r.actual_dtype}" if r.actual_dtype and r.actual_dtype != r.golden_dtype else ""
        )
        what = f"{r.role} {r.key.rsplit('.', 1)[-1]}"
        rows.append(
            f"<tr data-status='{esc(r.status)}'><td class=n data-v={i}>{i}</td>"
            f"<td>{status_span(r.status)}</td><td>{esc(_LOCAL[r.local])}</td>"
            f"<td>{esc(r.module)}</td><td>{esc(r.module_type)}</td>"
            f"<td title='{esc(r.key)}'>{esc(what)}</td><td>{esc(r.phase)}</td>"
            f"<td class=n>{r.step}</td><td class=n>{r.rank}</td><td>{esc(dtypes)}</td>"
            f"<td>{esc(m.level if m else '-')}</td>"
            f"{num_cell(m.error if m else None)}{num_cell(r.expected_error)}"
            f"{num_cell(r.amplification)}{num_cell(full.cosine if full else None, 7)}"
            f"{num_cell(full.max_abs_err if full else None)}"
            f"{num_cell(full.max_ulp if full else None)}{num_cell(scale, 5)}</tr>"
        )
    head = (
        "#",
        "status",
        "local",
        "module",
        "type",
        "record",
        "phase",
        "step",
        "rank",
        "dtype",
        "level",
        "error",
        "expected",
        "amplif.",
        "cosine",
        "max abs",
        "max ulp",
        "scale",
    )
    note = (
        f"<p class=note>{left_out} records left out of this table (the earliest failures "
        "kept first, then passes); compare --csv writes them all.</p>"
        if left_out
        else ""
    )
    return (
        f"<h2 id=records-section>Records ({len(result.records)})</h2>"
        "<p class=note>Click a column to sort; type to filter.</p>"
        + filter_box("records", ["fail", "nonfinite", "missing", "pass"])
        + f"<div class=scroll>{table(head, rows, table_id='records', sortable=True)}</div>{note}"
    )


def _unmatched(result: Comparison) -> str:
    u = result.unmatched
    if not u.golden_only and not u.actual_only:
        return ""
    parts = ["<h2 id=unmatched>Unmatched records</h2>"]
    for side, keys in (("golden", u.golden_only), ("actual", u.actual_only)):
        if not keys:
            continue
        items = "".join(f"<li><code>{esc(k)}</code></li>" for k in keys[:MAX_UNMATCHED])
        more = (
            f"<li>… and {len(keys) - MAX_UNMATCHED} more</li>" if len(keys) > MAX_UNMATCHED else ""
        )
        parts.append(
            f"<details{' open' if len(keys) <= 20 else ''}><summary>{len(keys)} only in "
            f"{side}</summary><ul>{items}{more}</ul></details>"
        )
    return "".join(parts)


def _fingerprints(result: Comparison) -> str:
    if not result.fingerprint_diff:
        return (
            "<h2 id=environment>Environment</h2>"
            "<p class=note>The two runs' fingerprints do not differ.</p>"
        )
    rows = [
        f"<tr><td><code>{esc(k)}</code></td><td>{esc(repr(v[0]))}</td>"
        f"<td>{esc(repr(v[1] if len(v) > 1 else None))}</td></tr>"
        for k, v in result.fingerprint_diff.items()
    ]
    return "<h2 id=environment>Environment differs (fingerprint)</h2>" + table(
        ("key", "golden", "actual"), rows
    )


def _warnings(result: Comparison) -> str:
    if not result.warnings:
        return ""
    items = "".join(f"<li>{esc(w)}</li>" for w in result.warnings)
    return f"<h2 id=warnings>Warnings</h2><ul>{items}</ul>"


def render_comparison_html(
    result: Comparison, golden: Path | None = None, actual: Path | None = None
) -> str:
    """The comparison as one self-contained HTML page.

    :param golden: the golden recording, read back for the suspects'
        statistics across layers (None: those plots are left out, with a note).
    :param actual: the actual recording, likewise.
    """
    from precguard.report.suspect_stats import suspect_stats

    stats, note = suspect_stats(result, golden, actual)
    word, _ = verdict_word(result)
    body = "".join(
        [
            _header(result),
            _nav(result),
            _first_divergence(result),
            "<h2 id=error-plot>Error along execution order</h2><p class=note>One point per record; "
            "diamonds made error themselves (local), circles passed it on (propagated), "
            "dashes mark the error the record's precision and inputs explain; hollow: "
            "compared on statistics only.</p>",
            _error_plot(result),
            _suspects(result),
            _replays(result),
            _impact(result),
            _stats_multiples(stats, note),
            _records_table(result),
            _unmatched(result),
            _fingerprints(result),
            _warnings(result),
            f"<details><summary>tolerances applied ({esc(result.profile)})</summary><pre>"
            f"{esc(_tolerances(result))}</pre></details>",
        ]
    )
    return document(f"precguard compare: {word} · {Path(result.actual).name}", body)


def _tolerances(result: Comparison) -> str:
    import json

    return json.dumps(result.tolerances, indent=2, default=str)


def write_comparison_html(
    result: Comparison, path: Path, golden: Path | None = None, actual: Path | None = None
) -> Path:
    """Write :func:`render_comparison_html` to ``path`` (a path that cannot be written: exit 2)."""
    from precguard.report.page import write_page

    return write_page(path, render_comparison_html(result, golden, actual))


def write_comparison_reports(
    result: Comparison,
    *,
    html: Path | None,
    csv: Path | None,
    golden: Path | None = None,
    actual: Path | None = None,
) -> None:
    """What ``compare --html/--csv`` writes: the HTML page and the CSV table, when asked."""
    if csv is not None:
        from precguard.report.csv_table import write_comparison_csv

        write_comparison_csv(result, csv)
    if html is not None:
        write_comparison_html(result, html, golden, actual)
