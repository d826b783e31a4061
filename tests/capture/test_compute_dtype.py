"""A recording says what precision its values were computed in, not only how they are
stored: the run's (an emulator's) in the manifest, autocast's on each record."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import precguard
from precguard import load_run


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def test_records_under_autocast_carry_the_autocast_dtype(tmp_path: Path) -> None:
    model = _model()
    x = torch.randn(2, 16)
    with precguard.monitor(model, tmp_path / "amp"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)
        model(x)  # a second step outside autocast

    records = list(load_run(tmp_path / "amp").records())
    amp = [r for r in records if r.step == 0 and r.role in ("input", "output")]
    plain = [r for r in records if r.step == 1 and r.role in ("input", "output")]
    assert amp and all(r.compute_dtype == "bfloat16" for r in amp)
    assert plain and all(r.compute_dtype is None for r in plain)
    assert load_run(tmp_path / "amp").manifest.compute_dtype is None


def test_an_emulated_run_records_the_profiles_compute_dtype(tmp_path: Path) -> None:
    bf16 = precguard.record_target("tiny-llama", device="emu:bf16", out=tmp_path / "emu")
    cpu = precguard.record_target("tiny-llama", device="cpu", out=tmp_path / "cpu")

    assert load_run(bf16).manifest.compute_dtype == "bfloat16"
    assert load_run(cpu).manifest.compute_dtype is None
