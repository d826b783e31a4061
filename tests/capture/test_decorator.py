"""@precision_monitor on classes, instances and functions; record() as the sink."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precguard
from precguard import NonFiniteError


@precguard.precision_monitor
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.second = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def test_class_decorator_writes_into_active_recording(tmp_path):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 4)
    plain = net(x)
    with precguard.recording(tmp_path / "run") as rec:
        watched = net(x)
        rec.step()
        net(x)
    assert torch.equal(plain, watched)
    records = list(precguard.load_run(tmp_path / "run").records())
    modules = {r.module for r in records}
    blocks = sorted({m.split(".")[0] for m in modules})
    assert len(blocks) == 2 and all(b.startswith("Block#") for b in blocks)
    assert {f"{blocks[0]}.proj", f"{blocks[1]}.proj"} <= modules
    assert {r.step for r in records} == {0, 1}


def test_class_decorator_outside_recording_only_watches(caplog):
    torch.manual_seed(0)
    block = Block()
    with torch.no_grad():
        block.proj.weight.fill_(float("nan"))
    with caplog.at_level("WARNING", logger="precguard"):
        block(torch.randn(2, 4))
    events = [r for r in caplog.records if getattr(r, "precguard_event", "") == "nonfinite_origin"]
    assert len(events) == 1
    assert events[0].precguard_data["module"].endswith(".proj")


def test_instance_decorator_and_unmonitor(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    precguard.precision_monitor(model, on_nonfinite="raise")
    assert len(model[0]._forward_hooks_with_kwargs) == 1
    with precguard.recording(tmp_path / "run"):
        model(torch.randn(1, 4))
    keys = {r.key for r in precguard.load_run(tmp_path / "run").records()}
    assert "0.0.forward.output.0" in keys and "root.0.forward.input.0" in keys
    with torch.no_grad():
        model[0].bias.fill_(float("inf"))
    with pytest.raises(NonFiniteError, match=r"produced by 0 \(Linear\)"):
        model(torch.randn(1, 4))
    assert precguard.unmonitor(model) is True
    assert len(model[0]._forward_hooks_with_kwargs) == 0
    assert precguard.unmonitor(model) is False


def test_function_decorator(tmp_path):
    @precguard.precision_monitor
    def rope_angles(pos: torch.Tensor, inv_freq: torch.Tensor) -> tuple:
        ang = pos[:, None].float() * inv_freq[None]
        return ang.cos(), ang.sin()

    pos = torch.arange(8)
    inv = 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))
    with precguard.recording(tmp_path / "run"):
        cos, _sin = rope_angles(pos, inv)
    expected = pos[:, None].float() * inv[None]
    assert torch.equal(cos, expected.cos())
    recs = {r.key: r for r in precguard.load_run(tmp_path / "run").records()}
    name = "test_function_decorator.<locals>.rope_angles"
    assert recs[f"{name}.0.forward.input.0"].dtype == "int64"
    assert recs[f"{name}.0.forward.output.1"].name == "output.1"
    assert recs[f"{name}.0.forward.output.0"].module_type == "function"


def test_decorated_module_inside_monitor_is_recorded_once(tmp_path):
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad(), precguard.monitor(net, out=tmp_path / "run"):
        net(torch.randn(2, 4))
    modules = {r.module for r in precguard.load_run(tmp_path / "run").records()}
    assert "first.proj" in modules
    assert not any(m.startswith("Block#") for m in modules)


def test_decorator_policy_applies_inside_a_recording(tmp_path):
    @precguard.precision_monitor(on_nonfinite="raise")
    def log_of(x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)

    with (
        precguard.recording(tmp_path / "run"),  # the recording itself only records NaN/Inf
        pytest.raises(NonFiniteError, match="log_of"),
    ):
        log_of(torch.tensor([1.0, -1.0]))
    origins = [r for r in precguard.load_run(tmp_path / "run").records() if r.nonfinite_origin]
    assert [r.module for r in origins] == [
        "test_decorator_policy_applies_inside_a_recording.<locals>.log_of"
    ]
