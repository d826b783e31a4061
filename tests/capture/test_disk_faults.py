"""The user's training survives the recording's disk: full, made read-only, failing.

An I/O error while recording is logged once and stops the recording; the
model's forward and backward, and the user's code after the ``with`` block,
run on unchanged, and the manifest says ``complete: false`` with the error and
how many of the run's steps were recorded.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from precguard import Run
from precguard.dump.writer import RunWriter
from tests import tmpfs

STEPS = 30


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))


def _train(model: nn.Module, mon: precguard.MonitorHandle | None, explicit: bool) -> list[float]:
    """Thirty SGD steps; the losses they give (what must not change)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        loss = model(torch.randn(32, 64, generator=gen)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if explicit and mon is not None:
            mon.step()
    return losses


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MB tmpfs: a disk that fills after a few steps of full tensors."""
    with tmpfs.small_tmpfs(tmp_path, "2m") as mnt:
        yield mnt


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


@pytest.mark.parametrize("explicit", [False, True], ids=["auto_step", "explicit_step"])
def test_a_full_disk_stops_the_recording_and_training_goes_on(
    small_tmpfs: Path, explicit: bool, caplog: pytest.LogCaptureFixture
) -> None:
    plain = _train(_model(), None, explicit)
    model = _model()
    after_block = False
    with caplog.at_level("WARNING", logger="precguard"):
        with precguard.monitor(
            model, out=small_tmpfs / "run", tensors=["*"], auto_step=not explicit
        ) as mon:
            losses = _train(model, mon, explicit)
        after_block = True  # the user's code after the block (saving the model) runs
    assert after_block
    assert losses == plain  # bitwise: the recording's failure changed nothing
    stopped = [r.getMessage() for r in caplog.records if "recording_stopped" in r.getMessage()]
    assert len(stopped) == 1 and "No space left" in stopped[0]
    assert "hook_failed" not in caplog.text
    m = _manifest(small_tmpfs / "run")
    assert m["complete"] is False
    assert m["error"]["type"] == "OSError" and "No space left" in m["error"]["message"]
    assert 0 < m["steps"] < STEPS and m["steps_run"] == STEPS
    # what was written before the disk filled stays readable, whole steps only
    run = Run(small_tmpfs / "run")
    steps = {r.step for r in run.records()}
    assert steps >= set(range(m["steps"]))
    assert not list((small_tmpfs / "run" / "rank0").glob("*.tmp"))


_READ_ONLY_CHILD = """
import json, os, sys, torch, precguard
from torch import nn
run = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
with precguard.monitor(model, out=run, tensors=["*"], auto_step=False) as mon:
    for step in range(10):
        if step == 4:  # the directory is made read-only under the running recording
            os.chmod(os.path.join(run, "rank0"), 0o555)
            os.chmod(run, 0o555)
        model(torch.ones(4, 64)).sum().backward()
        mon.step()
print("after the block")
"""


@pytest.mark.slow
def test_a_directory_made_read_only_mid_run_stops_the_recording(tmp_path: Path) -> None:
    """Real permissions; as root, the child runs without the capability to override them."""
    import sys

    prefix: list[str] = []
    if os.getuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root ignores permission bits and setpriv is not here to drop that")
        drop = "-dac_override,-dac_read_search"
        prefix = ["setpriv", "--bounding-set", drop, "--inh-caps", drop]
    base = tmp_path
    try:
        run = base / "run"
        done = subprocess.run(
            [*prefix, sys.executable, "-c", _READ_ONLY_CHILD, str(run)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "after the block" in done.stdout
        assert done.stderr.count("recording_stopped") == 1
        assert "Traceback" not in done.stderr
        # no new file can be made there, but the manifest is rewritten in place
        m = _manifest(run)
        assert m["complete"] is False and m["error"]["type"] == "PermissionError"
        assert (m["steps"], m["steps_run"]) == (4, 10)
        assert {r.step for r in Run(run).records()} == set(range(4))
    finally:
        for d in (base / "run" / "rank0", base / "run"):
            if d.exists():
                d.chmod(0o755)


@pytest.mark.parametrize(
    "code", [errno.EACCES, errno.EIO, errno.ENOSPC], ids=["EACCES", "EIO", "ENOSPC"]
)
def test_any_io_error_while_writing_records_is_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """Fault injected at the records file (a complement of the real-disk tests above)."""
    real = RunWriter._append
    calls = {"n": 0}

    def failing(self: RunWriter, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(code, os.strerror(code), str(self.rank_dir / "records.jsonl"))
        real(self, data)

    monkeypatch.setattr(RunWriter, "_append", failing)
    model = _model()
    with (
        caplog.at_level("WARNING", logger="precguard"),
        precguard.monitor(model, out=tmp_path / "run") as mon,
    ):
        losses = _train(model, mon, explicit=True)
    assert losses == _train(_model(), None, explicit=True)
    assert caplog.text.count("recording_stopped") == 1
    m = _manifest(tmp_path / "run")
    # two writes per step (the forward's records, then the backward's): the third is step 1's
    assert (m["complete"], m["steps"], m["steps_run"]) == (False, 1, STEPS)
    assert os.strerror(code) in m["error"]["message"]
    assert calls["n"] == 3  # recording stopped: nothing more was tried


def test_a_half_written_batch_is_cut_back_to_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails half-way leaves no truncated line behind."""
    model = _model()
    with precguard.monitor(model, out=tmp_path / "run", auto_step=False) as mon:
        model(torch.ones(2, 64))
        mon.step()
        fh = mon.recording.writer._records  # type: ignore[union-attr]

        class HalfWrite:
            def __getattr__(self, name: str) -> object:
                return getattr(fh, name)

            def write(self, data: memoryview) -> int:
                fh.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")

        mon.recording.writer._records = HalfWrite()  # type: ignore[union-attr,assignment]
        model(torch.ones(2, 64))
        mon.step()
        mon.recording._failed_writer._records = fh  # type: ignore[union-attr]
    lines = (tmp_path / "run" / "rank0" / "records.jsonl").read_bytes().splitlines()
    assert lines and all(json.loads(line)["step"] == 0 for line in lines)
    assert _manifest(tmp_path / "run")["steps"] == 1


def test_compare_names_the_stopped_recording(small_tmpfs: Path, tmp_path: Path) -> None:
    from precguard.compare import IncomparableRunsError

    model = _model()
    with precguard.monitor(model, out=small_tmpfs / "run", tensors=["*"], auto_step=False) as mon:
        _train(model, mon, explicit=True)
    with precguard.monitor(_model(), out=tmp_path / "gold"):
        pass
    # nothing to compare, and why: the actual stopped when the disk filled
    with pytest.raises(IncomparableRunsError) as refused:
        precguard.compare_runs(tmp_path / "gold", small_tmpfs / "run")
    line = str(refused.value)
    assert "the recording stopped at OSError" in line and f"of the run's {STEPS} step" in line
