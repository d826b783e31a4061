"""The backend interface a device plugin implements."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class Backend:
    """What precguard needs from a device. Subclass it in a device plugin.

    The defaults suit a device whose tensors torch handles natively; override
    what differs. ``device`` is the string the user asked for (``"cuda:1"``).
    """

    #: device type this backend serves, e.g. ``"cuda"``
    device_type: str = ""

    def __init__(self, device: str) -> None:
        self.device = device

    def availability(self) -> tuple[bool, str]:
        """Return ``(usable, reason)``; reason says why not, e.g. "torch_npu is not installed"."""
        return True, ""

    def torch_device(self) -> torch.device:
        """Return the torch device that tensors and models are moved to."""
        return torch.device(self.device)

    def synchronize(self) -> None:
        """Wait for queued work on the device to finish."""

    def manual_seed(self, seed: int) -> None:
        """Seed torch's generators and this device's generators."""
        torch.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        """Return this device's generator state as a CPU uint8 tensor."""
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore this device's generator state from :meth:`get_rng_state`."""
        torch.set_rng_state(state)

    @contextlib.contextmanager
    def deterministic(self) -> Iterator[None]:
        """Turn on deterministic algorithms for this device; restore the previous flags after."""
        before = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(before, warn_only=warn_only)

    def fingerprint(self) -> dict[str, Any]:
        """Return the device's numerics-relevant facts (versions, flags, env vars)."""
        return {}

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        """Context in which the model runs with this device's numerics (emulators use it)."""
        yield
