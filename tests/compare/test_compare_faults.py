"""The fault-injection suite: plant a fault in one named module, record, compare, and
check that compare names that module, on the same backend and under background noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import precguard
from tests.compare.conftest import FAULTS, Fault, record, run_cli


@pytest.mark.parametrize("noise", [False, True], ids=["same-backend", "background-noise"])
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_planted_fault_is_named(
    fault: Fault, noise: bool, tiny_golden: Path, tmp_path: Path
) -> None:
    actual = record(tmp_path / "actual", fault=fault, noise=noise)

    result = precguard.compare_runs(tiny_golden, actual)

    assert result.verdict == "diverged"
    fd = result.first_divergence
    assert fd is not None
    assert fd.module == fault.module, fd.reason
    assert fd.local is True
    assert fd.step == 0 and fd.rank == 0
    # the modules that contain the fault are explained by it, not suspects
    assert all(not fault.module.startswith(s.module + ".") for s in result.suspects)


def test_background_noise_alone_matches(tiny_golden: Path, tmp_path: Path) -> None:
    actual = record(tmp_path / "noise", noise=True)

    result = precguard.compare_runs(tiny_golden, actual)

    assert result.verdict == "match", [
        (r.key, r.metrics.error) for r in result.records if r.status != "pass"
    ]
    # the noise is real: some records differ, within tolerance
    assert any(r.metrics and r.metrics.error > 0 for r in result.records)
    assert result.first_divergence is None


def test_same_model_twice_matches_exit_0(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    again = record(tmp_path / "again")
    report = tmp_path / "cmp.json"

    args = ["compare", str(tiny_golden), str(again), "--json", str(report)]
    code, out, err = run_cli(args, capsys)

    assert code == 0, err
    assert "MATCH" in out
    data = json.loads(report.read_text())
    assert data["verdict"] == "match"
    assert data["first_divergence"] is None
    assert data["counts"]["failed"] == 0 and data["counts"]["missing"] == 0
    assert all(r["status"] == "pass" for r in data["records"])


def test_whole_model_bf16_vs_fp32_matches_within_bf16_exit_0(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bf16 = record(tmp_path / "bf16", dtype="bfloat16")

    code, out, _ = run_cli(["compare", str(tiny_golden), str(bf16)], capsys)

    # rounding to bf16 is not a fault: every record is judged by bf16's precision
    assert code == 0, out
    assert "matches within bfloat16 precision" in out


def test_whole_model_bf16_held_to_fp32_diverges_exit_1(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bf16 = record(tmp_path / "bf16", dtype="bfloat16")

    args = ["compare", str(tiny_golden), str(bf16), "--tolerance-dtype", "golden", "--json", "-"]
    code, out, err = run_cli(args, capsys)

    assert code == 1, err
    data = json.loads(out)
    assert data["verdict"] == "diverged"
    fd = data["first_divergence"]
    # held to fp32, the first thing bf16 changes is the first weight it rounds
    assert fd["module"] == "model.embed_tokens" and fd["local"] is True
    assert "bfloat16" in fd["reason"]
    assert fd["metrics"]["dtype"] == "float32"


def test_terminal_summary_highlights_first_divergence(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    actual = record(tmp_path / "drift", fault=fault)

    code, out, _ = run_cli(["compare", str(tiny_golden), str(actual), "--top", "3"], capsys)

    assert code == 1
    assert "DIVERGED" in out and "first divergence" in out
    assert fault.module in out
    assert "top 3 records by error" in out
    assert "pass" in out and "fail" in out


def test_stats_only_recordings_still_localize(tmp_path: Path) -> None:
    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    golden = record(tmp_path / "g", tensors=False)
    actual = record(tmp_path / "a", fault=fault, tensors=False)

    result = precguard.compare_runs(golden, actual)

    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.module == fault.module
    assert result.first_divergence.metrics.level == "stats"
    assert "weaker" in (result.first_divergence.metrics.note or "")
    assert result.counts.stats_only > 0 and result.counts.full == 0
