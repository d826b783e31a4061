"""The emulator's arithmetic: what each profile setting does to an op, and what it leaves alone."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from precguard import plugins
from precguard.backends.emu import numerics
from precguard.backends.emu.mode import EmuMode
from precguard.backends.emu.profile import EmuProfile
from precguard.capture.stats import capture_scope


def emulate(profile: str | EmuProfile, fn, *args):
    if isinstance(profile, str):
        backend = plugins.get_backend(f"emu:{profile}")
        ctx = backend.numerics()
    else:
        ctx = EmuMode(profile)
    with ctx:
        return fn(*args)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(32, 64, generator=torch.Generator().manual_seed(0))


def test_fp16_elementwise_matches_native_fp16(x: torch.Tensor) -> None:
    got = emulate("fp16", lambda t: torch.exp(t) * 3.0 + t, x)
    want = (torch.exp(x.half()) * 3.0 + x.half()).float()
    assert got.dtype == torch.float32
    assert torch.equal(got, want)


def test_fp16_matmul_is_fp16_storage_with_fp32_accumulation(x: torch.Tensor) -> None:
    w = torch.randn(64, 48, generator=torch.Generator().manual_seed(1))
    got = emulate("fp16", torch.matmul, x, w)
    want = (x.half().float() @ w.half().float()).half().float()
    assert torch.equal(got, want)
    assert not torch.equal(got, x @ w)


def test_bf16_rounds_to_bf16(x: torch.Tensor) -> None:
    got = emulate("bf16", torch.sigmoid, x)
    assert torch.equal(got, got.bfloat16().float())
    assert not torch.equal(got, torch.sigmoid(x))


def test_low_precision_accumulation_loses_small_terms() -> None:
    # 2048 then 4096 terms of 0.4: past 2048 an fp16 running sum moves in steps of 2,
    # so each block's +6.4 is rounded to +6 and ~100 is lost; one rounding at the end
    # (fp32 accumulation) loses less than 2
    terms = torch.cat([torch.tensor([2048.0]), torch.full((4096,), 0.4)]).unsqueeze(0)
    exact = terms.half().double().sum().item()
    plain = emulate("fp16", torch.sum, terms).item()
    low = emulate("fp16-lowacc", torch.sum, terms).item()
    assert abs(plain - exact) < 2
    assert exact - low > 50
    assert emulate("fp16-lowacc", lambda t: t.mean(dim=-1), terms).shape == (1,)
    a = torch.randn(8, 512, generator=torch.Generator().manual_seed(2))
    b = torch.randn(512, 8, generator=torch.Generator().manual_seed(3))
    exact = a.double() @ b.double()
    err_plain = (emulate("fp16", torch.mm, a, b).double() - exact).abs().max()
    err_low = (emulate("fp16-lowacc", torch.mm, a, b).double() - exact).abs().max()
    assert err_low > err_plain


def test_shuffled_reduction_changes_last_bits_only() -> None:
    a = torch.randn(16, 1024, generator=torch.Generator().manual_seed(4))
    b = torch.randn(1024, 16, generator=torch.Generator().manual_seed(5))
    shuffled = emulate("fp32-shuffled", torch.mm, a, b)
    assert not torch.equal(shuffled, a @ b)
    torch.testing.assert_close(shuffled, a @ b, rtol=1e-4, atol=1e-4)
    s = emulate("fp32-shuffled", lambda t: t.sum(dim=1, keepdim=True), a)
    assert s.shape == (16, 1)
    torch.testing.assert_close(s, a.sum(dim=1, keepdim=True), rtol=1e-4, atol=1e-4)


def test_flush_to_zero_zeroes_fp16_subnormals() -> None:
    t = torch.tensor([1e-6, 3e-5, 1e-4, -2e-5])
    assert emulate("fp16", torch.clone, t)[0].item() != 0.0  # fp16 keeps subnormals
    flushed = emulate("fp16-ftz", torch.clone, t)
    assert flushed[:2].tolist() == [0.0, 0.0] and flushed[3].item() == 0.0
    assert flushed[2].item() != 0.0


def test_saturation_clamps_and_zeroes_nan() -> None:
    t = torch.tensor([1e5, -1e6, float("inf"), float("nan"), 1.0])
    assert emulate("fp16-saturate", lambda v: v * 1.0, t).tolist() == [
        65504.0, -65504.0, 65504.0, 0.0, 1.0,
    ]  # fmt: skip
    inf_mode = emulate("fp16", lambda v: v * 1.0, t)
    assert torch.isinf(inf_mode[:3]).all() and torch.isnan(inf_mode[3])


def test_per_op_override_touches_only_that_op(x: torch.Tensor) -> None:
    soft = emulate("softmax-fp16", lambda t: F.softmax(t * 10, dim=-1), x)
    assert torch.equal(soft, F.softmax((x * 10).half().float(), dim=-1).half().float())
    assert torch.equal(emulate("softmax-fp16", torch.exp, x), torch.exp(x))


def test_in_place_and_out_ops_are_rounded_in_place(x: torch.Tensor) -> None:
    y = x.clone()

    def work(t: torch.Tensor) -> torch.Tensor:
        t.mul_(1e5)
        return t

    out = emulate("fp16-saturate", work, y)
    assert out is y
    assert y.abs().max().item() == 65504.0


def test_fp16_model_stays_fp16() -> None:
    lin = torch.nn.Linear(16, 16).half()
    out = emulate("fp16", lin, torch.randn(2, 16).half())
    assert out.dtype == torch.float16
    assert emulate("fp16", lambda t: t.float(), out).dtype == torch.float32
    assert emulate("fp16", lambda t: F.softmax(t, -1, dtype=torch.float32), out).dtype == (
        torch.float32
    )


def test_fp64_passes_through_unchanged() -> None:
    t = torch.randn(8, dtype=torch.float64)
    assert torch.equal(emulate("fp16", torch.exp, t), torch.exp(t))


def test_precguard_statistics_are_not_emulated() -> None:
    t = torch.tensor([1.0 + 2**-20, 70000.0])
    with plugins.get_backend("emu:fp16").numerics(), capture_scope():
        total = t.sum()
    assert total.item() == pytest.approx(70001.0 + 2**-20)


def test_model_weights_are_untouched_and_training_works() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(8, 16)
    with plugins.get_backend("emu:bf16-lowacc").numerics(), torch.no_grad():
        model(x)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with plugins.get_backend("emu:fp16").numerics():
        loss = model(x).pow(2).mean()
        loss.backward()
        grad = model[0].weight.grad
        assert torch.equal(grad, grad.half().float())  # backward ran emulated too
        opt.step()
    w = model[0].weight.detach()
    assert torch.equal(w, w.half().float())  # the update was stored at fp16


def test_rounding_helpers() -> None:
    rules = numerics.OpNumerics(storage=torch.float16, saturate=True)
    assert numerics.to_storage(torch.tensor([7e4]), rules).item() == 65504.0
    # a float32 model's mask value is the same model's fp16 mask value, not -inf
    mask_value = torch.finfo(torch.float32).min
    ieee = numerics.OpNumerics(storage=torch.float16)
    assert numerics.to_storage(torch.tensor([mask_value, 7e4]), ieee).tolist() == [
        -65504.0, float("inf"),
    ]  # fmt: skip
    assert not numerics.OpNumerics(storage=torch.float32).changes_values
    perm = numerics.reduction_order(10, numerics.OpNumerics(torch.float32, shuffle_seed=1))
    assert perm is not None and sorted(perm.tolist()) == list(range(10))
    a, b = torch.randn(3, 5, 37), torch.randn(3, 37, 4)
    low = numerics.OpNumerics(torch.float32, accumulate=torch.float32, block=8)
    torch.testing.assert_close(numerics.matmul(a, b, low), a @ b)
    blocked = numerics._block_products(a, b, 8)
    assert len(blocked) == 5
    torch.testing.assert_close(sum(blocked), a @ b)


def test_gathers_and_casts_round_their_result() -> None:
    table = torch.tensor([[1e5, 1.0 + 2**-12], [-3.0, 2e-8]])
    rows = emulate("fp16-saturate", F.embedding, torch.tensor([0, 1]), table)
    assert rows[0].tolist() == [65504.0, 1.0] and rows[1, 0].item() == -3.0
    assert rows[1, 1].item() == torch.tensor(2e-8).half().float().item()
    assert emulate("fp16-saturate", lambda t: t.half(), table)[0, 0].item() == 65504.0
    assert torch.isinf(emulate("fp16", lambda t: t.half(), table)[0, 0])


def test_low_precision_accumulation_covers_addmm_and_baddbmm() -> None:
    gen = torch.Generator().manual_seed(7)
    x, w, bias = (
        torch.randn(2, 3, 40, generator=gen),
        torch.randn(40, 5, generator=gen),
        torch.randn(5, generator=gen),
    )
    y = emulate("fp16-lowacc", F.linear, x, w.t(), bias)
    torch.testing.assert_close(y, x @ w + bias, rtol=2e-2, atol=2e-2)
    assert torch.equal(y, y.half().float())
    base = torch.randn(2, 3, 3, generator=gen)
    z = emulate(
        "fp16-lowacc",
        lambda: torch.baddbmm(base, x, x.transpose(1, 2), beta=0.5, alpha=2.0),
    )
    torch.testing.assert_close(z, 0.5 * base + 2 * (x @ x.transpose(1, 2)), rtol=2e-2, atol=0.1)


def test_nested_numerics_round_once() -> None:
    backend = plugins.get_backend("emu:fp16-lowacc")
    a = torch.randn(4, 256, generator=torch.Generator().manual_seed(8))
    b = torch.randn(256, 4, generator=torch.Generator().manual_seed(9))
    with backend.numerics():
        once = a @ b
        with backend.numerics():
            nested = a @ b
    assert torch.equal(once, nested)


def test_only_a_profile_that_changes_something_intercepts_ops(tmp_path) -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    plain = tmp_path / "plain.toml"
    plain.write_text('description = "fp32, nothing switched on"\n')
    with plugins.get_backend(f"emu:{plain}").numerics():
        assert not _get_current_dispatch_mode_stack()
    for name in ("softmax-fp16", "fp32-shuffled", "fp32-rng"):  # fp32, yet each changes ops
        with plugins.get_backend(f"emu:{name}").numerics():
            assert any(isinstance(m, EmuMode) for m in _get_current_dispatch_mode_stack()), name
