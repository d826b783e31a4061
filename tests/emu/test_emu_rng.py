"""Dropout masks: same seed, same masks on cpu; another stream on an emu device; seed it
through the backend."""

from __future__ import annotations

import torch

import precguard
from precguard import Backend, plugins
from tests.emu.models import dropout_target


def dropout_mask(backend: Backend, seed: int, *, through_backend: bool = True) -> torch.Tensor:
    if through_backend:
        backend.manual_seed(seed)
    else:
        torch.manual_seed(seed)
    ones = torch.ones(4096, device=backend.torch_device())
    with backend.numerics():
        return torch.nn.functional.dropout(ones, 0.5, training=True) != 0


def test_same_seed_same_masks_on_cpu_and_another_stream_on_emu() -> None:
    cpu = plugins.get_backend("cpu")
    emu = plugins.get_backend("emu:fp32-rng")
    assert torch.equal(dropout_mask(cpu, 0), dropout_mask(cpu, 0))
    emu_mask = dropout_mask(emu, 0)
    assert torch.equal(emu_mask, dropout_mask(emu, 0))  # reproducible, seeded via the backend
    assert not torch.equal(emu_mask, dropout_mask(cpu, 0))  # but another stream than the CPU's
    assert 0.4 < emu_mask.float().mean().item() < 0.6


def test_torch_manual_seed_alone_does_not_reach_the_device_generator() -> None:
    first = dropout_mask(plugins.get_backend("emu:fp32-rng"), 0, through_backend=False)
    second = dropout_mask(plugins.get_backend("emu:fp32-rng"), 0, through_backend=False)
    assert not torch.equal(first, second)


def test_random_tensors_drawn_with_a_cpu_generator_match_everywhere() -> None:
    emu = plugins.get_backend("emu:fp32-rng")
    emu.manual_seed(0)
    with emu.numerics():
        on_emu = torch.rand(64, generator=torch.Generator().manual_seed(5))
    assert torch.equal(on_emu, torch.rand(64, generator=torch.Generator().manual_seed(5)))


def test_rng_state_round_trips() -> None:
    emu = plugins.get_backend("emu:fp32-rng")
    emu.manual_seed(3)
    state = emu.get_rng_state()
    first = dropout_mask(emu, 0, through_backend=False)
    emu.set_rng_state(state)
    assert torch.equal(first, dropout_mask(emu, 0, through_backend=False))


def test_the_checklist_tells_the_user_to_seed_through_the_backend() -> None:
    diagnosis = precguard.check(
        "llama-finetune",
        dropout_target(),
        device="emu:fp32-rng",
        only=["rng.same_seed", "rng.cross_device"],
    )
    found = {f.id: f for f in diagnosis.findings}
    assert found["rng.same_seed"].status == "pass"  # seeded through the backend: runs repeat
    finding = found["rng.cross_device"]
    assert finding.status == "fail"
    assert "dropout masks" in finding.summary
    assert "manual_seed" in finding.remedy
