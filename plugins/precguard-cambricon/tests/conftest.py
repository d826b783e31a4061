"""A FAKE ``torch_mlu`` for testing precguard-cambricon on machines without an MLU.

This is *not* torch_mlu. It reproduces only the documented surface the plugin
touches (torch_mlu.mlu.manual_seed_all, get_rng_state, get_device_name, and
the ``torch.backends.mlu`` / ``torch.backends.cnnl`` flags torch_mlu installs
on import, with torch_mlu's defaults), keeps the values a test sets and logs
the calls made. ``torch.backends.cnnl.deterministic`` is a plain settable
flag, as in torch_mlu. The fixtures install the fake and take it out again.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch


@dataclass
class FakeMluState:
    """What the FAKE torch_mlu remembers: settings a test can change, calls it got."""

    available: bool = True
    device_count: int = 1
    calls: list[tuple[str, Any]] = field(default_factory=list)


def make_fake_torch_mlu(state: FakeMluState) -> types.ModuleType:
    """Return a FAKE ``torch_mlu`` module backed by ``state``."""
    mod = types.ModuleType("torch_mlu")
    mod.__version__ = "1.24.0+FAKE"
    generator = torch.Generator()

    def manual_seed_all(seed: int) -> None:
        state.calls.append(("mlu.manual_seed_all", seed))
        generator.manual_seed(seed)

    mod.mlu = types.SimpleNamespace(
        is_available=lambda: state.available,
        device_count=lambda: state.device_count,
        synchronize=lambda: state.calls.append(("mlu.synchronize", None)),
        manual_seed_all=manual_seed_all,
        get_rng_state=lambda device="mlu": generator.get_state(),
        set_rng_state=lambda s, device="mlu": generator.set_state(s),
        get_device_name=lambda index=0: "MLU370-FAKE",
    )
    return mod


def fake_mlu_backends() -> tuple[types.SimpleNamespace, types.SimpleNamespace]:
    """FAKE ``torch.backends.mlu`` and ``torch.backends.cnnl`` with torch_mlu's defaults."""
    mlu = types.SimpleNamespace(
        matmul=types.SimpleNamespace(allow_tf32=False),
        custom=types.SimpleNamespace(allow_tf32=False),
    )
    cnnl = types.SimpleNamespace(allow_tf32=True, deterministic=False)  # torch_mlu's defaults
    return mlu, cnnl


@pytest.fixture
def mlu_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMluState]:
    """Install the FAKE torch_mlu (and torch.backends.mlu/cnnl); yields its state."""
    state = FakeMluState()
    monkeypatch.setitem(sys.modules, "torch_mlu", make_fake_torch_mlu(state))
    mlu, cnnl = fake_mlu_backends()
    monkeypatch.setattr(torch.backends, "mlu", mlu, raising=False)
    monkeypatch.setattr(torch.backends, "cnnl", cnnl, raising=False)
    yield state


@pytest.fixture
def no_mlu_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import torch_mlu`` fail."""
    monkeypatch.setitem(sys.modules, "torch_mlu", None)
