"""rank{R}/vendor.jsonl: what a backend keeps after each step, written by dump/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from precguard import Backend
from precguard.dump.vendor import record_vendor_state


class RegisterBackend(Backend):
    """A chip that keeps a register dump per step and reports its temperature."""

    device_type = "chip"

    def vendor_state(self, step: int, out_dir: Path) -> dict[str, Any] | None:
        if step == 1:
            return None  # nothing worth keeping this step
        if step == 3:
            raise RuntimeError("status register unreadable")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"step{step}.bin").write_bytes(b"\x00\x01")
        return {"temperature_c": 61}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_step_appends_one_line_and_larger_files_go_to_the_backends_folder(
    tmp_path: Path,
) -> None:
    backend = RegisterBackend("chip:1")
    first = record_vendor_state(backend, tmp_path, 0, rank=1)
    assert first == {"step": 0, "device": "chip:1", "state": {"temperature_c": 61}}
    assert record_vendor_state(backend, tmp_path, 1, rank=1) is None
    record_vendor_state(backend, tmp_path, 2, rank=1)
    assert _lines(tmp_path / "rank1" / "vendor.jsonl") == [
        first,
        {"step": 2, "device": "chip:1", "state": {"temperature_c": 61}},
    ]
    assert (tmp_path / "rank1" / "vendor" / "chip" / "step2.bin").is_file()


def test_a_backend_that_keeps_nothing_writes_no_file(tmp_path: Path) -> None:
    assert record_vendor_state(Backend("cpu"), tmp_path, 0) is None
    assert not any(tmp_path.iterdir())


def test_a_failing_vendor_state_is_kept_as_evidence_and_the_recording_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    line = record_vendor_state(RegisterBackend("chip"), tmp_path, 3)
    assert line == {
        "step": 3,
        "device": "chip",
        "error": "RegisterBackend.vendor_state raised RuntimeError: status register unreadable",
    }
    assert _lines(tmp_path / "rank0" / "vendor.jsonl") == [line]
    assert "vendor_state_failed" in caplog.text
