"""Built-in plugin: ``emu:PROFILE``, the CPU emulating another chip's numerics.

``emu:fp16``, ``emu:bf16``, ``emu:fp16-saturate`` and the other profiles in
``profiles/`` ship with precguard; ``emu:/path/to/chip.toml`` loads a user's
own. See ``docs/emu.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from precguard.backend import Backend, Switch
from precguard.backends.emu.backend import EmuBackend
from precguard.hookspecs import hookimpl


@hookimpl
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register the emulator (``emu:PROFILE``)."""
    register(EmuBackend)


@hookimpl
def precguard_register_switches(register: Callable[[Switch], None]) -> None:
    """The emulator's profiles that undo one numeric behaviour of another (docs/impact.md)."""
    for low in ("bf16", "fp16"):
        register(
            Switch(
                f"emu-{low}-fp32-accumulate",
                [f"emu:{low}-lowacc"],
                "accumulate matmuls and reductions in fp32",
                instead=f"emu:{low}",
            )
        )
        register(
            Switch(
                f"emu-{low}-mixed",
                [f"emu:{low}"],
                "keep the model's float32 upcasts in float32 (mixed precision)",
                instead=f"emu:{low}-mixed",
            )
        )
    register(
        Switch(
            "emu-fp16-no-ftz",
            ["emu:fp16-ftz"],
            "keep fp16 subnormals (no flush-to-zero)",
            instead="emu:fp16",
        )
    )
