"""The ``emu:fp8-*`` profiles: Linear GEMMs with scaled fp8 operands, fp32 sums, bf16 out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precguard import numerics, plugins


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


def test_block_scales_keep_an_outlier_from_flushing_the_other_rows(tmp_path):
    """One element 2^20 times the rest: per tensor, the other rows fall below e4m3's
    subnormals and flush to zero; with 1 x 128 tiles only the outlier's tile is coarse."""
    torch.manual_seed(0)
    layer, x = nn.Linear(256, 64, bias=False), torch.randn(8, 256)
    x[0, 200] = 2.0**20
    rest = slice(1, None)

    @torch.no_grad()
    def rows_error(device: str) -> float:
        layer16, x16 = layer.to(torch.bfloat16), x.to(torch.bfloat16)
        exact = (x16.float() @ layer16.weight.float().T)[rest]
        with plugins.get_backend(device).numerics():
            got = layer16(x16).float()[rest]
        return float((got - exact).norm() / exact.norm())

    assert rows_error("emu:fp8-e4m3") > 0.5  # flushed
    assert rows_error("emu:fp8-e4m3-block") <= numerics.fp8_gemm_error("float8_e4m3fn", 256)


def test_power_of_two_scales_keep_the_derived_error(tmp_path):
    path = tmp_path / "mx.toml"
    path.write_text(
        'compute_dtype = "bfloat16"\nkeep_float32 = true\nfp8_format = "e4m3"\n'
        'fp8_scaling = "block"\nfp8_scale_rounding = "pow2"\n'
    )
    torch.manual_seed(0)
    err = _linear_error(f"emu:{path}", torch.randn(64, 256), nn.Linear(256, 128, bias=False))
    assert err <= numerics.fp8_gemm_error("float8_e4m3fn", 256, 128, pow2=True)


def test_linear_records_carry_the_fp8_dtype(tmp_path):
    import precguard

    out = precguard.record_target("tiny-llama", out=tmp_path / "run", device="emu:fp8-e4m3")
    records = {r.key: r for r in precguard.load_run(out).records()}
    assert records["model.layers.0.mlp.up_proj.0.forward.output.0"].compute_dtype == (
        "float8_e4m3fn"
    )
    assert records["model.layers.0.mlp.up_proj.0.forward.input.0"].compute_dtype is None
    assert records["model.layers.0.mlp.0.forward.output.0"].compute_dtype is None


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_a_block_scaled_operand_saturates_nothing_of_its_own(fmt):
    # each 1 x 128 tile's scale comes from its own amax: its largest element lands on
    # the format's max up to the float32 division's rounding, which is no saturation
    from precguard.backends.emu import fp8

    recipe = fp8.Fp8Recipe(fmt, scaling="block")
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0)) * 3
    stats = fp8.operand_statistics(x, fp8.activation_scales(x, recipe), recipe.dtype)
    assert stats["saturated"] == 0.0
    # and a tile scaled for another tile's smaller amax does saturate
    scales = fp8.activation_scales(x, recipe).clone()
    scales[0, :128] = scales[0, :128] / 4
    assert fp8.operand_statistics(x, scales, recipe.dtype)["saturated"] > 1 / x.numel()


def test_the_saturation_bound_is_half_a_spacing_above_the_format_max():
    assert numerics.fp8_saturation_bound(torch.float8_e4m3fn) == 448 + 16
    assert numerics.fp8_saturation_bound(torch.float8_e5m2) == 57344 + 4096
