"""The same LLaMA recorded by msprobe itself and by precguard, compared both ways.

Needs mindstudio-probe (``pip install mindstudio-probe==26.2.0``; it runs on CPU
without torch_npu). It is not in the ``test`` extra: it pulls pandas, matplotlib,
tensorboard, onnx and more. Where it is absent this test skips and
test_msprobe_fixtures.py covers the same story on dumps msprobe wrote once.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop.llama_two_tools import FAULTY_MODULE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("msprobe") is None,
        reason="mindstudio-probe is not installed (pip install mindstudio-probe==26.2.0); "
        "tests/interop/test_msprobe_fixtures.py covers its recorded dumps",
    ),
]

SCRIPT = Path(__file__).parent / "llama_two_tools.py"


def _record(out: Path, *args: str) -> Path:
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def _msprobe(out: Path, task: str, *args: str) -> Path:
    _record(out, "--tool", "msprobe", "--task", task, *args)
    return out / "dump"


def _compare(golden: Path, actual: Path, tmp: Path) -> tuple[int, dict]:
    out = tmp / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "precguard",
            "compare",
            str(golden),
            str(actual),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(out.read_text())


def test_msprobe_and_precguard_agree_and_name_the_planted_fault(tmp_path: Path) -> None:
    pg = _record(tmp_path / "pg", "--tool", "precguard", "--tensors")
    pg_fault = _record(tmp_path / "pg_fault", "--tool", "precguard", "--tensors", "--fault")
    ms_stats = _msprobe(tmp_path / "ms_stats", "statistics")
    ms_tensor = _msprobe(tmp_path / "ms_tensor", "tensor")
    ms_fault = _msprobe(tmp_path / "ms_fault", "statistics", "--fault")

    for golden, actual, levels in (
        (pg, ms_stats, {"stats"}),
        (ms_stats, pg, {"stats"}),
        (pg, ms_tensor, {"full", "exact"}),  # element-wise: bitwise equal tensors are "exact"
        (ms_tensor, pg, {"full", "exact"}),
    ):
        code, result = _compare(golden, actual, tmp_path)
        assert code == 0 and result["verdict"] == "match", result["first_divergence"]
        passed = [r for r in result["records"] if r["status"] == "pass"]
        assert len(passed) >= 90
        assert {r["metrics"]["level"] for r in passed} <= levels

    for golden, actual in ((pg, ms_fault), (ms_stats, pg_fault), (ms_tensor, pg_fault)):
        code, result = _compare(golden, actual, tmp_path)
        assert code == 1 and result["verdict"] == "diverged"
        assert result["first_divergence"]["module"] == FAULTY_MODULE
        assert result["first_divergence"]["local"] is True
