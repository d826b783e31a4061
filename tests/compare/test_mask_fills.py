"""One attention mask in two formats is one mask.

The story: eager attention adds a float mask, 0 where a query attends and the
format's minimum where it does not: fp32's and bf16's ``finfo.min`` (-3.4e38) on
one chip, fp16's -65504 on a chip that runs the model in fp16 (or saturates the
fp32 minimum to it). Both fills zero the key's softmax weight outright, so the
two runs attend to the same keys and compute the same numbers; compared as floats
the masks differ by 100 % (or by 5e33 relative to an fp16 golden), and a clean
tiny LLaMA on ``emu:fp16-lowacc`` against ``emu:bf16`` read DIVERGED at layer 0's
mask input. compare reads two additive masks whose fills both mask outright
(``precguard.numerics.MASK_FILL_MAX``) as masks, position by position, and still
names a mask that attends to other keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precguard

FP32_FILL = torch.finfo(torch.float32).min
FP16_FILL = torch.finfo(torch.float16).min


class Attend(nn.Module):
    """One attention head over the sequence, the mask added to its scores (eager)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.query = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ x.transpose(-1, -2) / 4 + mask
        return self.out(torch.softmax(scores, dim=-1) @ x)


class Decoder(nn.Module):
    """A causal decoder of one block; ``fill`` is its format's minimum."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Attend()

    def forward(self, x: torch.Tensor, fill: float, hidden: int = 0) -> torch.Tensor:
        seq = x.shape[-2]
        masked = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        if hidden:  # a mask that hides the first ``hidden`` keys from the last query too
            masked[-1, :hidden] = True
        mask = torch.zeros(seq, seq).masked_fill(masked, fill)
        return self.block(x, mask)


def _record(out: Path, fill: float, *, tensors: bool, hidden: int = 0) -> Path:
    torch.manual_seed(0)
    model = Decoder()
    x = torch.randn(1, 12, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), precguard.monitor(model, out=out, tensors=tensors):
        model(x, fill, hidden)
    return out


@pytest.mark.parametrize("tensors", [True, False], ids=["full", "statistics"])
def test_an_fp16_mask_fill_against_fp32_s_is_the_same_mask(tmp_path: Path, tensors) -> None:
    golden = _record(tmp_path / "g", FP16_FILL, tensors=tensors)
    actual = _record(tmp_path / "a", FP32_FILL, tensors=tensors)
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "match", result.first_divergence
    (mask,) = [r for r in result.records if r.key == "block.0.forward.input.1"]
    assert mask.status == "pass" and "compared as attention masks" in (mask.metrics.note or "")


def test_a_mask_that_hides_other_keys_is_still_a_divergence(tmp_path: Path) -> None:
    golden = _record(tmp_path / "g", FP16_FILL, tensors=True)
    actual = _record(tmp_path / "a", FP32_FILL, tensors=True, hidden=3)
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "diverged"
    (mask,) = [r for r in result.records if r.key == "block.0.forward.input.1"]
    assert mask.status != "pass"
