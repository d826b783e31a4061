"""Targets for the generation tests: a tiny LLaMA whose next-token distributions are peaked.

A random init gives nearly flat distributions (top probability ~0.05 over 256
tokens); a trained model's are peaked. Scaling the output head sharpens them
the way training does, so a flip is rare and means something.
Each function here is also a ``--target tests/generation/targets.py:NAME``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from precguard import Target
from precguard.targets import CharTokenizer, build_tiny_llama

#: the output head's scale: top-1 probabilities of ~0.3-0.9 over 256 tokens
HEAD_SCALE = 24.0
#: the query and key projections' scale: attention that picks positions, not a uniform average
QK_SCALE = 4.0

PROMPTS = [
    "The quick brown fox",
    "def f(x):",
    "Numbers 3.14",
]


def peaked_model(**overrides: Any) -> nn.Module:
    """The tiny LLaMA (4 layers, hidden 64) with its head scaled by :data:`HEAD_SCALE` and
    its query/key projections by :data:`QK_SCALE`."""
    model = build_tiny_llama(max_position_embeddings=4096, **overrides)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(QK_SCALE)
            layer.self_attn.k_proj.weight.mul_(QK_SCALE)
    return model


#: LLaMA's vocabulary: among 32000 random-init logits the best two are often within rounding
BIG_VOCAB = 32000


def big_vocab() -> Target:
    """tiny-llama's architecture (random init) with LLaMA's 32k vocabulary; its prompts are
    the two rows of its batch, 32 random ids each."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, BIG_VOCAB, (2, 32), generator=gen)
    return Target(
        model=lambda: build_tiny_llama(vocab_size=BIG_VOCAB),
        batch=lambda step: {"input_ids": ids},
        name="big-vocab-llama",
    )


def peaked() -> Target:
    """The peaked tiny LLaMA with the character tokenizer and three short prompts."""
    return Target(
        model=peaked_model,
        batch=lambda step: {"input_ids": torch.tensor([CharTokenizer().encode(PROMPTS[0])])},
        tokenizer=CharTokenizer,
        texts=list(PROMPTS),
        name="peaked-llama",
    )


def scale_projection(layer: int = 2, factor: float = 1.25) -> Any:
    """A ``prepare`` that plants a scale error in one layer's MLP down projection."""

    def prepare(model: nn.Module) -> None:
        with torch.no_grad():
            model.model.layers[layer].mlp.down_proj.weight.mul_(factor)

    return prepare


def scaled() -> Target:
    """The peaked LLaMA with layer 2's MLP down projection scaled by 1.25 (a planted fault)."""

    def model() -> nn.Module:
        m = peaked_model()
        scale_projection()(m)
        return m

    t = peaked()
    return Target(model=model, batch=t.batch, tokenizer=CharTokenizer, texts=t.texts, name="scaled")


class RotaryInActivationDtype(nn.Module):
    """The rotary embedding computing its angles ``position_ids * inv_freq`` in the
    activation dtype (bf16 on ``emu:bf16-mixed``): a fault seen in ported kernels."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("inv_freq", inner.inv_freq.clone(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        freqs = position_ids[..., None].to(x.dtype) * self.inv_freq.to(x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rope_in_activation_dtype(model: nn.Module) -> None:
    """A ``prepare`` replacing the model's rotary embedding by :class:`RotaryInActivationDtype`
    (in an HF LLaMA, or in the one a :class:`StepLlama` drives)."""
    hf = getattr(model, "inner", model)
    hf.model.rotary_emb = RotaryInActivationDtype(hf.model.rotary_emb)


def long_prompts(n: int = 2, length: int = 600) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids from a seeded CPU generator."""
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(4, 100, (length,), generator=gen).tolist() for _ in range(n)]


class Float16Cache:
    """A KV cache that stores keys and values in fp16 (as ``kv_cache_dtype=fp16`` does)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``/``v`` of ``layer`` and return everything cached for it."""
        if layer == len(self.keys):
            self.keys.append(k.half())
            self.values.append(v.half())
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k.half()], dim=-2)
            self.values[layer] = torch.cat([self.values[layer], v.half()], dim=-2)
        return self.keys[layer].to(k.dtype), self.values[layer].to(v.dtype)


class StepLlama(nn.Module):
    """A plain ``forward(input_ids, cache) -> (logits, cache)`` model over the HF LLaMA.

    ``cache_fp16`` stores the cache in fp16; ``offset`` starts the positions there
    (a prompt deep into a long context, cheaply). The cache it returns is a tuple of
    ``(keys, values)`` per layer, read back into HF's ``DynamicCache`` each step.
    """

    def __init__(
        self,
        inner: nn.Module,
        cache_fp16: bool = False,
        offset: int = 0,
        restart_positions: bool = False,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.cache_fp16 = cache_fp16
        self.offset = offset
        # a port that forgets the cache's length: each new token is rotated as position 0
        self.restart_positions = restart_positions

    def forward(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        from transformers import DynamicCache

        hf = DynamicCache(config=self.inner.config)
        dtype = self.inner.lm_head.weight.dtype
        past = self.offset
        if cache is not None:
            for i, (k, v) in enumerate(cache):
                hf.update(k.to(dtype), v.to(dtype), i)
            past = self.offset + (0 if self.restart_positions else cache[0][0].shape[-2])
        positions = torch.arange(past, past + input_ids.shape[1])[None]
        out = self.inner(input_ids=input_ids, cache=hf, use_cache=True, position_ids=positions)
        store = torch.float16 if self.cache_fp16 else dtype
        layers = tuple((layer.keys.to(store), layer.values.to(store)) for layer in hf.layers)
        return out.logits, layers


def outlier_model() -> nn.Module:
    """The peaked LLaMA with one value channel of layer 1 scaled up by 1e7 and the output
    projection's matching column down by as much (a "massive activation" channel): the
    model computes the same function, but its cache holds values past fp16's 65504."""
    model = peaked_model()
    with torch.no_grad():
        attn = model.model.layers[1].self_attn
        attn.v_proj.weight[3].mul_(1e7)
        head_dim = attn.head_dim
        groups = attn.config.num_attention_heads // attn.config.num_key_value_heads
        for g in range(groups):  # the heads that read kv head 0 see channel 3 at g*head_dim+3
            attn.o_proj.weight[:, g * head_dim + 3].div_(1e7)
    return model


def deep_context() -> Target:
    """The peaked LLaMA through a step module whose positions start at 3000."""
    return Target(
        model=lambda: StepLlama(peaked_model(), offset=3000),
        batch=peaked().batch,
        tokenizer=CharTokenizer,
        texts=list(PROMPTS),
        name="deep-context",
    )


def rope_bf16() -> Target:
    """:func:`deep_context` with the rotary angles computed in the activation dtype."""

    def model() -> nn.Module:
        m = StepLlama(peaked_model(), offset=3000)
        rope_in_activation_dtype(m)
        return m

    t = deep_context()
    return Target(
        model=model, batch=t.batch, tokenizer=CharTokenizer, texts=t.texts, name="rope-bf16"
    )


def step_llama() -> Target:
    """The outlier LLaMA driven through a plain step module, cache in fp32."""
    return Target(
        model=lambda: StepLlama(outlier_model()),
        batch=peaked().batch,
        tokenizer=CharTokenizer,
        texts=list(PROMPTS),
        name="step-llama",
    )


def step_llama_fp16_cache() -> Target:
    """The same with the cache stored in fp16."""
    return Target(
        model=lambda: StepLlama(outlier_model(), cache_fp16=True),
        batch=peaked().batch,
        tokenizer=CharTokenizer,
        texts=list(PROMPTS),
        name="step-llama-fp16-cache",
    )


def step_peaked() -> Target:
    """The peaked LLaMA through a plain step module (positions right)."""
    return Target(
        model=lambda: StepLlama(peaked_model()),
        batch=peaked().batch,
        tokenizer=CharTokenizer,
        texts=list(PROMPTS),
        name="step-peaked",
    )


def rope_offset_bug() -> Target:
    """The peaked LLaMA through a step module that rotates every cached step as position 0."""
    return Target(
        model=lambda: StepLlama(peaked_model(), restart_positions=True),
        batch=peaked().batch,
        tokenizer=CharTokenizer,
        texts=list(PROMPTS),
        name="rope-offset-bug",
    )


#: two tokens whose head rows differ by less than bf16 rounds away
TIE_TOKENS = (40, 41)


def near_tie_model() -> nn.Module:
    """The peaked LLaMA where two head rows are within rounding of each other, at the top.

    Token 40's row points along the mean final hidden state of the prompts (so it wins
    at most steps) and is rounded to bf16; token 41's is it times (1 + 2**-12), less
    than half a bf16 ulp away. In fp32 41 wins by a hair; in bf16 both rows round to
    the same values, the logits tie exactly and argmax takes 40.
    """
    model = peaked_model()
    tok = CharTokenizer()
    a, b = TIE_TOKENS
    with torch.no_grad():
        states = [
            model.model(input_ids=torch.tensor([tok.encode(p)])).last_hidden_state[0]
            for p in PROMPTS
        ]
        mean = torch.cat(states).mean(0)
        w = model.lm_head.weight
        row = mean / mean.norm() * w.norm(dim=1).max() * 2.0
        w[a] = row.to(torch.bfloat16).float()
        w[b] = w[a] * (1 + 2.0**-12)
    return model


def near_tie() -> Target:
    """A target whose greedy decoding flips between two tokens within rounding."""
    t = peaked()
    return Target(
        model=near_tie_model, batch=t.batch, tokenizer=CharTokenizer, texts=t.texts, name="near-tie"
    )
