"""compare says what it did not compare, before anything else, and never a bare MATCH for it.

The story: a user records a 5-step training golden of their hand-written
decoder with ``precguard.monitor()`` in their own script, then a 1-step eval
run with ``precguard record`` — or compares a recording with itself, or a run
that crashed half-way.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import precguard
from precguard.cli import main
from precguard.compare import SameRecordingError

TARGET = Path(__file__).resolve().parents[1] / "targets" / "handwritten" / "target.py"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return info.value.code or 0, out, err


def monitor_golden(out: Path, *, steps: int, train: bool, raise_at: int | None = None) -> Path:
    """Record the hand-written decoder the way a user's own script would."""
    target = precguard.load_target(str(TARGET))
    torch.manual_seed(target.seed)
    model = target.model().train(train)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with (
        torch.set_grad_enabled(train),
        precguard.monitor(
            model, out=out, backward=train, params="every_step", auto_step=False
        ) as mon,
    ):
        for step in range(steps):
            if step == raise_at:
                raise RuntimeError("data loader died")
            ids = target.batch(step)
            logits = model(ids)
            if train:
                target.loss(logits, ids).backward()
                opt.step()
                opt.zero_grad()
            mon.step()
    return out


@pytest.fixture(scope="module")
def golden_train5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return monitor_golden(tmp_path_factory.mktemp("cov") / "golden", steps=5, train=True)


@pytest.fixture(scope="module")
def actual_eval1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One eval step recorded by the real CLI, run from another folder than the target's."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    proc = subprocess.run(
        [sys.executable, "-m", "precguard", "record", "-t", str(TARGET), "-o", "actual"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return cwd / "actual"


def test_target_file_imports_the_module_beside_it(actual_eval1: Path) -> None:
    run = precguard.load_run(actual_eval1)
    assert run.manifest.complete and run.manifest.model == "HandwrittenDecoder"
    assert {"layers.1.attn.qkv", "layers.0.mlp.down"} <= {r.module for r in run.records()}


def test_training_golden_against_one_eval_step_is_a_partial_match(
    golden_train5: Path, actual_eval1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "cmp.json"
    code, out, _ = run_cli(
        ["compare", str(golden_train5), str(actual_eval1), "--json", str(report)], capsys
    )

    assert code == 3
    lines = out.splitlines()
    assert lines[0].startswith("not compared:")
    gaps = " ".join(line for line in lines if not line.startswith(("PARTIAL", "MATCH")))
    assert "4 of 5 steps: golden holds 5, actual 1, 1 compared" in gaps
    assert "the backward pass, recorded only in golden" in gaps
    assert any(line.startswith("PARTIAL MATCH") for line in lines)
    assert not any(line.startswith("MATCH") for line in lines)

    data = json.loads(report.read_text())
    assert data["verdict"] == "match"  # what was compared does match ...
    cov = data["coverage"]  # ... but that was only part of the recordings
    assert cov["complete"] is False
    assert (cov["steps_compared"], cov["golden_steps"], cov["actual_steps"]) == (1, 5, 1)
    assert cov["phases_compared"] == ["forward"]
    assert cov["phases_only_in_golden"] == ["backward"]
    # the golden's backward records were set aside, not counted as missing
    assert data["counts"]["missing"] == 0 and data["counts"]["passed"] > 0
    # the API's result carries the CLI's exit code
    result = precguard.compare_runs(golden_train5, actual_eval1)
    assert result.verdict == "match" and result.exit_code == precguard.ExitCode.INCONCLUSIVE == 3


def test_allow_partial_accepts_the_narrower_comparison(
    golden_train5: Path, actual_eval1: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        ["compare", str(golden_train5), str(actual_eval1), "--allow-partial"], capsys
    )
    assert code == 0
    assert out.startswith("not compared:")  # still said, first


def test_the_same_steps_and_phases_are_a_complete_match(
    actual_eval1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = monitor_golden(tmp_path / "golden", steps=1, train=False)
    code, out, _ = run_cli(["compare", str(golden), str(actual_eval1)], capsys)
    assert code == 0, out
    assert out.startswith("MATCH")
    assert precguard.compare_runs(golden, actual_eval1).coverage.complete


def test_a_recording_compared_with_itself_is_refused(
    actual_eval1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["compare", str(actual_eval1), str(actual_eval1)], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "same recording" in err

    copy = tmp_path / "copy"
    shutil.copytree(actual_eval1, copy)
    with pytest.raises(SameRecordingError, match="a copy"):
        precguard.compare_runs(actual_eval1, copy)


def test_an_incomplete_run_is_said_first(
    golden_train5: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = monitor_golden(tmp_path / "golden", steps=3, train=False)
    with pytest.raises(RuntimeError, match="data loader died"):
        monitor_golden(tmp_path / "crashed", steps=3, train=False, raise_at=2)
    crashed = precguard.load_run(tmp_path / "crashed")
    assert crashed.manifest.complete is False
    assert crashed.manifest.error is not None
    assert crashed.manifest.error.type == "RuntimeError"

    code, out, _ = run_cli(["compare", str(golden), str(tmp_path / "crashed")], capsys)

    assert code == 3
    first = " ".join(out.split("not compared:")[1].split())  # rich wraps long lines
    assert "actual" in first and "is incomplete: the run raised RuntimeError" in first
    assert "data loader died" in first
    assert "PARTIAL MATCH" in out


def test_a_run_that_raised_before_recording_anything_is_named_in_the_error(
    actual_eval1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RuntimeError):
        monitor_golden(tmp_path / "empty", steps=1, train=False, raise_at=0)
    code, out, err = run_cli(["compare", str(actual_eval1), str(tmp_path / "empty")], capsys)
    assert code == 2 and out == ""
    assert "nothing to compare" in err
    assert "is incomplete: the run raised RuntimeError: data loader died" in err


def test_step_narrows_what_must_be_covered(actual_eval1: Path, tmp_path: Path) -> None:
    golden = monitor_golden(tmp_path / "golden", steps=3, train=False)
    everything = precguard.compare_runs(golden, actual_eval1)
    step0 = precguard.compare_runs(golden, actual_eval1, step=0)
    assert everything.coverage is not None and not everything.coverage.complete
    assert (everything.coverage.golden_steps, everything.coverage.steps_compared) == (3, 1)
    assert step0.coverage is not None and step0.coverage.complete
    assert step0.verdict == everything.verdict == "match"
