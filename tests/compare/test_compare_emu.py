"""Across devices: a CPU golden against the ``emu:`` numerics emulator (another chip's
arithmetic, on the CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

import precguard
from precguard import PrecguardError
from tests.compare.conftest import FAULTS, record


def _needs(device: str) -> None:
    from precguard import resolve_backend

    try:
        resolve_backend(device)
    except PrecguardError as exc:
        pytest.skip(f"{device} unavailable: {exc}")


def test_another_reduction_order_matches(tiny_golden: Path, tmp_path: Path) -> None:
    _needs("emu:fp32-shuffled")
    actual = record(tmp_path / "shuffled", device="emu:fp32-shuffled")

    result = precguard.compare_runs(tiny_golden, actual)

    assert result.verdict == "match"
    assert result.fingerprint_diff["emu.profile"] == [None, "fp32-shuffled"]


def test_fault_under_another_reduction_order_is_named(tiny_golden: Path, tmp_path: Path) -> None:
    _needs("emu:fp32-shuffled")
    fault = next(f for f in FAULTS if f.name == "rmsnorm-fp16-first-layer")
    actual = record(tmp_path / "fault", device="emu:fp32-shuffled", fault=fault)

    result = precguard.compare_runs(tiny_golden, actual)

    assert result.first_divergence is not None
    assert result.first_divergence.module == fault.module


def test_chip_running_softmax_in_fp16_is_traced_to_attention(
    tiny_golden: Path, tmp_path: Path
) -> None:
    _needs("emu:softmax-fp16")
    actual = record(tmp_path / "softmax", device="emu:softmax-fp16")

    result = precguard.compare_runs(tiny_golden, actual)

    fd = result.first_divergence
    assert result.verdict == "diverged"
    assert fd is not None and fd.module == "model.layers.0.self_attn" and fd.local
    # softmax is not a module: the attention module's own code made the error
    assert "own code between its submodules" in fd.reason


def test_replay_on_the_emulated_chip_confirms_the_attention_module(tiny_golden: Path) -> None:
    _needs("emu:softmax-fp16")
    from precguard import replay_module

    chip = {"target": "tiny-llama", "device": "emu:softmax-fp16"}
    attention = replay_module(tiny_golden, "model.layers.2.self_attn", **chip)
    mlp = replay_module(tiny_golden, "model.layers.2.mlp", **chip)

    assert attention.verdict == "diverged" and attention.local_error > 1e-5
    assert mlp.verdict == "match"
