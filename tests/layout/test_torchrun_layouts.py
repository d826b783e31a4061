"""Real torchrun runs on gloo (CPU) compared with the same model run whole in one process.

Tensor parallel: a hand-written 2-way TP transformer (column-parallel q/k/v and
fc1, row-parallel attention output and fc2, all-reduces between). Pipeline
parallel: a hand-written 2-stage pipeline with send/recv. FSDP2: fully_shard
over both ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.slow

#: rank 1's shards of the attention's and the MLP's row-parallel weights
FAULTS = ("--fault", "layers.0.attn.out", "--fault", "layers.1.mlp.fc2")


def _record(script: str, out: Path, *args: str, ranks: int = 2) -> Path:
    """Record ``script`` into ``out``: under torchrun with ``ranks`` processes, or plainly."""
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--standalone"]
    proc = subprocess.run(
        [*launcher, str(HERE / script), str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _compare(golden: Path, actual: Path, layout: str, tmp: Path) -> tuple[int, dict, str]:
    """``precguard compare GOLDEN ACTUAL --layout LAYOUT`` as a user runs it."""
    report = tmp / f"{actual.name}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "precguard", "compare", str(golden), str(actual),
         "--layout", layout, "--json", str(report)],
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    data = json.loads(report.read_text()) if report.is_file() else {}
    return proc.returncode, data, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp")
    return {
        "tmp": tmp,
        "whole": _record("tp_model.py", tmp / "whole", ranks=1),
        "clean": _record("tp_model.py", tmp / "clean"),
        "fault": _record("tp_model.py", tmp / "fault", *FAULTS),
    }


def test_tensor_parallel_run_matches_the_whole_model(tp):
    code, result, out = _compare(tp["whole"], tp["clean"], str(HERE / "tp.yaml"), tp["tmp"])
    assert code == 0, out
    assert result["verdict"] == "match"
    assert result["counts"]["missing"] == 0 and result["counts"]["full"] > 100
    modules = {r["module"] for r in result["records"]}
    assert {"layers.0.attn.q", "layers.0.attn.out", "layers.1.mlp.fc1"} <= modules


def test_a_fault_in_rank_1s_row_parallel_shard_is_named_with_rank_1(tp):
    code, result, out = _compare(tp["whole"], tp["fault"], str(HERE / "tp.yaml"), tp["tmp"])
    assert code == 1, out
    first = result["first_divergence"]
    assert (first["module"], first["rank"], first["local"]) == ("layers.0.attn.out", 1, True)
    assert "rank 1's part of parameter weight" in first["reason"]
    assert "layers.0.attn.out" in out and "rank 1" in out
    later = {(s["module"], s["rank"]) for s in result["suspects"]}
    assert ("layers.1.mlp.fc2", 1) in later  # the MLP's faulty shard, found after it


@pytest.fixture(scope="module")
def pp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pp")
    return {
        "tmp": tmp,
        "whole": _record("pp_model.py", tmp / "whole", ranks=1),
        "clean": _record("pp_model.py", tmp / "clean"),
        # a fault on each stage: layers.1 is on stage 0 (rank 0), layers.2 on stage 1
        "faults": _record(
            "pp_model.py", tmp / "faults", "--fault", "layers.1.fc1", "--fault", "layers.2.fc2"
        ),
    }


def test_pipeline_stages_merged_match_the_whole_model(pp):
    code, result, out = _compare(pp["whole"], pp["clean"], str(HERE / "pp.yaml"), pp["tmp"])
    assert code == 0, out
    assert result["counts"]["missing"] == 0 and not result["unmatched"]["golden_only"]
    ranks = {r["module"]: r["rank"] for r in result["records"]}
    assert ranks["layers.0.fc1"] == 0 and ranks["layers.3.fc2"] == 1 and ranks["head"] == 1


def test_the_first_divergence_is_global_across_stages(pp):
    # stage 0's fault makes every later record of both stages fail; the first is stage 0's
    code, result, out = _compare(pp["whole"], pp["faults"], str(HERE / "pp.yaml"), pp["tmp"])
    assert code == 1, out
    first = result["first_divergence"]
    assert (first["module"], first["rank"]) == ("layers.1.fc1", 0)
    failing_ranks = {r["rank"] for r in result["records"] if r["status"] == "fail"}
    assert failing_ranks == {0, 1}
    # the last stage's own fault is found after it, on its rank
    assert ("layers.2.fc2", 1) in {(s["module"], s["rank"]) for s in result["suspects"]}


def test_fsdp2_fully_shard_matches_the_single_process_model(tmp_path):
    whole = _record("fsdp2_model.py", tmp_path / "whole", ranks=1)
    sharded = _record("fsdp2_model.py", tmp_path / "fsdp2")
    code, result, out = _compare(whole, sharded, "fsdp2", tmp_path)
    assert code == 0, out
    grads = [r for r in result["records"] if r["role"] == "grad"]
    assert len(grads) == 4 and all(r["metrics"]["level"] == "full" for r in grads)
    assert {tuple(r["shape"]) for r in grads} == {(32, 16), (32,), (16, 32), (16,)}
