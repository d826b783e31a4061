"""A finding's evidence as readable HTML: tables, not raw JSON, and plots where it has a curve.

Evidence is free-form JSON (each check puts its own numbers in it), so it is
drawn by its shape: scalars as a two-column table, a mapping of mappings
(per module, per layer, per op) as one table with a row each, a list of
mappings as a table, a list of scalars inline. Three shapes are curves and get
a plot as well: errors per position bin (RoPE), errors per input case (norms),
and norms per layer (gradients).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from precguard.report.page import esc, number, sort_value

#: list items shown inline before '… N more'
MAX_INLINE = 24
#: table rows shown per mapping before '… N more'
MAX_ROWS = 200
#: columns a table shows (evidence naming 100k modules per row would make a page no one reads)
MAX_COLUMNS = 200
#: layers a per-layer plot draws (one tick label each)
MAX_PLOT_LAYERS = 128
#: a mapping of at most this many rows with many more columns is shown transposed
TRANSPOSE_UP_TO = 4
#: nesting rendered as tables; deeper values are shown as compact JSON
MAX_DEPTH = 3


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return esc(number(v, 4))
    if v is None:
        return "-"
    return esc(number(v))


def _inline(v: Any) -> str:
    if _is_scalar(v):
        return _scalar(v)
    if v == {} or v == []:
        return "<span class=note>none</span>"
    # sentences (failures, differences): one a line
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v) and sum(map(len, v)) > 120:
        items = "".join(f"<li>{esc(x)}</li>" for x in v[:MAX_ROWS])
        more = f"<li>… {len(v) - MAX_ROWS} more</li>" if len(v) > MAX_ROWS else ""
        return f"<ul class=evidence>{items}{more}</ul>"
    if isinstance(v, list) and all(_is_scalar(x) for x in v):
        shown = ", ".join(_scalar(x) for x in v[:MAX_INLINE])
        more = f", … {len(v) - MAX_INLINE} more" if len(v) > MAX_INLINE else ""
        return f"[{shown}{more}]" if v else "[]"
    text = json.dumps(v, default=str)
    return f"<code>{esc(text if len(text) <= 400 else text[:400] + '…')}</code>"


def _cell(v: Any, depth: int) -> str:
    if _is_scalar(v):
        num = isinstance(v, int | float) and not isinstance(v, bool)
        return f"<td{' class=n' + sort_value(v) if num else ''}>{_scalar(v)}</td>"
    if depth < MAX_DEPTH and isinstance(v, Mapping) and v:
        return f"<td>{render_value(v, depth + 1)}</td>"
    return f"<td>{_inline(v)}</td>"


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every key of ``rows``, in first-seen order (a dict: linear in the keys, not quadratic)."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def _rows_table(rows: Mapping[str, Mapping[str, Any]], depth: int) -> str:
    columns = _columns(rows.values())
    if len(rows) <= TRANSPOSE_UP_TO and len(columns) > 2 * len(rows):
        # a few sides with many facts (device vs reference fingerprints): side by side
        flipped = {c: {name: row.get(c) for name, row in rows.items()} for c in columns}
        return _rows_table(flipped, depth)
    items = list(rows.items())
    columns = columns[:MAX_COLUMNS]  # after transposing: many facts become rows instead
    body = [
        f"<tr><td class=name><code>{esc(name)}</code></td>"
        + "".join(_cell(row.get(c), depth) for c in columns)
        + "</tr>"
        for name, row in items[:MAX_ROWS]
    ]
    more = f"<p class=note>… {len(items) - MAX_ROWS} more</p>" if len(items) > MAX_ROWS else ""
    head = "".join(f"<th>{esc(c)}</th>" for c in ["", *columns])
    return (
        f"<div class=wide><table class=sortable><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>{more}"
    )


def _list_table(items: list[Mapping[str, Any]], depth: int) -> str:
    columns = _columns(items)[:MAX_COLUMNS]
    body = [
        "<tr>" + "".join(_cell(row.get(c), depth) for c in columns) + "</tr>"
        for row in items[:MAX_ROWS]
    ]
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    return (
        f"<div class=wide><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def render_value(value: Any, depth: int = 0) -> str:
    """One evidence value as HTML, by its shape (every string escaped)."""
    if isinstance(value, Mapping):
        if value and all(isinstance(v, Mapping) for v in value.values()):
            return _rows_table(value, depth)
        simple = {k: v for k, v in value.items() if not isinstance(v, Mapping) or not v}
        nested = {k: v for k, v in value.items() if k not in simple}
        parts = []
        if simple:
            rows = "".join(
                f"<tr><th>{esc(k)}</th>{_cell(v, depth)}</tr>" for k, v in simple.items()
            )
            parts.append(f"<table class=kv><tbody>{rows}</tbody></table>")
        for k, v in nested.items():
            inner = render_value(v, depth + 1) if depth < MAX_DEPTH else _inline(v)
            parts.append(f"<h4>{esc(k)}</h4>{inner}")
        return "".join(parts)
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        return _list_table(value, depth)
    return _inline(value)


def render_evidence(evidence: Mapping[str, Any]) -> str:
    """The whole evidence of a finding: tables first, then its plots."""
    if not evidence:
        return ""
    plots = evidence_plots(evidence)
    return render_value(evidence) + "".join(f"<div class=plot>{svg}</div>" for svg in plots)


# -- plots: the shapes that are curves ----------------------------------------


_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


def _row_maps(evidence: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Mapping[str, Any]]]]:
    """(key, rows) for every top-level value that maps names to mappings."""
    return [
        (k, v)
        for k, v in evidence.items()
        if isinstance(v, Mapping) and v and all(isinstance(r, Mapping) for r in v.values())
    ]


def _num(v: Any) -> float:
    """A number for a plot: NaN for text ('NaN', 'nonfinite'), None and bools."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        try:
            return float(v) if isinstance(v, str) else math.nan
        except ValueError:
            return math.nan
    return float(v)


def _position_curves(evidence: Mapping[str, Any]) -> str | None:
    """Error per position bin (rope.*): device, reference and allowed, per module."""
    from precguard.report.plots import figure, log_floor, positive, to_svg

    curves = []
    for _, rows in _row_maps(evidence):
        for name, row in rows.items():
            xs = row.get("bin_start_positions")
            if not isinstance(xs, list) or len(xs) < 2:
                continue
            series = {
                k: [_num(v) for v in vals]
                for k, vals in row.items()
                if k != "bin_start_positions"
                and isinstance(vals, list)
                and len(vals) == len(xs)
                and all(isinstance(v, int | float | str) for v in vals)
            }
            if series:
                curves.append((name, [_num(x) for x in xs], series))
    if not curves:
        return None
    fig = figure(9, 3.2)
    ax = fig.add_subplot()
    ax.set_yscale("log")
    values = [v for _, _, s in curves for vals in s.values() for v in vals]
    floor = log_floor(values)
    style = {"device": "-", "reference": ":", "allowed": "--"}
    for name, xs, series in curves[:8]:
        for key, ys in series.items():
            ls = next((s for k, s in style.items() if key.startswith(k)), "-.")
            color = "#8c959f" if key.startswith("allowed") else None
            ax.plot(xs, positive(ys, floor), ls, marker=".", color=color, label=f"{name}: {key}")
    ax.set_xlabel("position (start of bin)")
    ax.set_ylabel("error (log)")
    ax.grid(True, alpha=0.3)
    fig.legend(fontsize=7, loc="outside right center")
    return to_svg(fig)


def _case_points(evidence: Mapping[str, Any]) -> str | None:
    """Error per input case (norm.*): one marker series per module."""
    from precguard.report.models import NORM_CASE_LABELS as CASE_LABELS
    from precguard.report.plots import figure, log_floor, positive, to_svg

    cases = list(CASE_LABELS)
    found = []
    for _, rows in _row_maps(evidence):
        for name, row in rows.items():
            present = [c for c in cases if c in row]
            if len(present) >= 2:
                found.append((name, {c: _num(row[c]) for c in present}))
    if not found:
        return None
    used = [c for c in cases if any(c in r for _, r in found)]
    # the modules with the largest error first: at most 10 lines stay readable
    found.sort(key=lambda nr: -max((v for v in nr[1].values() if math.isfinite(v)), default=0))
    fig = figure(9, 3.4)
    ax = fig.add_subplot()
    ax.set_yscale("log")
    floor = log_floor([v for _, r in found for v in r.values()])
    xs = list(range(len(used)))
    for name, row in found[:10]:
        ys = positive([row.get(c, math.nan) for c in used], floor)
        ax.plot(xs, ys, marker="o", ms=4, lw=0.8, label=name)
    tol = evidence.get("tolerance")
    if isinstance(tol, int | float) and tol > 0:
        ax.axhline(tol, color="#cf222e", ls="--", lw=1, label="tolerance (before conditioning)")
    ax.set_xticks(xs, used, rotation=20, fontsize=8, ha="right")
    ax.set_ylabel("error vs fp64 (log)")
    ax.grid(True, alpha=0.3)
    fig.legend(fontsize=7, loc="outside right center")
    return to_svg(fig)


def _layer_norms(evidence: Mapping[str, Any]) -> str | None:
    """Norms per layer (grads.*): every '*_norm' column along the layers."""
    from precguard.report.plots import figure, log_floor, positive, to_svg

    for _, rows in _row_maps(evidence):
        names = list(rows)
        shown_names = names[:MAX_PLOT_LAYERS]  # a tick per layer: 100k would take minutes
        columns = sorted(
            {k for n in shown_names for k in rows[n] if k.endswith("_norm")},
        )
        if len(names) < 2 or not columns:
            continue
        fig = figure(9, 3.2)
        ax = fig.add_subplot()
        ax.set_yscale("log")
        data = {c: [_num(rows[n].get(c)) for n in shown_names] for c in columns}
        floor = log_floor([v for vals in data.values() for v in vals])
        xs = list(range(len(shown_names)))
        missing = 0
        # device and reference often coincide: different line styles keep both visible
        for (c, ys), (ls, marker) in zip(data.items(), itertools.cycle(_STYLES), strict=False):
            ax.plot(xs, positive(ys, floor), ls=ls, marker=marker, ms=4, lw=1, label=c)
            missing += sum(1 for y in ys if not math.isfinite(y))
        ax.set_xticks(xs, shown_names, rotation=30, fontsize=7, ha="right")
        ax.set_ylabel("norm (log)")
        ax.grid(True, alpha=0.3)
        notes = []
        if missing:
            notes.append(f"{missing} non-finite value(s) not drawn")
        if len(names) > len(shown_names):
            notes.append(f"first {len(shown_names)} of {len(names)} layers drawn")
        if notes:
            ax.set_title("; ".join(notes), fontsize=8, color="#8250df")
        fig.legend(fontsize=7, loc="outside right center")
        return to_svg(fig)
    return None


def evidence_plots(evidence: Mapping[str, Any]) -> list[str]:
    """SVG plots for the curves in ``evidence`` (none when it has no curve)."""
    out = []
    for draw in (_position_curves, _case_points, _layer_norms):
        svg = draw(evidence)
        if svg is not None:
            out.append(svg)
    return out
