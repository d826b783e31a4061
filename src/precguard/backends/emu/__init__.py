"""Built-in plugin: ``emu:PROFILE``, the CPU emulating another chip's numerics.

``emu:fp16``, ``emu:bf16``, ``emu:fp16-saturate`` and the other profiles in
``profiles/`` ship with precguard; ``emu:/path/to/chip.toml`` loads a user's
own. See ``docs/emu.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from precguard.backend import Backend
from precguard.backends.emu.backend import EmuBackend
from precguard.hookspecs import hookimpl


@hookimpl
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register the emulator (``emu:PROFILE``)."""
    register(EmuBackend)
