"""examples/watch_training.py runs as its docstring says and finds its planted fault."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_watch_example_names_the_layers_whose_learning_rate_jumped(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "watch_training.py"), str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "step 30: update_ratio_jump" in proc.stdout
    layers = proc.stdout.split("layers:")[1].splitlines()[0]
    assert {x.strip() for x in layers.split(",")} == {
        f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkvo"
    }
    assert (tmp_path / "w" / "recording" / "manifest.json").is_file()
