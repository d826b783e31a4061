"""The second hand-written decoder: a trained model's statistics, four bugs beside their twins."""

from __future__ import annotations

import pytest
import torch

from precguard import load_target
from precguard.models.parallel_decoder import BUGS, DecoderStep, build, lm_batch


def _model(bug: str | None = None, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return build(bug).to(dtype)


def test_the_model_computes_its_own_loss_and_returns_it_first():
    batch = lm_batch(0)
    with torch.no_grad():
        loss, logits = _model()(**batch)
        (alone,) = _model()(batch["input_ids"])
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert logits.shape == (2, 128, 256)
    assert torch.equal(alone, logits)


def test_the_weights_have_a_trained_models_statistics():
    model, batch = _model(), lm_batch(0)
    t = model.transformer
    with torch.no_grad():
        x = t.wte(batch["input_ids"]) + t.wpe(torch.arange(128))[None]
        # a residual stream whose mean is several times its spread
        assert float(x.mean(-1).abs().mean() / x.std(-1).mean()) > 4
        block = t.h[0]
        q, k, _ = block.attn.qkv(block.ln_attn(x)).chunk(3, dim=-1)
        heads = (2, 128, 4, 32)
        scores = block.attn.scores(
            q.reshape(heads).transpose(1, 2), k.reshape(heads).transpose(1, 2)
        )[:, 0]
        causal = torch.ones(128, 128, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        # head 0 is an attention sink on the first token
        assert float(weights[:, 1:, 0].mean()) > 0.99
        (logits,) = model(batch["input_ids"])
        # peaked next-token distributions
        assert float(logits.softmax(-1).max(-1).values.mean()) > 0.9


@pytest.mark.parametrize("bug", ["norm_low_precision", "loss_low_precision"])
def test_a_dtype_bug_is_harmless_in_float32_and_changes_bfloat16(bug):
    batch = lm_batch(0)
    with torch.no_grad():
        assert torch.allclose(_model(bug)(**batch)[0], _model()(**batch)[0], rtol=1e-5)
        twin = _model(None, torch.bfloat16)(**batch)[0]
        buggy = _model(bug, torch.bfloat16)(**batch)[0]
    assert not torch.equal(twin, buggy)


def test_the_fp16_attention_kernel_overflows_only_when_it_scales_after_the_matmul():
    batch = lm_batch(0)
    with torch.no_grad():
        assert torch.isfinite(_model()(**batch)[1]).all()
        assert not torch.isfinite(_model("qk_fp16")(**batch)[1]).all()


def test_the_fp16_cache_overflows_in_decoding_only():
    ids = lm_batch(0)["input_ids"][:1]
    step = DecoderStep(_model("cache_fp16", torch.bfloat16))
    with torch.no_grad():
        prefill, cache = step(ids[:, :8])
        assert torch.isfinite(prefill).all()
        assert cache[0][1].dtype == torch.float16
        following, _ = step(ids[:, 8:9], cache)
    assert not torch.isfinite(following).all()
    twin = DecoderStep(_model(None, torch.bfloat16))
    with torch.no_grad():
        _, cache = twin(ids[:, :8])
        assert torch.isfinite(twin(ids[:, 8:9], cache)[0]).all()


def test_every_bug_has_a_builtin_target():
    names = ["parallel-decoder", "parallel-decoder-step", "parallel-decoder-cache-fp16"]
    names += [f"parallel-decoder-{bug.replace('_', '-')}" for bug in BUGS if bug != "cache_fp16"]
    for name in names:
        target = load_target(name)
        assert target.name == name
    with pytest.raises(ValueError, match="unknown bug"):
        build("nope")
