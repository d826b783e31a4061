"""Backward localization: a module whose backward computes wrong gradients is named.

The fault is a custom autograd.Function on the module's input: identity in
forward (the forward is bitwise equal to the golden's), gradient scaled by 1%
in backward, as a fused kernel with a wrong backward would be.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from tests.compare.conftest import record, run_cli


class _ScaledBackward(torch.autograd.Function):
    """Identity forward; backward scales the incoming gradient by 1.01."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * 1.01


def _wrong_input_grad(module: nn.Module) -> None:
    original = module.forward

    def forward(x: torch.Tensor, *args, **kwargs):
        return original(_ScaledBackward.apply(x), *args, **kwargs)

    module.forward = forward


@pytest.fixture(scope="module")
def train_golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama, one training step (forward and backward) with every tensor."""
    return record(tmp_path_factory.mktemp("golden") / "run", train=True)


@pytest.mark.parametrize("tensors", [True, False], ids=["full-tensors", "stats-only"])
@pytest.mark.parametrize(
    "module",
    [
        "model.layers.2.mlp.down_proj",
        # shares its input with the decoder layer's residual add
        "model.layers.1.input_layernorm",
        # shares its input with its siblings q_proj and v_proj
        "model.layers.3.self_attn.k_proj",
    ],
)
def test_wrong_backward_is_named_local(
    module: str, tensors: bool, train_golden: Path, tmp_path: Path, capsys
) -> None:
    golden = train_golden
    if not tensors:
        golden = record(tmp_path / "golden", train=True, tensors=False)

    def plant(model: nn.Module) -> None:
        _wrong_input_grad(model.get_submodule(module))

    actual = precguard.record_target(
        "tiny-llama", out=tmp_path / "actual", train=True, tensors=tensors, prepare=plant
    )
    result = precguard.compare_runs(golden, actual)

    forward = [r for r in result.records if r.phase == "forward"]
    assert forward and all(r.status == "pass" for r in forward)  # forward bitwise equal
    assert result.verdict == "diverged"
    fd = result.first_divergence
    assert fd is not None
    assert (fd.module, fd.phase, fd.local) == (module, "backward", True), fd.reason
    assert fd.key == f"{module}.0.backward.input.0"
    # modules upstream in backward only passed the error on: the gradients they compute
    # carry it, and the error they consumed explains it (judged by their expected error)
    failing = [r for r in result.records if r.phase == "backward" and r.status == "fail"]
    assert all(r.module == module or module.startswith(r.module + ".") for r in failing), [
        r.key for r in failing
    ]
    passed_on = [
        r
        for r in result.records
        if r.phase == "backward" and r.status == "pass" and r.seq > fd_seq(result, fd.key)
    ]
    assert any(r.metrics and r.metrics.error > 0 for r in passed_on)
    assert all(s.module != module for s in result.suspects)
    # replay re-runs a forward: compare prints no command for a backward divergence, and why
    code, out, _ = run_cli(["compare", str(golden), str(actual)], capsys)
    assert code == 1 and "confirm it alone" not in out
    [why] = [line for line in out.splitlines() if line.startswith("no replay command:")]
    assert "backward" in why


def fd_seq(result: precguard.compare.Comparison, key: str) -> int:
    """Capture order of the record ``key`` in ``result``."""
    return next(r.seq for r in result.records if r.key == key)


def test_clean_training_step_matches(train_golden: Path, tmp_path: Path) -> None:
    again = record(tmp_path / "again", train=True)
    result = precguard.compare_runs(train_golden, again)
    assert result.verdict == "match"
    assert any(r.phase == "backward" and r.role == "input" for r in result.records)
