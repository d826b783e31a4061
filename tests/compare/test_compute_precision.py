"""A run whose fp32 matmuls ran as TF32 (a GPU with TF32 on, Cambricon's flag, Ascend's HF32)
is judged by that precision, not by fp32's: the user's story is an fp32 model on a GPU
with ``torch.set_float32_matmul_precision("high")`` against a CPU fp32 golden."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import precguard
from precguard.compare.tolerance import SIGNIFICAND_BITS, unit_roundoff


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """Round fp32 to TF32's 10 mantissa bits (nearest, ties away), as TF32 cores read operands."""
    bits = t.contiguous().view(torch.int32)
    rounded = (bits + (1 << 12)) & ~((1 << 13) - 1)
    return rounded.view(torch.float32)


class TF32Linear(nn.Linear):
    """An fp32 Linear whose matmul reads its operands in TF32, as cuBLAS does with TF32 on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(_tf32(x), _tf32(self.weight), self.bias)


class MLP(nn.Module):
    def __init__(self, tf32: bool, hidden: int = 256) -> None:
        super().__init__()
        cls = TF32Linear if tf32 else nn.Linear
        self.up = cls(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.down = cls(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def _record(out: Path, *, tf32: bool, compute_dtype: str | None, scale: float = 1.0) -> None:
    torch.manual_seed(0)
    model = MLP(tf32)
    torch.manual_seed(0)
    ref = MLP(False)
    model.load_state_dict(ref.state_dict())
    if scale != 1.0:
        with torch.no_grad():
            model.down.weight.mul_(scale)
    x = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(1))
    with precguard.monitor(model, out, tensors=True, compute_dtype=compute_dtype):
        model(x)


def test_tf32_precision_is_between_bf16_and_fp32() -> None:
    assert SIGNIFICAND_BITS["bfloat16"] < SIGNIFICAND_BITS["tfloat32"] < SIGNIFICAND_BITS["float32"]
    assert unit_roundoff("hfloat32") == unit_roundoff("tfloat32") / 2  # one bit more


def test_a_tf32_run_matches_an_fp32_golden_within_tf32_precision(tmp_path: Path) -> None:
    _record(tmp_path / "golden", tf32=False, compute_dtype=None)
    _record(tmp_path / "gpu", tf32=True, compute_dtype="tfloat32")

    judged = precguard.compare(tmp_path / "golden", tmp_path / "gpu")
    strict = precguard.compare(tmp_path / "golden", tmp_path / "gpu", tolerance_dtype="golden")

    assert judged.verdict == "match", judged.first_divergence
    assert {r.metrics.dtype for r in judged.records if r.metrics and r.role == "output"} == {
        "tfloat32"
    }
    # held to fp32, the same TF32 rounding diverges: the precision is what made it pass
    assert strict.verdict == "diverged"


def test_a_real_fault_still_shows_through_tf32_precision(tmp_path: Path) -> None:
    _record(tmp_path / "golden", tf32=False, compute_dtype=None)
    _record(tmp_path / "gpu", tf32=True, compute_dtype="tfloat32", scale=1.01)

    result = precguard.compare(tmp_path / "golden", tmp_path / "gpu")

    assert result.verdict == "diverged"
    assert result.first_divergence is not None and result.first_divergence.module == "down"
