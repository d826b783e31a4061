"""`precguard record` end to end, and its answers to bad input (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import precguard
from precguard.cli import main


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return info.value.code or 0, out, err


@pytest.mark.slow
def test_record_console_script(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "precguard",
            "record",
            "--target",
            "tiny-llama",
            "--out",
            str(out),
            "--steps",
            "2",
            "--train",
            "--tensors",
            "model.layers.0.*",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    run = precguard.load_run(out)
    assert run.manifest.complete and run.manifest.steps == 2
    assert run.manifest.target == "tiny-llama"
    assert run.manifest.fingerprint["torch.version"]
    records = list(run.records())
    assert {r.step for r in records} == {0, 1}
    assert any(r.role == "grad" for r in records)
    assert any(r.tensor for r in records)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_record_low_precision(dtype, tmp_path, capsys):
    code, _, _ = run_cli(
        ["record", "-t", "tiny-llama", "--out", str(tmp_path / "r"), "--dtype", dtype], capsys
    )
    assert code == 0
    rec = next(r for r in precguard.load_run(tmp_path / "r").records() if r.role == "output")
    assert rec.dtype == dtype


def test_existing_output_refused_then_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["record", "-t", "tiny-llama", "--out", str(out)], capsys)[0] == 0
    code, _, err = run_cli(["record", "-t", "tiny-llama", "--out", str(out)], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0 and "not empty" in err and "--overwrite" in err
    assert run_cli(["record", "-t", "tiny-llama", "--out", str(out), "--overwrite"], capsys)[0] == 0


def bad_target_file(tmp_path: Path) -> str:
    f = tmp_path / "t.py"
    f.write_text("def target():\n    raise ValueError('no weights here')\n")
    return f"{f}:target"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--target", "no-such-target"], "unknown target 'no-such-target'"),
        (["--dtype", "float8"], "unknown dtype 'float8'"),
        (["--device", "npu"], "device 'npu'"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--target", "BAD"], "raised ValueError: no weights here"),
        (["--target", "missing.py:target"], "no such file"),
    ],
)
def test_bad_input_one_line_exit_2(extra, needle, tmp_path, capsys):
    extra = [bad_target_file(tmp_path) if a == "BAD" else a for a in extra]
    code, _, err = run_cli(
        ["record", "-t", "tiny-llama", "--out", str(tmp_path / "run"), *extra], capsys
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("precguard: error:") and needle in lines[0]
    assert "Traceback" not in err


def test_unwritable_output(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(["record", "-t", "tiny-llama", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "cannot write" in err and len(err.strip().splitlines()) == 1


def test_debug_shows_traceback(tmp_path, capsys):
    code, _, err = run_cli(
        ["--debug", "record", "-t", "tiny-llama", "--out", str(tmp_path / "r"), "--dtype", "nope"],
        capsys,
    )
    assert code == 2 and "Traceback" in err


def test_schema_command(capsys):
    code, out, _ = run_cli(["schema", "record"], capsys)
    assert code == 0
    assert json.loads(out)["title"] == "Record"
