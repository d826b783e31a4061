"""A LLaMA-style decoder written by hand, the way a user ports one, with the classic RoPE bug.

RMSNorm that normalizes in fp32 and casts once, an HF-convention rotary
embedding *module* (``model.rotary_emb(x, position_ids) -> (cos, sin)``),
``rotate_half`` attention with grouped keys and values, a SwiGLU MLP. Nothing
from ``transformers``: module names and call structure are the user's own.

``rope_bug=True`` plants the bug ports make most often: the rotary angles
``position * inv_freq`` computed in the activation dtype. In fp32 it is
harmless; in a bf16 model the angle of position ``p`` carries an error of about
``p * 2**-9`` radians, so ``cos``/``sin`` are wrong by up to ~0.25 in the late
positions and high-frequency channels while their global relative error stays
modest. The correct code (``rope_bug=False``) computes the angles in fp32 with
autocast off and casts ``cos``/``sin`` to the activation dtype once, as
``transformers`` does.

The built-in targets ``handwritten-llama`` and ``handwritten-llama-rope-bug``
(4 layers, hidden 128, 2 × 128 tokens) wrap it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HandwrittenConfig:
    """Sizes of :class:`HandwrittenLlama` (the defaults are the built-in targets')."""

    vocab_size: int = 256
    hidden_size: int = 128
    intermediate_size: int = 344
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    rope_bug: bool = False

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.hidden_size // self.num_heads


class RMSNorm(nn.Module):
    """RMSNorm that normalizes in fp32 and casts the result to the input dtype once."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """HF-convention rotary embedding: ``(x, position_ids) -> (cos, sin)``, each (B, T, D)."""

    def __init__(self, config: HandwrittenConfig) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_bug = config.rope_bug

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope_bug:
            # the bug: the angles in the activation dtype
            freqs = position_ids[:, :, None].to(x.dtype) * self.inv_freq[None, None, :].to(x.dtype)
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos(), emb.sin()
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :].float()
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` over the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query attention with rotary positions, softmax in fp32."""

    def __init__(self, config: HandwrittenConfig) -> None:
        super().__init__()
        self.config = config
        d, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return self.o_proj(self.attend(q, k, v).transpose(1, 2).reshape(b, t, -1))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax attention of rotated ``q``, ``k`` over ``v`` (B, heads, T, D)."""
        return self.weights(q, k) @ self.repeat_kv(v)

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The causal softmax weights (B, heads, T, T) of rotated ``q`` over ``k``, in q's dtype."""
        t = q.shape[2]
        scores = (q @ self.repeat_kv(k).transpose(-1, -2)) / self.config.head_dim**0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        return scores.float().softmax(-1).to(q.dtype)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """Key or value heads repeated to the query heads (grouped-query attention)."""
        return x.repeat_interleave(self.config.num_heads // self.config.num_kv_heads, dim=1)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: HandwrittenConfig) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then MLP."""

    def __init__(self, config: HandwrittenConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Embedding, rotary embedding, the layers and the final norm."""

    def __init__(self, config: HandwrittenConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = self.rotary_emb(x, positions[None].expand(input_ids.shape[0], -1))
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class HandwrittenLlama(nn.Module):
    """``HandwrittenLlama(config)(input_ids) -> logits``; keys read ``model.layers.3.mlp...``."""

    def __init__(self, config: HandwrittenConfig | None = None) -> None:
        super().__init__()
        self.config = config or HandwrittenConfig()
        self.model = Decoder(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        self.apply(_init)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


def _init(module: nn.Module) -> None:
    # LLaMA's init (normal, std 0.02) so activations have a trained model's scale
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
