"""``emu:`` devices reject what a real device rejects: matmuls given fp16 and fp32 operands.

The story: a user's fp16 port feeds an fp32 activation (a norm that forgets to
cast back) into an fp16 Linear. On a GPU or NPU this raises at once; the
emulator, which computes everything in fp32 internally, used to let it through
and report numbers for a model that cannot run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precguard import resolve_backend


class ForgetfulNorm(nn.Module):
    """Normalises in fp32 and returns fp32, forgetting to cast back to the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)


def fp16_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(ForgetfulNorm(), nn.Linear(8, 8)).half()


def plain_error(fn) -> str:
    with pytest.raises(RuntimeError) as exc:
        fn()
    return str(exc.value)


@pytest.mark.parametrize("device", ["emu:fp16-mixed", "emu:fp16", "emu:bf16-mixed"])
def test_an_fp32_activation_into_an_fp16_linear_raises_as_on_the_device(device):
    model, x = fp16_model(), torch.randn(2, 8).half()
    expected = plain_error(lambda: model(x))  # what torch itself says, outside the emulator
    with resolve_backend(device).numerics(), pytest.raises(RuntimeError) as exc:
        model(x)
    assert str(exc.value) == expected


@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a @ b,
        lambda a, b: torch.bmm(a[None], b[None]),
        lambda a, b: torch.addmm(b, a, b),
        lambda a, b: torch.mv(a, b[0]),
    ],
    ids=["matmul", "bmm", "addmm", "mv"],
)
def test_matmul_like_ops_with_mixed_float_operands_raise(op):
    a, b = torch.randn(4, 4).half(), torch.randn(4, 4)
    with resolve_backend("emu:fp16-mixed").numerics(), pytest.raises(RuntimeError):
        op(a, b)


def test_elementwise_type_promotion_still_works_and_rounds():
    a = torch.full((4,), 1.0 + 2**-9).half()
    b = torch.full((4,), 2**-12)
    with resolve_backend("emu:fp16-mixed").numerics():
        got = a + b  # fp16 + fp32 promotes to fp32, as torch does
    assert got.dtype == torch.float32
    with resolve_backend("emu:fp16").numerics():
        rounded = a + b
    assert rounded.dtype == torch.float32
    assert rounded[0].item() == 1.0 + 2**-9  # emu:fp16 rounds the result to fp16


def test_under_autocast_the_same_model_runs():
    model, x = fp16_model(), torch.randn(2, 8).half()
    with resolve_backend("emu:fp16-mixed").numerics(), torch.autocast("cpu", dtype=torch.float16):
        y = model(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
