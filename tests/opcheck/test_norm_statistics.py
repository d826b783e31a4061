"""op-check on a norm: judged where norms fail, rows with a large mean, within the positions.

The user's story: a GPT-NeoX-style decoder computes LayerNorm's mean and variance
one-pass in bf16. On centred rows that is harmless; on a trained model's residual
stream (a mean several times its spread) it cancels. op-check must fail that norm
and pass its correct twin, and never sweep past the model's positions.
"""

from __future__ import annotations

import torch

from precguard.opcheck.norm import MEAN_TO_SPREAD, looks_like_norm, with_large_mean
from precguard.opcheck.sweep import op_check
from tests.opcheck.norm_models import PARALLEL, undeclared_positions


def test_large_mean_rows_keep_their_spread_and_sit_at_8x_it():
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0))
    (shifted,), _ = with_large_mean((x,), {})
    centred = x - x.mean(-1, keepdim=True)
    spread = centred.pow(2).mean(-1).sqrt()
    assert MEAN_TO_SPREAD == 8  # op-check's tolerance, 8 eps (numerics.TOLERANCE_EPS)
    torch.testing.assert_close(shifted.mean(-1), MEAN_TO_SPREAD * spread)
    torch.testing.assert_close(shifted - shifted.mean(-1, keepdim=True), centred)
    assert looks_like_norm(torch.nn.LayerNorm(4)) and not looks_like_norm(torch.nn.Linear(2, 2))


def _norm_points(target: str) -> dict:
    result = op_check(device="emu:bf16", target=target, module="transformer.h.0.ln_attn")
    return result, {p.label: p for p in result.results}


def test_one_pass_layernorm_statistics_in_bf16_fail_on_large_mean_rows():
    result, points = _norm_points(f"{PARALLEL}:norm_low_precision")
    shifted = points["transformer.h.0.ln_attn (mean 8x spread)"]
    assert shifted.status == "fail" and shifted.max_rel_err > 2 * shifted.allowed
    assert result.exit_code == 1


def test_the_correct_twin_passes_both_and_stays_within_the_models_positions():
    result, points = _norm_points(f"{PARALLEL}:correct")
    assert set(points) == {
        "transformer.h.0.ln_attn",
        "transformer.h.0.ln_attn (mean 8x spread)",
    }
    assert all(p.status == "pass" for p in points.values()), points
    assert result.exit_code == 0
    # the small build takes 64 positions: the default lengths past it are left out, said so
    assert result.seq_lens == [32]
    assert any("64 positions" in n and "128, 1024, 4096" in n for n in result.notes)


def test_a_model_that_does_not_declare_its_positions_stops_where_its_forward_does():
    result = op_check(device="emu:bf16", target=undeclared_positions(), module="norm")
    assert result.seq_lens == [16]
    assert result.exit_code == 0
    assert result.notes and "stopped at 128 tokens" in result.notes[0]


def test_inputs_that_are_not_finite_at_reference_are_refused_not_a_nan_fail():
    import pytest

    from precguard import TargetError
    from tests.opcheck.norm_models import overflow_upstream

    with pytest.raises(TargetError, match="hold NaN/Inf"):
        op_check(device="emu:bf16", target=overflow_upstream(), module="norm", seq_lens="4")
