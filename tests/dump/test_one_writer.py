"""One writer per recording directory: a second one is refused and nothing is deleted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from precguard import OutputExistsError, Run


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_second_recording_into_a_directory_in_use_is_refused(
    tmp_path: Path, overwrite: bool
) -> None:
    out = tmp_path / "run"
    model = _model()
    with precguard.monitor(model, out=out) as first:
        model(torch.ones(2, 8))
        first.step()
        with pytest.raises(OutputExistsError, match="being written there"):
            precguard.monitor(_model(), out=out, overwrite=overwrite)
        model(torch.ones(2, 8))
    # the first recording is whole: nothing of it was removed
    run = Run(out)
    assert run.manifest.complete and run.manifest.steps == 2
    assert {r.step for r in run.records()} == {0, 1}


def test_the_directory_is_free_again_once_the_recording_closed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    model = _model()
    with precguard.monitor(model, out=out):
        model(torch.ones(2, 8))
    with precguard.monitor(model, out=out, overwrite=True):
        model(torch.ones(2, 8))
    assert Run(out).manifest.complete


def test_a_failed_open_leaves_the_directory_free(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        precguard.monitor(_model(), out=out)  # not empty, no overwrite
    (out / "notes.txt").unlink()
    with precguard.monitor(_model(), out=out):
        pass


_SECOND_WRITER = """
import sys, torch, precguard
from precguard import PrecguardError
try:
    precguard.monitor(torch.nn.Linear(2, 2), out=sys.argv[1], overwrite=True)
except PrecguardError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


@pytest.mark.slow
def test_another_process_with_overwrite_is_refused_with_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "run"
    model = _model()
    with precguard.monitor(model, out=out) as mon:
        model(torch.ones(2, 8))
        mon.step()
        second = subprocess.run(
            [sys.executable, "-c", _SECOND_WRITER, str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        model(torch.ones(2, 8))
    assert second.returncode == 2, second.stderr
    assert "another process is writing a recording there" in second.stderr
    assert Run(out).manifest.complete
    assert {r.step for r in Run(out).records()} == {0, 1}


_CLI = [sys.executable, "-m", "precguard"]


@pytest.mark.slow
def test_record_cli_refuses_a_directory_in_use(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with precguard.monitor(_model(), out=out):
        cli = subprocess.run(
            [*_CLI, "record", "-t", "tiny-llama", "--out", str(out), "--overwrite"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert cli.returncode == 2, cli.stderr[-2000:]
    assert "another process is writing a recording there" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert Run(out).manifest.complete
