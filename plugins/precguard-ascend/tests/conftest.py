"""A FAKE ``torch_npu`` for testing precguard-ascend on machines without an NPU.

This is *not* torch_npu. It reproduces only the documented surface the plugin
touches (torch_npu.npu.manual_seed_all, set_deterministic_level,
utils.is_support_inf_nan, _C._npu_getOption, get_npu_format /
npu_format_cast, npu.matmul.allow_hf32, ...), keeps the values a test sets,
logs the calls made, and mimics the side effects the plugin relies on:

- ``set_deterministic_level`` sets torch's deterministic flag itself;
- ``_get_deterministic_level`` calls the setter when no level was set yet, so
  reading it can change state;
- torch_npu warns against ``torch.use_deterministic_algorithms``: the fake
  wraps it to log the call and warn;
- ``_npu_getOption`` returns bytes, and None for an option never set.

The fixtures put the fake into ``sys.modules`` and take it out again.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

#: torch_npu's ACL_FORMAT_ND and ACL_FORMAT_FRACTAL_NZ
FORMAT_ND = 2
FORMAT_FRACTAL_NZ = 29


@dataclass
class FakeDevice:
    """Stands in for ``torch.device("npu:0")``, which needs a real torch_npu."""

    type: str
    index: int = 0

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


class FakeNpuTensor:
    """FAKE NPU tensor: CPU data plus the internal format torch_npu would report."""

    def __init__(self, data: torch.Tensor, npu_format: int) -> None:
        self.data = data
        self.npu_format = npu_format
        self.device = FakeDevice("npu")

    def detach(self) -> FakeNpuTensor:
        return self

    def to(self, device: str) -> torch.Tensor:
        assert device == "cpu"
        return self.data.clone()


@dataclass
class FakeNpuState:
    """What the FAKE torch_npu remembers: settings a test can change, calls it got."""

    available: bool = True
    device_count: int = 1
    options: dict[str, str] = field(default_factory=dict)
    inf_nan: bool = True
    overflow_flag: bool = False
    #: None: no level set yet in this process
    deterministic_level: int | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)

    FORMAT_ND = FORMAT_ND
    FORMAT_FRACTAL_NZ = FORMAT_FRACTAL_NZ

    def tensor(self, data: torch.Tensor, npu_format: int) -> FakeNpuTensor:
        """A FAKE NPU tensor holding ``data`` in ``npu_format``."""
        return FakeNpuTensor(data, npu_format)


def make_fake_torch_npu(state: FakeNpuState, use_deterministic: Any) -> types.ModuleType:
    """Return a FAKE ``torch_npu`` module backed by ``state``.

    ``use_deterministic`` is torch's own ``use_deterministic_algorithms``, which
    the fake setter calls the way torch_npu does.
    """
    mod = types.ModuleType("torch_npu")
    mod.__version__ = "2.1.0.post99+FAKE"
    generator = torch.Generator()

    def log(name: str, value: Any = None) -> None:
        state.calls.append((name, value))

    def manual_seed_all(seed: int) -> None:
        log("npu.manual_seed_all", seed)
        generator.manual_seed(seed)

    def set_deterministic_level(level: int) -> None:
        log("npu.set_deterministic_level", level)
        state.deterministic_level = level
        use_deterministic(level > 0)  # torch_npu keeps torch's flag in step

    def get_deterministic_level() -> int:
        if state.deterministic_level is None:
            set_deterministic_level(0)  # reading can write: the plugin must not read it
        return state.deterministic_level

    def check_overflow(_grad: Any) -> bool:
        log("npu.utils.npu_check_overflow")
        return state.overflow_flag

    def clear_flag() -> None:
        log("npu.clear_npu_overflow_flag")
        state.overflow_flag = False

    def format_cast(t: FakeNpuTensor, fmt: int) -> FakeNpuTensor:
        log("npu_format_cast", fmt)
        return FakeNpuTensor(t.data, fmt)

    mod.npu = types.SimpleNamespace(
        is_available=lambda: state.available,
        device_count=lambda: state.device_count,
        synchronize=lambda: log("npu.synchronize"),
        manual_seed=lambda seed: log("npu.manual_seed", seed),
        manual_seed_all=manual_seed_all,
        get_rng_state=lambda device="npu": generator.get_state(),
        set_rng_state=lambda s, device="npu": generator.set_state(s),
        get_device_name=lambda index=0: "Ascend910B-FAKE",
        is_jit_compile_false=lambda: True,
        _get_deterministic_level=get_deterministic_level,
        set_deterministic_level=set_deterministic_level,
        clear_npu_overflow_flag=clear_flag,
        matmul=types.SimpleNamespace(allow_hf32=False, cube_math_type=0),
        conv=types.SimpleNamespace(allow_hf32=True),  # torch_npu's documented default
        config=types.SimpleNamespace(allow_internal_format=True),  # default before Atlas A3
        utils=types.SimpleNamespace(
            is_support_inf_nan=lambda: state.inf_nan, npu_check_overflow=check_overflow
        ),
    )

    def get_option(name: str) -> bytes | None:
        # torch_npu's C binding returns bytes (its own Python code calls .decode())
        value = state.options.get(name)
        return None if value is None else value.encode()

    mod._C = types.SimpleNamespace(_npu_getOption=get_option)
    mod.get_npu_format = lambda t: t.npu_format
    mod.npu_format_cast = format_cast
    return mod


@pytest.fixture
def npu_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNpuState]:
    """Install the FAKE torch_npu in sys.modules; yields its state.

    torch's deterministic flag is restored afterwards (the fake setter changes it).
    """
    state = FakeNpuState()
    real = torch.use_deterministic_algorithms
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )

    def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
        state.calls.append(("torch.use_deterministic_algorithms", mode))
        warnings.warn(
            "FAKE torch_npu: use torch_npu.npu.set_deterministic_level instead of "
            "torch.use_deterministic_algorithms",
            UserWarning,
            stacklevel=2,
        )
        real(mode, warn_only=warn_only)

    monkeypatch.setitem(sys.modules, "torch_npu", make_fake_torch_npu(state, real))
    monkeypatch.setattr(torch, "use_deterministic_algorithms", use_deterministic_algorithms)
    try:
        yield state
    finally:
        real(before[0], warn_only=before[1])


@pytest.fixture
def no_npu_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import torch_npu`` fail, as on a machine without CANN."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)
