"""Small hand-written modules with awkward inputs and outputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class PairOut:
    main: torch.Tensor
    aux: torch.Tensor


class Branchy(nn.Module):
    """Returns a tuple holding a dict and a dataclass; takes a kwarg."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple:
        h = self.norm(self.a(x)) * scale
        return h, {"b": self.b(h)}, PairOut(main=h.sum(-1), aux=torch.relu(h))


class Stack(nn.Module):
    """Three blocks; the middle one can be told to produce NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.act = nn.GELU()
        self.poison_block = -1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = self.act(block(x))
            if i == self.poison_block:
                x = x / torch.zeros_like(x) * 0  # 0/0 -> NaN
        return x
