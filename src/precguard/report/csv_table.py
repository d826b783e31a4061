"""``compare --csv``: one row per record, in execution order, for a spreadsheet.

The columns are the ones msprobe users read in its comparison table: the
record's name and place (key, module, step, rank, phase, role), both dtypes,
the metrics, the status and whether the module made the error itself.

Cells that hold text a recording names are untrusted, and a spreadsheet must
neither split them into rows or columns nor evaluate them (CSV injection):

* every cell is quoted (numbers too: spreadsheets still read quoted numbers as
  numbers; ``csv.QUOTE_ALL``);
* control characters (CR, LF, tab, the Unicode line separators) are written
  as visible escapes (``\\r``, ``\\n``, ``\\t``, ``\\u2028``), so no cell ends a row
  in a program that ignores quotes around a bare CR;
* a text that starts, after any whitespace, with ``=``, ``+``, ``-``, ``@`` (or
  their full-width forms) gets a leading apostrophe, as OWASP advises; so does
  each part after a ``,`` ``;`` or ``|`` inside a cell, as a program that reads
  the file with another separator (``;`` in many locales) would start a cell there.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from precguard.compare.report import Comparison, RecordResult

#: metric columns, in the order written (Metrics field names)
METRIC_COLUMNS: tuple[str, ...] = (
    "error",
    "rel_l2",
    "cosine",
    "max_abs_err",
    "mean_abs_err",
    "max_rel_err",
    "rmse",
    "max_ulp",
    "close_share",
    "scale",
    "mean_rel_err",
    "nan_mismatch",
    "inf_mismatch",
    "mismatched",
)

COLUMNS: tuple[str, ...] = (
    "index",
    "key",
    "actual_key",
    "module",
    "module_type",
    "step",
    "rank",
    "phase",
    "role",
    "golden_dtype",
    "actual_dtype",
    "shape",
    "status",
    "local",
    "level",
    "tolerance_dtype",
    *METRIC_COLUMNS,
    "expected_error",
    "amplification",
    "bias",
)

#: first characters that make a spreadsheet read a cell as a formula (with full-width forms)
_FORMULA_START = frozenset("=+-@\uff1d\uff0b\uff0d\uff20")
#: characters that end a row or a cell in some reader, or that a reader may drop
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_ESCAPES = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}
#: separators a spreadsheet may split a line on, other than the file's own ","
_SEPARATOR = re.compile(r"([,;|])")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    return _ESCAPES.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def _defuse(part: str) -> str:
    stripped = part.lstrip().lstrip('"')
    return "'" + part if stripped[:1] in _FORMULA_START else part


def _text(value: str) -> str:
    """``value`` as a cell no spreadsheet splits or evaluates (see the module doc)."""
    value = _CONTROL.sub(_escape, value)
    if not _SEPARATOR.search(value):
        return _defuse(value)
    return "".join(_defuse(part) for part in _SEPARATOR.split(value))


def _number(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # 'nan', 'inf': what spreadsheets and pandas read back
    return value


def row(index: int, r: RecordResult) -> dict[str, Any]:
    """The CSV row of one record."""
    m = r.metrics
    out: dict[str, Any] = {
        "index": index,
        "key": _text(r.key),
        "actual_key": _text(r.actual_key or ""),
        "module": _text(r.module),
        "module_type": _text(r.module_type),
        "step": r.step,
        "rank": r.rank,
        "phase": r.phase,
        "role": r.role,
        "golden_dtype": _text(r.golden_dtype),
        "actual_dtype": _text(r.actual_dtype or ""),
        "shape": "x".join(str(d) for d in r.shape),
        "status": r.status,
        "local": _number(r.local),
        "level": m.level if m else "",
        "tolerance_dtype": _text(m.dtype) if m else "",
        "expected_error": _number(r.expected_error),
        "amplification": _number(r.amplification),
        "bias": _number(m.bias) if m else "",
    }
    for col in METRIC_COLUMNS:
        # a column its level does not measure is empty, as a missing record's
        out[col] = _number(getattr(m, col, None)) if m else ""
    return out


def comparison_csv(result: Comparison) -> str:
    """Every record of ``result`` as CSV text, in golden execution order."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writeheader()
    for i, r in enumerate(result.records):
        writer.writerow(row(i, r))
    return buf.getvalue()


def write_comparison_csv(result: Comparison, path: Path) -> Path:
    """Write :func:`comparison_csv` to ``path`` (a path that cannot be written: exit 2)."""
    from precguard.report.page import write_page

    return write_page(path, comparison_csv(result), what="--csv")
