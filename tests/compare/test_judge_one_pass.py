"""compare settles each record once, in capture order, and decides each call from that pass.

The user story: the rules of a real stack are applied where their record sits in the
step, not in passes after the judge. A router that returns its indices before the scores
they were ranked by is judged when its scores are (its indices, met first, are settled
then); a loss computed in low precision is a finding of its own that explains the calls
around it; a fixed profile decides local and the why line in the same pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from precguard import Target
from precguard.compare import Metrics, RecordResult
from precguard.compare.tolerance import get_profile
from precguard.compare.verdict import judge_unit

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


# -- hand-built steps: what one pass decides -----------------------------------------------


def _rec(
    key: str,
    seq: int,
    error: float,
    *,
    status: str = "pass",
    golden_dtype: str = "float32",
    actual_dtype: str = "float32",
    shape: tuple[int, ...] = (4, 8),
    module_type: str = "Block",
) -> RecordResult:
    module, call, phase, role, index = key.rsplit(".", 4)
    return RecordResult(
        key=key,
        module=module,
        module_type=module_type,
        call=int(call),
        index=int(index),
        golden_dtype=golden_dtype,
        actual_dtype=actual_dtype,
        shape=list(shape),
        phase=phase,
        role=role,
        step=0,
        rank=0,
        seq=seq,
        status=status,
        metrics=Metrics(level="full", dtype=actual_dtype, error=error),
    )


def test_a_loss_computed_in_bf16_explains_the_call_that_returns_it() -> None:
    # a fixed profile: the statuses are the tolerance's; the pass decides local and why
    results = [
        _rec("root.0.forward.input.0", 0, 0.0, shape=(4, 8)),
        _rec("head.0.forward.input.0", 1, 0.0),
        _rec("head.0.forward.output.0", 2, 1e-3),
        _rec("loss_fn.0.forward.input.0", 3, 1e-3),
        _rec("loss_fn.0.forward.input.1", 4, 0.0, golden_dtype="int64", actual_dtype="int64"),
        _rec("loss_fn.0.forward.output.0", 5, 1e-3, actual_dtype="bfloat16", shape=()),
        _rec("root.0.forward.output.0", 6, 5e-2, status="fail", shape=()),
    ]

    verdict = judge_unit(results, get_profile("fixed"))

    (found,) = verdict.candidates
    assert found.result.key == "loss_fn.0.forward.output.0"
    assert "computes the loss in bfloat16" in found.reason
    loss = next(r for r in verdict.results if r.key == found.result.key)
    assert loss.status == "fail" and loss.local is True and loss.expected_error is None
    # the root's output carries the loss's error: decided, but explained by the loss
    root = next(r for r in verdict.results if r.key == "root.0.forward.output.0")
    assert root.local is True
    assert verdict.carried is None  # the expected-error judge did not run


@pytest.mark.parametrize("profile", ["default", "fixed"])
def test_one_pass_names_the_module_that_amplified_and_not_the_one_that_passed_it_on(
    profile: str,
) -> None:
    bad = "fail" if profile == "fixed" else "pass"  # the default profile judges it anew
    results = [
        _rec("a.0.forward.input.0", 0, 0.0),
        _rec("a.0.forward.output.0", 1, 1e-2, status=bad),
        _rec("b.0.forward.input.0", 2, 1e-2, status=bad),
        _rec("b.0.forward.output.0", 3, 1.2e-2, status=bad),
    ]

    verdict = judge_unit(results, get_profile(profile))

    assert [c.result.module for c in verdict.candidates] == ["a"]
    by_key = {r.key: r for r in verdict.results}
    assert by_key["a.0.forward.output.0"].local is True
    # b grew the error it received 1.2x: it passes it on (or, judged anew, passes)
    assert by_key["b.0.forward.output.0"].local is not True
