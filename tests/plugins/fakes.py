"""FAKES of the vendor SDKs, for tests on machines without the hardware.

These are *not* torch_npu or torch_mlu. They reproduce only the documented
surface the precguard-ascend and precguard-cambricon plugins touch (names and
call shapes taken from the vendors' API docs: torch_npu.npu.manual_seed_all,
torch_npu.npu.utils.is_support_inf_nan, torch_npu._C._npu_getOption,
torch_npu.get_npu_format / npu_format_cast, torch_npu.npu.matmul.allow_hf32,
torch_mlu.mlu.manual_seed_all, torch.backends.mlu.matmul.allow_tf32,
torch.backends.cnnl.allow_tf32, ...), keep the values a test sets, and log the
calls made so a test can assert on them. Install them with the fixtures in
``conftest.py``, which put them into ``sys.modules`` and take them out again.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

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
class FakeSdkState:
    """What the fake SDK remembers: settings a test can change, calls it made."""

    available: bool = True
    device_count: int = 1
    options: dict[str, str] = field(default_factory=dict)
    inf_nan: bool = True
    overflow_flag: bool = False
    deterministic_level: int = 0
    calls: list[tuple[str, Any]] = field(default_factory=list)


def make_fake_torch_npu(state: FakeSdkState) -> types.ModuleType:
    """Return a FAKE ``torch_npu`` module backed by ``state``."""
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
        _get_deterministic_level=lambda: state.deterministic_level,
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
    mod.generator = generator  # for tests: the fake device generator
    return mod


def make_fake_torch_mlu(state: FakeSdkState) -> types.ModuleType:
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
    mod.generator = generator
    return mod


def fake_mlu_backends() -> tuple[types.SimpleNamespace, types.SimpleNamespace]:
    """FAKE ``torch.backends.mlu`` and ``torch.backends.cnnl`` with torch_mlu's defaults."""
    mlu = types.SimpleNamespace(
        matmul=types.SimpleNamespace(allow_tf32=False),
        custom=types.SimpleNamespace(allow_tf32=False),
    )
    cnnl = types.SimpleNamespace(allow_tf32=True)  # torch_mlu's documented default
    return mlu, cnnl
