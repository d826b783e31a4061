"""Replay runs in the dtype ``record`` uses on the device and judges by the expected error.

The story: ``precguard replay`` of the hand-written LLaMA's buggy RoPE on
``emu:bf16-mixed`` without ``--dtype``. ``record`` runs that device in bf16, so
replay does too; the rotary output then carries several times the error one
bf16 rounding explains (its inputs are exact positions), while clean modules
replayed in bf16 stay within theirs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precguard
from precguard.compare.expected import rounding_floor
from precguard.localize.replay import REPLAY_MARGIN, replay_module

ROPE_BUG = "handwritten-llama-rope-bug"
DEVICE = "emu:bf16-mixed"


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The buggy decoder on the CPU in fp32, every tensor saved."""
    out = tmp_path_factory.mktemp("replay") / "g"
    return precguard.record_target(ROPE_BUG, device="cpu", out=out, tensors=True)


def test_rope_replayed_without_dtype_runs_bf16_and_diverges(golden: Path) -> None:
    result = replay_module(golden, "model.rotary_emb", target=ROPE_BUG, device=DEVICE)
    assert (result.dtype, result.precision, result.profile) == ("bfloat16", "bfloat16", "expected")
    assert result.verdict == "diverged"
    for out in result.outputs:  # cos and sin
        assert out.expected_error == pytest.approx(rounding_floor("bfloat16"), rel=1e-3)
        assert out.metrics is not None and out.metrics.error > REPLAY_MARGIN * out.expected_error
        assert out.status == "fail"


@pytest.mark.parametrize("module", ["model.layers.0.mlp", "model.layers.1.attn", "model.norm"])
def test_clean_module_replayed_in_bf16_matches(golden: Path, module: str) -> None:
    # the fixed fp32 tolerance failed these: bf16 arithmetic is not fp32's
    result = replay_module(golden, module, target=ROPE_BUG, device=DEVICE)
    assert result.dtype == "bfloat16" and result.verdict == "match", result.outputs
    assert result.local_error > 1e-4  # it did run in bf16


def test_fixed_profile_still_available(golden: Path) -> None:
    result = replay_module(
        golden, "model.layers.0.mlp", target=ROPE_BUG, device=DEVICE, profile="default"
    )
    assert result.profile == "default" and result.outputs[0].expected_error is None


def test_dtype_when_told_runs_in_it(golden: Path) -> None:
    result = replay_module(
        golden, "model.rotary_emb", target=ROPE_BUG, device="cpu", dtype="float32"
    )
    # on the CPU in fp32 the angles are exact enough: the bug only bites in bf16
    assert (result.dtype, result.verdict, result.local_error) == ("float32", "match", 0.0)


def _scale_down_proj(model: torch.nn.Module) -> None:
    model.get_submodule("model.layers.1.mlp.down_proj").register_forward_hook(
        lambda _m, _args, out: out * 1.01
    )


def test_compare_replay_with_a_statistics_only_actual_replays_from_the_golden(
    golden: Path, tmp_path: Path
) -> None:
    from precguard import replay_suspects

    actual = precguard.record_target(ROPE_BUG, out=tmp_path / "a", prepare=_scale_down_proj)
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "diverged"
    checked = replay_suspects(result, target=ROPE_BUG, top=1)
    [check] = checked.replays
    # the actual lacks full tensors, the golden has them: replay needs only the golden's
    assert check.replayed and "no full tensors" not in (check.note or "")
    assert check.verdict == "match"  # the target's own code is clean: the fault was planted


def test_compare_replay_says_when_it_is_the_golden_that_lacks_tensors(tmp_path: Path) -> None:
    from precguard import replay_suspects

    golden = precguard.record_target(ROPE_BUG, out=tmp_path / "g")
    actual = precguard.record_target(
        ROPE_BUG, out=tmp_path / "a", tensors=True, prepare=_scale_down_proj
    )
    result = precguard.compare_runs(golden, actual)
    [check] = replay_suspects(result, target=ROPE_BUG, top=1).replays
    assert not check.replayed and "the golden holds no full tensors" in (check.note or "")
