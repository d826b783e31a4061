"""Built-in plugin: the CPU, the reference every other device is compared with."""

from __future__ import annotations

import os
from typing import Any

import torch

from precguard.backend import Backend
from precguard.plugins import hookimpl

_CPU_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY")


class CpuBackend(Backend):
    """The host CPU."""

    device_type = "cpu"

    def torch_device(self) -> torch.device:
        """Always ``cpu``."""
        return torch.device("cpu")

    def fingerprint(self) -> dict[str, Any]:
        """Thread count (it changes reduction order), ISA level, oneDNN, thread env vars."""
        facts: dict[str, Any] = {
            "cpu.num_threads": torch.get_num_threads(),
            "cpu.capability": torch.backends.cpu.get_cpu_capability(),
            "cpu.mkldnn_enabled": torch.backends.mkldnn.enabled,
        }
        for var in _CPU_ENV:
            if var in os.environ:
                facts[f"env.{var}"] = os.environ[var]
        return facts


@hookimpl
def precguard_backend(device: str) -> Backend | None:
    """Claim ``cpu``."""
    if device == "cpu":
        return CpuBackend(device)
    return None


@hookimpl
def precguard_device_types() -> list[str]:
    """The host CPU's one device type."""
    return ["cpu"]


@hookimpl
def precguard_fingerprint(device: str) -> dict[str, Any] | None:
    """torch's version and global numerics flags for every device; CPU facts for ``cpu``
    and for ``emu:`` devices, which run on the CPU."""
    facts: dict[str, Any] = {
        "torch.version": torch.__version__,
        "torch.deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch.float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch.default_dtype": str(torch.get_default_dtype()),
    }
    if device == "cpu" or device == "emu" or device.startswith("emu:"):
        facts.update(CpuBackend("cpu").fingerprint())
    return facts
