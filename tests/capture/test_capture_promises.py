"""Capture never breaks the user's run: hashes at op level, a failing flush, thread counts.

Each case is one that reached the user's loop as an exception, or lost records, before
issue 31: the training loop below must run to its end and the records be there.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import precguard
from precguard.capture import stats as stats_module
from precguard.capture.hashing import tensor_hash
from precguard.capture.stats import StatsBuffer


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_hashes_at_op_level_record_every_step(tmp_path, training):
    # the hashes' own stack and transfer were captured as ops of the root, queueing hashes
    # while the buffer was emptied: IndexError out of h.step() into the loop
    model = _mlp()
    xs = [torch.randn(2, 8) for _ in range(3)]
    with precguard.monitor(model, out=tmp_path / "r", hashes=True, level="both") as h:
        for x in xs:
            if training:
                model(x).sum().backward()
            else:
                with torch.no_grad():
                    model(x)
            h.step()
    records = list(precguard.load_run(tmp_path / "r").records())
    assert {r.step for r in records} == {0, 1, 2}
    assert not [r.key for r in records if ".op.stack." in r.key or ".op.cpu." in r.key]
    by_key = {(r.step, r.key): r for r in records}
    for step, x in enumerate(xs):
        assert by_key[(step, "root.0.forward.input.0")].hash == tensor_hash(x)
        assert by_key[(step, "0.op.linear.0.forward.input.0")].hash == tensor_hash(x)


def test_a_failing_flush_never_reaches_the_loop(tmp_path, monkeypatch, caplog):
    model = _mlp()
    calls = {"n": 0}
    real = StatsBuffer.materialize_with_evidence

    def fails_once(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("statistics transfer failed")
        return real(self)

    monkeypatch.setattr(StatsBuffer, "materialize_with_evidence", fails_once)
    with caplog.at_level(logging.ERROR), precguard.monitor(model, out=tmp_path / "r") as h:
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
            h.step()
    assert "flush_failed" in caplog.text
    keys = {(r.step, r.key) for r in precguard.load_run(tmp_path / "r").records()}
    # the failed flush (step 0's forward) lost its own records only
    assert (0, "root.0.forward.output.0") not in keys
    assert (0, "root.0.backward.output.0") in keys
    assert {(s, "root.0.forward.output.0") for s in (1, 2)} <= keys


def test_more_threads_than_the_kernel_takes_still_records(monkeypatch):
    # torch.set_num_threads(1100) on a large tensor: the kernel refused "1 to 1024
    # threads" and the tensor had no statistics at all
    if stats_module._fused is None:
        pytest.skip("the one-read kernel is not built")
    monkeypatch.setattr(stats_module, "FUSED_SPLIT", 1 << 10)
    monkeypatch.setattr(stats_module, "_FUSED_MIN_RUN", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1100)
    t = torch.randn(4096, 2)
    buf = StatsBuffer()
    slot, finite = buf.add(t)
    row = buf.materialize()[slot]
    assert finite and row["numel"] == t.numel()
    assert row["max"] == t.max().item() and row["min"] == t.min().item()


class Recursive(nn.Module):
    """A root module whose forward calls itself (a recursive cell, a tree model)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, depth: int = 3) -> torch.Tensor:
        h = self.lin(x)
        return self(h, depth - 1) if depth > 0 else h


def _record_recursive(out, steps: int = 2) -> None:
    torch.manual_seed(0)
    model = Recursive()
    with precguard.monitor(model, out=out):
        for _ in range(steps):
            model(torch.ones(2, 4)).sum().backward()


def test_a_root_that_calls_itself_is_one_step_of_numbered_calls(tmp_path):
    # each nested root call opened a new step: four inputs at steps 0..3 and four outputs
    # all keyed root.0 at step 3, so two identical runs compared DIVERGED, 15 unmatched
    _record_recursive(tmp_path / "a")
    _record_recursive(tmp_path / "b")
    run = precguard.load_run(tmp_path / "a")
    outputs = [(r.step, r.key) for r in run.records() if r.key.endswith("forward.output.0")]
    for step in (0, 1):
        assert {k for s, k in outputs if s == step and k.startswith("root.")} == {
            f"root.{call}.forward.output.0" for call in range(4)
        }
    result = precguard.compare_runs(run, precguard.load_run(tmp_path / "b"))
    assert result.verdict == "match", result.first_divergence
    assert not result.unmatched.golden_only and not result.unmatched.actual_only
    assert result.counts.missing == 0


def test_a_refusal_of_the_kernel_takes_the_passes(monkeypatch):
    if stats_module._fused is None:
        pytest.skip("the one-read kernel is not built")

    class Refusing:
        BLOCK = stats_module._fused.BLOCK

        @staticmethod
        def scan(*args):
            raise ValueError("scan(): 1 to 1024 threads")

        stats = scan  # the finished scan refuses alike

    t = torch.randn(64, 8)
    monkeypatch.setattr(stats_module, "_fused", Refusing)
    buf = StatsBuffer()
    slot, _ = buf.add(t)
    row = buf.materialize()[slot]
    assert row["max"] == t.max().item() and row["numel"] == t.numel()
