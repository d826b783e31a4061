"""The ``emu:fp8-*`` profiles: Linear GEMMs with scaled fp8 operands, fp32 sums, bf16 out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precguard import numerics, plugins
from precguard.backends.emu import fp8


@torch.no_grad()
def _linear_error(device: str, x: torch.Tensor, layer: nn.Linear) -> float:
    """A bf16 Linear (the profiles are mixed precision) on the device vs its exact product."""
    layer, x = layer.to(torch.bfloat16), x.to(torch.bfloat16)
    exact = x.float() @ layer.weight.float().T
    with plugins.get_backend(device).numerics():
        got = layer(x)
    assert got.dtype == torch.bfloat16
    return float((got.float() - exact).norm() / exact.norm())


@pytest.mark.parametrize(
    ("device", "dtype"),
    [
        ("emu:fp8-e4m3", "float8_e4m3fn"),
        ("emu:fp8-e4m3-block", "float8_e4m3fn"),
        ("emu:fp8-e4m3-delayed", "float8_e4m3fn"),
        ("emu:fp8-e5m2", "float8_e5m2"),
    ],
)
def test_an_fp8_linear_is_off_by_about_its_derived_error_and_no_more(device, dtype):
    torch.manual_seed(0)
    layer, x = nn.Linear(256, 128, bias=False), torch.randn(64, 256)
    err = _linear_error(device, x, layer)
    floor = numerics.fp8_gemm_error(dtype, 256)
    # the derivation's rms bound holds, and the error is the format's, not bf16's
    assert numerics.unit_roundoff("bfloat16") < err <= floor


def test_current_scaling_never_saturates_and_a_stale_amax_does():
    torch.manual_seed(0)
    x = torch.randn(32, 256)
    recipe = fp8.Fp8Recipe()
    scale = fp8.scale_of(x.abs().amax(), recipe.dtype)
    assert fp8.operand_statistics(x, scale, recipe.dtype)["saturated"] == 0.0
    stale = fp8.operand_statistics(x, scale / 4, recipe.dtype)
    assert stale["saturated"] > 0.01 and stale["scale_amax_ratio"] == pytest.approx(0.25)


def test_delayed_scaling_uses_the_history_of_the_same_gemm():
    history = fp8.AmaxHistory(2)
    assert history.scale_amax((1, 0), 1.0) == 1.0  # no history: its own
    assert history.scale_amax((1, 0), 8.0) == 1.0  # the history's: stale
    assert history.scale_amax((2, 0), 8.0) == 8.0  # another GEMM has its own
    assert history.scale_amax((1, 0), 2.0) == 8.0
    assert history.scale_amax((1, 0), 2.0) == 8.0  # 1.0 fell out; 8.0 is still in
    assert history.scale_amax((1, 0), 2.0) == 2.0  # length 2: 8.0 is gone


def test_block_scales_follow_tiles_of_128():
    x = torch.ones(2, 256)
    x[0, 200] = 448.0 * 4
    scales = fp8.activation_scales(x, fp8.Fp8Recipe(scaling="block"))
    assert scales[0, 0] == 1.0 / 448 and scales[0, 200] == 4.0 and scales[1, 200] == 1.0 / 448


def test_pow2_scales_are_powers_of_two_at_or_above_the_exact_scale():
    s = fp8.scale_of(torch.tensor([3.0, 448.0]), torch.float8_e4m3fn, "pow2")
    assert torch.equal(s, torch.tensor([2.0**-7, 1.0]))


def test_linear_records_carry_the_fp8_dtype(tmp_path):
    import precguard
    from precguard.dump.reader import load_run

    out = precguard.record_target("tiny-llama", out=tmp_path / "run", device="emu:fp8-e4m3")
    records = {r.key: r for r in load_run(out).records()}
    assert records["model.layers.0.mlp.up_proj.0.forward.output.0"].compute_dtype == (
        "float8_e4m3fn"
    )
    assert records["model.layers.0.mlp.up_proj.0.forward.input.0"].compute_dtype is None
    assert records["model.layers.0.mlp.0.forward.output.0"].compute_dtype is None
