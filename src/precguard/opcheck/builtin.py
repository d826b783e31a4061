"""The built-in op sweeps: the ops that cause most cross-chip trouble, at a sequence length.

Each op builds its inputs for a sequence length ``n`` from a seeded CPU
generator (fp32) and is one plain function of them, which op-check runs on
the device in its dtype and under the fp64 oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HIDDEN = 256
HEADS = 2
HEAD_DIM = 64
VOCAB = 1024
ROPE_BASE = 10000.0


@dataclass(frozen=True)
class OpSpec:
    """One built-in op: inputs for a sequence length, the function, and what the sweep varies."""

    name: str
    describe: str
    inputs: Callable[[int, torch.Generator], tuple[torch.Tensor, ...]]
    fn: Callable[..., torch.Tensor]
    rotary: bool = False  # judged against the angle allowance (rope_allowed)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(a, b) -> (-b, a) over the last dim's halves (HF's layout)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope(q: torch.Tensor) -> torch.Tensor:
    """HF-style RoPE on ``q`` (B, H, T, D): fp32 inv_freq and angles, cos/sin in q's dtype."""
    d, n = q.shape[-1], q.shape[-2]
    inv = 1.0 / ROPE_BASE ** (torch.arange(0, d, 2, device=q.device, dtype=torch.float32) / d)
    positions = torch.arange(n, device=q.device, dtype=torch.float32)
    freqs = positions[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return q * emb.cos().to(q.dtype) + rotate_half(q) * emb.sin().to(q.dtype)


def max_angle(n: int, head_dim: int = HEAD_DIM) -> float:
    """The largest rotary angle of :func:`rope` at ``n`` positions (the first frequency is 1)."""
    return float(n - 1)


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


BUILTIN_OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec(
            "rope",
            f"rotary embedding of q (1, {HEADS}, n, {HEAD_DIM}), positions 0..n-1",
            lambda n, g: (_randn(g, 1, HEADS, n, HEAD_DIM),),
            rope,
            rotary=True,
        ),
        OpSpec(
            "rmsnorm",
            f"F.rms_norm over {HIDDEN} channels of (1, n, {HIDDEN}), inputs x3",
            lambda n, g: (_randn(g, 1, n, HIDDEN, scale=3.0), 1 + _randn(g, HIDDEN, scale=0.1)),
            lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps=1e-6),
        ),
        OpSpec(
            "layernorm",
            f"F.layer_norm over {HIDDEN} channels of (1, n, {HIDDEN}), inputs x3 + 1",
            lambda n, g: (
                _randn(g, 1, n, HIDDEN, scale=3.0) + 1,
                1 + _randn(g, HIDDEN, scale=0.1),
                _randn(g, HIDDEN, scale=0.1),
            ),
            lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5),
        ),
        OpSpec(
            "softmax",
            "softmax over n of (4, 64, n) scores, scores x4",
            lambda n, g: (_randn(g, 4, 64, n, scale=4.0),),
            lambda s: torch.softmax(s, dim=-1),
        ),
        OpSpec(
            "attention",
            f"causal F.scaled_dot_product_attention, q/k/v (1, {HEADS}, n, {HEAD_DIM})",
            lambda n, g: tuple(_randn(g, 1, HEADS, n, HEAD_DIM) for _ in range(3)),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
        OpSpec(
            "matmul",
            "(64, n) @ (n, 64): n terms per dot product",
            lambda n, g: (_randn(g, 64, n), _randn(g, n, 64, scale=n**-0.5)),
            torch.matmul,
        ),
        OpSpec(
            "cross_entropy",
            f"mean F.cross_entropy of n tokens over {VOCAB} classes, logits x3",
            lambda n, g: (
                _randn(g, n, VOCAB, scale=3.0),
                torch.randint(0, VOCAB, (n,), generator=g),
            ),
            F.cross_entropy,
        ),
    )
}
