"""``compare --csv``: one row per record, in execution order, for a spreadsheet.

The columns are the ones msprobe users read in its comparison table: the
record's name and place (key, module, step, rank, phase, role), both dtypes,
the metrics, the status and whether the module made the error itself. Cells
that hold text a recording names are untrusted: one that a spreadsheet would
take for a formula (starting with ``=``, ``+``, ``-``, ``@``, tab or carriage
return) is written with a leading apostrophe, as OWASP advises against CSV
injection; numbers are written as numbers.
"""

from __future__ import annotations

import csv
import io
import math
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

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _text(value: str) -> str:
    return "'" + value if value.startswith(_FORMULA_START) else value


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
        out[col] = _number(getattr(m, col)) if m else ""
    return out


def comparison_csv(result: Comparison) -> str:
    """Every record of ``result`` as CSV text, in golden execution order."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for i, r in enumerate(result.records):
        writer.writerow(row(i, r))
    return buf.getvalue()


def write_comparison_csv(result: Comparison, path: Path) -> Path:
    """Write :func:`comparison_csv` to ``path`` (a path that cannot be written: exit 2)."""
    from precguard.report.page import write_page

    return write_page(path, comparison_csv(result), what="--csv")
