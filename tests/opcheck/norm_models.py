"""Targets for op-check's norm and position tests (``tests/opcheck/norm_models.py:NAME``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import precguard

#: the corpus's second decoder, cut small (tests/checks/parallel.py)
PARALLEL = str(Path(__file__).parents[1] / "checks" / "parallel.py")


class Positions(nn.Module):
    """Learned positions and a LayerNorm, with no config saying how many positions there are."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(50, 32)
        self.positions = nn.Embedding(40, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = torch.arange(input_ids.shape[1])
        return self.norm(self.tokens(input_ids) + self.positions(t)[None])


def undeclared_positions() -> precguard.Target:
    """40 learned positions the model does not declare; batches of 16 tokens."""
    return precguard.Target(
        model=Positions,
        batch=lambda step: {"input_ids": torch.randint(0, 50, (1, 16))},
        seed=0,
    )


class Overflowing(nn.Module):
    """A Linear whose output overflows fp32 (x 1e38), then a LayerNorm that reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x) * 1e38 * 1e38)


def overflow_upstream() -> precguard.Target:
    """The norm's captured inputs are NaN/Inf already in fp32 on the CPU."""
    return precguard.Target(model=Overflowing, batch=lambda step: torch.randn(1, 4, 8), seed=0)
