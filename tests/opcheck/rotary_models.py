"""A hand-written decoder whose rotary embedding is swapped per target (``rotary_models.py:NAME``).

``ActivationDtypeRotary`` computes ``position * inv_freq`` in the activation
dtype, the porting bug; ``Fp32Rotary`` computes the angles in fp32 from an
inv_freq it builds in fp32 (a ``model.to(bfloat16)`` cannot round it) and
casts only cos/sin to the activation dtype.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

import precguard

HEAD_DIM = 16
MAX_POSITIONS = 4096


def _inv_freq(device: torch.device | None = None) -> torch.Tensor:
    exponents = torch.arange(0, HEAD_DIM, 2, dtype=torch.float32, device=device) / HEAD_DIM
    return 1.0 / 10000.0**exponents


class ActivationDtypeRotary(nn.Module):
    """cos/sin of position x inv_freq, computed in x.dtype (bf16 angles on a bf16 model)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", _inv_freq(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        freqs = position_ids[..., None].to(x.dtype) * self.inv_freq.to(x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class Fp32Rotary(nn.Module):
    """The same angles computed in fp32, autocast off; cos/sin cast to x.dtype at the end."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        with torch.autocast(x.device.type, enabled=False):
            freqs = position_ids[..., None].float() * _inv_freq(x.device)
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class StackedRotary(Fp32Rotary):
    """Named like a rotary embedding, but returns one stacked (2, ...) tensor, not (cos, sin)."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        return torch.stack(super().forward(x, position_ids))


class OuterRotary(nn.Module):
    """A hand-written rotary taking 1-D positions (``torch.outer``), as many ports do; its
    angles in the activation dtype. Called with HF's ``[1, n]`` position_ids it raises."""

    one_dim = True

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", _inv_freq(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor):
        freqs = torch.outer(positions.to(x.dtype), self.inv_freq.to(x.dtype))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class LengthRotary(OuterRotary):
    """Takes the sequence length, not positions: neither convention op-check can drive."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor):
        if positions.dim() != 1 or positions.numel() != 24:
            raise RuntimeError("The size of tensor a (128) must match the size of tensor b (16)")
        return super().forward(x, positions)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Decoder(nn.Module):
    """embed -> rotary-embedded projection -> head; says its maximum length in ``config``."""

    def __init__(self, rotary: nn.Module) -> None:
        super().__init__()
        self.config = SimpleNamespace(max_position_embeddings=MAX_POSITIONS)
        self.embed = nn.Embedding(64, HEAD_DIM)
        self.rotary_emb = rotary
        self.proj = nn.Linear(HEAD_DIM, HEAD_DIM)
        self.head = nn.Linear(HEAD_DIM, 64)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if not getattr(self.rotary_emb, "one_dim", False):
            positions = positions[None]
        cos, sin = self.rotary_emb(h, positions)
        q = self.proj(h)
        return self.head(q * cos + _rotate_half(q) * sin)


def _target(rotary: type[nn.Module]) -> precguard.Target:
    return precguard.Target(
        model=lambda: Decoder(rotary()),
        batch=lambda step: {
            "input_ids": torch.randint(
                0, 64, (1, 24), generator=torch.Generator().manual_seed(step)
            )
        },
    )


def activation_dtype_rope() -> precguard.Target:
    """Rotary angles in the activation dtype."""
    return _target(ActivationDtypeRotary)


def fp32_rope() -> precguard.Target:
    """Rotary angles in fp32."""
    return _target(Fp32Rotary)


def stacked_rope() -> precguard.Target:
    """A rotary-named module off the HF convention (swept on captured inputs instead)."""
    return _target(StackedRotary)


def one_dim_rope() -> precguard.Target:
    """A rotary module on 1-D positions, its angles in the activation dtype."""
    return _target(OuterRotary)


def length_rope() -> precguard.Target:
    """A rotary module that runs only at the batch's own 24 positions."""
    return _target(LengthRotary)
