"""The user's training survives the watch's disk, and one watch writes a directory.

As for recordings (tests/capture/test_disk_faults.py): an I/O error on the watch's
files is logged once, the watch stops writing and goes on detecting, training runs
to its end bitwise unchanged, and ``watch.json`` says ``complete: false`` with the
error. A second watch on a directory a running watch writes is refused before
anything there is removed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import precguard
from precguard import OutputExistsError
from precguard.training.handle import SCALARS_FILE
from tests import tmpfs
from tests.watch.conftest import train

STEPS = 40


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class _FailingFile:
    """A watch file whose writes fail with ``code`` from the ``after``-th write on."""

    def __init__(self, real, code: int, after: int, counter: dict) -> None:
        self.real, self.code, self.after, self.counter = real, code, after, counter

    def write(self, data: str) -> int:
        self.counter["writes"] += 1
        if self.counter["writes"] >= self.after:
            raise OSError(self.code, os.strerror(self.code), "scalars.jsonl")
        return self.real.write(data)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


@pytest.mark.parametrize(
    "code", [errno.EFBIG, errno.ENOSPC, errno.EACCES, errno.EIO], ids=errno.errorcode.get
)
def test_an_io_error_on_the_watch_files_stops_the_watch_not_training(tmp_path, caplog, code):
    plain, _ = train(STEPS)
    counter = {"writes": 0}

    def factory(model, opt):
        w = precguard.watch(model, opt, every=1000, out=tmp_path / "w")
        real = w._files[SCALARS_FILE]
        w._files[SCALARS_FILE] = _FailingFile(real, code, after=13, counter=counter)
        return w

    with caplog.at_level("WARNING", logger="precguard"):
        model, handle = train(STEPS, factory)
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert a.equal(b)  # training went on, bitwise as without the watch
    assert caplog.text.count("watch_stopped_writing") == 1
    assert counter["writes"] == 13  # stopped: nothing more was tried
    assert handle.step_index == STEPS and handle.write_failure.errno == code
    info = json.loads((tmp_path / "w" / "watch.json").read_text())
    assert info["complete"] is False and info["steps"] == STEPS
    assert info["steps_written"] == 12 and os.strerror(code) in info["error"]["message"]
    assert [s["step"] for s in _lines(tmp_path / "w" / SCALARS_FILE)] == list(range(12))


_FILE_SIZE_CHILD = """
import resource, sys, torch, precguard
from tests.watch.conftest import train
resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))
model, w = train(95, lambda m, o: precguard.watch(m, o, every=1000, out=sys.argv[1]))
print("trained", w.step_index, "steps")
"""


def test_a_file_size_limit_stops_the_watch_and_training_goes_on(tmp_path):
    # a real EFBIG (RLIMIT_FSIZE): before, "OSError: [Errno 27] File too large" ended training
    out = tmp_path / "w"
    done = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_CHILD, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained 95 steps" in done.stdout
    assert "Traceback" not in done.stderr
    assert done.stderr.count("watch_stopped_writing") == 1
    info = json.loads((out / "watch.json").read_text())
    assert info["complete"] is False and info["error"]["message"].startswith("[Errno 27]")
    assert 0 < info["steps_written"] < 95 and info["steps"] == 95
    # what was written is whole lines, readable by watch-report
    from precguard import load_watch

    assert len(load_watch(out).scalars) >= info["steps_written"]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 24 KB tmpfs: a disk that fills after some steps of the watch's lines."""
    with tmpfs.small_tmpfs(tmp_path, "24k") as mnt:
        yield mnt


def test_a_full_disk_stops_the_watch_and_training_goes_on(small_tmpfs, caplog):
    plain, _ = train(120)
    with caplog.at_level("WARNING", logger="precguard"):
        model, handle = train(
            120, lambda m, o: precguard.watch(m, o, every=1000, out=small_tmpfs / "w")
        )
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert a.equal(b)
    assert caplog.text.count("watch_stopped_writing") == 1
    assert handle.write_failure.errno == errno.ENOSPC
    info = json.loads((small_tmpfs / "w" / "watch.json").read_text())
    assert info["complete"] is False and 0 < info["steps_written"] < 120


def test_a_second_watch_on_a_running_watch_directory_is_refused_untouched(tmp_path):
    out = tmp_path / "w"
    steps_when_refused = []

    def second_watch(step, model, opt):
        if step == 20:
            with pytest.raises(OutputExistsError, match="nothing was changed"):
                precguard.watch(model, opt, out=out, overwrite=True)
            steps_when_refused.append(len(_lines(out / SCALARS_FILE)))

    train(STEPS, lambda m, o: precguard.watch(m, o, out=out), before_step=second_watch)
    assert steps_when_refused == [20]  # the first watch's 20 steps were still there
    assert [s["step"] for s in _lines(out / SCALARS_FILE)] == list(range(STEPS))
    assert json.loads((out / "watch.json").read_text())["complete"] is True
    # once the first watch is closed, the directory can be replaced
    train(3, lambda m, o: precguard.watch(m, o, out=out, overwrite=True))
    assert len(_lines(out / SCALARS_FILE)) == 3


_SECOND_WATCH_CHILD = """
import sys, torch, precguard
from precguard import OutputExistsError
try:
    precguard.watch(torch.nn.Linear(2, 2), out=sys.argv[1], overwrite=True)
except OutputExistsError as exc:
    print("refused:", exc)
"""


def test_a_second_process_cannot_replace_a_running_watch(tmp_path):
    out = tmp_path / "w"
    seen = []

    def other_process(step, model, opt):
        if step == 10:
            done = subprocess.run(
                [sys.executable, "-c", _SECOND_WATCH_CHILD, str(out)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            seen.append(done.stdout)

    train(20, lambda m, o: precguard.watch(m, o, out=out), before_step=other_process)
    assert "refused:" in seen[0] and "another process is writing a watch" in seen[0]
    assert [s["step"] for s in _lines(out / SCALARS_FILE)] == list(range(20))


def test_watch_report_says_the_watch_stopped_writing(tmp_path, capsys):
    from precguard.cli import main

    counter = {"writes": 0}

    def factory(model, opt):
        w = precguard.watch(model, opt, every=1000, out=tmp_path / "w")
        w._files[SCALARS_FILE] = _FailingFile(w._files[SCALARS_FILE], errno.EFBIG, 6, counter)
        return w

    train(10, factory)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["watch-report", str(tmp_path / "w")])
    out = capsys.readouterr().out
    assert exited.value.code in (0, None)
    assert "the watch stopped writing after 5 of 10 steps: OSError: [Errno 27]" in out


_READ_ONLY_CHILD = """
import json, os, sys, torch, precguard
from tests.watch.conftest import train
out = sys.argv[1]

def read_only_at_10(step, model, opt):
    if step == 10:  # the directory is made read-only under the running watch
        os.chmod(out, 0o555)

model, w = train(30, lambda m, o: precguard.watch(m, o, every=1000, out=out),
                 before_step=read_only_at_10)
print("trained", w.step_index, "steps")
"""


@pytest.mark.slow
def test_a_watch_directory_made_read_only_mid_run_keeps_its_last_word(tmp_path):
    """Real permissions; as root, the child runs without the capability to override them.

    The lines go on into the files the watch holds open; at the close, watch.json can
    no longer be replaced by a new file, and is rewritten in place instead.
    """
    prefix: list[str] = []
    if os.getuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root ignores permission bits and setpriv is not here to drop that")
        drop = "-dac_override,-dac_read_search"
        prefix = ["setpriv", "--bounding-set", drop, "--inh-caps", drop]
    out = tmp_path / "w"
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-c", _READ_ONLY_CHILD, str(out)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=Path(__file__).parents[2],
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "trained 30 steps" in done.stdout and "Traceback" not in done.stderr
        assert [s["step"] for s in _lines(out / SCALARS_FILE)] == list(range(30))
        info = json.loads((out / "watch.json").read_text())
        assert (info["complete"], info["steps"]) == (True, 30)
        assert not list(out.glob("*.tmp"))
    finally:
        out.chmod(0o755)
