"""Complex tensors (Llama 4's rotary frequencies, ``torch.polar``) are measured as floats.

Before, a ``complex64`` record was compared for equality as an integer one is, so two correct
runs differing by rounding read an error of 1 at the rotary embedding.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import precguard


class Frequencies(nn.Module):
    """Rotary frequencies as complex numbers, the way Llama 4 makes them."""

    def __init__(self, shift: float = 0.0) -> None:
        super().__init__()
        self.shift = shift
        self.register_buffer("inv_freq", 10000.0 ** -(torch.arange(0, 16, 2).float() / 16))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None] * self.inv_freq[None, :] * (1 + self.shift)
        return torch.polar(torch.ones_like(angles), angles)


class Model(nn.Module):
    def __init__(self, shift: float = 0.0) -> None:
        super().__init__()
        self.rotary = Frequencies(shift)
        self.proj = nn.Linear(16, 16)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.view_as_real(self.rotary(positions)).flatten(1))


def record(out: Path, model: nn.Module) -> None:
    with precguard.monitor(model, out, tensors=["*"]), torch.no_grad():
        model(torch.arange(64))


def test_a_complex_record_is_measured_by_its_parts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    golden, actual = Model(), Model()
    actual.load_state_dict(golden.state_dict())
    record(tmp_path / "g", golden)
    record(tmp_path / "a", actual)
    result = precguard.compare_runs(tmp_path / "g", tmp_path / "a")
    out = next(r for r in result.records if r.key.startswith("rotary") and ".output." in r.key)
    assert out.golden_dtype == "complex64"
    assert out.metrics is not None and out.metrics.level == "full"
    assert out.metrics.error == 0.0
    assert result.verdict == "match"


def test_a_wrong_angle_is_found_at_the_complex_output(tmp_path: Path) -> None:
    torch.manual_seed(0)
    golden, actual = Model(), Model(shift=0.01)
    actual.load_state_dict(golden.state_dict())
    record(tmp_path / "g", golden)
    record(tmp_path / "a", actual)
    result = precguard.compare_runs(tmp_path / "g", tmp_path / "a")
    out = next(r for r in result.records if r.key.startswith("rotary") and ".output." in r.key)
    assert out.metrics is not None and out.metrics.level == "full"
    # a 1 % error of the angles at positions up to 63: a relative error of the parts, not 1
    assert 0.0 < out.metrics.error < 0.5
    assert result.first_divergence is not None
    assert result.first_divergence.module == "rotary"
