"""Everyday use of the command line: versions, typos, forgotten options, the user's own errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import precguard
from precguard.cli import main

TARGET = Path(__file__).resolve().parent / "targets" / "handwritten" / "target.py"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return info.value.code or 0, out, err


def test_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "precguard", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout.strip().startswith(f"precguard {precguard.__version__} (torch ")


def test_record_without_target_says_what_to_pass(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(["record", "--out", str(tmp_path / "run")], capsys)
    assert code == 2
    assert "record needs --target" in err and "tiny-llama" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["check", "--only", "nrom.extreme_inputs"], "did you mean 'norm.extreme_inputs'"),
        (["check", "--skip", "rnj"], "did you mean 'rng'"),
        (["record", "-t", "tiny-llama", "--device", "cdua:1"], "did you mean 'cuda:1'"),
        (["record", "-t", "tiny-llama", "--device", "emu:fp61"], "did you mean 'fp16'"),
        (["record", "-t", "tiny-llama", "--dtype", "bfloat61"], "did you mean 'bfloat16'"),
        (["check", "--checklist", "llama-finetuen"], "did you mean 'llama-finetune'"),
    ],
)
def test_typos_get_the_closest_name(args, suggestion, tmp_path: Path, capsys) -> None:
    if args[0] == "record":
        args = [*args, "--out", str(tmp_path / "run")]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and suggestion in err


def test_the_targets_own_exception_is_the_targets_error(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    spec = f"{TARGET}:failing_target"
    code, _, err = run_cli(["record", "-t", spec, "--out", str(out), "--steps", "3"], capsys)

    assert code == 2
    assert "internal error" not in err
    assert "step 1: the model raised ValueError" in err
    manifest = precguard.load_run(out).manifest
    assert manifest.complete is False
    assert manifest.error is not None and manifest.error.type == "ValueError"

    code, _, err = run_cli(
        ["--debug", "record", "-t", spec, "--out", str(tmp_path / "again"), "--steps", "3"],
        capsys,
    )
    assert code == 2 and "Traceback" in err and "rerun with --debug" not in err


def test_internal_error_under_debug_does_not_ask_for_debug(monkeypatch, capsys) -> None:
    def broken(*_a, **_k):
        raise ZeroDivisionError("a bug in precguard")

    monkeypatch.setattr("precguard.compare.jobs.job", broken)  # what precguard compare runs
    code, _, err = run_cli(["compare", "a", "b"], capsys)
    assert code == 2 and "internal error" in err and "rerun with --debug" in err
    code, _, err = run_cli(["--debug", "compare", "a", "b"], capsys)
    assert code == 2 and "Traceback" in err and "rerun with --debug" not in err


def test_a_tensors_glob_that_matches_nothing_is_named(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(
        ["record", "-t", str(TARGET), "--out", str(tmp_path / "run"), "--tensors", "layer.0.*"],
        capsys,
    )
    assert code == 0
    warning = next(line for line in err.splitlines() if "tensors_pattern_matches_nothing" in line)
    assert "layer.0.*" in warning and "layers.0" in warning
    assert not any(r.tensor for r in precguard.load_run(tmp_path / "run").records())


def _run_in_terminal(args: list[str], cwd: Path) -> tuple[int, bytes]:
    """Run the CLI with a pseudo-terminal as stdout and stderr; return (code, what it printed)."""
    import os
    import pty
    import select

    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "precguard", *args],
        cwd=cwd,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        close_fds=True,
    )
    os.close(terminal)
    shown = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(controller, 1 << 16)
            except OSError:  # the terminal closed: the process is done
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(controller)
    return proc.wait(timeout=300), shown


@pytest.mark.slow
def test_progress_on_a_terminal_and_nothing_extra_in_a_pipe(tmp_path: Path) -> None:
    # a short target spec, so an 80-column terminal shows the bar's description whole
    args = ["record", "-t", "target.py", "--steps", "3"]
    code, shown = _run_in_terminal([*args, "--out", str(tmp_path / "tty")], TARGET.parent)
    assert code == 0
    assert b"recording target.py on cpu" in shown  # the bar's description
    assert b"\x1b[" in shown  # drawn, then erased (transient)

    proc = subprocess.run(
        [sys.executable, "-m", "precguard", *args, "--out", str(tmp_path / "pipe")],
        cwd=TARGET.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0
    assert proc.stderr == ""
    assert proc.stdout.splitlines() == [
        f"recorded 3 step(s) of target.py on cpu (float32) -> {tmp_path / 'pipe'}"
    ]


EXITING_TARGET = """
import sys
import torch
import precguard


class Quits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > -1e9:
            sys.exit(0)  # a script's "done" deep inside the model
        return self.lin(x)


def quits_at_import():
    return precguard.Target(model=Quits, batch=lambda step: torch.ones(2, 4))


def target():
    sys.exit(0)
"""


@pytest.mark.parametrize(
    ("function", "said"),
    [
        ("target", "target() called sys.exit(0)"),
        ("quits_at_import", "the model called sys.exit(0)"),
    ],
)
def test_a_target_calling_sys_exit_is_the_targets_error_not_success(
    function: str, said: str, tmp_path: Path, capsys
) -> None:
    script = tmp_path / "exiting.py"
    script.write_text(EXITING_TARGET)
    code, _, err = run_cli(
        ["record", "-t", f"{script}:{function}", "--out", str(tmp_path / "run")], capsys
    )
    assert code == 2, err
    assert said in err and len(err.strip().splitlines()) == 1
