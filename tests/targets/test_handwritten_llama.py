"""The hand-written LLaMA of the built-in targets: the RoPE bug is harmless in fp32 only."""

from __future__ import annotations

import torch

from precguard import load_target
from precguard.targets import build_handwritten_llama


def _logits(rope_bug: bool, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    model = build_handwritten_llama(rope_bug=rope_bug).to(dtype)
    ids = torch.randint(0, 256, (1, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids).float()


def test_rope_bug_is_bitwise_harmless_in_fp32() -> None:
    assert torch.equal(_logits(False, torch.float32), _logits(True, torch.float32))


def test_rope_bug_changes_bf16_rotary_late_positions_most() -> None:
    model = build_handwritten_llama(rope_bug=True).to(torch.bfloat16)
    x = torch.zeros(1, 128, model.config.hidden_size, dtype=torch.bfloat16)
    pos = torch.arange(128)[None]
    cos_bug, _ = model.model.rotary_emb(x, pos)
    model.model.rotary_emb.rope_bug = False
    cos_ok, _ = model.model.rotary_emb(x, pos)
    err = (cos_bug.float() - cos_ok.float()).abs()
    assert err[0, :16].max() < err[0, -16:].max()
    assert err.max() > 0.05


def test_builtin_targets_load() -> None:
    for name in ("handwritten-llama", "handwritten-llama-rope-bug"):
        target = load_target(name)
        assert target.name == name
        assert target.batch(0)["input_ids"].shape == (2, 128)
