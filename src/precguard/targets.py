"""Built-in targets: small real models with a seeded random init (no download)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from precguard.target import Target

TINY_LLAMA_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def build_tiny_llama(**overrides: Any) -> nn.Module:
    """Build a ``transformers`` LlamaForCausalLM with a small config and the current RNG.

    Seed before calling (``torch.manual_seed``) for a reproducible init.
    """
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "the tiny-llama target needs transformers: pip install 'precguard[hf]'"
        ) from exc
    config = LlamaConfig(**{**TINY_LLAMA_CONFIG, **overrides})
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config)


def lm_batch(step: int, *, batch: int = 2, seq: int = 32, vocab: int = 256, seed: int = 0) -> dict:
    """Token ids for ``step``, from a CPU generator seeded by ``seed`` and ``step``."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    return {"input_ids": ids}


def causal_lm_loss(output: Any, batch: Any) -> torch.Tensor:
    """Next-token cross-entropy of a causal LM output against its own input ids."""
    logits = output.logits if hasattr(output, "logits") else output
    ids = batch["input_ids"] if isinstance(batch, dict) else batch
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
    )


def tiny_llama() -> Target:
    """The ``tiny-llama`` built-in target: 4 layers, hidden 64, vocab 256, 2×32 tokens."""
    return Target(
        model=build_tiny_llama,
        batch=lm_batch,
        loss=causal_lm_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        seed=0,
        name="tiny-llama",
    )
