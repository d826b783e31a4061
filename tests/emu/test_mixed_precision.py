"""Mixed-precision profiles keep the fp32 islands a model's code asks for."""

from __future__ import annotations

import torch
from torch import nn

import precguard
from precguard import resolve_backend


class UpcastNorm(nn.Module):
    """RMSNorm the HF way: upcast, normalise in fp32, cast back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def run(device: str, x: torch.Tensor) -> torch.Tensor:
    with resolve_backend(device).numerics():
        return UpcastNorm()(x)


def test_upcast_is_honoured_only_by_the_mixed_profile():
    x = torch.full((2, 8), 300.0)  # 300**2 overflows fp16
    # all-fp16 storage (Ascend allow_fp32_to_fp16): the upcast is rounded away, x**2 is inf
    assert torch.equal(run("emu:fp16", x), torch.zeros(2, 8))
    assert torch.equal(run("emu:fp16", x.half()), torch.zeros(2, 8, dtype=torch.float16))
    # mixed precision: the fp32 island stays fp32, as on a GPU
    assert torch.equal(run("emu:fp16-mixed", x.half()), torch.ones(2, 8, dtype=torch.float16))


def test_mixed_profile_still_rounds_low_precision_ops():
    a = torch.randn(64, 64).half()
    b = torch.randn(64, 64).half()
    with resolve_backend("emu:fp16-mixed").numerics():
        got = a @ b
    exact = (a.float() @ b.float()).half()  # fp32 accumulation, one rounding
    assert got.dtype == torch.float16
    assert torch.equal(got, exact)
    big = torch.full((4,), 60000.0).half()
    with resolve_backend("emu:fp16-mixed").numerics():
        assert torch.isinf(big + big).all()


def test_model_dtype_follows_the_profile_unless_asked(tmp_path):
    path = precguard.record_target("tiny-llama", device="emu:fp16-mixed", out=tmp_path / "a")
    assert precguard.load_run(path).manifest.dtype == "float16"
    path = precguard.record_target(
        "tiny-llama", device="emu:fp16-mixed", dtype="float32", out=tmp_path / "b"
    )
    assert precguard.load_run(path).manifest.dtype == "float32"
    path = precguard.record_target("tiny-llama", device="emu:fp16", out=tmp_path / "c")
    assert precguard.load_run(path).manifest.dtype == "float32"


def test_checklist_tells_all_fp16_from_mixed_precision():
    only = ["norm.*", "rope.*"]
    all_fp16 = precguard.check("llama-inference", "tiny-llama", device="emu:fp16", only=only)
    mixed = precguard.check("llama-inference", "tiny-llama", device="emu:fp16-mixed", only=only)
    status = {
        d: {f.id: f.status for f in x.findings} for d, x in (("all", all_fp16), ("mix", mixed))
    }
    # HF's RMSNorm upcasts: it breaks only where the chip runs fp32 ops in fp16
    assert status["all"]["norm.extreme_inputs"] == "fail"
    assert status["mix"]["norm.extreme_inputs"] == "pass"
    # model.half() also casts the rotary inv_freq buffer: a real mixed-precision bug
    assert mixed.dtype == "float16"
    rope = next(f for f in mixed.findings if f.id == "rope.position_sweep")
    assert rope.status == "fail" and "inv_freq" in rope.summary
