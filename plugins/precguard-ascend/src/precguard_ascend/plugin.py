"""The hooks precguard calls: this module is the ``ascend`` entry point.

Nothing here imports torch_npu; :mod:`precguard_ascend.sdk` does, on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from precguard import hookimpl
from precguard.backend import Backend
from precguard_ascend.backend import AscendBackend


def _mine(device: str) -> bool:
    return device.split(":", 1)[0] == "npu"


@hookimpl
def precguard_backend(device: str) -> Backend | None:
    """Claim ``npu`` and ``npu:N``, with or without torch_npu installed."""
    return AscendBackend(device) if _mine(device) else None


@hookimpl
def precguard_device_types() -> list[str]:
    """The device type this plugin claims."""
    return ["npu"]


@hookimpl
def precguard_fingerprint(device: str) -> dict[str, Any] | None:
    """torch_npu version, numerics switches and Ascend environment variables."""
    return AscendBackend(device).fingerprint() if _mine(device) else None


@hookimpl
def precguard_to_host(tensor: torch.Tensor) -> torch.Tensor | None:
    """NPU tensors: cast internal formats to ND, then copy to the CPU."""
    if tensor.device.type != "npu":
        return None
    return AscendBackend(str(tensor.device)).to_host(tensor)


@hookimpl
def precguard_vendor_dump(device: str, step: int, out_dir: Path) -> dict[str, Any] | None:
    """In saturation mode, the float-status overflow flag of each step (read and cleared)."""
    return AscendBackend(device).overflow_state() if _mine(device) else None


@hookimpl
def precguard_register_checks(register: Callable[..., None]) -> None:
    """Register the ``env.ascend_*`` and ``env.npu_*`` checks."""
    from precguard_ascend.checks import CHECKS

    for check in CHECKS:
        register(check)
