"""A GPT-NeoX/Falcon-style decoder written by hand, with a trained model's weight statistics.

The project's second hand-written decoder, deliberately unlike the LLaMA ones so
that a rule tuned on those cannot pass here by accident:

- LayerNorm with bias (not RMSNorm), fused ``qkv`` projection with bias, GELU MLP,
  **parallel residual** (``x + attn(ln1(x)) + mlp(ln2(x))``), learned absolute
  positions, a head tied to the token embedding;
- the loss computed *inside* ``forward`` by a loss module, returned HF's
  ``return_dict=False`` way: ``(loss, logits)`` when ``labels`` are given;
- decoding with a KV cache through :class:`DecoderStep` (``step(ids, cache) ->
  (logits, cache)``, the plain step convention of ``generate-diff``).

Random init does not look like a trained model, and the numerics of a trained
model are what break ports. The init plants three properties of trained LLMs:

- **an attention sink**: head 0 of every layer puts nearly all its weight on the
  first token (BOS), through a key channel that is large at position 0 only
  (``sink_key``) and a constant query bias; the sink's value channel carries a
  *massive activation* (``sink_value``, about 1e5: finite in bf16, past fp16's
  65504);
- **a residual stream with a large mean**: every token's hidden state has a mean
  over channels ``residual_mean`` times its spread (what LayerNorm subtracts);
- **peaked logits**: a final gain makes the next-token distribution confident
  (logits spanning tens of units), the regime where low-precision log-softmax
  cancels.

Each classic low-precision bug has a flag and a correct twin (flag off). The
golden of a bug is its correct twin on the reference device (cpu, float32); the
``qk_fp16`` and ``cache_fp16`` bugs cast explicitly, so they show on every
device, the other two only in low precision (``emu:bf16`` included, which keeps
float32 tensors and rounds each op's result):

``qk_fp16``
    attention scores ``q @ k^T`` from an fp16 kernel, scaled *after* the matmul:
    the sink's raw score, about 1e5, overflows to inf; the twin scales ``q`` first.
``norm_low_precision``
    LayerNorm's mean and variance in the activation dtype, the one-pass
    ``E[x^2] - E[x]^2``: with a mean several times the spread it cancels in bf16.
    The twin upcasts to float32 and centres first.
``loss_low_precision``
    cross-entropy written by hand on the activation-dtype logits
    (``logits - logsumexp``): with peaked logits the subtraction cancels in bf16.
    The twin takes float32 logits.
``cache_fp16``
    the KV cache kept in float16 in a bf16 model: the sink's massive value
    overflows to inf in the cache (only the cached decoding path sees it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BUGS = ("qk_fp16", "norm_low_precision", "loss_low_precision", "cache_fp16")


@dataclass(frozen=True)
class ParallelConfig:
    """Sizes, the trained-like statistics and the bug flags of :class:`ParallelDecoder`."""

    vocab_size: int = 256
    hidden_size: int = 128
    num_heads: int = 4
    num_layers: int = 3
    intermediate_size: int = 512
    max_positions: int = 256
    layer_norm_eps: float = 1e-5
    # trained-like statistics (module docstring)
    sink_key: float = 2.0e3
    sink_query: float = 50.0
    sink_value: float = 1.0e5
    residual_mean: float = 6.0
    logit_gain: float = 0.35
    # the bugs, each off in the correct twin
    qk_fp16: bool = False
    norm_low_precision: bool = False
    loss_low_precision: bool = False
    cache_fp16: bool = False

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.hidden_size // self.num_heads

    def with_bug(self, bug: str | None) -> ParallelConfig:
        """This config with one bug of :data:`BUGS` switched on (``None``: the correct twin)."""
        if bug is None:
            return self
        if bug not in BUGS:
            raise ValueError(f"unknown bug {bug!r}; expected one of {', '.join(BUGS)}")
        return replace(self, **{bug: True})


class LayerNorm(nn.Module):
    """LayerNorm with bias; statistics in float32 unless the config plants the bug."""

    def __init__(self, dim: int, eps: float, low_precision: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps
        self.low_precision = low_precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.low_precision:
            # the bug: one-pass statistics in the activation dtype
            mean = x.mean(-1, keepdim=True)
            var = (x * x).mean(-1, keepdim=True) - mean * mean
            h = (x - mean) * torch.rsqrt(var.clamp_min(0) + self.eps)
            return h * self.weight.to(x.dtype) + self.bias.to(x.dtype)
        h = x.float()
        mean = h.mean(-1, keepdim=True)
        var = (h - mean).pow(2).mean(-1, keepdim=True)
        h = (h - mean) * torch.rsqrt(var + self.eps)
        return (h * self.weight.float() + self.bias.float()).to(x.dtype)


class Attention(nn.Module):
    """Causal multi-head attention with a fused ``qkv`` projection; softmax in float32."""

    def __init__(self, config: ParallelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.qkv = nn.Linear(d, 3 * d)
        self.dense = nn.Linear(d, d)

    def forward(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Attend over the cached keys/values and ``x``'s; return the output and the new cache."""
        c = self.config
        b, t, _ = x.shape
        q, k, v = (
            part.view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
            for part in self.qkv(x).chunk(3, dim=-1)
        )
        if cache is not None:
            k = torch.cat([cache[0].to(k.dtype), k], dim=2)
            v = torch.cat([cache[1].to(v.dtype), v], dim=2)
        stored = (k, v)
        if c.cache_fp16:
            # the bug: the cache kept in float16, whatever the model's dtype (this step
            # attends its own keys and values as computed; the next step reads fp16)
            stored = (k.half(), v.half())
        scores = self.scores(q, k)
        past = k.shape[2] - t
        causal = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(past)
        scores = scores.masked_fill(~causal, float("-inf"))
        weights = scores.softmax(-1).to(v.dtype)
        out = (weights @ v).transpose(1, 2).reshape(b, t, -1)
        return self.dense(out), stored

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Scaled attention scores (B, heads, T, S) in float32."""
        scale = 1.0 / math.sqrt(self.config.head_dim)
        if self.config.qk_fp16:
            # the bug: an fp16 kernel's matmul first, the scale after (the sink's raw
            # score, about 1e5, overflows to inf)
            return (q.half() @ k.half().transpose(-1, -2)).float() * scale
        return ((q * scale) @ k.transpose(-1, -2)).float()


class MLP(nn.Module):
    """``dense_4h_to_h(gelu(dense_h_to_4h(x)))``."""

    def __init__(self, config: ParallelConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, config.intermediate_size)
        self.dense_4h_to_h = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Block(nn.Module):
    """Parallel residual: ``x + attn(ln_attn(x)) + mlp(ln_mlp(x))``."""

    def __init__(self, config: ParallelConfig) -> None:
        super().__init__()
        low = config.norm_low_precision
        self.ln_attn = LayerNorm(config.hidden_size, config.layer_norm_eps, low)
        self.attn = Attention(config)
        self.ln_mlp = LayerNorm(config.hidden_size, config.layer_norm_eps, low)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The block's output and its layer's new cache entry."""
        attn, stored = self.attn(self.ln_attn(x), cache)
        return x + attn + self.mlp(self.ln_mlp(x)), stored


class CausalLMLoss(nn.Module):
    """Next-token cross-entropy over shifted labels (ignore index -100)."""

    def __init__(self, low_precision: bool) -> None:
        super().__init__()
        self.low_precision = low_precision

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits[:, :-1].reshape(-1, logits.shape[-1])
        labels = labels[:, 1:].reshape(-1)
        if self.low_precision:
            # the bug: a hand-written log-softmax on the activation-dtype logits
            logp = logits - logits.logsumexp(-1, keepdim=True)
            keep = labels != -100
            picked = logp[keep].gather(-1, labels[keep, None]).squeeze(-1)
            return -picked.mean()
        return F.cross_entropy(logits.float(), labels, ignore_index=-100)


class ParallelDecoder(nn.Module):
    """``model(input_ids, labels=None)``: ``(loss, logits)`` with labels, else ``(logits,)``.

    Keys read ``transformer.h.1.attn``, ``transformer.ln_f``, ``loss_fn``.
    """

    def __init__(self, config: ParallelConfig | None = None) -> None:
        super().__init__()
        self.config = c = config or ParallelConfig()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(c.vocab_size, c.hidden_size)
        self.transformer.wpe = nn.Embedding(c.max_positions, c.hidden_size)
        self.transformer.h = nn.ModuleList(Block(c) for _ in range(c.num_layers))
        self.transformer.ln_f = LayerNorm(c.hidden_size, c.layer_norm_eps, c.norm_low_precision)
        self.loss_fn = CausalLMLoss(c.loss_low_precision)
        with torch.no_grad():
            _trained_like_init(self, c)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        """``(loss, logits)`` when ``labels`` are given, else ``(logits,)``."""
        logits, _ = self.decode(input_ids, None)
        if labels is None:
            return (logits,)
        return self.loss_fn(logits, labels), logits

    def decode(
        self, input_ids: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Logits of ``input_ids`` after the cached positions, and the extended cache."""
        past = 0 if cache is None else cache[0][0].shape[2]
        t = input_ids.shape[1]
        if past + t > self.config.max_positions:
            raise ValueError(
                f"sequence of {past + t} positions: the model has {self.config.max_positions}"
            )
        positions = torch.arange(past, past + t, device=input_ids.device)
        x = self.transformer.wte(input_ids) + self.transformer.wpe(positions)[None]
        stored = []
        for i, block in enumerate(self.transformer.h):
            x, entry = block(x, None if cache is None else cache[i])
            stored.append(entry)
        h = self.transformer.ln_f(x)
        return F.linear(h, self.transformer.wte.weight), stored


class DecoderStep(nn.Module):
    """The decoding convention of ``generate-diff``: ``step(ids, cache) -> (logits, cache)``."""

    def __init__(self, model: ParallelDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, cache: Any = None) -> tuple[torch.Tensor, Any]:
        return self.model.decode(input_ids, cache)


def _trained_like_init(model: ParallelDecoder, c: ParallelConfig) -> None:
    """Weights with a trained LLM's statistics (module docstring); draws from the current RNG."""
    d = c.hidden_size
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
    # the residual stream: per-channel spread about 1 around a common offset residual_mean,
    # carried by the positions (the tied head reads a zero-mean token embedding, as trained
    # heads are well conditioned)
    model.transformer.wte.weight.normal_(0.0, 1.0)
    wpe = model.transformer.wpe.weight
    wpe.normal_(0.0, 0.3).add_(c.residual_mean)
    # position 0 carries the sink's marker: a large value in the last channel
    sink_channel = d - 1
    wpe[0, sink_channel] += 40.0
    for block in model.transformer.h:
        qkv = block.attn.qkv
        # head 0 of the key sees the marker (large at position 0 only, small elsewhere
        # after LayerNorm), its query is a constant: every token's top score is BOS
        key_row = d + 0
        value_row = 2 * d + 0
        scale = 1.0 / 12.0  # the marker's value after LayerNorm is about 11
        qkv.weight[key_row].zero_()
        qkv.weight[key_row, sink_channel] = c.sink_key * scale
        qkv.bias[0] = c.sink_query
        qkv.weight[value_row].zero_()
        qkv.weight[value_row, sink_channel] = c.sink_value * scale
        # the massive value reaches the residual only through small weights, as in trained
        # models (the sink's output is a near-constant the next layers learn to ignore)
        block.attn.dense.weight[:, 0].normal_(0.0, 1.0 / c.sink_value)
        # LayerNorm gains of a trained model are not all 1
        for ln in (block.ln_attn, block.ln_mlp):
            ln.weight.normal_(1.0, 0.1)
            ln.bias.normal_(0.0, 0.05)
    model.transformer.ln_f.weight.normal_(c.logit_gain, 0.1 * c.logit_gain)
    model.transformer.ln_f.bias.normal_(0.0, 0.05)


def build(bug: str | None = None, **sizes: Any) -> ParallelDecoder:
    """Build the decoder with one bug of :data:`BUGS` (``None``: correct) from the current RNG."""
    return ParallelDecoder(ParallelConfig(**sizes).with_bug(bug))


def lm_batch(step: int, *, batch: int = 2, seq: int = 128, vocab: int = 256) -> dict:
    """Token ids and labels for ``step``; every sequence starts with BOS (id 0), like real data."""
    gen = torch.Generator().manual_seed(1_000_003 + step)
    ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    ids[:, 0] = 0
    return {"input_ids": ids, "labels": ids.clone()}
