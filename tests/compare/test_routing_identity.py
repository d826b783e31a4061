"""Routing judged by expert identity (issue 37): a token's routing is the set of experts it
reaches, and every value per chosen expert (the routing weights, their gradients, the rows
inside the experts) is paired by (token, expert), never by its place in the top-k.

The two runs here compute the same numbers in fp32; the actual lists each token's chosen
experts in the opposite order (as an unsorted top-k does, or a near-tie between two chosen
experts). A comparison by position would read that as a fault.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precguard

TOKENS, HIDDEN, EXPERTS, K = 24, 16, 4, 2


class _Router(nn.Module):
    """gpt-oss's router: top-k of the logits, a softmax over the k chosen (top-k order)."""

    def __init__(self, reverse: bool, shift: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, EXPERTS)
        self.reverse, self.shift = reverse, shift

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.proj(x)
        top, idx = logits.topk(K, dim=-1)
        weights = top.softmax(dim=-1)
        if self.reverse:  # the same experts, listed the other way round
            top, idx, weights = top.flip(-1), idx.flip(-1), weights.flip(-1)
        if self.shift:  # a wrong routing: every token to the next experts
            idx = (idx + 1) % EXPERTS
        return logits, weights, idx


class _Experts(nn.Module):
    """An eager loop over experts (HF's layout: per expert, rows by top-k slot then token)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(EXPERTS, HIDDEN, HIDDEN) / HIDDEN**0.5)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in range(EXPERTS):
            slot, token = torch.where(idx.T.eq(e))
            if token.numel():
                h = self.act(x[token] @ self.w[e])
                out = out.index_add(0, token, h * weights[token, slot, None])
        return out


class _Block(nn.Module):
    """A mixture-of-experts block that returns its routing weights beside its output."""

    def __init__(self, reverse: bool = False, shift: bool = False) -> None:
        super().__init__()
        self.router = _Router(reverse, shift)
        self.experts = _Experts()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, weights, idx = self.router(x)
        return x + self.experts(x, idx, weights), weights


def _record(out: Path, **variant: bool) -> Path:
    torch.manual_seed(0)
    model = _Block(**variant)
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with precguard.monitor(model, out=out, tensors=["*"], backward=True):
        y, weights = model(x)
        (y.square().mean() + weights.square().sum()).backward()  # an order-free loss
    return out


def test_the_same_experts_in_another_top_k_order_match(tmp_path: Path) -> None:
    golden = _record(tmp_path / "golden")
    actual = _record(tmp_path / "actual", reverse=True)

    result = precguard.compare_runs(golden, actual)

    assert result.verdict == "match", result.first_divergence
    by_key = {r.key: r for r in result.records}
    # the weights, their gradients and the rows inside the experts were paired by expert
    weights = by_key["router.0.forward.output.1"]
    assert weights.status == "pass" and weights.metrics is not None
    assert weights.metrics.error < 1e-6
    grad = by_key["router.0.backward.output.1"]
    assert grad.status == "pass" and grad.metrics is not None and grad.metrics.error < 1e-6
    inner = [r for r in result.records if r.module == "experts.act" and r.metrics is not None]
    assert inner and all(r.metrics.error < 1e-6 for r in inner)  # type: ignore[union-attr]
    idx = by_key["router.0.forward.output.2"]
    assert idx.metrics is not None and idx.metrics.rerouted == 0


def test_a_router_that_sends_tokens_elsewhere_is_still_named(tmp_path: Path) -> None:
    golden = _record(tmp_path / "golden")
    actual = _record(tmp_path / "actual", reverse=True, shift=True)

    result = precguard.compare_runs(golden, actual)

    fd = result.first_divergence
    assert result.verdict == "diverged" and fd is not None and fd.module == "router", fd
    assert "top-k choice" in fd.reason


@pytest.mark.parametrize("reverse", [False, True])
def test_identical_routing_is_never_a_finding(tmp_path: Path, reverse: bool) -> None:
    golden = _record(tmp_path / "golden", reverse=reverse)
    actual = _record(tmp_path / "actual", reverse=reverse)

    result = precguard.compare_runs(golden, actual)

    assert result.verdict == "match", result.first_divergence
    assert "top-k choice" not in " ".join(r.metrics.note or "" for r in result.records if r.metrics)
