"""Read a watch directory back, and render it: ``precguard watch-report DIR --html FILE``.

The page shows the loss and the global gradient norm along the steps with
each alert and each recorded step marked, the alerts as a table, and per-layer
small multiples of the update/param ratio: the layers an alert named first,
then the others in the model's order. The CSV
has one row per step: the scalars, the alert kinds, then one column per layer
and series (``update_ratio:LAYER``, ``grad_norm:LAYER``).

A watch directory is read like a recording, through
:mod:`precguard.dump.untrusted`: regular files inside the directory, sizes,
line lengths and nesting bounded, every row validated (a step a non-negative
integer, a statistic a finite number or ``"NaN"``/``"Infinity"``), a
truncated last line (the run was killed mid-write) skipped with a warning,
any other bad line an error naming the file and line.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from precguard._logging import get_logger
from precguard.dump.untrusted import (
    Count,
    Finite,
    Int64,
    confine,
    iter_json_lines,
    memory_limit,
    parse_json,
    read_json_file,
    validated,
)
from precguard.errors import DumpFormatError
from precguard.text import shown
from precguard.training.alerts import Alert
from precguard.training.handle import (
    ALERTS_FILE,
    LAYERS_FILE,
    RECORDING_DIR,
    SCALARS_FILE,
    SCHEMA_VERSION,
    WATCH_FILE,
)

logger = get_logger(__name__)

#: layers drawn as small multiples (alerted layers first); the CSV has them all
MAX_PANELS = 36
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: a statistic as the watch writes it: a finite number, a non-finite one as its string, or null
Stat = Finite | Literal["NaN", "Infinity", "-Infinity"] | None
M = TypeVar("M", bound=BaseModel)


def _float(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, str):
        return _NONFINITE.get(v)
    return float(v)


@dataclass
class WatchRun:
    """A watch directory read back."""

    path: Path
    info: dict[str, Any]
    layers: list[str]
    scalars: list[dict[str, Any]] = field(default_factory=list)
    per_layer: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)

    @property
    def recording(self) -> Path:
        """The recorded steps, a precguard recording."""
        return self.path / RECORDING_DIR


class _Info(BaseModel):
    """What the report reads of ``watch.json`` (the rest is kept as written)."""

    model_config = ConfigDict(strict=True, extra="allow")

    schema_version: Int64 = Field(description="Format version.")
    layers: list[str] = Field(description="The watched parameters, in the model's order.")
    model: str = Field(default="", description="The model's class name.")


class _ScalarRow(BaseModel):
    """One line of ``scalars.jsonl``."""

    model_config = ConfigDict(strict=True, extra="allow")

    step: Count
    loss: Stat = None
    grad_norm: Stat = None
    nonfinite: bool | None = None
    lr: list[Stat] | None = None
    recorded: bool | None = None


class _LayerRow(BaseModel):
    """One line of ``layers.jsonl``: a value per watched layer."""

    model_config = ConfigDict(strict=True, extra="allow")

    step: Count
    grad_norm: list[Stat]
    update_ratio: list[Stat]


def _watch_file_limit() -> int:
    """Largest JSONL file of a watch read: an eighth of the memory it may use.

    Every row is held (the page and the CSV draw them all), and a parsed number
    costs a Python float and a list slot, about twice the ~20 bytes it takes as
    text; the rows of the three files are held at once. An eighth keeps the
    whole report within half the memory; a larger file is refused unread.
    """
    return memory_limit() // 8


def _lines(path: Path, model: type[M], what: str) -> list[tuple[int, M]]:
    """Each line of a JSONL file of a watch validated as ``model`` (none if the file is absent).

    Read through :mod:`precguard.dump.untrusted`: a regular file, bounded in size and
    line length, each line's nesting bounded; a truncated last line is skipped with
    a warning, any other bad line refused naming it.
    """
    if not os.path.lexists(path):
        return []
    out = []
    where = shown(path)
    for lineno, line in iter_json_lines(path, what=what, max_bytes=_watch_file_limit()):
        if line is None:
            logger.warning("truncated_last_line_skipped", file=where, line=lineno)
            continue
        value = parse_json(line, where=f"{where} line {lineno}")
        out.append((lineno, validated(model, value, where=f"{where} line {lineno}")))
    return out


def load_watch(path: str | Path) -> WatchRun:
    """Read a watch directory; a directory that is not one is a :class:`DumpFormatError`.

    Every file goes through :mod:`precguard.dump.untrusted` (regular files inside
    the directory, sizes and nesting bounded, numbers finite or the strings
    ``"NaN"``/``"Infinity"``/``"-Infinity"``), so a broken or hostile directory is
    refused with one line naming the file and line.
    """
    root = Path(path)
    if not root.is_dir():
        raise DumpFormatError(f"{shown(root)}: no such watch directory")

    def member(name: str) -> Path:
        return confine(root, name, what=name, inside="the watch directory")

    info_path = member(WATCH_FILE)
    if not info_path.exists():
        raise DumpFormatError(f"{shown(root)}: no {WATCH_FILE}; is it a precguard watch directory?")
    where = shown(root / WATCH_FILE)
    raw = read_json_file(info_path, what="watch.json")
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if type(version) is not int or not 1 <= version <= SCHEMA_VERSION:
        raise DumpFormatError(
            f"{where}: schema_version {shown(repr(version), 40)} is not one this precguard "
            f"reads (1..{SCHEMA_VERSION})"
        )
    info = validated(_Info, raw, where=where)
    layers = info.layers
    run = WatchRun(root, info.model_dump(), layers)
    run.scalars = [r.model_dump() for _, r in _lines(member(SCALARS_FILE), _ScalarRow, "watch row")]
    for lineno, row in _lines(member(LAYERS_FILE), _LayerRow, "watch layer row"):
        for series in ("grad_norm", "update_ratio"):
            values = getattr(row, series)
            if len(values) != len(layers):
                raise DumpFormatError(
                    f"{shown(root / LAYERS_FILE)} line {lineno}: {series} has not one value "
                    f"per layer ({len(layers)})"
                )
        run.per_layer.append(row.model_dump())
    run.alerts = [a for _, a in _lines(member(ALERTS_FILE), Alert, "watch alert")]
    return run


def watch_csv(run: WatchRun) -> str:
    """One row per step: scalars, alert kinds, then per-layer ratio and gradient-norm columns."""
    kinds: dict[int, list[str]] = {}
    for a in run.alerts:
        kinds.setdefault(a.step, []).append(a.kind)
    per_layer = {row["step"]: row for row in run.per_layer}
    head = ["step", "loss", "grad_norm", "nonfinite", "lr", "recorded", "alerts"]
    head += [f"update_ratio:{n}" for n in run.layers] + [f"grad_norm:{n}" for n in run.layers]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(head)
    for s in run.scalars:
        lr = s.get("lr")
        layer_row = per_layer.get(s["step"], {})
        ratios = layer_row.get("update_ratio", [None] * len(run.layers))
        grads = layer_row.get("grad_norm", [None] * len(run.layers))
        writer.writerow(
            [
                s["step"],
                _cell(s.get("loss")),
                _cell(s.get("grad_norm")),
                s.get("nonfinite"),
                _cell(lr[0]) if isinstance(lr, list) and lr else "",
                s.get("recorded"),
                ";".join(kinds.get(s["step"], [])),
                *(_cell(v) for v in ratios),
                *(_cell(v) for v in grads),
            ]
        )
    return buf.getvalue()


def _cell(v: Any) -> Any:
    f = _float(v)
    return "" if f is None else repr(f)


def _line_plot(run: WatchRun, key: str, title: str, *, log: bool) -> str:
    from precguard.report.plots import figure, to_svg

    steps = [s["step"] for s in run.scalars]
    values = [_float(s.get(key)) for s in run.scalars]
    fig = figure(11.0, 3.0)
    ax = fig.add_subplot()
    ax.plot(steps, [math.nan if v is None else v for v in values], lw=1.0, color="#0969da")
    if log and any(v is not None and v > 0 for v in values):
        ax.set_yscale("log")
    for a in run.alerts:
        ax.axvline(a.step, color="#cf222e", lw=0.8, alpha=0.7)
    recorded = [s["step"] for s in run.scalars if s.get("recorded")]
    ax.plot(recorded, [0] * len(recorded), "|", color="#8250df", transform=ax.get_xaxis_transform())
    ax.set_title(f"{title} (red: alerts; purple ticks: recorded steps)", fontsize=10)
    ax.set_xlabel("step")
    return to_svg(fig)


def _panels(run: WatchRun, series: str, title: str) -> str:
    import numpy as np
    from matplotlib.figure import Figure

    from precguard.report.plots import log_floor, positive, to_svg

    named = []
    for a in run.alerts:
        named += [e.layer for e in a.layers if e.layer in run.layers and e.layer not in named]
    order = named + [n for n in run.layers if n not in named]
    shown_layers = order[:MAX_PANELS]
    if not shown_layers or not run.per_layer:
        return "<p class=note>no per-layer data</p>"
    cols = 4
    rows = math.ceil(len(shown_layers) / cols)
    # a fixed grid: constrained layout costs seconds for dozens of axes
    fig = Figure(figsize=(11.0, 1.6 * rows))
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.5 / rows, top=1 - 0.3 / rows, hspace=0.7)
    steps = [row["step"] for row in run.per_layer]
    alert_steps = {name: [a.step for a in run.alerts if name in {e.layer for e in a.layers}]
                   for name in shown_layers}  # fmt: skip
    for k, name in enumerate(shown_layers):
        i = run.layers.index(name)
        values = [_float(row[series][i]) for row in run.per_layer]
        ax = fig.add_subplot(rows, cols, k + 1)
        # log10 on a linear axis: log-scale tick labels are mathtext, parsed per label
        ax.plot(steps, np.log10(positive(values, log_floor(values))), lw=0.8, color="#0969da")
        for step in alert_steps[name]:
            ax.axvline(step, color="#cf222e", lw=0.8)
        ax.set_title(name, fontsize=7)
        ax.locator_params(nbins=3)
        ax.tick_params(labelsize=6)
    more = len(order) - len(shown_layers)
    note = f"<p class=note>{more} more layers in the CSV</p>" if more > 0 else ""
    return f"<h2>{title} (log10)</h2>{to_svg(fig)}{note}"


def _alert_z(alert: Alert) -> float | None:
    """The global z-score, or the largest of the layers' (None for a non-finite alert)."""
    if alert.z is not None:
        return alert.z
    return max((e.z for e in alert.layers if e.z is not None), default=None)


def watch_html(run: WatchRun) -> str:
    """The self-contained HTML page of a watch directory."""
    from precguard.report.page import document, esc, num_cell, table

    rows = []
    for a in run.alerts:
        layers = ", ".join(e.layer for e in a.layers[:8]) + (
            f" (+{len(a.layers) - 8})" if len(a.layers) > 8 else ""
        )
        rows.append(
            f"<tr><td class=n>{a.step}</td><td>{esc(a.kind)}</td><td>{esc(layers)}</td>"
            f"{num_cell(_alert_z(a))}"
            f"<td>{esc(a.message)}</td>"
            f"<td>{'' if a.recorded_step is None else a.recorded_step}</td></tr>"
        )
    steps = len(run.scalars)
    body = [
        f"<h1>precguard watch: {esc(run.info.get('model', ''))}</h1>",
        f"<p>{esc(run.path)}: {steps} steps, {len(run.layers)} layers, "
        f"{len(run.alerts)} alerts; recorded steps in {esc(run.recording)}</p>",
        _line_plot(run, "loss", "loss", log=False),
        _line_plot(run, "grad_norm", "global gradient norm", log=True),
        "<h2>alerts</h2>",
        table(["step", "kind", "layers", "z", "message", "recorded step"], rows, sortable=True)
        if rows
        else "<p>no alerts</p>",
        _panels(run, "update_ratio", "update/param ratio per layer"),
        "<p class=note>per-layer gradient norms: the CSV (grad_norm:LAYER columns)</p>",
    ]
    return document(f"precguard watch {run.path}", "\n".join(body))
