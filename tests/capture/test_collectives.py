"""Collectives inside a recording: dist.<op> records, results untouched, nothing left patched.

A one-rank gloo group in this process: every collective runs for real, fast.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import precguard
from precguard.capture import collectives

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


class TensorParallelish(nn.Module):
    """A row-parallel linear: a partial product all-reduced, as Megatron's RowParallelLinear."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        dist.all_reduce(y)
        gathered = [torch.empty_like(y)]
        dist.all_gather(gathered, y)
        out = torch.empty(y.numel(), dtype=y.dtype)
        if hasattr(dist, "all_gather_single"):  # torch >= 2.13's name for the one below
            dist.all_gather_single(out, y.flatten())
        dist.all_gather_into_tensor(out, y.flatten())
        dist.broadcast(out, src=0)
        return gathered[0] + out.view_as(y)


def run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


def test_collectives_become_dist_records_with_group_and_reduce_op(one_rank, tmp_path):
    torch.manual_seed(0)
    model, x = TensorParallelish(), torch.randn(3, 8)
    with precguard.monitor(model, out=tmp_path / "run"):
        run(model, x)
    recs = [r for r in precguard.load_run(tmp_path / "run").records() if r.collective]
    keys = [r.key for r in recs]
    assert keys[:2] == ["dist.all_reduce.0.forward.input.0", "dist.all_reduce.0.forward.output.0"]
    expected = {"dist.all_reduce", "dist.all_gather", "dist.all_gather_into_tensor",
                "dist.broadcast"} | ({"dist.all_gather_single"} if hasattr(dist,
                "all_gather_single") else set())  # fmt: skip
    assert {r.module for r in recs} == expected
    # the old name calls the new one: recorded once, under the name called
    assert sum(r.module == "dist.all_gather_single" for r in recs) == 2 * (
        "dist.all_gather_single" in expected
    )
    assert [r.key for r in recs if r.module == "dist.all_gather_into_tensor"] == [
        "dist.all_gather_into_tensor.0.forward.input.0",
        "dist.all_gather_into_tensor.0.forward.output.0",
    ]
    assert all(r.collective.group == [0] and r.collective.api == "c10d" for r in recs)
    assert recs[0].collective.reduce_op == "sum"
    assert all(r.module_type == r.collective.op for r in recs)


def test_results_bitwise_equal_and_nothing_stays_patched(one_rank, tmp_path):
    torch.manual_seed(0)
    model, x = TensorParallelish(), torch.randn(3, 8)
    plain = run(model, x)
    originals = {name: getattr(dist, name) for name in collectives.C10D_OPS}
    with precguard.monitor(model, out=tmp_path / "run"):
        assert collectives.is_patched()
        watched = run(model, x)
    assert torch.equal(plain, watched)
    assert not collectives.is_patched()
    assert {name: getattr(dist, name) for name in collectives.C10D_OPS} == originals


def test_unpatched_also_when_the_body_raises(one_rank, tmp_path):
    model, original = TensorParallelish(), dist.all_reduce
    with pytest.raises(RuntimeError, match="boom"), precguard.monitor(model, out=tmp_path / "r"):
        run(model, torch.randn(2, 8))
        raise RuntimeError("boom")
    assert not collectives.is_patched()
    assert dist.all_reduce is original


def test_async_op_records_the_output_when_waited(one_rank, tmp_path):
    y = torch.arange(4.0)
    with precguard.recording(tmp_path / "run"):
        work = dist.all_reduce(y, async_op=True)
        work.wait()
        assert work.is_completed()  # the rest of the work object is the original's
    recs = {r.key: r for r in precguard.load_run(tmp_path / "run").records()}
    out = recs["dist.all_reduce.0.forward.output.0"]
    assert out.collective.async_ and out.stats.max == 3.0


def test_functional_collectives_share_the_op_count(one_rank, tmp_path):
    import torch.distributed._functional_collectives as funcol

    y = torch.arange(4.0)
    with precguard.recording(tmp_path / "run"):
        dist.all_reduce(y)
        z = funcol.all_reduce(y, "sum", dist.group.WORLD)
    recs = {r.key: r for r in precguard.load_run(tmp_path / "run").records()}
    assert recs["dist.all_reduce.1.forward.output.0"].collective.api == "functional"
    assert recs["dist.all_reduce.1.forward.output.0"].stats.max == float(z.max())


def test_collectives_off_records_none(one_rank, tmp_path):
    with precguard.recording(tmp_path / "run2", collectives=False):
        dist.all_reduce(torch.ones(2))
    assert not list(precguard.load_run(tmp_path / "run2").records())


def test_outside_a_recording_a_collective_is_the_original_function(one_rank):
    assert getattr(dist.all_reduce, "__precguard_original__", None) is None


def test_a_run_with_collectives_compares_with_a_golden_without(one_rank, tmp_path):
    torch.manual_seed(0)
    model, x = TensorParallelish(), torch.randn(3, 8)
    with precguard.monitor(model, out=tmp_path / "golden", collectives=False):
        run(model, x)
    with precguard.monitor(model, out=tmp_path / "actual"):
        run(model, x)
    result = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual")
    assert result.verdict == "match" and not result.unmatched.actual_only
    assert any("collective (dist.*) records only in actual" in w for w in result.warnings)


def test_object_collectives_record_no_pickled_bytes(one_rank, tmp_path):
    box = [{"step": 3}]
    with precguard.recording(tmp_path / "run"):
        dist.broadcast_object_list(box, src=0)
        gathered = [None]
        dist.all_gather_object(gathered, "hello")
        dist.all_reduce(torch.ones(2))
    modules = {r.module for r in precguard.load_run(tmp_path / "run").records()}
    assert box == [{"step": 3}] and gathered == ["hello"]
    assert modules == {"dist.all_reduce"}
