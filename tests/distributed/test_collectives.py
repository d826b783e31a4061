"""Real two-rank torchrun jobs (gloo, CPU): collectives recorded, replicas checked, ranks agree.

Each scenario of ``collectives_run.py`` is run once per session; the tests read its
recording with ``precguard ranks`` as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import precguard

ROOT = Path(__file__).parents[2]
SCRIPT = Path(__file__).with_name("collectives_run.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.slow


def torchrun(*args: str, timeout: int = 240, monitor: int = 2) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 --standalone ARGS`` as a subprocess."""
    # --monitor-interval: let each rank exit by itself before torchrun stops the others,
    # so every rank's own exit code is in torchrun's summary
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           f"--monitor-interval={monitor}", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def precguard_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "precguard", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=ENV,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Record each scenario once: clean, nan, drift, die."""
    root = tmp_path_factory.mktemp("collectives")
    out = {}
    for scenario in ("clean", "nan", "drift", "die"):
        path = root / scenario
        proc = torchrun(str(SCRIPT), str(path), scenario)
        if scenario != "die":
            assert proc.returncode == 0, proc.stderr[-3000:]
        out[scenario] = path
    return out


def ranks_report(path: Path) -> tuple[int, dict]:
    proc = precguard_cli("ranks", str(path), "--json", "-")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def test_collectives_are_recorded_with_their_group_and_change_nothing(runs):
    # the script itself exits non-zero if a parameter differs bit for bit from a run
    # without precguard, or if a collective stayed patched (checked by the fixture)
    run = precguard.load_run(runs["clean"])
    dist_recs = [r for r in run.records(rank=1) if r.module.startswith("dist.")]
    assert {r.module for r in dist_recs} == {"dist.all_reduce"}
    assert all(r.collective.group == [0, 1] and r.collective.reduce_op == "sum" for r in dist_recs)
    waited = [r for r in dist_recs if r.collective.async_ and r.role == "output"]
    assert waited, "an async all_reduce records its output at wait()"
    code, report = ranks_report(runs["clean"])
    assert code == 0 and report["verdict"] == "agree" and report["compared"] > 0


def test_nan_on_rank_1_is_named_with_the_all_reduce_it_spread_through(runs):
    code, report = ranks_report(runs["nan"])
    assert code == 1
    assert report["first_nonfinite"]["rank"] == 1
    assert report["first_nonfinite"]["module"] == "poison"
    spread = report["spread"]
    assert spread["module"] == "dist.all_reduce" and spread["step"] == 0
    assert spread["from_ranks"] == [1] and spread["to_ranks"] == [0, 1]


def test_a_ddp_replica_whose_gradient_drifts_is_reported(runs):
    code, report = ranks_report(runs["drift"])
    assert code == 1
    d = report["first_disagreement"]
    assert d["module"] == "module.mlp.down" and d["role"] == "param"
    assert d["step"] == 1 and d["differing_ranks"] == [1]
    assert report["first_nonfinite"] is None


def test_a_rank_killed_mid_run_leaves_the_others_readable(runs):
    run = precguard.load_run(runs["die"])
    status = run.rank_status()
    assert status[0].complete and status[0].steps == 2
    assert not status[1].complete
    assert {r.step for r in run.records(rank=1)} == {0, 1}  # flushed before the kill
    _code, report = ranks_report(runs["die"])
    assert report["incomplete_ranks"] == [1]


def test_a_non_empty_output_directory_stops_every_rank_with_exit_2(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    # before: a hang at a barrier. A long monitor interval gives a slow machine time to
    # let both ranks exit by themselves (the decision itself takes a broadcast)
    proc = torchrun(str(SCRIPT), str(out), "clean", timeout=120, monitor=10)
    # both ranks write to one pipe, so count the line rather than split on newlines
    line = f"precguard: error: {out}: directory exists and is not empty"
    assert proc.stderr.count(line) == 2, proc.stderr[-3000:]
    assert proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "mine" and sorted(os.listdir(out)) == ["notes.txt"]


def test_compare_with_workers_and_under_torchrun_equals_one_process(runs, tmp_path):
    one, two, job = tmp_path / "one.json", tmp_path / "two.json", tmp_path / "job.json"
    g, a = str(runs["clean"]), str(runs["drift"])
    for out, extra in ((one, []), (two, ["--workers", "2"])):
        proc = precguard_cli("compare", g, a, "--json", str(out), "--map", "module.*=*", *extra)
        assert proc.returncode == 1, proc.stderr[-2000:]
    proc = torchrun("-m", "precguard.compare", g, a, "--json", str(job), "--map", "module.*=*")
    assert "exitcode" not in proc.stderr or "exitcode  : 1" in proc.stderr
    assert one.read_bytes() == two.read_bytes() == job.read_bytes()
    assert json.loads(one.read_text())["verdict"] == "diverged"
