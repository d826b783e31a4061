"""The fp64 oracle sees through the casts a module makes internally.

The story: a checker re-runs a user's module "in fp64" to judge it. If that
re-run still squares in fp16 because the module calls ``x.half()``, the broken
module looks perfect. These tests hold the oracle to computing the function
the code means, in fp64, whatever dtype the code asks for.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from precguard.oracle import run_in_fp64


class Fp16SquareRMSNorm(nn.Module):
    """An RMSNorm that computes the mean square in fp16 (the bug the oracle must see through)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = x.half().pow(2).mean(-1, keepdim=True).float()
        return self.weight * (x * torch.rsqrt(ms + self.eps))


def exact_rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_bf16_angles(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary cos/sin whose angles are computed with ``dtype=torch.bfloat16``."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(positions.to(torch.bfloat16), inv_freq.to(dtype=torch.bfloat16))
    return angles.cos(), angles.sin()


def test_a_norm_that_squares_in_fp16_is_judged_against_the_real_function():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 1e3
    norm = Fp16SquareRMSNorm(64)
    # the module's own code in fp64 still overflows: x.half() ** 2 > 65504, rsqrt(inf) = 0
    plain = Fp16SquareRMSNorm(64).double()(x.double())
    assert plain.abs().max().item() == 0.0
    exact = run_in_fp64(norm, x)
    assert exact.dtype == torch.float64
    torch.testing.assert_close(exact, exact_rms_norm(x), rtol=1e-12, atol=0)
    # the user's module and input are untouched
    assert norm.weight.dtype == torch.float32 and x.dtype == torch.float32


def test_rope_angles_requested_in_bf16_are_computed_in_fp64():
    positions = torch.arange(0, 4096, 97)
    cos, sin = run_in_fp64(rope_bf16_angles, positions, 64)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float32).double() / 64))
    # inv_freq is the fp32 the code built it in (an exact fp32 value), then fp64 throughout
    want = torch.outer(positions.double(), inv)
    torch.testing.assert_close(cos, want.cos(), rtol=0, atol=1e-12)
    torch.testing.assert_close(sin, want.sin(), rtol=0, atol=1e-12)
    low_cos, _ = rope_bf16_angles(positions, 64)
    assert (low_cos.double() - want.cos()).abs().max() > 0.1  # what the bug costs


def test_softmax_with_a_low_dtype_argument_stays_fp64():
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 8

    def softmax16(t: torch.Tensor) -> torch.Tensor:
        return torch.softmax(t, dim=-1, dtype=torch.float16)

    got = run_in_fp64(softmax16, x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.softmax(x.double(), -1), rtol=1e-12, atol=1e-15)


def test_factory_and_reduction_dtypes_and_default_dtype_are_widened():
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ramp = torch.arange(300, dtype=torch.bfloat16)  # bf16 cannot hold 257
        total = x.sum(dtype=torch.float16)
        third = torch.tensor(1.0) / 3  # the default dtype
        return ramp, total, third, torch.zeros(2, dtype=torch.half)

    ramp, total, third, zeros = run_in_fp64(f, torch.full((4096,), 1.0 + 2**-20))
    assert ramp[257].item() == 257.0
    assert total.item() == pytest.approx(4096 * (1 + 2**-20), rel=1e-15)
    assert third.item() == pytest.approx(1 / 3, rel=1e-15)
    assert {ramp.dtype, total.dtype, third.dtype, zeros.dtype} == {torch.float64}
    assert torch.get_default_dtype() == torch.float32  # restored


def test_autocast_inside_the_code_cannot_lower_the_oracle():
    layer = nn.Linear(16, 16)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(2))

    def under_autocast(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return m(h)

    got = run_in_fp64(under_autocast, x, module=layer)
    want = x.double() @ layer.weight.double().T + layer.bias.double()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert layer.weight.dtype == torch.float32


def test_a_constant_kept_outside_the_buffers_is_widened_where_it_is_used():
    table = torch.linspace(0, 1, 8, dtype=torch.float16)  # a plain attribute, not a buffer

    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * table

    x = torch.full((8,), 1.0 + 2**-30, dtype=torch.float64)
    got = run_in_fp64(Scaled(), x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, x * table.double(), rtol=1e-15, atol=0)


def test_integer_work_is_untouched_and_complex_is_widened():
    def f(ids: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = torch.polar(torch.ones_like(x), x).to(torch.complex64)
        return ids * 3, (ids > 2), torch.view_as_real(z)

    ids = torch.arange(5)
    tripled, mask, real = run_in_fp64(f, ids, torch.tensor([0.5, 1.5]))
    assert tripled.dtype == torch.int64 and tripled.tolist() == [0, 3, 6, 9, 12]
    assert mask.dtype == torch.bool
    assert real.dtype == torch.float64
    assert real[1, 1].item() == pytest.approx(math.sin(1.5), rel=1e-15)


def test_a_model_output_keeps_its_type():
    from transformers.modeling_outputs import CausalLMOutput

    out = CausalLMOutput(logits=torch.randn(1, 2, 3))
    got = run_in_fp64(lambda o: o.logits.sum(dtype=torch.float16), out)
    assert got.dtype == torch.float64


def test_without_a_copy_the_module_gives_the_same_numbers_and_is_untouched():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 16), Fp16SquareRMSNorm(16), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 16) * 300
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copied = run_in_fp64(model, x)
    shared = run_in_fp64(lambda m, h: m(h), x, module=model, copy_module=False)
    assert torch.equal(copied, shared) and shared.dtype == torch.float64
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and after[k].dtype == torch.float32 for k in after)


def test_an_exception_inside_leaves_no_mode_and_no_default_dtype_behind():
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("user code failed")

    with pytest.raises(ValueError, match="user code failed"):
        run_in_fp64(broken, torch.ones(2))
    assert torch.get_default_dtype() == torch.float32
    assert (torch.ones(2, dtype=torch.float16) * 2).dtype == torch.float16  # no Fp64Mode left
