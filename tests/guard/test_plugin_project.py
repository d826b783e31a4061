"""A throwaway project guarded by the plugin: write goldens, pass, plant a fault, fail.

The story of docs/guard.md, run as a user would: pytest in a subprocess, in a
fresh project whose only precguard-specific code is the test file below.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = Path(__file__).with_name("models.py")

TESTS = """\
from precguard.testing import assert_matches_golden

import model


def test_forward(precguard_golden):
    assert_matches_golden(model.build(), model.batch(), precguard_golden)


def test_backward(precguard_golden):
    assert_matches_golden(model.build(), model.batch(), precguard_golden, train=True)
"""


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["NO_COLOR"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.slow
def test_a_project_writes_goldens_passes_and_fails_on_a_planted_fault(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    shutil.copy(MODEL, project / "model.py")
    (project / "test_precision.py").write_text(TESTS)

    # 1. the first run writes the goldens, and says which
    wrote = _pytest(project, "--precguard-update-golden")
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    assert "golden new: goldens/test_precision/test_forward\n" in wrote.stdout
    assert "golden new: goldens/test_precision/test_backward\n" in wrote.stdout
    first = _snapshot(project / "goldens")
    assert "test_precision/test_forward/rank0/records.jsonl" in first
    assert sum(len(b) for b in first.values()) < 200_000  # statistics only: small

    # 2. written again from scratch, the goldens are the same bytes
    shutil.rmtree(project / "goldens")
    again = _pytest(project, "--precguard-update-golden")
    assert again.returncode == 0, again.stdout + again.stderr
    assert _snapshot(project / "goldens") == first

    # 3. the unchanged model passes, its margins in the summary
    passed = _pytest(project)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "precguard precision tests" in passed.stdout
    assert re.search(r"test_precision.py::test_forward +match +worst margin +0\n", passed.stdout)

    # 4. a 0.1 % gain planted in layer 1 fails, naming that layer
    source = (project / "model.py").read_text()
    planted = source.replace("GAINS: dict[int, float] = {}", "GAINS: dict[int, float] = {1: 1.001}")
    assert planted != source
    (project / "model.py").write_text(planted)
    failed = _pytest(project)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "2 failed" in failed.stdout
    assert "first divergence: layers.1 (Block)" in failed.stdout
    assert "DIVERGED" in failed.stdout and "HTML report:" in failed.stdout
    assert _snapshot(project / "goldens") == first  # a failing run never touches the goldens

    # 5. -p no:precguard turns the plugin off (its option is gone)
    assert "--precguard-update-golden" in _pytest(project, "--help").stdout
    assert (
        "--precguard-update-golden" not in _pytest(project, "-p", "no:precguard", "--help").stdout
    )
