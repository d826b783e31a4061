"""A real two-rank torchrun (gloo, CPU) writes one recording with rank0/ and rank1/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import precguard


@pytest.mark.slow
def test_two_ranks_record_into_one_run(tmp_path):
    out = tmp_path / "run"
    script = Path(__file__).with_name("ddp_record.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--standalone",
            str(script),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = precguard.load_run(out)
    assert run.ranks == [0, 1]
    assert run.manifest.world_size == 2 and run.manifest.complete
    by_rank = {r: list(run.records(rank=r)) for r in run.ranks}
    for rank, records in by_rank.items():
        assert {rec.rank for rec in records} == {rank}
        assert {rec.step for rec in records} == {0, 1}
        assert any(rec.role == "grad" for rec in records)
    key = "module.model.layers.0.mlp.down_proj.0.forward.output.0"
    stats = {r: next(x for x in recs if x.key == key).stats for r, recs in by_rank.items()}
    assert stats[0].mean != stats[1].mean  # each rank saw its own data
