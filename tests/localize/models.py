"""Hand-written decoders for bisect (used as ``tests/localize/models.py:NAME``).

Each is a stack of residual blocks (norm, then an MLP). A *fragile* norm is
mathematically the same RMS norm, but it scales its input by 100 first: the
squares then pass 65504 and overflow in fp16, the rsqrt of inf is 0, and the
block silently adds nothing where fp32 adds the normalised MLP.
"""

from __future__ import annotations

import torch
from torch import nn

import precguard

HIDDEN = 32


class RMSNorm(nn.Module):
    """x / rms(x), squaring the input as it comes."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.scale
        return self.weight * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    """x + mlp(norm(x))."""

    def __init__(self, fragile: bool = False) -> None:
        super().__init__()
        self.norm = RMSNorm(100.0 if fragile else 1.0)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 64), nn.GELU(), nn.Linear(64, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Decoder(nn.Module):
    """embed -> blocks -> norm -> head, with the blocks listed in ``fragile`` overflowing."""

    def __init__(self, blocks: int = 4, fragile: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.embed = nn.Linear(16, HIDDEN)
        self.blocks = nn.ModuleList(Block(i in fragile) for i in range(blocks))
        self.norm = RMSNorm()
        self.head = nn.Linear(HIDDEN, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * 4
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(step))


def decoder_target(blocks: int = 4, fragile: tuple[int, ...] = ()) -> precguard.Target:
    """A target of :class:`Decoder` with the given fragile blocks."""
    return precguard.Target(model=lambda: Decoder(blocks, fragile), batch=_batch, seed=0)


def fine() -> precguard.Target:
    """Four blocks, none fragile: fp16 computes what fp32 does."""
    return decoder_target(4)


def one_overflow() -> precguard.Target:
    """Block 2's norm overflows in fp16."""
    return decoder_target(4, (2,))


def two_overflows() -> precguard.Target:
    """Blocks 1 and 6 of eight overflow in fp16, independently."""
    return decoder_target(8, (1, 6))


# -- a real transformers model -----------------------------------------------------------------
class OverflowingLinear(nn.Module):
    """``linear(x * 1e6) / 1e6``: the same numbers in fp32, inf past 65504 in fp16."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x * 1e6) / 1e6


def _llama_with_overflow() -> nn.Module:
    from precguard.targets import build_tiny_llama

    model = build_tiny_llama()
    layer = model.model.layers[1].mlp
    layer.down_proj = OverflowingLinear(layer.down_proj)
    return model


def llama_overflow() -> precguard.Target:
    """tiny-llama whose layer 1 MLP down projection overflows in fp16."""
    from precguard.targets import lm_batch

    return precguard.Target(model=_llama_with_overflow, batch=lm_batch, seed=0)


class NoisyDecoder(Decoder):
    """Adds fresh unseeded noise in every forward: no two forwards agree."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + torch.randn((*x.shape[:-1], 8))


def noisy() -> precguard.Target:
    """A forward that does not reproduce itself, even on the reference."""
    return precguard.Target(model=lambda: NoisyDecoder(2), batch=_batch, seed=0)


# -- activations beyond fp16's range ------------------------------------------------------------
class Gain(nn.Module):
    """Multiplies by a constant: 3e4 takes unit activations past fp16's 65504."""

    def __init__(self, gain: float) -> None:
        super().__init__()
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


class Loud(nn.Module):
    """embed -> block -> gain -> norm -> head: the gain's output exceeds fp16's range."""

    def __init__(self, gain_last: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(16, HIDDEN)
        self.block = Block()
        self.gain = Gain(3e4)
        self.norm = RMSNorm()
        self.head = nn.Linear(HIDDEN, 8)
        self.gain_last = gain_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gain(self.block(self.embed(x)))
        if self.gain_last:  # the output itself is beyond fp16: no module can fix it
            return h
        return self.head(self.norm(h))


def loud() -> precguard.Target:
    """One module's output exceeds fp16's range; the norm after it would bring it back."""
    return precguard.Target(model=Loud, batch=_batch, seed=0)


def loud_output() -> precguard.Target:
    """The model's output itself exceeds fp16's range."""
    return precguard.Target(model=lambda: Loud(gain_last=True), batch=_batch, seed=0)


class LossFirst(nn.Module):
    """Computes its own loss in ``forward`` and returns ``(loss, logits)`` (HF's order).

    Its layers sit in a namespace module (``transformer``, as GPT-2's do) whose own
    forward never runs; the loss, a mean far from zero like a cross-entropy on peaked
    logits, averages the logits' error away.
    """

    def __init__(self, fragile: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.inner = Decoder(4, fragile)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inner = self.transformer.inner
        h = inner.embed(x) * 4
        for block in inner.blocks:
            h = block(h)
        logits = inner.head(inner.norm(h))
        return (logits - 100.0).pow(2).mean(), logits


def loss_first_overflow() -> precguard.Target:
    """Block 2's norm overflows in fp16; the model returns ``(loss, logits)``."""
    return precguard.Target(model=lambda: LossFirst((2,)), batch=_batch, seed=0)
