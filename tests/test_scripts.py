"""The benchmark and example scripts still run and print what they promise.

Tiny sizes: the benchmark figures themselves are not asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts a Python process

ROOT = Path(__file__).parents[1]


def run_script(relpath: str, *args: str) -> str:
    """Run a repository script with this interpreter; return its stdout (exit 0 asserted)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / relpath), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_overhead_benchmark():
    out = run_script(
        "benchmarks/overhead.py",
        *("--hidden", "64", "128", "--vocab", "1000", "--layers", "1", "--seq", "8"),
        *("--repeats", "15", "--threads", "1", "--backward", "--profile"),
    )
    table = out.split("ratio: median of")[0].splitlines()
    rows = {line.split()[0]: line for line in table if line.split()[0].isdigit()}
    assert rows.keys() == {"64", "128"}  # both sizes, one run
    assert all(rows[h].count("x") >= 3 for h in rows)  # ratio, quartiles, cpu ratio
    assert "-- profile: hidden=64" in out and "tottime" in out
    assert "monitored, input grads median:" in out and "input-gradient recording costs:" in out
    assert "Monitor, statistics" in out and "Python calls/call" in out  # the per-call table


def test_compare_benchmark_cleans_up(tmp_path):
    out = run_script(
        "benchmarks/compare.py", "--gb", "0.004", "--tensor-mb", "1", "--dir", str(tmp_path)
    )
    assert "GB/s read" in out and "peak RSS" in out
    assert not any(tmp_path.iterdir()), "the benchmark must clean up its recordings"


def test_emu_speed_benchmark():
    out = run_script(
        "benchmarks/emu_speed.py",
        "--m",
        "8",
        "--k",
        "40",
        "--n",
        "8",
        "--repeats",
        "1",
        "--no-llama",
    )
    assert "matmul emu:fp16-saturate" in out


def test_monitor_your_model_example(tmp_path):
    out = run_script("examples/monitor_your_model.py", str(tmp_path))
    assert "judged by the golden's precision: diverged" in out
    assert "judged by the actual's precision: match" in out
    assert (tmp_path / "fp32" / "manifest.json").is_file()


def test_checklist_speed_benchmark():
    out = run_script(
        "benchmarks/checklist_speed.py", "--checklist", "quick", "--only", "env", "--device", "cpu"
    )
    assert "checklist quick on handwritten-llama, cpu:" in out and "(exit code 0" in out


def test_bisect_probes_benchmark():
    out = run_script("benchmarks/bisect_probes.py", "--blocks", "4")
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    assert rows and all(row[-1] == "ok" for row in rows), out
    # one row per placement: no culprit, each single block, each pair
    assert {row[1] for row in rows} == {"0", "1", "2"}


def test_compare_memory_benchmark(tmp_path):
    out = run_script(
        "benchmarks/compare_memory.py",
        *("--records", "400", "--per-step", "200", "--dir", str(tmp_path)),
    )
    head, row = out.splitlines()
    assert "B/pair" in head and "us/pair" in head
    assert row.split()[:2] == ["400", "2"]  # 400 records, 2 steps of 200
    assert "match (400 records" in row  # float32-sized noise is within tolerance
    assert not any(tmp_path.iterdir()), "the benchmark must clean up its recordings"


def test_metrics_dump_benchmark():
    """Each level's costs printed, and its fields: 29 or 30, not the 41 keys it writes."""
    out = run_script("benchmarks/metrics_dump.py", "--n", "10")
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines.keys() == {"full", "stats"}
    assert all("json" in line and "row" in line and "validate" in line for line in lines.values())
    assert all(int(line.split()[-1]) < 41 for line in lines.values())


def test_heldout_moe_refuses_an_unknown_family():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/heldout_moe.py"), "mixtral"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "unknown family 'mixtral'; one of olmoe, granitemoe, glm4-moe, ernie-moe"
    ]
