"""A comparison keeps its per-record results compactly, and reads and writes them as before.

compare holds one result per record pair for the whole run; kept as a pydantic
model each, they cost ~3 KB a pair (19 GB for 2M records per side). They are
kept as rows of compact JSON instead (:class:`RecordRows`): these tests check
that what a user reads (``result.records``) and what ``--json`` writes are the
same as with a plain list of models, and that a row stays well under 1 KB.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

import precguard
from precguard.compare import UnmeasuredMetrics, metrics_of
from precguard.compare.report import (
    Comparison,
    Counts,
    RecordResult,
    RecordRows,
    write_comparison_json,
)

from .conftest import FAULTS, record
from .synthetic import record_result


def _result(seq: int, level: str = "full", **metrics: object) -> RecordResult:
    return record_result(
        seq,
        metrics_of({"level": level, "dtype": "float32", **metrics}),
        module=f"model.fc{seq}",
        module_type="Linear",
        golden_dtype="float32",
        shape=[4, 8],
        status="fail",
        local=True,
        amplification=12.5,
    )


def test_rows_give_back_every_value_exactly_even_nan_and_infinity() -> None:
    """A float written as JSON reads back as the same double (shortest repr), NaN and Inf too."""
    results = [
        _result(0, error=1 / 3, rel_l2=2.0**-149, max_abs_err=math.nan, cosine=-0.0),
        _result(1, "stats", error=math.inf, stat_rel_diff={"min": -math.inf, "max": 1e300}),
        # a key not spelled from the fields (an imported dump), notes shared and not
        _result(2, error=0.5, note="statistics only").model_copy(update={"key": "Fn.linear.0"}),
        _result(3, error=0.5, note="statistics only"),
        _result(4, error=0.5, note="shapes differ: golden [4, 8], actual [8, 4]"),
    ]
    rows = RecordRows(results)
    assert len(rows) == 5
    for kept, original in zip(rows, results, strict=True):
        assert kept.model_dump_json() == original.model_dump_json()
    assert math.isnan(rows[0].metrics.max_abs_err)  # type: ignore[union-attr]
    assert rows[1].metrics.stat_rel_diff == {"min": -math.inf, "max": 1e300}  # type: ignore[union-attr]
    assert [r.seq for r in rows[-1:]] == [4]
    assert rows[2].key == "Fn.linear.0" and rows[3].metrics.note == "statistics only"  # type: ignore[union-attr]
    assert rows == RecordRows(results)


def test_counts_and_filters_read_the_status_bytes_not_the_rows() -> None:
    """Counting statuses and levels, and picking the failing rows, agree with the models."""
    missing = _result(2, error=0.0).model_copy(update={"status": "missing", "metrics": None})
    passed = _result(3, error=0.0).model_copy(update={"status": "pass"})
    # compare --layout marks a pass it could not combine missing: it counts at no level
    uncombined = _result(5, error=0.0).model_copy(update={"status": "missing"})
    rows = RecordRows([_result(0, error=1.0), missing, passed, uncombined])
    rows.extend(RecordRows([_result(4, error=2.0)]))
    assert rows.counts().model_dump() == {
        "passed": 1,
        "failed": 2,
        "nonfinite": 0,
        "missing": 2,
        "full": 3,
        "stats_only": 0,
        "shape_mismatch": 0,
        "not_compared": 0,
    }
    assert [r.seq for r in rows.having(["fail"])] == [0, 4]
    assert [r.seq for r in rows.having(["missing", "pass"])] == [2, 3, 5]
    assert rows.counts() == Counts.of(list(rows))


def test_pairs_whose_shapes_differ_count_apart_so_the_counts_add_up() -> None:
    """A pair whose shapes differ (compared at no level) is counted as such (issue 28)."""
    shaped = _result(0, error=math.inf, note="shapes differ").model_copy(
        update={
            "actual_shape": [30, 128],
            "metrics": UnmeasuredMetrics(level="none", dtype="float32", error=math.inf),
        }
    )
    rows = RecordRows([shaped, _result(1, error=0.0).model_copy(update={"status": "pass"})])
    c = rows.counts()
    assert (c.shape_mismatch, c.full, c.failed, c.passed) == (1, 1, 1, 1)
    assert c.passed + c.failed + c.nonfinite == c.full + c.stats_only + c.shape_mismatch
    assert rows[0].actual_shape == [30, 128]
    assert rows.counts() == Counts.of(list(rows))


@pytest.fixture(scope="module")
def diverged(tmp_path_factory: pytest.TempPathFactory) -> Comparison:
    """tiny-llama with its MLP output drifted by 0.1%, against the clean golden."""
    root = tmp_path_factory.mktemp("rows")
    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    golden = record(root / "golden", tensors=False)
    actual = record(root / "actual", fault=fault, tensors=False)
    return precguard.compare_runs(golden, actual)


def test_json_of_a_comparison_is_that_of_its_records_as_a_list(diverged: Comparison) -> None:
    """--json writes what a Comparison holding a list of RecordResult models writes."""
    assert isinstance(diverged.records, RecordRows)
    as_list = diverged.model_copy(update={"records": list(diverged.records)})
    assert diverged.model_dump_json(indent=2) == as_list.model_dump_json(indent=2)
    dumped = diverged.model_dump(mode="json")
    assert dumped["records"] == json.loads(as_list.model_dump_json())["records"]
    assert diverged.verdict == "diverged"
    assert any(r.status == "fail" for r in diverged.records)


def test_a_result_read_back_from_json_is_the_same(diverged: Comparison, tmp_path: Path) -> None:
    """``report`` and ``guard`` read result JSON back: the records come back as rows, equal."""
    path = tmp_path / "result.json"
    path.write_text(diverged.model_dump_json())
    again = Comparison.model_validate_json(path.read_text())
    assert isinstance(again.records, RecordRows)
    assert again.model_dump_json() == diverged.model_dump_json()


def test_a_row_is_a_fraction_of_a_kilobyte(diverged: Comparison) -> None:
    """One statistics-level result (its defaults left out) keeps well under 1 KB."""
    rows = diverged.records
    assert isinstance(rows, RecordRows)
    assert rows.nbytes() / len(rows) < 800  # 572 for tiny-llama (samples, positions)


@pytest.mark.parametrize("indent", [2, None])
def test_streamed_json_is_the_one_string(diverged: Comparison, indent: int | None) -> None:
    """``write_comparison_json`` writes exactly ``model_dump_json``, a record at a time."""
    out = io.StringIO()
    write_comparison_json(diverged, out, indent=indent)
    assert out.getvalue() == diverged.model_dump_json(indent=indent)
    empty = diverged.model_copy(update={"records": RecordRows()})
    out = io.StringIO()
    write_comparison_json(empty, out, indent=indent)
    assert out.getvalue() == empty.model_dump_json(indent=indent)
