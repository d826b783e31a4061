"""A float8 tensor's record carries its saturated and underflow shares, scale and amax."""

from __future__ import annotations

import torch
from torch import nn

import precguard


class _Fp8Weight(nn.Module):
    """A layer that stores its weight in float8_e4m3fn and upcasts it per call."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.to(torch.float8_e4m3fn), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.float().T


def test_monitor_records_fp8_statistics_of_a_float8_weight(tmp_path):
    weight = torch.tensor([[448.0, -448.0, 1.0, 0.0], [2.0, 3.0, 0.0, 0.5]])
    model = nn.Sequential(_Fp8Weight(weight))
    with precguard.monitor(model, tmp_path / "run"):
        model(torch.ones(3, 4))
    records = {r.key: r for r in precguard.load_run(tmp_path / "run").records()}
    param = records["0.0.forward.param.0"]
    assert param.dtype == "float8_e4m3fn"
    fp8 = param.stats.fp8
    assert fp8 is not None
    assert fp8.saturated == 2 / 8  # the two elements at +-448
    assert fp8.underflow == 2 / 8  # the two zeros
    assert fp8.amax == 448.0 and fp8.scale is None
    # float32 tensors carry none
    assert records["0.0.forward.output.0"].stats.fp8 is None


def test_a_float8_tensor_below_the_max_saturates_nothing(tmp_path):
    model = nn.Sequential(_Fp8Weight(torch.full((2, 4), 3.0)))
    with precguard.monitor(model, tmp_path / "run"):
        model(torch.ones(1, 4))
    param = {r.key: r for r in precguard.load_run(tmp_path / "run").records()}[
        "0.0.forward.param.0"
    ]
    assert param.stats.fp8.saturated == 0.0 and param.stats.fp8.amax == 3.0
