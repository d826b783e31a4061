"""Small models and targets for the emulator tests."""

from __future__ import annotations

import torch
from torch import nn

from precguard import Target


class Blowup(nn.Module):
    """Three layers; ``big`` multiplies by 1e5, so its outputs pass fp16's 65504."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.big = nn.Linear(8, 8, bias=False)
        self.out = nn.Linear(8, 4)
        with torch.no_grad():
            self.big.weight.copy_(torch.eye(8) * 1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.big(self.inp(x))))


class DropoutMLP(nn.Module):
    """An MLP with dropout, for RNG tests."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _batch(features: int):
    def batch(step: int) -> torch.Tensor:
        return torch.randn(4, features, generator=torch.Generator().manual_seed(step))

    return batch


def blowup_target() -> Target:
    return Target(model=Blowup, batch=_batch(8), name="blowup")


def dropout_target() -> Target:
    return Target(
        model=DropoutMLP,
        batch=_batch(16),
        loss=lambda out, _batch: out.pow(2).mean(),
        name="dropout-mlp",
    )
