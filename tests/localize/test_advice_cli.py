"""What a newcomer reads after ``compare --target --verify`` (issue 39).

The story: a hand-written decoder computes its rotary angles in bfloat16. compare
names ``model.rotary_emb``; with ``--target --verify`` the first line says whether
the output is affected, the remedy line is the one the re-run chose (or, without
a re-run, the candidates in the order it would try them), every line fits an 80
column terminal with the remedy wrapped, never cut, and each file written is
announced on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import precguard
from tests.localize.cli import ROOT

TARGET = "handwritten-llama-rope-bug"


def cli80(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "COLUMNS": "80", "PATH": os.environ["PATH"]}
    return subprocess.run(
        [sys.executable, "-m", "precguard", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("rope")
    golden = precguard.record_target(TARGET, device="cpu", out=base / "g", tensors=True)
    actual = precguard.record_target(
        precguard.Side(TARGET, "cpu", "bfloat16"), out=base / "a", tensors=True
    )
    return golden, actual


def _fits(out: str) -> list[str]:
    """The lines wider than 80 columns, but a command to copy (kept whole on one line)."""
    return [
        line
        for line in out.splitlines()
        if len(line) > 80 and not line.startswith(("confirm it alone:", "precguard "))
    ]


def test_without_a_target_the_candidates_are_listed_in_the_order_verify_tries_them(
    recordings: tuple[Path, Path], tmp_path: Path
) -> None:
    golden, actual = recordings
    out = cli80("compare", str(golden), str(actual), "--json", str(tmp_path / "c.json"))
    assert out.returncode == 1, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("DIVERGED (output impact not measured")
    said = " ".join(out.stdout.replace("│", " ").split())
    assert "remedy try in order: 1) keep `inv_freq` in float32" in said
    assert "2) compute the rotary frequencies and angles in float32" in said
    assert "…(+" not in out.stdout  # wrapped, never cut
    assert _fits(out.stdout) == []
    assert f"wrote {tmp_path / 'c.json'}" in out.stderr


def test_with_verify_the_first_line_says_the_output_is_not_affected(
    recordings: tuple[Path, Path], tmp_path: Path
) -> None:
    """At 128 positions with near-uniform attention the bug does not reach the logits: the
    finding is real, the output within a correct run's floor, and no remedy "did not help"."""
    golden, actual = recordings
    out = cli80(
        *("compare", str(golden), str(actual), "--target", TARGET, "--verify"),
        *("--json", str(tmp_path / "c.json"), "--html", str(tmp_path / "c.html")),
        *("--csv", str(tmp_path / "c.csv")),
    )
    assert out.returncode == 1, out.stderr  # the records diverged: the documented rule
    assert out.stdout.splitlines()[0].startswith("DIVERGED (output not affected")
    said = " ".join(out.stdout.replace("│", " ").split())
    assert "real, but the output is within a correct run's floor" in said
    assert "did not help" not in said and "not needed" in said
    assert "floor of a correct run:" in said and "explains 100%" not in said
    budget = json.loads((tmp_path / "c.json").read_text())["impact"]
    assert budget["within_floor"] is True and budget["unexplained"] == 0.0
    assert _fits(out.stdout) == []
    for name in ("c.json", "c.html", "c.csv"):
        assert f"wrote {tmp_path / name}" in out.stderr


def test_a_syntax_error_in_the_target_is_one_line_before_comparing(
    recordings: tuple[Path, Path], tmp_path: Path
) -> None:
    golden, actual = recordings
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n")
    out = cli80("compare", str(golden), str(actual), "--target", str(bad))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "SyntaxError" in out.stderr
