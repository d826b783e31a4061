"""A tiny training loop the watch tests share: a seeded MLP regression, AdamW, fixed data."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn


class TinyNet(nn.Module):
    """Three named layers, so alerts have layers to name."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.hidden = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(torch.tanh(self.inp(x)))))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's inputs and targets, from a generator seeded by the step."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8, 16, generator=gen)
    return x, torch.sin(x[:, :4])


def train(
    steps: int,
    handle_factory: Callable[[nn.Module, torch.optim.Optimizer], object] | None = None,
    *,
    before_step: Callable[[int, nn.Module, torch.optim.Optimizer], None] | None = None,
    seed: int = 0,
) -> tuple[nn.Module, object]:
    """Train a fresh seeded TinyNet for ``steps`` steps, calling ``handle.step(loss)`` each."""
    torch.manual_seed(seed)
    model = TinyNet()
    hidden = list(model.hidden.parameters())
    others = [p for n, p in model.named_parameters() if not n.startswith("hidden.")]
    opt = torch.optim.AdamW([{"params": others}, {"params": hidden}], lr=1e-3)
    handle = handle_factory(model, opt) if handle_factory is not None else None
    try:
        for step in range(steps):
            x, y = batch(step)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if before_step is not None:
                before_step(step, model, opt)
            opt.step()
            opt.zero_grad()
            if handle is not None:
                handle.step(loss)
    finally:
        if handle is not None:
            handle.close()
    return model, handle


@pytest.fixture
def tiny_train() -> Callable[..., tuple[nn.Module, object]]:
    """The :func:`train` loop."""
    return train
