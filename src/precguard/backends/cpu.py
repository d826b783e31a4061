"""Built-in plugin: the CPU, the reference every other device is compared with.

torch's global facts (version, deterministic algorithms, float32 matmul
precision) are not the CPU's: precguard adds them to every device's
fingerprint (:func:`precguard.backend.torch_facts`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from precguard.backend import Backend
from precguard.hookspecs import hookimpl

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
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register the host CPU (``cpu``)."""
    register(CpuBackend)
