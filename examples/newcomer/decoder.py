"""The newcomer's decoder (docs/newcomer.md): a LLaMA-style model written by hand.

RMSNorm with an fp32 upcast, a rotary embedding with an ``inv_freq`` buffer,
SwiGLU (``precguard.models.handwritten_llama``), with attention sharp enough
(query and key weights scaled up, as a trained model's are) for the rotary
angles to reach the logits. ``buggy`` computes the angles in the activation
dtype, the classic port bug; ``fixed`` computes them in float32.

    precguard record -t examples/newcomer/decoder.py:buggy -d cpu -o golden --tensors '*'
"""

from __future__ import annotations

import torch
from torch import nn

import precguard
from precguard.targets import build_handwritten_llama, causal_lm_loss, lm_batch

#: query/key weights scaled so that attention is sharp (a random init's is near uniform)
SHARPNESS = 8.0


def build(rope_bug: bool) -> nn.Module:
    """The decoder, its attention sharpened; ``rope_bug``: angles in the activation dtype."""
    model = build_handwritten_llama(rope_bug=rope_bug)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(SHARPNESS)
    return model


def _target(rope_bug: bool, name: str) -> precguard.Target:
    return precguard.Target(
        model=lambda: build(rope_bug),
        batch=lambda step: lm_batch(step, seq=128, vocab=256),
        loss=causal_lm_loss,
        seed=0,
        name=name,
    )


def buggy() -> precguard.Target:
    """The decoder with its rotary angles computed in the activation dtype."""
    return _target(True, "newcomer-decoder-buggy")


def fixed() -> precguard.Target:
    """The same decoder with the angles in float32, as transformers computes them."""
    return _target(False, "newcomer-decoder-fixed")
