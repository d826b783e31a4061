"""The margin of a comparison: measured error ÷ allowed error, record by record.

A precision test that passes with a margin of 0.9 is one kernel update away
from failing; one at 0.001 is not. The margin shows that drift before it
fails: 0 for identical numbers, 1 at the edge of what the verdict accepts,
above 1 for a record that fails on its error.

The allowed error is the threshold the record's error was held to, as the verdict
stored it (``RecordResult.allowed_error``, written once by compare's one pass,
compare/verdict.py, whichever rule settled the record: the expected error times the
amplification, an optimizer step's allowance, the profile's tolerance). Under the
expected-error judge the margin is the record's amplification over the threshold (its
global or its concentrated error, whichever is nearer failing). A report written before
the field existed falls back to the tolerance of the record's judging dtype in the
comparison's profile (``rel_l2`` for full tensors, ``stats_rtol`` for statistics). A
record judged by another rule as well (cosine, a systematic bias) can fail with a
margin under 1: its status says so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from precguard.compare.report import Comparison, RecordResult

#: the tolerance field that bounds ``Metrics.error`` at each comparison level
_BOUND = {"full": "rel_l2", "stats": "stats_rtol"}


class RecordMargin(BaseModel):
    """How close one compared record came to its allowed error."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    key: str = Field(description="Record key (the golden's).")
    module: str = Field(description="Qualified module name.")
    status: str = Field(description="The record's status in the comparison.")
    level: str = Field(description="'full', 'stats' or 'exact': what was compared.")
    dtype: str = Field(description="dtype whose tolerance judged the record.")
    error: float = Field(description="Measured error (Metrics.error).")
    allowed: float | None = Field(
        description="The error the record was allowed (None: not a threshold test)."
    )
    margin: float = Field(
        description="error / allowed: 0 identical, 1 at the limit, inf for NaN/Inf mismatch "
        "or unequal integers."
    )


def allowed_error(record: RecordResult, tolerances: dict[str, Any]) -> float | None:
    """The threshold ``record``'s error was held to, from the comparison's ``tolerances``.

    None for records not judged on an error threshold (missing, exact, nothing comparable).
    """
    metrics = record.metrics
    if metrics is None or metrics.level not in _BOUND:
        return None
    # the bound the verdict held the record to; the profile's for a report without it
    if record.allowed_error is not None:
        return record.allowed_error
    tol = tolerances.get(metrics.dtype) or tolerances.get("float32")
    if not isinstance(tol, dict):
        return None
    bound = tol.get(_BOUND[metrics.level])
    return float(bound) if isinstance(bound, int | float) else None


def record_margin(
    record: RecordResult, tolerances: dict[str, Any], threshold: float | None = None
) -> RecordMargin | None:
    """The margin of one record, or None for a record that was not compared.

    ``threshold``: the expected-error judge's amplification limit, when it judged the
    comparison (a record's ``amplification`` over it is then its margin).
    """
    metrics = record.metrics
    if metrics is None or record.status == "missing" or metrics.level == "none":
        return None
    allowed = allowed_error(record, tolerances)
    judged = threshold is not None and record.expected_error is not None
    if record.status == "nonfinite":
        margin = math.inf
    elif metrics.level == "exact":
        margin = math.inf if metrics.mismatched else 0.0
    elif judged and threshold and record.amplification is not None:
        margin = record.amplification / threshold
    elif allowed is None or not math.isfinite(metrics.error):
        margin = math.inf if metrics.error else 0.0
    elif allowed <= 0 or math.isinf(allowed):
        margin = 0.0 if metrics.error == 0 or math.isinf(allowed) else math.inf
    else:
        margin = metrics.error / allowed
    return RecordMargin(
        key=record.key,
        module=record.module,
        status=record.status,
        level=metrics.level,
        dtype=metrics.dtype,
        error=metrics.error,
        allowed=allowed,
        margin=margin,
    )


def judge_threshold(profile: str) -> float | None:
    """The amplification limit of ``profile`` if the expected-error judge is its rule."""
    from precguard.compare.tolerance import get_profile
    from precguard.errors import PrecguardError

    try:
        prof = get_profile(profile)
    except (PrecguardError, KeyError, ValueError):
        return None
    return prof.amplification if prof.rule == "expected" else None


def margins(comparison: Comparison) -> list[RecordMargin]:
    """Every compared record's margin, in the comparison's (execution) order."""
    threshold = judge_threshold(comparison.profile)
    found = (record_margin(r, comparison.tolerances, threshold) for r in comparison.records)
    return [m for m in found if m is not None]


def worst_margin(comparison: Comparison) -> RecordMargin | None:
    """The record with the largest margin (the first in execution order on a tie).

    None when nothing was compared.
    """
    worst: RecordMargin | None = None
    for m in margins(comparison):
        if worst is None or m.margin > worst.margin:
            worst = m
    return worst
