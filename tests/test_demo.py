"""`make demo` finds the fault it plants."""

from __future__ import annotations

import subprocess
import sys


def test_demo_localizes_planted_fault(tmp_path):
    # what `make demo` runs: python -m precguard.demo
    done = subprocess.run(
        [sys.executable, "-m", "precguard.demo", "--out", str(tmp_path), "--layer", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "model.layers.1.post_attention_layernorm" in done.stdout
    assert "localized" in done.stdout
    assert (tmp_path / "golden" / "manifest.json").is_file()
