"""The hooks precguard calls: this module is the ``cambricon`` entry point.

Nothing here imports torch_mlu; :mod:`precguard_cambricon.backend` does, on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from precguard import hookimpl
from precguard.backend import Backend
from precguard_cambricon.backend import CambriconBackend


def _mine(device: str) -> bool:
    return device.split(":", 1)[0] == "mlu"


@hookimpl
def precguard_backend(device: str) -> Backend | None:
    """Claim ``mlu`` and ``mlu:N``, with or without torch_mlu installed."""
    return CambriconBackend(device) if _mine(device) else None


@hookimpl
def precguard_device_types() -> list[str]:
    """The device type this plugin claims."""
    return ["mlu"]


@hookimpl
def precguard_fingerprint(device: str) -> dict[str, Any] | None:
    """torch_mlu version, TF32 switches and Cambricon environment variables."""
    return CambriconBackend(device).fingerprint() if _mine(device) else None


@hookimpl
def precguard_register_checks(register: Callable[..., None]) -> None:
    """Register the ``env.mlu_*`` checks."""
    from precguard_cambricon.checks import CHECKS

    for check in CHECKS:
        register(check)
