"""A small residual network for precision regression tests (plain torch, seeded).

The throwaway project of ``test_plugin_project.py`` copies this file as its
``model.py``; a fault is planted by giving one layer a gain in ``GAINS``.
"""

from __future__ import annotations

import torch
from torch import nn

#: layer index -> factor on that layer's residual branch (a planted fault; empty: none)
GAINS: dict[int, float] = {}


class Block(nn.Module):
    """Pre-norm MLP block with a residual connection."""

    def __init__(self, dim: int, gain: float = 1.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * dim, dim)
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.down(self.act(self.up(self.norm(x))))
        return x + (branch * self.gain if self.gain != 1.0 else branch)


class Net(nn.Module):
    """``depth`` blocks and a linear head."""

    def __init__(self, dim: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(dim, GAINS.get(i, 1.0)) for i in range(depth)])
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(seed: int = 0, **kwargs: int) -> Net:
    """The network with a seeded init, in eval mode."""
    torch.manual_seed(seed)
    return Net(**kwargs).eval()


def batch(seed: int = 1) -> torch.Tensor:
    """A (4, 16, 32) input from a seeded generator."""
    return torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(seed))
