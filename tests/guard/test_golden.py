"""Goldens kept in git: the same numbers give the same bytes, and a refresh says what it did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import precguard
from precguard import OutputExistsError
from precguard.guard.golden import golden_files, read_golden, write_golden
from precguard.testing import record_model
from tests.guard.models import batch, build


def _record(out: Path, **kwargs) -> Path:
    return record_model(build(), batch(), out, **kwargs)


def test_two_recordings_of_the_same_numbers_give_identical_golden_bytes(tmp_path: Path) -> None:
    first = write_golden(_record(tmp_path / "run1"), tmp_path / "a")
    second = write_golden(_record(tmp_path / "run2"), tmp_path / "b")
    assert (first, second) == ("new", "new")
    a, b = read_golden(tmp_path / "a"), read_golden(tmp_path / "b")
    assert set(a) == {"manifest.json", "rank0/records.jsonl", "rank0/status.json"}
    assert a == b
    # while the recordings themselves differ (time, random id, pid)
    raw1 = (tmp_path / "run1" / "manifest.json").read_bytes()
    assert raw1 != (tmp_path / "run2" / "manifest.json").read_bytes()


def test_a_golden_holds_no_time_host_or_process_and_stays_a_recording(tmp_path: Path) -> None:
    write_golden(_record(tmp_path / "run"), tmp_path / "golden")
    manifest = json.loads((tmp_path / "golden" / "manifest.json").read_text())
    status = json.loads((tmp_path / "golden" / "rank0" / "status.json").read_text())
    assert manifest["created"] == ""
    assert manifest["run_id"].startswith("golden-")
    assert (status["host"], status["pid"], status["complete"]) == ("", None, True)
    for data in read_golden(tmp_path / "golden").values():
        assert b"\r\n" not in data
    run = precguard.load_run(tmp_path / "golden")
    assert run.manifest.complete and len(list(run.records(0))) > 10
    # a fresh run compares with it (its id is a content digest, not a copy's id)
    result = precguard.compare_runs(tmp_path / "golden", _record(tmp_path / "again"))
    assert result.verdict == "match" and result.counts.failed == 0


def test_rewriting_the_same_numbers_leaves_the_golden_untouched(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    write_golden(_record(tmp_path / "run1"), golden)
    records = golden / "rank0" / "records.jsonl"
    before = records.stat().st_mtime_ns
    assert write_golden(_record(tmp_path / "run2"), golden) == "unchanged"
    assert records.stat().st_mtime_ns == before


def test_a_changed_model_refreshes_the_golden_and_changes_its_id(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    write_golden(_record(tmp_path / "run1"), golden)
    old = read_golden(golden)
    (golden / "NOTES.md").write_text("why this golden changed\n")
    model = build()
    with torch.no_grad():
        model.layers[1].down.weight.mul_(1.001)
    assert write_golden(record_model(model, batch(), tmp_path / "run2"), golden) == "refreshed"
    new = read_golden(golden)
    assert new["rank0/records.jsonl"] != old["rank0/records.jsonl"]
    assert json.loads(new["manifest.json"])["run_id"] != json.loads(old["manifest.json"])["run_id"]
    assert (golden / "NOTES.md").read_text() == "why this golden changed\n"  # the user's file stays


def test_a_folder_that_is_not_a_golden_is_never_overwritten(tmp_path: Path) -> None:
    folder = tmp_path / "golden"
    folder.mkdir()
    (folder / "data.csv").write_text("1,2,3\n")
    with pytest.raises(OutputExistsError, match="not a precguard recording"):
        write_golden(_record(tmp_path / "run"), folder)
    assert (folder / "data.csv").read_text() == "1,2,3\n"
    assert not (folder / "manifest.json").exists()


def test_full_tensors_are_kept_only_where_asked(tmp_path: Path) -> None:
    small = golden_files(_record(tmp_path / "stats"))
    full = golden_files(_record(tmp_path / "full", tensors=["layers.1.*"]))
    assert not any(name.endswith(".safetensors") for name in small)
    tensor_files = [name for name in full if name.endswith(".safetensors")]
    assert len(tensor_files) == 1
    saved = [
        json.loads(line) for line in full["rank0/records.jsonl"].splitlines() if b'"tensor"' in line
    ]
    assert saved and all(r["module"].startswith("layers.1") for r in saved)
    # the bytes of full tensors are as deterministic as the statistics
    again = golden_files(_record(tmp_path / "full2", tensors=["layers.1.*"]))
    assert again == full
