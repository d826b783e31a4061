"""compare's record store keeps what repeats once per store, and reads back every result.

A statistics-only comparison puts the same long note on every pair and the
same few sets of fields on every row: kept in each row they would double its
size. These tests check that they cost once per store (not per row, and not in
a table shared by every comparison of the process), and that rows added from
another store read back as they were.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import precguard
from precguard.compare import StatsMetrics
from precguard.compare.report import RecordResult, RecordRows, write_comparison_json

from .conftest import FAULTS, record
from .synthetic import record_result

_NOTE = "statistics only: " + "the tensors were not recorded; " * 16


def _result(seq: int, *, note: str | None = _NOTE, **metrics: object) -> RecordResult:
    return record_result(
        seq,
        StatsMetrics(level="stats", dtype="bfloat16", error=1e-3, note=note, **metrics),  # type: ignore[arg-type]
        module=f"model.layers.{seq}.mlp",
        module_type="LlamaMLP",
        golden_dtype="bfloat16",
        shape=[2, 16, 64],
        status="pass",
    )


def test_a_note_on_every_row_costs_once_per_store() -> None:
    """1000 statistics-only pairs with a 500-character note keep well under the note a row."""
    results = [_result(i, sample_size=64, sample_rel_l2=i * 1e-6) for i in range(1000)]
    rows = RecordRows(results)
    assert len(_NOTE) > 500
    assert rows.nbytes() / len(rows) < 150  # the values only; the names and note once
    assert [r.model_dump_json() for r in rows] == [r.model_dump_json() for r in results]


def test_rows_from_another_store_read_back_as_they_were() -> None:
    """Stores with their own notes and field sets, joined, give back every result."""
    first = [_result(0), _result(1, note="shapes differ"), _result(2, note=None)]
    missing = _result(3).model_copy(update={"status": "missing", "metrics": None})
    second = [
        _result(4, note="another note", pos_dim=1, pos_rel_l2=math.inf),
        missing,
        _result(5).model_copy(update={"key": "Fn.linear.5"}),  # a key not spelled from fields
    ]
    rows = RecordRows(first)
    rows.extend(RecordRows(second))
    rows.append(_result(6, note="shapes differ"))
    expected = [*first, *second, _result(6, note="shapes differ")]
    assert [r.model_dump_json() for r in rows] == [r.model_dump_json() for r in expected]
    assert rows[-3].metrics is None and rows[-2].key == "Fn.linear.5"
    assert rows == RecordRows(expected)
    assert rows != RecordRows([*expected[:-1], _result(6, note="a third note")])


def test_stores_share_nothing() -> None:
    """Thousands of distinct notes in one store leave another's rows as they were."""
    kept = RecordRows([_result(0, note="kept")])
    RecordRows([_result(i, note=f"note {i}") for i in range(5000)])
    assert kept[0].metrics is not None and kept[0].metrics.note == "kept"


def test_json_of_a_full_tensor_comparison_is_that_of_its_models(
    tiny_golden: Path, tmp_path: Path
) -> None:
    """--json of a full-tensor case (an fp16 norm planted) is what a list of models writes.

    The JSON compare wrote before the store changed was checked equal byte for
    byte by hand (this case and a statistics-only one; too large to keep here):
    the models are unchanged, so this comparison holds it from now on.
    """
    fault = next(f for f in FAULTS if f.name == "rmsnorm-fp16-first-layer")
    result = precguard.compare_runs(tiny_golden, record(tmp_path / "actual", fault=fault))
    assert result.verdict == "diverged" and result.first_divergence is not None
    out = io.StringIO()
    write_comparison_json(result, out)
    as_list = result.model_copy(update={"records": list(result.records)})
    assert out.getvalue() == as_list.model_dump_json(indent=2)
    levels = {r.metrics.level for r in result.records if r.metrics is not None}
    assert "full" in levels
