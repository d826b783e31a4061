"""Fixtures for plugin tests: a fresh plugin manager and the FAKE vendor SDKs."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

from precguard import plugins
from tests.plugins.fakes import (
    FakeSdkState,
    fake_mlu_backends,
    make_fake_torch_mlu,
    make_fake_torch_npu,
)


@pytest.fixture
def fresh_plugins() -> Iterator[None]:
    """Reload every plugin before the test and again after it (env vars may have changed)."""
    plugins.reset()
    try:
        yield
    finally:
        plugins.reset()
        plugins.load_plugins()


@pytest.fixture
def npu_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSdkState]:
    """Install the FAKE torch_npu in sys.modules; yields its state."""
    state = FakeSdkState()
    monkeypatch.setitem(sys.modules, "torch_npu", make_fake_torch_npu(state))
    yield state


@pytest.fixture
def no_npu_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import torch_npu`` fail, as on a machine without CANN."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)


@pytest.fixture
def mlu_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSdkState]:
    """Install the FAKE torch_mlu (and torch.backends.mlu/cnnl); yields its state."""
    state = FakeSdkState()
    monkeypatch.setitem(sys.modules, "torch_mlu", make_fake_torch_mlu(state))
    mlu, cnnl = fake_mlu_backends()
    monkeypatch.setattr(torch.backends, "mlu", mlu, raising=False)
    monkeypatch.setattr(torch.backends, "cnnl", cnnl, raising=False)
    yield state


@pytest.fixture
def no_mlu_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import torch_mlu`` fail."""
    monkeypatch.setitem(sys.modules, "torch_mlu", None)
