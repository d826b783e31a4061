"""benchmarks/compare.py still runs (a tiny size; the figure itself is not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_compare_benchmark_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare.py"),
            "--gb",
            "0.004",
            "--tensor-mb",
            "1",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "GB/s read" in proc.stdout and "peak RSS" in proc.stdout
    assert not any(tmp_path.iterdir()), "the benchmark must clean up its recordings"
