"""The benchmark scripts still run (tiny sizes; the figures themselves are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_overhead_benchmark_runs():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "overhead.py"),
            "--hidden",
            "64",
            "--layers",
            "1",
            "--seq",
            "8",
            "--repeats",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "overhead ratio:" in proc.stdout
    assert "KiB/step" in proc.stdout
