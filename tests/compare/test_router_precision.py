"""A router computed in lower precision than its code asks (issue 37): named at the router.

Reference mixture-of-experts code keeps its router in float32 inside a bf16 model (the
logits from ``F.linear(h.float(), w.float())``, the softmax in float32). A device that
computes those float32 ops in bf16 errs by one bf16 rounding, no more than the error its
bf16 inputs explain, so judged by size the router passes; its weights are then no longer
what its own recorded logits give in float32, which compare measures.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import precguard
from precguard import resolve_backend
from tests.realstacks.corpus import Bf16Kernels

TOKENS, HIDDEN, EXPERTS, K = 64, 32, 8, 2


class _Router(nn.Module):
    """Mixtral's router with DeepSeek-V3's float32 logits: softmax over all experts in
    float32, the top-k weights normalized."""

    def __init__(self, in_bf16: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(EXPERTS, HIDDEN) / HIDDEN**0.5)
        self.in_bf16 = in_bf16

    def _forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = F.linear(h.float(), self.weight.float())
        weights, idx = torch.softmax(logits, dim=-1).topk(K, dim=-1)
        return logits, weights / weights.sum(dim=-1, keepdim=True), idx

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.in_bf16:
            return self._forward(h)
        # the device computes this float32 code in bf16 (every op rounded to bf16)
        with Bf16Kernels():
            return self._forward(h)


class _Model(nn.Module):
    def __init__(self, router_in_bf16: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.router = _Router(router_in_bf16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.router(self.proj(x))


def _record(out: Path, device: str, router_in_bf16: bool = False) -> Path:
    model = _Model(router_in_bf16)
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    backend = resolve_backend(device)
    if device != "cpu":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    compute = backend.compute_dtype()
    with (
        backend.numerics(),
        precguard.monitor(
            model,
            out,
            tensors=["*"],
            device=device,
            compute_dtype=str(compute).removeprefix("torch.") if compute else None,
        ),
        torch.no_grad(),
    ):
        model(x)
    return out


def test_a_router_kept_in_float32_on_a_mixed_precision_device_matches(tmp_path: Path):
    golden = _record(tmp_path / "golden", "cpu")
    actual = _record(tmp_path / "actual", "emu:bf16-mixed")
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "match", result.first_divergence


def test_a_router_computed_in_bf16_is_named_at_the_router_from_its_weights(tmp_path: Path):
    golden = _record(tmp_path / "golden", "cpu")
    actual = _record(tmp_path / "actual", "emu:bf16-mixed", router_in_bf16=True)
    result = precguard.compare_runs(golden, actual)
    first = result.first_divergence
    assert result.verdict == "diverged" and first is not None
    assert first.module == "router"
    assert "computed in bfloat16 where its code keeps float32" in first.reason


def test_on_a_device_that_rounds_every_op_to_bf16_a_bf16_router_is_its_numerics(tmp_path: Path):
    # emu:bf16 computes every op in bf16, the code's float32 islands too: the model stays
    # stored in float32 and the run says every value was computed in bf16
    golden = _record(tmp_path / "golden", "cpu")
    model = _Model()
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    backend = resolve_backend("emu:bf16")
    out = tmp_path / "actual"
    with (
        backend.numerics(),
        precguard.monitor(model, out, tensors=["*"], device="emu:bf16", compute_dtype="bfloat16"),
        torch.no_grad(),
    ):
        model(x)
    assert precguard.compare_runs(golden, out).verdict == "match"
