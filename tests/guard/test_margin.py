"""The margin: measured error / allowed error, from what a comparison records."""

from __future__ import annotations

import math
from types import SimpleNamespace

from precguard.compare import metrics_of
from precguard.guard.margin import allowed_error, record_margin

TOLERANCES = {
    "float32": {"rel_l2": 2.6e-6, "stats_rtol": 2.6e-6},
    "bfloat16": {"rel_l2": 0.048, "stats_rtol": 0.024},
}


def _record(status: str = "pass", **metrics: object) -> SimpleNamespace:
    fields = {"level": "stats", "dtype": "float32", "error": 0.0, **metrics}
    if fields["level"] == "exact":
        fields.setdefault("mismatched", 0)
    # a record of a report written before the verdict stored its allowed error
    return SimpleNamespace(
        key="m.0.forward.output.0",
        module="m",
        status=status,
        metrics=metrics_of(fields),
        allowed_error=None,
    )


def test_the_allowed_error_is_the_profiles_bound_for_the_level_and_dtype() -> None:
    assert allowed_error(_record(level="full"), TOLERANCES) == 2.6e-6
    assert allowed_error(_record(dtype="bfloat16"), TOLERANCES) == 0.024
    assert allowed_error(_record(dtype="float16"), TOLERANCES) == 2.6e-6  # float32's fallback
    assert allowed_error(_record(level="exact"), TOLERANCES) is None


def test_a_records_own_allowed_error_wins_over_the_profile() -> None:
    record = _record(error=1e-6)
    record.allowed_error = 4e-6
    margin = record_margin(record, TOLERANCES)
    assert margin is not None and math.isclose(margin.margin, 0.25)


def test_margins_of_every_kind_of_record() -> None:
    def margin_of(record: SimpleNamespace) -> float:
        found = record_margin(record, TOLERANCES)
        assert found is not None
        return found.margin

    assert math.isclose(margin_of(_record(error=1.3e-6)), 0.5)
    assert math.isclose(margin_of(_record(status="fail", error=2.6e-5)), 10.0)
    assert margin_of(_record(status="nonfinite", error=0.0, nan_mismatch=3)) == math.inf
    assert margin_of(_record(level="exact", error=0.5, mismatched=2)) == math.inf
    assert margin_of(_record(level="exact")) == 0.0
    assert record_margin(_record(level="none"), TOLERANCES) is None
    missing = SimpleNamespace(key="k", module="m", status="missing", metrics=None)
    assert record_margin(missing, TOLERANCES) is None
