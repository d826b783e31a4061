"""The ``emu:PROFILE`` backend: the CPU, running the model with another chip's numerics.

Model weights stay float32 on the CPU; the emulator rounds them (and every
other float input) to the profile's storage dtype at each op instead of
converting the model. That keeps the user's model untouched outside
:meth:`EmuBackend.numerics`, makes weights identical to a ``cpu`` run's
(both are built on the CPU from the same seed), and lets one recorded tensor
show fp16 behaviour (inf above 65504, or 65504 under saturation) while its
container stays float32. Recorded tensors therefore say ``dtype: float32``;
the manifest's fingerprint (``emu.compute_dtype``) says what was emulated.
Passing ``--dtype float16`` as well also works: the emulator then computes
the fp16 model's ops in fp32 and stores their results as fp16.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from precguard.backends.cpu import CpuBackend
from precguard.backends.emu import numerics
from precguard.backends.emu.profile import EmuProfile, EmuProfileError, load_profile

_MASK64 = (1 << 63) - 1


def device_stream_seed(seed: int, stream: int) -> int:
    """Return the seed the emulated device generator gets for ``seed`` on ``stream``.

    A fixed mix (splitmix64 constants), so the same seed gives the same
    device stream every run and a different one from the CPU's.
    """
    z = (seed + stream * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _MASK64


class EmuBackend(CpuBackend):
    """The CPU emulating the numerics of the profile named after ``emu:``.

    It runs on the host CPU, so it is a :class:`CpuBackend` and its fingerprint
    carries the CPU's facts (thread count, ISA level) as well as the profile's.
    """

    device_type = "emu"

    def __init__(self, device: str) -> None:
        super().__init__(device)
        self.spec = device.partition(":")[2]
        self.profile: EmuProfile | None = None
        self.source = ""
        self.sha256 = ""
        self._error = ""
        try:
            self.profile, self.source, self.sha256 = load_profile(self.spec)
        except EmuProfileError as exc:
            self._error = str(exc)
        self.generator: torch.Generator | None = None
        if self.profile is not None and self.profile.rng_stream:
            # Like a real device whose generator torch.manual_seed does not reach:
            # until backend.manual_seed is called, its stream is unpredictable.
            self.generator = torch.Generator()
            self.generator.seed()

    def availability(self) -> tuple[bool, str]:
        """Usable unless the profile is unknown or invalid (the reason says which)."""
        return (False, self._error) if self._error else (True, "")

    def torch_device(self) -> torch.device:
        """Emulated devices keep their tensors on the CPU."""
        return torch.device("cpu")

    def model_dtype(self) -> torch.dtype | None:
        """The storage dtype for mixed-precision profiles (``keep_float32``), else None."""
        if self.profile is not None and self.profile.keep_float32:
            return numerics.DTYPES[self.profile.compute_dtype]
        return None

    def compute_dtype(self) -> torch.dtype | None:
        """The profile's compute dtype when it is below float32 (every op rounds to it)."""
        if self.profile is None or self.profile.compute_dtype == "float32":
            return None
        return numerics.DTYPES[self.profile.compute_dtype]

    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator, and the emulated device generator on its own stream."""
        torch.manual_seed(seed)
        if self.generator is not None and self.profile is not None:
            self.generator.manual_seed(device_stream_seed(seed, self.profile.rng_stream))

    def get_rng_state(self) -> torch.Tensor:
        """The device generator's state (the CPU's when the profile has no own stream)."""
        return self.generator.get_state() if self.generator is not None else torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state from :meth:`get_rng_state`."""
        if self.generator is not None:
            self.generator.set_state(state)
        else:
            torch.set_rng_state(state)

    def fingerprint(self) -> dict[str, Any]:
        """The CPU's facts, and the profile's every setting (``emu.*``), source and hash."""
        facts = super().fingerprint()
        if self.profile is None:
            return {**facts, "emu.profile": self.spec, "emu.error": self._error}
        facts |= {
            "emu.profile": self.profile.name,
            "emu.source": self.source,
            "emu.sha256": self.sha256,
        }
        for key, value in self.profile.model_dump(exclude={"name", "description"}).items():
            facts[f"emu.{key}"] = value
        return facts

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        """Run the enclosed ops with the profile's numerics (see :mod:`.mode`).

        Nested inside another emulator's ``numerics()`` on the same thread, it
        adds nothing: the outer profile stays in charge (ops are never rounded twice).
        """
        if self.profile is None:
            raise EmuProfileError(self._error)
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        from precguard.backends.emu.mode import EmuMode

        nested = any(isinstance(m, EmuMode) for m in _get_current_dispatch_mode_stack())
        mode = None if nested else EmuMode(self.profile, self.generator)
        if mode is None or not mode.changes_anything:
            yield
            return
        with mode:
            yield
