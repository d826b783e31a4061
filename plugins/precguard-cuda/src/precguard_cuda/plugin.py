"""The hooks precguard calls: this module is the ``cuda`` entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from precguard import hookimpl
from precguard.backend import Backend
from precguard_cuda.backend import CudaBackend


def _mine(device: str) -> bool:
    return device.split(":", 1)[0] == "cuda"


@hookimpl
def precguard_backend(device: str) -> Backend | None:
    """Claim ``cuda`` and ``cuda:N``."""
    return CudaBackend(device) if _mine(device) else None


@hookimpl
def precguard_device_types() -> list[str]:
    """The device type this plugin claims."""
    return ["cuda"]


@hookimpl
def precguard_fingerprint(device: str) -> dict[str, Any] | None:
    """CUDA versions, TF32/cuDNN/SDPA switches and environment variables."""
    return CudaBackend(device).fingerprint() if _mine(device) else None


@hookimpl
def precguard_register_checks(register: Callable[..., None]) -> None:
    """Register the ``env.cuda_*`` checks."""
    from precguard_cuda.checks import CHECKS

    for check in CHECKS:
        register(check)
