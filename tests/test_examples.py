"""The copy-me example runs and says what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_monitor_your_model_example(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "monitor_your_model.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "judged by the golden's dtype: diverged" in proc.stdout
    assert "judged by the actual's dtype: match" in proc.stdout
    assert (tmp_path / "fp32" / "manifest.json").is_file()
