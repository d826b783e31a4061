"""Comparing statistics recordings imports no torch (issue 41: compare's memory and start-up).

A recording of statistics is JSON lines; reading, judging and reporting it needs NumPy,
pydantic and the standard library. torch is imported only where a saved tensor is read
or a target re-run, so ``precguard compare`` of statistics starts without torch's seconds
of import and ~240 MiB of memory (benchmarks/compare_memory.py). The subprocess below
makes importing torch or transformers fail outright: a module that still imports torch at
the top, or a statistics path that reaches for it, fails the test instead of going
unnoticed. Its output must be the one an ordinary run (torch loaded) writes, byte for byte.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.compare.conftest import FAULTS, record

#: the CLI in a fresh process, with torch and transformers made unimportable ("blocked")
#: or with torch imported first ("loaded"); a fresh process each, as the HTML's plot ids
#: count the figures a process drew
_CLI = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"torch-free compare imported {name}")

if sys.argv[1] == "blocked":
    sys.meta_path.insert(0, Refuse())
else:
    import torch  # noqa: F401
from precguard.cli import main

main(sys.argv[2:])
"""

pytestmark = pytest.mark.slow  # starts a process


@pytest.fixture(scope="module")
def stats_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tiny-llama's statistics (no tensors), golden and with fp16 RMSNorm in layer 0."""
    root = tmp_path_factory.mktemp("stats-only")
    fault = next(f for f in FAULTS if f.name == "rmsnorm-fp16-first-layer")
    return record(root / "golden", tensors=False), record(
        root / "actual", tensors=False, fault=fault
    )


def test_a_statistics_compare_runs_without_torch(
    stats_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    golden, actual = stats_runs
    for kind in ("json", "html", "csv"):
        runs = {}
        for how in ("blocked", "loaded"):
            out = tmp_path / f"{how}.{kind}"
            args = ["compare", str(golden), str(actual), f"--{kind}", str(out)]
            proc = subprocess.run(
                [sys.executable, "-c", _CLI, how, *args],
                capture_output=True,
                text=True,
            )
            # a divergence (exit 1), reported whole: not an ImportError (exit 2)
            assert proc.returncode == 1, proc.stderr
            assert "model.layers.0.input_layernorm" in proc.stdout
            runs[how] = (proc.stdout.replace(str(out), "FILE"), out.read_bytes())
        assert runs["blocked"] == runs["loaded"], kind
