"""benchmarks/emu_speed.py still runs (tiny sizes; the figures are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "emu_speed.py"


def test_emu_speed_benchmark_runs() -> None:
    args = ["--m", "8", "--k", "40", "--n", "8", "--repeats", "1", "--no-llama"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "matmul emu:fp16-saturate" in proc.stdout
