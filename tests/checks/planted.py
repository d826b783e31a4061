"""Targets that each plant one known failure pattern (used as ``tests/checks/planted.py:NAME``).

Each is the built-in tiny-llama (or a small MLP) with exactly one thing wrong,
the way it goes wrong in real ports.
"""

from __future__ import annotations

import random
import time

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import precguard
from precguard.targets import CharTokenizer, build_tiny_llama, lm_batch
from precguard.targets import tiny_llama as _tiny_llama


def tiny_llama() -> precguard.Target:
    """tiny-llama, unnamed so the diagnosis shows the planted target's own spec."""
    t = _tiny_llama()
    t.name = ""
    return t


# -- rng: a clock-seeded noise source ------------------------------------------------------
class NoisyMLP(nn.Module):
    """Adds "regularising" noise from a generator seeded with the clock."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(time.time_ns())
        return self.inner(x) + 1e-3 * torch.randn(x.shape, generator=gen)


def _noisy_model() -> nn.Module:
    model = build_tiny_llama()
    model.model.layers[1].mlp = NoisyMLP(model.model.layers[1].mlp)
    return model


def clock_noise() -> precguard.Target:
    t = tiny_llama()
    t.model = _noisy_model
    return t


# -- norm: a LayerNorm without eps ----------------------------------------------------------
def _eps0_model() -> nn.Module:
    model = build_tiny_llama()
    model.model.norm = nn.LayerNorm(64, eps=0.0)
    return model


def layernorm_eps0() -> precguard.Target:
    t = tiny_llama()
    t.model = _eps0_model
    return t


# -- rope: rotary angles computed in the activation dtype ----------------------------------
class ActivationDtypeRotary(LlamaRotaryEmbedding):
    """Computes position * inv_freq in x.dtype (bf16/fp16) instead of fp32."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):  # type: ignore[override]
        freqs = position_ids[..., None].to(x.dtype) * self.inv_freq.to(x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _low_rope_model() -> nn.Module:
    model = build_tiny_llama()
    model.model.rotary_emb = ActivationDtypeRotary(model.config)
    return model


def rope_activation_dtype() -> precguard.Target:
    t = tiny_llama()
    t.model = _low_rope_model
    return t


# -- tokenizer: ids beyond the embedding ----------------------------------------------------
class ShiftedTokenizer(CharTokenizer):
    """A tokenizer from a larger vocabulary: ids start at 200, the embedding has 256 rows."""

    _FIRST = 200


def tokenizer_too_big() -> precguard.Target:
    t = tiny_llama()
    t.tokenizer = ShiftedTokenizer
    return t


# -- data: a batch order that changes from run to run --------------------------------------
def shuffled_batches() -> precguard.Target:
    pool = lm_batch(0, batch=8)["input_ids"]
    epoch: dict[str, list[int]] = {}

    def batch(step: int) -> dict:
        if step == 0 or "order" not in epoch:
            # A sampler that shuffles each epoch with an unseeded generator (os.urandom).
            epoch["order"] = random.Random().sample(range(8), 8)
        rows = epoch["order"][2 * (step % 4) : 2 * (step % 4) + 2]
        return {"input_ids": pool[rows]}

    t = tiny_llama()
    t.batch = batch
    return t


# -- amp: fp16 training without loss scaling -------------------------------------------------
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))


def _mlp_batch(step: int) -> tuple:
    gen = torch.Generator().manual_seed(step)
    return (torch.randn(64, 32, generator=gen),)


def _accumulated_loss(output: torch.Tensor, batch: tuple) -> torch.Tensor:
    # Cross-entropy averaged over 16384 micro-batches of gradient accumulation.
    labels = torch.arange(output.shape[0]) % 10
    return nn.functional.cross_entropy(output, labels) / 16384


def fp16_no_loss_scaling() -> precguard.Target:
    return precguard.Target(model=_mlp, batch=_mlp_batch, loss=_accumulated_loss, seed=0)


def fp16_with_loss_scaling() -> precguard.Target:
    t = fp16_no_loss_scaling()
    t.grad_scaler = lambda: torch.amp.GradScaler("cpu", init_scale=2.0**16)  # type: ignore[attr-defined]
    return t


# -- data vs golden: the same model fed other data ------------------------------------------
def other_data() -> precguard.Target:
    t = tiny_llama()
    t.batch = lambda step: lm_batch(step, seed=1)
    return t


# -- rng across devices: a model that uses dropout -------------------------------------------
def with_dropout() -> precguard.Target:
    t = tiny_llama()
    t.model = lambda: build_tiny_llama(attention_dropout=0.1)
    return t


# -- attention: a wrapper that drops the attention mask --------------------------------------
class DropsMask(nn.Module):
    """Forwards input_ids but silently drops attention_mask (a classic port bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_tiny_llama()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kw):
        return self.inner(input_ids=input_ids, **kw)


def ignores_padding_mask() -> precguard.Target:
    t = tiny_llama()
    t.model = DropsMask
    return t


def rmsnorm_eps_below_fp16() -> precguard.Target:
    """RMSNorm eps 1e-9: fine in fp32, exactly 0 once stored in fp16."""
    t = tiny_llama()
    t.model = lambda: build_tiny_llama(rms_norm_eps=1e-9)
    return t


# -- rng: an init that ignores the seed ------------------------------------------------------
def _clock_init_model() -> nn.Module:
    model = build_tiny_llama()
    gen = torch.Generator().manual_seed(time.time_ns())
    with torch.no_grad():
        model.model.layers[2].mlp.up_proj.weight.normal_(0, 0.02, generator=gen)
    return model


def unseeded_init() -> precguard.Target:
    t = tiny_llama()
    t.model = _clock_init_model
    return t


def broken_model() -> precguard.Target:
    t = tiny_llama()

    def build() -> nn.Module:
        raise RuntimeError("checkpoint shard 3 is missing")

    t.model = build
    return t


# -- data: the same tokens padded on the other side ------------------------------------------
def _padded(step: int, side: str) -> dict:
    ids = lm_batch(step)["input_ids"]
    mask = torch.ones_like(ids)
    if side == "left":
        mask[:, :4] = 0
    else:
        mask[:, -4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def right_padded() -> precguard.Target:
    t = tiny_llama()
    t.batch = lambda step: _padded(step, "right")
    return t


def left_padded() -> precguard.Target:
    t = tiny_llama()
    t.batch = lambda step: _padded(step, "left")
    return t


# -- batch: a split-K kernel chosen by the batch size --------------------------------------
#: rows (batch x positions) below which the planted GEMM splits its reduced dimension
SPLIT_K_ROWS = 32


def _split_k_model() -> nn.Module:
    """tiny-llama whose layer-2 down_proj splits K in two for small batches (split-K)."""
    model = build_tiny_llama()
    mod = model.get_submodule("model.layers.2.mlp.down_proj")

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[:-1].numel()
        if rows >= SPLIT_K_ROWS:
            return nn.functional.linear(x, mod.weight)
        half = x.shape[-1] // 2  # two partial sums added after: another rounding order
        low = nn.functional.linear(x[..., :half], mod.weight[:, :half])
        return low + nn.functional.linear(x[..., half:], mod.weight[:, half:])

    mod.forward = forward  # type: ignore[method-assign]
    return model


def batch_split_k() -> precguard.Target:
    """tiny-llama with one batch-dependent GEMM (run it on emu:fp32-batch-invariant)."""
    t = _tiny_llama()
    t.model = _split_k_model
    t.name = ""
    return t


# -- fp8: an activation spike under delayed scaling; master weights in fp8 ---------------------
#: how much the layer-1 MLP input grows on the second call (a loss spike)
SPIKE = 8.0


class _Spike(nn.Module):
    """Multiplies its input by ``SPIKE`` from its second call on (activations that grew)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x * (SPIKE if self.calls > 1 else 1.0))


def _spike_model() -> nn.Module:
    model = build_tiny_llama()
    layer = model.get_submodule("model.layers.1.mlp")
    layer.up_proj = _Spike(layer.up_proj)
    return model


def fp8_activation_spike() -> precguard.Target:
    """tiny-llama whose layer-1 up_proj input grows 8x after its first call (run it on
    emu:fp8-e4m3-delayed: the amax history predates the growth)."""
    t = _tiny_llama()
    t.model = _spike_model
    t.name = ""
    return t


class _Fp8Linear(nn.Module):
    """A Linear whose trainable weight (the optimizer's master copy) is float8_e4m3fn."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(inner.weight.detach().to(torch.float8_e4m3fn))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight.to(x.dtype))


def _fp8_weights_model() -> nn.Module:
    model = build_tiny_llama()
    mlp = model.get_submodule("model.layers.0.mlp")
    mlp.down_proj = _Fp8Linear(mlp.down_proj)
    return model


def fp8_master_weights() -> precguard.Target:
    """tiny-llama with one Linear's weight stored in fp8."""
    t = _tiny_llama()
    t.model = _fp8_weights_model
    t.name = ""
    return t


# -- real float8 tensors: a weight stored in float8_e4m3fn with a per-tensor scale ----------
_E4M3_MAX = 448.0


class _ScaledFp8Linear(nn.Module):
    """A Linear whose weight is stored in float8_e4m3fn with a per-tensor scale (buffer),
    dequantized in its forward, as fp8 checkpoints for serving hold it.

    ``stale``: the scale was made from an amax this many times below the weight's own
    (a stale amax), so the quantization clips the largest weights at ±448.
    """

    def __init__(self, inner: nn.Linear, stale: float = 1.0, trainable: bool = False) -> None:
        super().__init__()
        w = inner.weight.detach()
        scale = w.abs().max() / _E4M3_MAX / stale
        q = (w / scale).clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn)
        self.weight = nn.Parameter(q, requires_grad=trainable)
        self.register_buffer("weight_scale", scale.reshape(()))
        self.bias = inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype) * self.weight_scale.to(x.dtype)
        return nn.functional.linear(x, w, self.bias)


def _fp8_mlp(stale: float = 1.0, trainable: bool = False) -> nn.Module:
    model = _mlp()
    model[2] = _ScaledFp8Linear(model[2], stale, trainable)
    return model


def fp8_scaled_weight() -> precguard.Target:
    """An MLP whose second Linear holds a float8_e4m3fn weight scaled from its own amax."""
    return precguard.Target(model=_fp8_mlp, batch=_mlp_batch, seed=0)


def fp8_stale_weight_scale() -> precguard.Target:
    """The same weight quantized with a scale from an amax 2x below its own (clips)."""
    return precguard.Target(model=lambda: _fp8_mlp(stale=2.0), batch=_mlp_batch, seed=0)


def fp8_trainable_weight() -> precguard.Target:
    """The same float8 weight left trainable: the optimizer's master copy is fp8."""
    return precguard.Target(model=lambda: _fp8_mlp(trainable=True), batch=_mlp_batch, seed=0)
