"""Every dtype safetensors can hold is recorded, read back bit for bit, and compared."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precguard

#: every dtype the safetensors format defines (F64 ... F8_E8M0), by torch's name: the list
#: is the format's, written here and not read from the writer, so a dtype the writer drops
#: fails; the ones this torch lacks are left out
SAFETENSORS_DTYPES = [
    getattr(torch, name)
    for name in (
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "uint64",
        "uint32",
        "uint16",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    )
    if hasattr(torch, name)
]


class CastTo(nn.Module):
    """A layer whose output is stored in ``dtype``: a float8 projection, a uint16 index map."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        if self.dtype.is_complex:
            return torch.complex(y, -y).to(self.dtype)
        if not self.dtype.is_floating_point and self.dtype is not torch.bool:
            y = y.abs() * 100  # unsigned and signed ints get distinct, non-negative values
        return y.to(self.dtype)


def _record(model: nn.Module, out: Path) -> precguard.Run:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with precguard.monitor(model, out, tensors=True):
        model(x)
    return precguard.load_run(out)


@pytest.mark.parametrize("dtype", SAFETENSORS_DTYPES, ids=str)
def test_every_safetensors_dtype_round_trips_bit_for_bit(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    model = CastTo(dtype)
    run = _record(model, tmp_path / "run")
    out = next(r for r in run.records() if r.key == "root.0.forward.output.0")
    assert out.dtype == str(dtype).removeprefix("torch.")
    expected = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)))
    stored = run.tensor(out)
    assert stored.dtype is dtype
    # bit patterns, not values: NaN payloads and -0.0 must survive too
    assert torch.equal(stored.view(torch.uint8), expected.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16])
def test_two_recordings_of_a_low_precision_output_compare(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    model = CastTo(dtype)
    golden = _record(model, tmp_path / "golden")
    same = precguard.compare_runs(golden, _record(model, tmp_path / "same"))
    assert same.verdict == "match"
    with torch.no_grad():
        model.proj.weight.mul_(3.0)  # the run under test computes a different projection
    diverged = precguard.compare_runs(golden, _record(model, tmp_path / "actual"))
    assert diverged.verdict == "diverged"
    assert diverged.first_divergence is not None
    assert diverged.first_divergence.module == "proj"


def test_a_float8_output_is_measured_in_floating_point_not_by_equality(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = CastTo(torch.float8_e4m3fn)
    golden = _record(model, tmp_path / "golden")
    with torch.no_grad():
        model.proj.bias.add_(0.5)
    result = precguard.compare_runs(golden, _record(model, tmp_path / "actual"))
    root = next(r for r in result.records if r.key == "root.0.forward.output.0")
    assert root.metrics is not None
    assert root.metrics.level == "full" and root.metrics.dtype.startswith("float8_e4m3fn")
    assert root.metrics.error > 0  # a relative error, not a count of unequal elements
