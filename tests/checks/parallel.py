"""Small builds of the corpus's second decoder (``targets.build_parallel_decoder``) as targets.

The model computes its loss inside ``forward`` and returns ``(loss, logits)``, HF's
``return_dict=False`` order; sizes are cut so a check runs in seconds.
"""

from __future__ import annotations

import torch

import precguard
from precguard.targets import build_parallel_decoder, parallel_decoder_batch

SIZES = {"num_layers": 1, "hidden_size": 64, "intermediate_size": 128, "max_positions": 64}


def _target(bug: str | None, name: str) -> precguard.Target:
    return precguard.Target(
        model=lambda: build_parallel_decoder(bug, **SIZES),
        batch=lambda step: parallel_decoder_batch(step, seq=32),
        loss=lambda output, batch: output[0],
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
        seed=0,
        name=name,
    )


def correct() -> precguard.Target:
    """The correct twin."""
    return _target(None, "parallel-small")


def loss_low_precision() -> precguard.Target:
    """Cross-entropy by hand on the activation-dtype logits."""
    return _target("loss_low_precision", "parallel-small-loss")


def norm_low_precision() -> precguard.Target:
    """One-pass LayerNorm statistics in the activation dtype."""
    return _target("norm_low_precision", "parallel-small-norm")
