"""Built-in plugin: ``emu:PROFILE``, the CPU emulating another chip's numerics.

``emu:fp16``, ``emu:bf16``, ``emu:fp16-saturate`` and the other profiles in
``profiles/`` ship with precguard; ``emu:/path/to/chip.toml`` loads a user's
own. See ``docs/emu.md``.
"""

from __future__ import annotations

from typing import Any

from precguard.backend import Backend
from precguard.backends.emu.backend import EmuBackend
from precguard.plugins import hookimpl


@hookimpl
def precguard_backend(device: str) -> Backend | None:
    """Claim ``emu`` and ``emu:PROFILE``."""
    if device == "emu" or device.startswith("emu:"):
        return EmuBackend(device)
    return None


@hookimpl
def precguard_device_types() -> list[str]:
    """The emulator's one device type."""
    return ["emu"]


@hookimpl
def precguard_fingerprint(device: str) -> dict[str, Any] | None:
    """The emulated profile's settings, for ``emu:`` devices only."""
    if device == "emu" or device.startswith("emu:"):
        return EmuBackend(device).fingerprint()
    return None
