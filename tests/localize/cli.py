"""``python -m precguard ...`` in a subprocess, as a user runs it: the localize tests'
one way to run the CLI (a wide terminal, so a verdict's lines are not wrapped)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def precguard_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``precguard *args`` from the project root; never raises on its exit code."""
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "COLUMNS": "250", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "precguard", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
