"""A small ``parallel-decoder`` (the corpus's second decoder) for tests that take seconds.

The built-in targets are 3 layers over 128 positions; these are the same model
(the same trained-like statistics: an attention-sink head with a ~1e5 value, a
residual stream with a large mean, peaked logits) with fewer layers and
positions, built through the public :class:`precguard.Target`.
"""

from __future__ import annotations

import torch

import precguard
from precguard.targets import build_parallel_decoder, parallel_decoder_batch


def small_target(
    bug: str | None = None, *, layers: int = 1, seq: int = 32, **config: float
) -> precguard.Target:
    """``parallel-decoder`` with ``layers`` layers on batches of ``seq`` positions.

    ``config`` overrides the trained-like numbers of
    :func:`precguard.targets.build_parallel_decoder` (``sink_value``).
    Pure low-precision training: ``record_target(..., dtype="float16")`` casts the
    whole model, so the optimizer state is float16 too.
    """

    def model() -> torch.nn.Module:
        return build_parallel_decoder(bug, num_layers=layers, max_positions=max(seq, 8), **config)

    return precguard.Target(
        model=model,
        batch=lambda step: parallel_decoder_batch(step, seq=seq),
        loss=lambda output, batch: output[0],
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4, eps=1e-8),
        seed=0,
        name=f"parallel-decoder-small{'-' + bug if bug else ''}",
    )
