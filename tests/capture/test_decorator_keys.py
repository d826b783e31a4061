"""@precision_monitor keys are stable: two runs in one process line up module by module.

Also: the class decoration can be undone, a decorated module inside another
decorated one is recorded once under its path there, and record() fills the
manifest's device, dtype, model and fingerprint from what it records.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from precguard.cli import main


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + torch.tanh(self.proj(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.second = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


@pytest.fixture
def decorated_block():
    """Block decorated for the test, and undecorated afterwards."""
    precguard.precision_monitor(Block)
    try:
        yield Block
    finally:
        precguard.unmonitor(Block)


def one_run(out: Path, *, fault: str | None = None) -> Path:
    """A fresh model (same seed) run for two steps inside record()."""
    torch.manual_seed(0)
    net = Net()
    if fault is not None:
        module = net.get_submodule(fault)
        module.register_forward_hook(lambda _m, _a, output: output * 1.05)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), precguard.recording(out) as rec:
        for _ in range(2):
            net(x)
            rec.step()
    return out


def compare_cli(golden: Path, actual: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["compare", str(golden), str(actual)])
    return info.value.code or 0, capsys.readouterr().out


def test_two_runs_in_one_process_compare_by_module(
    decorated_block, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = one_run(tmp_path / "first")
    second = one_run(tmp_path / "second")

    modules = {r.module for r in precguard.load_run(second).records()}
    assert {"Block#0", "Block#0.proj", "Block#1", "Block#1.norm"} <= modules
    assert {r.key for r in precguard.load_run(first).records()} == {
        r.key for r in precguard.load_run(second).records()
    }
    code, out = compare_cli(first, second, capsys)
    assert code == 0, out
    assert out.startswith("MATCH")


def test_a_fault_in_the_second_instance_is_named(
    decorated_block, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = one_run(tmp_path / "clean")
    faulty = one_run(tmp_path / "faulty", fault="second.proj")

    code, out = compare_cli(clean, faulty, capsys)

    assert code == 1
    assert out.startswith("DIVERGED")
    result = precguard.compare_runs(clean, faulty)
    assert result.first_divergence is not None
    assert result.first_divergence.module == "Block#1.proj"


def test_explicit_name_and_manifest_facts(tmp_path: Path) -> None:
    precguard.precision_monitor(Block, name="block")
    try:
        torch.manual_seed(0)
        net = Net().to(torch.float64)
        with torch.no_grad(), precguard.recording(tmp_path / "run"):
            net(torch.randn(2, 8, dtype=torch.float64))
    finally:
        assert precguard.unmonitor(Block) is True
    run = precguard.load_run(tmp_path / "run")
    assert {"block.proj", "block#1.proj"} <= {r.module for r in run.records()}
    m = run.manifest
    assert (m.device, m.dtype, m.model, m.complete) == ("cpu", "float64", "Block", True)
    assert m.fingerprint["torch.version"] == torch.__version__


def test_monitor_fills_fingerprint_and_dtype(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).to(torch.bfloat16)
    with precguard.monitor(model, out=tmp_path / "run"):
        model(torch.randn(2, 4, dtype=torch.bfloat16))
    m = precguard.load_run(tmp_path / "run").manifest
    assert m.dtype == "bfloat16"
    assert m.fingerprint["torch.version"] == torch.__version__


def test_class_decoration_can_be_undone(tmp_path: Path) -> None:
    precguard.precision_monitor(Block)
    torch.manual_seed(0)
    block = Block()
    block(torch.randn(2, 8))  # watch-only hooks go on at the first call
    assert block.proj._forward_hooks_with_kwargs

    assert precguard.unmonitor(Block) is True
    assert "__call__" not in Block.__dict__
    assert not block.proj._forward_hooks_with_kwargs
    with precguard.recording(tmp_path / "run"):
        block(torch.randn(2, 8))
    assert not list(precguard.load_run(tmp_path / "run").records())
    assert precguard.unmonitor(Block) is False


def test_decorated_module_inside_a_decorated_module_is_recorded_once(tmp_path: Path) -> None:
    precguard.precision_monitor(Block)
    precguard.precision_monitor(Net)
    try:
        torch.manual_seed(0)
        net = Net()
        with torch.no_grad(), precguard.recording(tmp_path / "run"):
            net(torch.randn(2, 8))
    finally:
        precguard.unmonitor(Net)
        precguard.unmonitor(Block)
    records = list(precguard.load_run(tmp_path / "run").records())
    modules = {r.module for r in records}
    assert {"Net#0", "Net#0.first.proj", "Net#0.second.norm"} <= modules
    assert not any(m.startswith("Block#") for m in modules)
    assert len({r.key for r in records}) == len(records)


def test_a_raising_body_is_written_incomplete(decorated_block, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    with pytest.raises(KeyError), precguard.recording(tmp_path / "run"):
        net(torch.randn(2, 8))
        raise KeyError("tokenizer")
    m = precguard.load_run(tmp_path / "run").manifest
    assert m.complete is False and m.error is not None and m.error.type == "KeyError"


def test_only_the_innermost_recording_records(decorated_block, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 8)
    with torch.no_grad(), precguard.recording(tmp_path / "outer") as outer:
        net(x)
        outer.step()
        with precguard.recording(tmp_path / "inner"):
            net(x)
        net(x)
    outer = [r for r in precguard.load_run(tmp_path / "outer").records() if r.role != "param"]
    inner = [r for r in precguard.load_run(tmp_path / "inner").records() if r.role != "param"]
    assert {r.module for r in inner} >= {"Block#0.proj", "Block#1.proj"}
    # the outer recording has the calls before and after the inner one, not the inner one
    assert {r.step for r in outer} == {0, 1}
    assert len(outer) == 2 * len(inner)


def test_a_closed_recording_keeps_no_instance_alive(decorated_block, tmp_path) -> None:
    import gc
    import weakref

    block = Block()
    with precguard.recording(tmp_path / "run"):
        block(torch.randn(2, 8))
    assert not block.proj._forward_hooks_with_kwargs  # the recording's hooks went with it
    ref = weakref.ref(block)
    del block
    gc.collect()
    assert ref() is None


def test_the_recordings_options_apply_to_a_bare_decorated_class(
    decorated_block, tmp_path: Path
) -> None:
    @precguard.precision_monitor(on_nonfinite="raise")
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad(), precguard.recording(tmp_path / "run", tensors=["Block#1.*"]):
        scale(net(torch.randn(2, 8)))
    run = precguard.load_run(tmp_path / "run")
    saved = {r.module for r in run.records() if r.tensor is not None}
    assert saved == {"Block#1", "Block#1.proj", "Block#1.norm"}  # as the manifest says
    assert run.manifest.options["tensors"] == ["Block#1.*"]
    # a decorator's own explicit option still wins inside any recording
    with pytest.raises(precguard.NonFiniteError), precguard.recording(tmp_path / "again"):
        scale(torch.tensor([3e38]))  # finite in, inf out: scale is the origin


def test_a_tensors_glob_that_matches_nothing_in_record_is_named(
    decorated_block, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    net = Net()
    with (
        caplog.at_level("WARNING", logger="precguard"),
        torch.no_grad(),
        precguard.recording(tmp_path / "run", tensors=["Block#1.proj", "Blok#0.*"]),
    ):
        net(torch.randn(2, 8))
    unmatched = [
        r.precguard_data
        for r in caplog.records
        if getattr(r, "precguard_event", "") == "tensors_pattern_matches_nothing"
    ]
    assert [w["pattern"] for w in unmatched] == ["Blok#0.*"]
    assert unmatched[0]["closest"][0] == "Block#0"
