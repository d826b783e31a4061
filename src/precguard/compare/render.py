"""Render a :class:`Comparison` for the terminal with rich."""

from __future__ import annotations

import math

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from precguard.compare.coverage import headline, print_gaps
from precguard.compare.levels import FullMetrics, MeasuredMetrics, StatsMetrics
from precguard.compare.report import Comparison, FirstDivergence, Metrics, RecordResult
from precguard.text import shown

_STATUS_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "nonfinite": "bold magenta",
    "missing": "yellow",
}


def format_number(x: float | None) -> str:
    """Three significant digits; '-' for None, 'inf'/'nan' spelled out."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"


def format_cosine(x: float | None) -> str:
    """Cosine with enough digits to tell 0.999999 from 1."""
    return "-" if x is None else f"{x:.6f}"


def scale_text(m: Metrics) -> str:
    """'scale 1.0100 ± 2e-04' (the systematic part of the error), or '' without one."""
    if not isinstance(m, MeasuredMetrics) or m.scale is None:
        return ""
    se = f" ± {m.scale_se:.1g}" if m.scale_se is not None else ""
    return f"scale {m.scale:.4f}{se}" + (" (bias)" if m.bias else "")


def nonfinite_text(m: Metrics) -> str:
    """'non-finite: 32768 NaN, 0 Inf on one side only' when NaN/Inf differ, else ''
    (the other metrics cover only elements finite on both sides)."""
    if not (m.nan_mismatch or m.inf_mismatch):
        return ""
    return f"non-finite: {m.nan_mismatch} NaN, {m.inf_mismatch} Inf on one side only"


def metric_line(m: Metrics) -> str:
    """One line with the metrics that matter for a record (a NaN/Inf mismatch first)."""
    bad = nonfinite_text(m)
    if bad:
        finite = _metric_line(m, finite_only=True)
        return f"{bad};  over the elements finite on both sides: {finite}"
    return _metric_line(m)


def _metric_line(m: Metrics, *, finite_only: bool = False) -> str:
    # finite_only: the statistics' error is infinite (a NaN mean), the sample's is that of
    # the sampled elements finite on both sides
    if m.level == "full":
        scale = scale_text(m)
        return (
            f"rel_l2 {format_number(m.rel_l2)}  cosine {format_cosine(m.cosine)}  "
            f"max_abs {format_number(m.max_abs_err)}  max_rel {format_number(m.max_rel_err)}  "
            f"max_ulp {format_number(m.max_ulp)}  [{m.dtype}]" + (f"  {scale}" if scale else "")
        )
    if m.level == "stats" and m.sample_size:
        error = m.sample_rel_l2 if finite_only else m.error
        where = (
            f"  worst position {m.pos_worst} (norm off by {format_number(m.pos_worst_err)})"
            if m.pos_worst is not None and m.pos_worst_err
            else ""
        )
        # the sample's standard error of rel_l2: half that of its mean square (delta method)
        rse = m.sample_rse
        spread = f" ±{50 * rse:.0f}%" if rse is not None and 0 < rse < 2 else ""
        return (
            f"stats and {m.sample_size} sampled elements: rel_l2 ~{format_number(error)}"
            f"{spread}  sampled max_abs {format_number(m.sample_max_abs)}{where} (weaker test)"
        )
    if m.level == "stats":
        worst = max((m.stat_rel_diff or {}).items(), key=lambda kv: kv[1], default=("-", 0.0))
        return f"stats only: largest difference {worst[0]} {format_number(worst[1])} (weaker test)"
    if m.level == "exact" and m.rerouted is not None and m.note:
        return m.note  # a router's indices (routing.py): re-routed tokens, margins
    if m.level == "exact":
        return f"{m.mismatched} unequal elements (indices, compared for equality)"
    return m.note or "not comparable"


def judged_precision(result: Comparison) -> str | None:
    """The least precise dtype whose tolerances judged a float record (None if none did)."""
    from precguard.numerics import less_precise

    found: str | None = None
    for r in result.records:
        m = r.metrics
        if m is not None and m.level in ("full", "stats") and r.golden_dtype != "bool":
            found = m.dtype if found is None else less_precise(found, m.dtype)
    return found


def render(result: Comparison, console: Console, *, top: int = 10) -> None:
    """Print the verdict, the first divergence, suspects, the top-N records and counts."""
    print_gaps(result.coverage, console)  # what was not compared comes first
    console.print(_headline(result))
    from precguard.compare.advice import swapped_sides

    swapped = swapped_sides(result.devices, result.dtypes)
    if swapped is not None:  # one line, before any advice (which would come out inverted)
        console.print(Text(f"warning: {shown(swapped, 400)}", style="bold yellow"))
    _print_within_floor(result, console)
    fd = result.first_divergence
    if fd is not None:
        _print_first_divergence(result, fd, console)
    _print_further_findings(result, console)
    if result.suspects:
        console.print(_suspects_table(result))
    if top > 0:
        _top_table(result.records, console, top)
    _print_counts(result, console)
    if result.fingerprint_diff:
        _fingerprint_table(result, console)
    for w in result.warnings:
        if w == swapped:
            continue
        console.print(f"[yellow]warning:[/] {shown(w, 400, markup=True)}")


def _headline(result: Comparison) -> Text:
    """The verdict's first line: the verdict, its output impact, the two sides."""
    head = headline(result.verdict, result.coverage)
    if result.verdict == "match":
        within = judged_precision(result)
        if within is not None:
            head.append(f" (matches within {within} precision)", style=head.style)
    if result.verdict != "match":
        affected, style = output_impact(result)
        head.append(f" ({affected})", style=style)
    g_dev, a_dev = [*result.devices, "?", "?"][:2]
    g_dt, a_dt = [*result.dtypes, None, None][:2]
    head.append(
        f"  {shown(result.actual)} ({shown(a_dev)}, {shown(a_dt or '?')})  vs golden  "
        f"{shown(result.golden)} ({shown(g_dev)}, {shown(g_dt or '?')})  profile {result.profile}",
        style="default",
    )
    return head


def _print_within_floor(result: Comparison, console: Console) -> None:
    """A real divergence whose output stays within a correct run's floor, said once."""
    budget = result.impact
    if budget is not None and budget.within_floor:
        console.print(
            Text(
                f"real, but the output is within a correct run's floor: output error "
                f"{format_number(budget.output_error)}, floor {format_number(budget.floor)} "
                "(the records diverged: exit 1; docs/impact.md)",
                style="yellow",
            )
        )


def _print_first_divergence(result: Comparison, fd: FirstDivergence, console: Console) -> None:
    """The first divergence's panel (module, record, local, error, expected, why, remedy),
    then how to settle a statistics-only one and the replay hint."""
    stats_only = fd.confidence == "statistics"
    local = {
        True: "likely: this module made the error (statistics only, not conclusive)"
        if stats_only
        else "yes: this module made the error",
        False: "no: error came from upstream",
        None: "undecided",
    }[fd.local]
    lines = [
        Text.assemble(
            ("module  ", "bold"), (shown(fd.module), "bold red"), f"  ({shown(fd.module_type)})"
        ),
        Text(f"record  {shown(fd.key)}   step {fd.step}  rank {fd.rank}  {fd.phase}"),
        Text(
            f"local   {local}"
            + (
                f"   amplification {format_number(fd.amplification)}x"
                if fd.amplification and not nonfinite_text(fd.metrics)
                else ""
            )
        ),
        Text(f"error   {metric_line(fd.metrics)}"),
    ]
    if fd.expected_error is not None:
        lines.append(
            Text(
                f"expect  {format_number(fd.expected_error)} explained by {fd.metrics.dtype} "
                f"precision and the input error, measured {_measured(fd.metrics)}"
            )
        )
    lines.append(Text(f"why     {shown(fd.reason, 4000)}"))
    remedy = remedy_line(result)
    if remedy:
        lines.append(Text(f"remedy  {remedy}"))
    console.print(Panel(Group(*lines), title="first divergence", border_style="red", expand=False))
    if fd.settle_with is not None:
        glob = shown(fd.settle_with, markup=True)
        console.print(
            "[dim]judged on statistics only; to settle it, record both runs again with full "
            f"tensors of this module: precguard record ... --tensors '{glob}'[/]",
            soft_wrap=True,  # a command to copy: never broken over lines
        )
    _print_replay_hint(result, console)


def _suspects_table(result: Comparison) -> Table:
    """The other suspects, each a module that made error of its own."""
    table = Table(title="other suspects (made error of their own)", title_justify="left")
    for col in ("module", "type", "phase", "amplification", "error", "expected", "scale", "step"):
        table.add_column(col, overflow="fold")  # a name wrapped, never cut
    for s in result.suspects:
        amp = (
            ("weights differ" if s.role == "param" else "indices differ")
            if s.amplification is None
            else f"{format_number(s.amplification)}x"
        )
        table.add_row(
            shown(s.module, markup=True) + (" \\[stats]" if s.confidence == "statistics" else ""),
            shown(s.module_type, markup=True),
            s.phase,
            amp,
            format_number(s.error),
            format_number(s.expected_error),
            "-" if s.scale is None else f"{s.scale:.4f}",
            str(s.step),
        )
    return table


def _print_counts(result: Comparison, console: Console) -> None:
    """The record counts, and what statistics-only pairs weigh."""
    c = result.counts
    console.print(
        f"records: [green]{c.passed} pass[/]  [red]{c.failed} fail[/]  "
        f"[magenta]{c.nonfinite} nonfinite[/]  [yellow]{c.missing} missing[/]   "
        f"compared on full tensors {c.full}, on statistics only {c.stats_only}"
        + (f", shapes differ {c.shape_mismatch}" if c.shape_mismatch else "")
        + (f", nothing comparable {c.not_compared}" if c.not_compared else "")
    )
    if c.stats_only:
        console.print(
            "[dim]statistics-only pairs are a weaker test: record full tensors (--tensors) "
            "of the suspect modules for a conclusive one[/]"
        )


#: further findings the terminal shows in full; the JSON holds every one
SHOWN_FINDINGS = 10


def _print_further_findings(result: Comparison, console: Console) -> None:
    """Each module after the first divergence that made error of its own, in execution
    order, named in full with its why line (a narrow table would cut the name)."""
    findings = result.further_findings
    if not findings:
        return
    console.print(
        f"[bold red]further findings[/] ({len(findings)}, each made error of its own, "
        "judged as the first divergence; in execution order):"
    )
    for f in findings[:SHOWN_FINDINGS]:
        stats = " \\[stats]" if f.confidence == "statistics" else ""
        console.print(
            f"  [bold]{shown(f.module, markup=True)}[/] ({shown(f.module_type, markup=True)}), "
            f"{f.phase}, step {f.step}{stats}",
            highlight=False,
        )
        console.print(f"    why {shown(f.reason, 400, markup=True)}", highlight=False)
    if len(findings) > SHOWN_FINDINGS:
        console.print(f"  ... and {len(findings) - SHOWN_FINDINGS} more (--json FILE lists all)")


def output_impact(result: Comparison) -> tuple[str, str]:
    """Whether a divergence reaches the model's output, for the first line, and its style."""
    budget = result.impact
    if budget is not None and budget.measured == "recordings" and budget.note.startswith("the "):
        # a --target that could not re-run these recordings (two targets): say why, briefly
        return f"output impact not measured: {budget.note.split(' (')[0]}", "default"
    if budget is None or budget.measured != "target" or budget.output_error is None:
        return "output impact not measured: --target re-runs it", "default"
    error = format_number(budget.output_error)
    if budget.within_floor:
        return f"output not affected: error {error} within a correct run's floor", "yellow"
    if budget.floor is None:
        return f"output error {error}, floor of a correct run unknown", "default"
    floor = format_number(budget.floor)
    return f"output affected: error {error}, a correct run's {floor}", "bold red"


def remedy_line(result: Comparison) -> str:
    """The first divergence's remedy: the one verification chose, else its candidates in
    the order --verify tries them (compare/advice.py: one source of advice)."""
    from precguard.compare.advice import listed

    fd = result.first_divergence
    if fd is None:
        return ""
    if fd.remedy is not None:
        return shown(fd.remedy.describe(), 4000)
    budget = result.impact
    checks = [
        c for i in (budget.impacts if budget else []) if i.module == fd.module for c in i.remedies
    ]
    if budget is not None and budget.within_floor:
        return "none needed: the output is within the floor of a correct run"
    if any(c.verdict != "not run" for c in checks):
        return "no mechanical remedy reached the floor (each one's result is listed below)"
    return shown(listed(fd.remedies), 4000) if fd.remedies else ""


def _measured(m: Metrics) -> str:
    """The measured error of a panel: 'non-finite (...)' where NaN/Inf differ."""
    if nonfinite_text(m):
        finite = m.sample_rel_l2 if isinstance(m, StatsMetrics) else m.error
        return (
            f"non-finite ({m.nan_mismatch} NaN, {m.inf_mismatch} Inf on one side only; "
            f"{format_number(finite)} over the finite elements)"
        )
    return format_number(m.error)


def _cosine_max_abs(m: Metrics) -> tuple[str, str]:
    """A table's cosine and max-abs cells: measured on full tensors only ('-' elsewhere)."""
    if isinstance(m, FullMetrics):
        return format_cosine(m.cosine), format_number(m.max_abs_err)
    return "-", "-"


def _print_replay_hint(result: Comparison, console: Console) -> None:
    from precguard.compare.hints import replay_hint

    hint = replay_hint(result)
    if hint is None:
        return
    if hint.command is not None:
        console.print(
            Text(f"confirm it alone: {shown(hint.command, 2000)}", style="dim"),
            soft_wrap=True,  # a command to copy: never broken over lines
        )
    else:
        console.print(Text(f"no replay command: {shown(hint.reason, 4000)}", style="dim"))


def _fingerprint_table(result: Comparison, console: Console, limit: int = 8) -> None:
    items = list(result.fingerprint_diff.items())
    table = Table(title="environment differs (fingerprint)", title_justify="left")
    for col in ("key", "golden", "actual"):
        table.add_column(col)
    for key, (g, a) in items[:limit]:
        table.add_row(*(shown(text, markup=True) for text in (key, repr(g), repr(a))))
    console.print(table)
    if len(items) > limit:
        console.print(f"[dim]... and {len(items) - limit} more (see --json)[/]")


def _top_table(records: list[RecordResult], console: Console, top: int) -> None:
    scored = [r for r in records if r.metrics is not None and r.status != "missing"]
    scored.sort(key=lambda r: (r.status == "pass", -_finite(r.metrics.error)))  # type: ignore[union-attr]
    rows = scored[:top]
    if not rows:
        return
    table = Table(title=f"top {len(rows)} records by error", title_justify="left")
    for col in ("status", "module", "record", "step", "error", "cosine", "max_abs"):
        table.add_column(col, overflow="fold")  # at 80 columns a long name wraps, never cut
    for r in rows:
        m = r.metrics
        assert m is not None
        what = f"{r.role} {r.key.rsplit('.', 1)[-1]}"
        if r.phase == "backward":
            what += " (bwd)"
        if m.level == "stats":
            what += " [stats]"
        error = format_number(m.error)
        if r.actual_shape is not None:  # the shapes, not an error of inf
            g_shape = "x".join(map(str, r.shape))
            a_shape = "x".join(map(str, r.actual_shape))
            error = f"shape {g_shape} vs {a_shape}" + (f" ({error})" if m.level != "none" else "")
        elif m.level == "exact":
            error = f"{m.mismatched} differ"
        table.add_row(
            Text(r.status, style=_STATUS_STYLE[r.status]),
            shown(r.module, markup=True),
            shown(what, markup=True),
            str(r.step),
            *(
                ("non-finite", "-", "-")
                if nonfinite_text(m) and r.actual_shape is None
                else (error, *_cosine_max_abs(m))
            ),
        )
    console.print(table)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 1e300
