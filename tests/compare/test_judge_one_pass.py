"""compare settles each record once, in capture order, and decides each call from that pass.

The user story: the rules of a real stack are applied where their record sits in the
step, not in passes after the judge. A router that returns its indices before the scores
they were ranked by is judged when its scores are: its indices, met first, are settled
then. (The pass on hand-made steps: tests/compare/test_compare_expected_judge.py.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import precguard
from precguard import Target

HIDDEN, EXPERTS, TOP_K, TOKENS = 32, 4, 2, 48


class IndicesFirstRouter(nn.Module):
    """A router whose outputs are (indices, weights, scores): its indices are recorded
    before the scores that rank them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, EXPERTS, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.proj(x)
        weights, indices = logits.softmax(dim=-1).topk(TOP_K, dim=-1)
        return indices, weights, logits


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(EXPERTS, HIDDEN, HIDDEN) * HIDDEN**-0.5)

    def forward(
        self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(x)
        for slot in range(TOP_K):
            chosen = self.weight[indices[:, slot]]
            out = out + weights[:, slot, None] * torch.einsum("th,thd->td", x, chosen)
        return out


class TinyMoe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.router = IndicesFirstRouter()
        self.experts = Experts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        indices, weights, _ = self.router(h)
        return self.experts(h, indices, weights)


def _target() -> Target:
    def batch(step: int) -> torch.Tensor:
        return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(step))

    return Target(model=TinyMoe, batch=batch, seed=0, name="tiny-moe-indices-first")


def _shift_indices(model: nn.Module) -> None:
    """Every token goes to the next experts: a re-routing no near-tie explains."""

    def shifted(_m: nn.Module, _args: object, out: tuple[torch.Tensor, ...]) -> object:
        indices, weights, logits = out
        return (indices + 1) % EXPERTS, weights, logits

    model.get_submodule("router").register_forward_hook(shifted)


def test_a_router_recording_its_indices_before_its_scores_is_named(tmp_path: Path) -> None:
    golden = precguard.record_target(_target(), device="cpu", out=tmp_path / "g", tensors=True)
    actual = precguard.record_target(
        _target(), device="cpu", out=tmp_path / "a", tensors=True, prepare=_shift_indices
    )

    result = precguard.compare_runs(golden, actual)

    fd = result.first_divergence
    assert fd is not None and fd.module == "router", fd and fd.reason
    assert fd.key == "router.0.forward.output.0" and fd.local
    assert "re-routed" in fd.reason and "beyond" in fd.reason
    indices = next(r for r in result.records if r.key == fd.key)
    assert indices.status == "fail" and indices.metrics.rerouted == TOKENS


def test_the_same_router_clean_matches(tmp_path: Path) -> None:
    golden = precguard.record_target(_target(), device="cpu", out=tmp_path / "g", tensors=True)
    actual = precguard.record_target(_target(), device="cpu", out=tmp_path / "a", tensors=True)

    result = precguard.compare_runs(golden, actual)

    assert result.verdict == "match"
    indices = next(r for r in result.records if r.key == "router.0.forward.output.0")
    assert indices.status == "pass" and indices.metrics.rerouted == 0
