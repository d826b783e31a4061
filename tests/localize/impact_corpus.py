"""Targets of the impact and verify tests (``tests/localize/impact_corpus.py:NAME``).

The built-in tiny-llama with attention sharp enough for the rotary angles to
reach the logits (init std 0.2, 128 positions; at HF's 0.02 the scores are near
zero, attention is uniform, and no rotary error shows at the output), each with
one port bug planted the way real ports get it wrong, plus the clean model whose
run is the floor the remedies must reach.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import precguard
from precguard.localize.impact import ActualSide
from precguard.targets import build_tiny_llama, causal_lm_loss, lm_batch
from tests.checks.planted import ActivationDtypeRotary

SEQ = 128


class LowPrecisionRMSNorm(LlamaRMSNorm):
    """RMSNorm whose statistics are computed in the activation dtype (no fp32 upcast)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class WrongLowPrecisionGemm(nn.Linear):
    """A projection whose low-precision kernel scales its fp32 accumulator by 1.05 (a wrong
    epilogue alpha): right in float32 (the reference), wrong on the device's bf16 path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = F.linear(x.float(), self.weight.float())
        if x.dtype != torch.float32:
            out = out * 1.05
        return out.to(x.dtype)


def _model(*, rope: bool = False, norm: bool = False, projection: bool = False) -> nn.Module:
    model = build_tiny_llama(initializer_range=0.2)
    if rope:
        model.model.rotary_emb = ActivationDtypeRotary(model.config)
    if norm:
        layer = model.model.layers[2]
        layer.post_attention_layernorm = LowPrecisionRMSNorm(64, eps=1e-6)
    if projection:
        attn = model.model.layers[1].self_attn
        wrong = WrongLowPrecisionGemm(64, attn.v_proj.out_features, bias=False)
        wrong.weight = attn.v_proj.weight
        attn.v_proj = wrong
    return model


def _low_precision_loss(output, batch) -> torch.Tensor:
    """Cross-entropy on the logits as they come (bf16 on a bf16 device): no fp32 upcast."""
    logits = output.logits
    ids = batch["input_ids"]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _target(name: str, loss=causal_lm_loss, **faults: bool) -> precguard.Target:
    return precguard.Target(
        model=lambda: _model(**faults),
        batch=lambda step: lm_batch(step, seq=SEQ),
        loss=loss,
        seed=0,
        name=name,
    )


def clean() -> precguard.Target:
    """The correct model: HF's code, cast to the device's dtype (inv_freq rounded with it)."""
    return _target("sharp-llama")


def rope_bug() -> precguard.Target:
    """Rotary angles computed in the activation dtype."""
    return _target("sharp-llama-rope-bug", rope=True)


def norm_bug() -> precguard.Target:
    """Layer 2's post-attention RMSNorm takes its statistics in the activation dtype."""
    return _target("sharp-llama-norm-bug", norm=True)


def projection_bug() -> precguard.Target:
    """Layer 1's v_proj kernel is wrong in low precision only."""
    return _target("sharp-llama-projection-bug", projection=True)


def two_bugs() -> precguard.Target:
    """The rotary bug and the projection bug at once."""
    return _target("sharp-llama-two-bugs", rope=True, projection=True)


def loss_bug() -> precguard.Target:
    """The correct model with its loss taken on low-precision logits."""
    return _target("sharp-llama-loss-bug", loss=_low_precision_loss)


#: the device of the corpus's actual side
DEVICE = "emu:bf16-mixed"


@functools.cache
def side(name: str, device: str = DEVICE) -> ActualSide:
    """The actual side of corpus target ``name``, built once per test session (re-runs
    restore the model: every change is a context)."""
    return ActualSide.open(precguard.Side(f"tests/localize/impact_corpus.py:{name}", device))
