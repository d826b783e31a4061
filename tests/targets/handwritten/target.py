"""precguard target for the hand-written decoder that sits beside this file."""

from __future__ import annotations

import torch
from handwritten_decoder import VOCAB, HandwrittenDecoder  # the module beside this file
from torch.nn import functional as F

import precguard


def batch(step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (2, 12), generator=gen)


def loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def target() -> precguard.Target:
    return precguard.Target(model=HandwrittenDecoder, batch=batch, loss=loss, seed=0)


def failing_target() -> precguard.Target:
    """The same model, but the batch of step 1 is malformed: the model raises there."""

    def bad_batch(step: int) -> torch.Tensor:
        return batch(step) if step == 0 else torch.zeros(2, 12, 5, dtype=torch.long)

    return precguard.Target(model=HandwrittenDecoder, batch=bad_batch, loss=loss, seed=0)
