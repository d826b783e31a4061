"""The frame every precguard HTML report shares: one self-contained file.

Everything a report shows is inline: the CSS below, the SVG plots
(:mod:`precguard.report.plots`) and a few lines of JavaScript that sort and
filter tables. Nothing is fetched, so the file opens offline from an email
attachment. Every string a recording, a target or a check names is untrusted
text and passes through :func:`esc` (``html.escape`` with quotes) before it
reaches the page.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

#: status colours shared by the comparison and the diagnosis reports
STATUS_COLOR = {
    "pass": "#1a7f37",
    "match": "#1a7f37",
    "warn": "#9a6700",
    "partial": "#9a6700",
    "inconclusive": "#9a6700",
    "missing": "#9a6700",
    "fail": "#cf222e",
    "diverged": "#cf222e",
    "skip": "#6e7781",
    "error": "#8250df",
    "nonfinite": "#8250df",
}

_CSS = """
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
  padding: 1.2em 2em 3em; max-width: 110em; color: #1f2328; line-height: 1.4; }
h1 { font-size: 1.5em; margin: .2em 0; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
h3 { font-size: 1.05em; margin: 1em 0 .3em; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 90%; word-break: break-all; }
.sub { color: #57606a; }
.verdict { font-size: 1.4em; font-weight: 700; }
.box { border: 2px solid #cf222e; border-radius: 6px; padding: .6em 1em; margin: .8em 0;
  background: #fff8f8; }
.box.ok { border-color: #1a7f37; background: #f6fff8; }
.box.warn { border-color: #9a6700; background: #fffbeb; }
.box dl { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; margin: .4em 0; }
.box dt { font-weight: 600; color: #57606a; }
.box dd { margin: 0; }
.cmd { background: #f6f8fa; border: 1px solid #d0d7de; padding: .4em .6em; display: block;
  white-space: pre-wrap; word-break: normal; overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: .4em 0; font-size: 92%; }
td, th { border-bottom: 1px solid #d0d7de; padding: .25em .6em; vertical-align: top;
  text-align: left; }
th { background: #f6f8fa; }
thead th { position: sticky; top: 0; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort=ascending]::after { content: " \\25B2"; }
table.sortable th[aria-sort=descending]::after { content: " \\25BC"; }
.scroll { max-height: 38em; overflow: auto; border: 1px solid #d0d7de; }
.filter { margin: .4em 0; display: flex; gap: .8em; align-items: center; flex-wrap: wrap; }
.filter input { width: 24em; padding: .2em .4em; }
.st { font-weight: 700; }
.plot svg { width: 100%; height: auto; max-width: 100em; }
.finding .plot svg { max-width: 56em; }
.multiples { display: grid; grid-template-columns: repeat(auto-fill, minmax(30em, 1fr)); gap: 1em; }
details { margin: .4em 0; }
summary { cursor: pointer; }
.remedy { margin: .3em 0; color: #1f2328; background: #f6f8fa; padding: .3em .6em;
  border-left: 3px solid #0969da; }
.finding { border-left: 4px solid #d0d7de; padding: .2em .8em; margin: .6em 0; }
.note { color: #57606a; font-size: 92%; }
.wide { overflow-x: auto; max-width: 100%; }
td.name { white-space: nowrap; }
td.name code { word-break: normal; }
table.kv td.n { text-align: left; }
ul.evidence { margin: .2em 0; padding-left: 1.4em; }
"""

# Sorting compares data-v (numbers) when every cell has one, else the text;
# filtering hides rows whose text lacks the query or whose status differs.
_JS = """
(function () {
  function key(cell) {
    var v = cell.getAttribute('data-v');
    return v === null ? cell.textContent.trim().toLowerCase() : parseFloat(v);
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.querySelectorAll('thead th');
    heads.forEach(function (th, col) {
      th.addEventListener('click', function () {
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        heads.forEach(function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[col]), y = key(b.cells[col]);
          if (typeof x === 'number' && typeof y === 'number') {
            if (isNaN(x)) { return 1; }
            if (isNaN(y)) { return -1; }
            return asc ? x - y : y - x;
          }
          x = String(x); y = String(y);
          return asc ? x.localeCompare(y) : y.localeCompare(x);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  document.querySelectorAll('[data-filter-for]').forEach(function (box) {
    var table = document.getElementById(box.getAttribute('data-filter-for'));
    var text = box.querySelector('input');
    var status = box.querySelector('select');
    var shown = box.querySelector('.count');
    function apply() {
      var q = text.value.trim().toLowerCase();
      var s = status ? status.value : '';
      var n = 0;
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var ok = (!q || row.textContent.toLowerCase().indexOf(q) >= 0) &&
                 (!s || row.getAttribute('data-status') === s);
        row.style.display = ok ? '' : 'none';
        if (ok) { n += 1; }
      });
      if (shown) { shown.textContent = n + ' shown'; }
    }
    text.addEventListener('input', apply);
    if (status) { status.addEventListener('change', apply); }
    apply();
  });
})();
"""


def esc(value: object) -> str:
    """``value`` as HTML text: every ``<``, ``&`` and quote escaped (untrusted names)."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def number(x: object, digits: int = 3) -> str:
    """A number with ``digits`` significant digits; '-' for None; text as is (e.g. 'NaN')."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return str(x) if not math.isfinite(x) else f"{x:.{digits}g}"
    return str(x)


def sort_value(x: object) -> str:
    """The ``data-v`` attribute a sortable numeric cell carries ('' for text)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return ""
    return f' data-v="{x!r}"' if math.isfinite(x) else ' data-v="NaN"'


def num_cell(x: object, digits: int = 3) -> str:
    """A right-aligned table cell for a number, sortable by value."""
    return f"<td class=n{sort_value(x)}>{esc(number(x, digits))}</td>"


def status_span(status: str, label: str | None = None) -> str:
    """A coloured status word."""
    color = STATUS_COLOR.get(status, "#1f2328")
    return f"<span class=st style='color:{color}'>{esc(label or status)}</span>"


def table(
    head: Sequence[str],
    rows: Iterable[str],
    *,
    table_id: str | None = None,
    sortable: bool = False,
) -> str:
    """A table from already rendered ``<tr>`` rows; ``head`` is plain (escaped) text."""
    cls = " class=sortable" if sortable else ""
    ident = f" id={esc(table_id)}" if table_id else ""
    ths = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f"<table{ident}{cls}><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def filter_box(table_id: str, statuses: Sequence[str] = ()) -> str:
    """A text filter (and a status menu) for the sortable table ``table_id``."""
    options = "".join(f"<option value='{esc(s)}'>{esc(s)}</option>" for s in statuses)
    select = f"<select aria-label='status'><option value=''>any status</option>{options}</select>"
    return (
        f"<div class=filter data-filter-for='{esc(table_id)}'>"
        "<input type=search placeholder='filter: module, key, dtype...' aria-label='filter'>"
        f"{select if statuses else ''}<span class='count note'></span></div>"
    )


def document(title: str, body: str) -> str:
    """The whole page: ``body`` (already escaped HTML) inside the shared frame."""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>\n"
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style></head>\n<body>\n{body}\n"
        f"<script>{_JS}</script>\n</body></html>\n"
    )


def ensure_writable(**paths: Path | None) -> None:
    """Refuse, before a long run, an output whose folder does not exist or is a file.

    >>> ensure_writable(html=None, csv=None)   # nothing asked, nothing to check
    """
    from precguard.errors import UsageError

    for option, path in paths.items():
        if path is None:
            continue
        if path.is_dir():
            raise UsageError(f"--{option} {path}: is a directory; give a file name")
        if not path.parent.is_dir():
            raise UsageError(f"--{option} {path}: the folder {path.parent} does not exist")


def write_page(path: Path, text: str, what: str = "--html") -> Path:
    """Write a report to ``path`` atomically; a path that cannot be written is a usage error.

    A reader (a CI step, a browser reloading) sees the old file or the new one,
    never half (:func:`precguard.dump.atomic.write_atomic`).
    """
    from precguard.dump.atomic import write_atomic

    return write_atomic(path, text, what=what)
