"""Built-in targets: small real models with a seeded random init (no download)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from precguard import tree
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
    attention = overrides.pop("attn_implementation", "eager")
    config = LlamaConfig(**{**TINY_LLAMA_CONFIG, **overrides})
    config._attn_implementation = attention
    return LlamaForCausalLM(config)


def lm_batch(step: int, *, batch: int = 2, seq: int = 32, vocab: int = 256, seed: int = 0) -> dict:
    """Token ids for ``step``, from a CPU generator seeded by ``seed`` and ``step``."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    return {"input_ids": ids}


def causal_lm_loss(output: Any, batch: Any) -> torch.Tensor:
    """Next-token cross-entropy of a causal LM output against its own input ids."""
    logits = output.logits if hasattr(output, "logits") else output
    ids = batch["input_ids"] if tree.is_mapping(batch) else batch
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
    )


class CharTokenizer:
    """A deterministic character tokenizer (HF-style API) that needs no download.

    Ids: 0 PAD, 1 BOS, 2 EOS, 3 UNK, then printable ASCII, tab and newline
    (101 ids in all, inside tiny-llama's 256-row embedding).
    """

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    unk_token_id = 3
    padding_side = "right"
    _FIRST = 4

    def __init__(self) -> None:
        chars = "\t\n" + "".join(chr(c) for c in range(32, 127))
        self._ids = {ch: self._FIRST + i for i, ch in enumerate(chars)}
        self._chars = {i: ch for ch, i in self._ids.items()}

    def __len__(self) -> int:
        return self._FIRST + len(self._ids)

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return len(self)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS first when ``add_special_tokens``)."""
        ids = [self._ids.get(ch, self.unk_token_id) for ch in text]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; special tokens are dropped with ``skip_special_tokens``."""
        names = {0: "<pad>", 1: "<s>", 2: "</s>", 3: "<unk>"}
        out = []
        for i in ids:
            if i in self._chars:
                out.append(self._chars[i])
            elif not skip_special_tokens:
                out.append(names.get(int(i), "<unk>"))
        return "".join(out)


TINY_LLAMA_TEXTS: list[str] = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "Numbers 3.14159, 2**16 = 65536; tabs\tand\nnewlines.",
    "def f(x):\n    return x ** 2  # code",
]


def tiny_llama() -> Target:
    """The ``tiny-llama`` built-in target: 4 layers, hidden 64, vocab 256, 2×32 tokens.

    It also gives a character tokenizer and sample texts for the tokenizer checks.
    """
    return Target(
        model=build_tiny_llama,
        batch=lm_batch,
        loss=causal_lm_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        tokenizer=CharTokenizer,
        texts=list(TINY_LLAMA_TEXTS),
        seed=0,
        name="tiny-llama",
    )


def build_handwritten_llama(**config: Any) -> nn.Module:
    """Build ``handwritten-llama``'s decoder from the current RNG (no ``transformers``).

    Keywords override its config (the built-in target's defaults): ``vocab_size`` (256),
    ``hidden_size`` (128), ``intermediate_size`` (344), ``num_layers`` (4), ``num_heads``
    (4), ``num_kv_heads`` (2), ``rope_theta``, ``rms_norm_eps`` and ``rope_bug`` (False:
    ``True`` is ``handwritten-llama-rope-bug``). ``model(input_ids)`` returns the logits;
    ``model.config`` is the config it was built with.
    """
    from precguard.models.handwritten_llama import HandwrittenConfig, HandwrittenLlama

    return HandwrittenLlama(HandwrittenConfig(**config))


def _handwritten(rope_bug: bool, name: str) -> Target:
    return Target(
        model=lambda: build_handwritten_llama(rope_bug=rope_bug),
        batch=lambda step: lm_batch(step, seq=128, vocab=256),
        loss=causal_lm_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        seed=0,
        name=name,
    )


def handwritten_llama() -> Target:
    """``handwritten-llama``: a LLaMA-style decoder written by hand (4 layers, hidden 128, 2×128).

    RMSNorm with an fp32 upcast, an HF-convention rotary module, SwiGLU; correct code.
    """
    return _handwritten(False, "handwritten-llama")


def handwritten_llama_rope_bug() -> Target:
    """``handwritten-llama-rope-bug``: the same decoder, rotary angles in the activation dtype.

    The classic port bug: harmless in fp32, wrong late positions in bf16.
    """
    return _handwritten(True, "handwritten-llama-rope-bug")


def build_parallel_decoder(bug: str | None = None, **sizes: Any) -> nn.Module:
    """Build ``parallel-decoder``'s model from the current RNG, with one bug or none.

    ``bug`` is one of ``"qk_fp16"``, ``"norm_low_precision"``, ``"loss_low_precision"``,
    ``"cache_fp16"`` (the ``parallel-decoder-*`` targets' bugs; ``None``: the correct twin).
    Keywords override its sizes and trained-like statistics (the built-in target's
    defaults): ``num_layers`` (3), ``hidden_size`` (128), ``intermediate_size`` (512),
    ``num_heads`` (4), ``max_positions`` (256), ``vocab_size`` (256), ``sink_value``
    (1e5)... ``model(**parallel_decoder_batch(step))`` returns ``(loss, logits)``.
    """
    from precguard.models import parallel_decoder as pd

    return pd.build(bug, **sizes)


def parallel_decoder_batch(
    step: int, *, batch: int = 2, seq: int = 128, vocab: int = 256
) -> dict[str, torch.Tensor]:
    """``parallel-decoder``'s batch for ``step``: ``input_ids`` and ``labels``, rows from BOS."""
    from precguard.models import parallel_decoder as pd

    return pd.lm_batch(step, batch=batch, seq=seq, vocab=vocab)


def _parallel(bug: str | None, name: str) -> Target:
    return Target(
        model=lambda: build_parallel_decoder(bug),
        batch=parallel_decoder_batch,
        # the model computes its loss itself and returns (loss, logits), HF's return_dict=False
        loss=lambda output, batch: output[0],
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
        seed=0,
        name=name,
    )


def _parallel_step(bug: str | None, name: str) -> Target:
    from precguard.models import parallel_decoder as pd

    return Target(
        model=lambda: pd.DecoderStep(pd.build(bug)),
        batch=lambda step: {"input_ids": pd.lm_batch(step)["input_ids"]},
        seed=0,
        name=name,
    )


def parallel_decoder() -> Target:
    """``parallel-decoder``: a GPT-NeoX/Falcon-style decoder with trained-like statistics.

    LayerNorm with bias, fused qkv, GELU, parallel residual, learned positions, tied
    head, the loss inside ``forward`` (``(loss, logits)``); an attention sink, a
    large-mean residual stream and peaked logits (``models/parallel_decoder.py``).
    Correct code: the twin of the ``parallel-decoder-*`` bug targets.
    """
    return _parallel(None, "parallel-decoder")


def parallel_decoder_qk_fp16() -> Target:
    """``parallel-decoder-qk-fp16``: attention scores in fp16, scaled after the matmul."""
    return _parallel("qk_fp16", "parallel-decoder-qk-fp16")


def parallel_decoder_norm_low_precision() -> Target:
    """``parallel-decoder-norm-low-precision``: one-pass LayerNorm statistics, activation dtype."""
    return _parallel("norm_low_precision", "parallel-decoder-norm-low-precision")


def parallel_decoder_loss_low_precision() -> Target:
    """``parallel-decoder-loss-low-precision``: cross-entropy by hand on low-precision logits."""
    return _parallel("loss_low_precision", "parallel-decoder-loss-low-precision")


def parallel_decoder_step() -> Target:
    """``parallel-decoder-step``: the cached decoding step, ``(ids, cache) -> (logits, cache)``."""
    return _parallel_step(None, "parallel-decoder-step")


def parallel_decoder_cache_fp16() -> Target:
    """``parallel-decoder-cache-fp16``: the decoding step with its KV cache kept in float16."""
    return _parallel_step("cache_fp16", "parallel-decoder-cache-fp16")
