"""Every way to record returns one kind of handle: step(), remove() (twice is harmless), with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard


@precguard.precision_monitor
class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


#: how each way to record is opened on a model, writing into a folder
OPENERS: dict[str, Callable[[nn.Module, Path], precguard.Handle]] = {
    "monitor": lambda model, out: precguard.monitor(model, out),
    "op capture": lambda model, out: precguard.monitor(model, out, level="op"),
    "recording": lambda model, out: precguard.recording(out),
    "watch": lambda model, out: precguard.watch(model, None, out=out),
}


@pytest.mark.parametrize("way", sorted(OPENERS))
def test_every_way_to_record_is_removed_once_and_twice_is_harmless(way: str, tmp_path: Path):
    model = _model()
    plain = model(torch.ones(2, 4))
    handle = OPENERS[way](model, tmp_path / "out")
    assert isinstance(handle, precguard.Handle)
    watched = model(torch.ones(2, 4))
    handle.step()
    handle.remove()
    handle.remove()  # as torch's RemovableHandle: a second removal does nothing
    assert torch.equal(plain, watched)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("way", sorted(OPENERS))
def test_every_way_to_record_is_a_context_manager_that_names_the_error(
    way: str, tmp_path: Path
) -> None:
    model = _model()
    with (
        pytest.raises(RuntimeError, match="the loop broke"),
        OPENERS[way](model, tmp_path / "out") as handle,
    ):
        model(torch.ones(2, 4))
        handle.step()
        raise RuntimeError("the loop broke")
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    run = tmp_path / "out" / ("recording" if way == "watch" else "")
    manifest = precguard.load_run(run).manifest
    assert manifest.complete is False
    assert manifest.error is not None and manifest.error.type == "RuntimeError"


def test_a_recording_opened_without_with_records_decorated_modules_until_removed(tmp_path):
    block = Scaled()
    handle = precguard.recording(tmp_path / "run")
    block(torch.ones(1, 4))
    handle.remove()
    block(torch.ones(1, 4))  # closed: this call is only watched
    records = list(precguard.load_run(tmp_path / "run").records())
    assert records and {r.step for r in records} == {0}
    assert len({r.key for r in records}) == len(records)


def test_the_watch_keeps_close_as_its_old_name_for_remove(tmp_path: Path) -> None:
    handle = precguard.watch(_model(), None, out=tmp_path / "w")
    handle.close()
    assert handle.closed
    handle.remove()
