"""A decoder written by hand, the way a user ports one: no transformers, no HF conventions.

Custom RMSNorm, RoPE as plain functions called inside the attention (no rotary
module to find by class name), its own attention with a padding mask, and a
tensor batch (``model(ids)``). Targets here (``tests/checks/handmade.py:NAME``)
plant one fault each; ``clean`` is correct code that must pass on ``cpu``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import precguard

VOCAB, DIM, HEADS, LAYERS, SEQ = 128, 32, 2, 2, 24


class RMSNorm(nn.Module):
    """RMSNorm; ``square_dtype`` plants the bug of squaring in a low dtype, ``upcast`` the fix."""

    def __init__(
        self, dim: int, eps: float = 1e-6, square_dtype: torch.dtype | None = None, upcast=True
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.square_dtype = square_dtype
        self.upcast = upcast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float() if self.upcast else x
        low = h if self.square_dtype is None else h.to(self.square_dtype)
        ms = low.pow(2).mean(-1, keepdim=True).to(h.dtype)
        return self.weight * (h * torch.rsqrt(ms + self.eps)).to(x.dtype)


def rope_angles_cos_sin(
    positions: torch.Tensor, head_dim: int, dtype: torch.dtype, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of position × frequency, the angles computed in ``dtype``."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.to(dtype)[:, None] * inv_freq.to(dtype)[None, :]
    return angles.cos(), angles.sin()


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2i, 2i+1) of ``x`` (B, H, T, D) by the angles' cos/sin (T, D/2)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, rope_dtype: torch.dtype, use_mask: bool = True) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, DIM, bias=False)
        self.rope_dtype = rope_dtype
        self.use_mask = use_mask

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        cos, sin = rope_angles_cos_sin(torch.arange(t), DIM // HEADS, self.rope_dtype)
        q, k = rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(DIM // HEADS)
        keep = torch.ones(t, t, dtype=torch.bool).tril()
        if mask is not None and self.use_mask:
            keep = keep & mask[:, None, None, :].bool()
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        p = scores.softmax(-1).to(v.dtype)
        return self.out((p @ v).transpose(1, 2).reshape(b, t, DIM))


class Block(nn.Module):
    def __init__(self, rope_dtype: torch.dtype, norm: dict, use_mask: bool = True) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(DIM, **norm)
        self.attn = Attention(rope_dtype, use_mask)
        self.mlp_norm = RMSNorm(DIM, **norm)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.SiLU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """``Decoder()(ids, mask=None) -> logits``."""

    def __init__(
        self, rope_dtype: torch.dtype = torch.float32, use_mask: bool = True, **norm
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(rope_dtype, norm, use_mask) for _ in range(LAYERS))
        self.norm = RMSNorm(DIM, **norm)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def ids_batch(step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (2, SEQ), generator=gen)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def _target(**model_args) -> precguard.Target:
    return precguard.Target(
        model=lambda: Decoder(**model_args), batch=ids_batch, loss=next_token_loss, seed=0
    )


def clean() -> precguard.Target:
    """fp32 RoPE angles, RMSNorm that upcasts: correct code."""
    return _target()


def rope_bf16() -> precguard.Target:
    """RoPE angles computed in bf16 inside a plain function."""
    return _target(rope_dtype=torch.bfloat16)


def norm_squares_fp16() -> precguard.Target:
    """An fp32 model whose RMSNorm squares in fp16."""
    return _target(square_dtype=torch.float16)


def norm_no_upcast() -> precguard.Target:
    """RMSNorm that skips the fp32 upcast: fine in fp32, broken in an fp16 model."""
    return _target(upcast=False)


def mask_ignored() -> precguard.Target:
    """Takes a padding mask and drops it: padded keys get attention."""
    return _target(use_mask=False)


def large_activations_no_upcast() -> precguard.Target:
    """Activations of ~300 (massive-activation scale) into a norm that squares in the model dtype.

    Fine in fp32; in an fp16 model x**2 overflows and the norm outputs zeros.
    """

    def model() -> nn.Module:
        m = Decoder(upcast=False)
        with torch.no_grad():
            m.embed.weight.mul_(300.0)
        return m

    t = _target()
    t.model = model
    return t


def tuple_batch() -> precguard.Target:
    """The clean decoder fed ``model(*(ids,))``."""
    t = _target()
    t.batch = lambda step: (ids_batch(step),)
    return t


def dict_batch() -> precguard.Target:
    """The clean decoder fed ``model(ids=..., mask=...)``, with the loss reading the dict."""
    t = _target()
    t.batch = lambda step: {"ids": ids_batch(step)}
    t.loss = lambda out, batch: next_token_loss(out, batch["ids"])
    return t


def torch_norms() -> precguard.Target:
    """torch's own LayerNorm and RMSNorm in an fp32 model (correct by construction)."""
    model = lambda: nn.Sequential(  # noqa: E731
        nn.Embedding(VOCAB, DIM),
        nn.LayerNorm(DIM),
        nn.Linear(DIM, DIM),
        nn.RMSNorm(DIM, eps=1e-6),
        nn.Linear(DIM, VOCAB),
    )
    return precguard.Target(model=model, batch=ids_batch, seed=0)


def loss_in_fp16() -> precguard.Target:
    """The clean decoder whose loss casts the logits to fp16 first."""
    t = _target()
    t.loss = lambda logits, ids: F.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB).half(), ids[:, 1:].reshape(-1)
    )
    return t


class PairRotation(nn.Module):
    """Rotates channel pairs by a cos/sin table computed once at init (angles in ``dtype``)."""

    def __init__(self, head_dim: int, max_positions: int, angle_dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.arange(max_positions).to(angle_dtype)[:, None] * inv_freq.to(angle_dtype)
        self.register_buffer("cos_table", angles.float().cos(), persistent=False)
        self.register_buffer("sin_table", angles.float().sin(), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = q.shape[-2]
        cos, sin = self.cos_table[:t], self.sin_table[:t]
        return rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)


class TableAttention(Attention):
    """The attention with RoPE applied by a :class:`PairRotation` module."""

    def __init__(self, angle_dtype: torch.dtype) -> None:
        super().__init__(torch.float32)
        self.rotation = PairRotation(DIM // HEADS, 512, angle_dtype)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        q, k = self.rotation(q, k)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(DIM // HEADS)
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -1e9)
        p = scores.softmax(-1).to(v.dtype)
        return self.out((p @ v).transpose(1, 2).reshape(b, t, DIM))


def _table_model(angle_dtype: torch.dtype) -> nn.Module:
    model = Decoder()
    for block in model.blocks:
        block.attn = TableAttention(angle_dtype)
    return model


def table_rope() -> precguard.Target:
    """RoPE from a table built at init with fp32 angles: correct."""
    t = _target()
    t.model = lambda: _table_model(torch.float32)
    return t


def table_rope_bf16_angles() -> precguard.Target:
    """RoPE from a table whose angles were computed in bf16 at init."""
    t = _target()
    t.model = lambda: _table_model(torch.bfloat16)
    return t


class AddNorm(nn.Module):
    """A fused residual-add + RMSNorm: ``forward(x, residual)``, which cannot run on x alone."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = (x + residual).float()
        return self.weight * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


class AddNormModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.add_norm = AddNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.head(self.add_norm(self.proj(x), x))


def two_input_norm() -> precguard.Target:
    """Its only norm-like module takes two inputs."""
    return precguard.Target(model=AddNormModel, batch=ids_batch, seed=0)
