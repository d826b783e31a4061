"""Device services: dtypes by name, the backend for a device, seeding, building a model.

Everything that needs "the device" asks here: recording (:mod:`precguard.runner`),
the checklist, replay, fingerprints and the CLI. This module sits below
capture, compare, localize and checks and imports none of them; it reaches
backends through the plugin registry (:mod:`precguard.plugins`).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import torch

from precguard import plugins
from precguard.errors import DeviceUnavailableError, TargetError, UsageError
from precguard.target import raised

if TYPE_CHECKING:
    from precguard.backend import Backend
    from precguard.target import Target

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Return the torch dtype for ``name`` (``float32``, ``bf16``, ...).

    >>> parse_dtype("bf16")
    torch.bfloat16
    """
    if isinstance(name, torch.dtype):
        return name
    dtype = DTYPES.get(name.lower().removeprefix("torch."))
    if dtype is None:
        from precguard.suggest import did_you_mean

        raise UsageError(
            f"unknown dtype {name!r}{did_you_mean(name, DTYPES, n=1)}; "
            "expected one of: float32, bfloat16, float16"
        )
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``float16``."""
    return str(dtype).removeprefix("torch.")


def find_backend(device: str) -> Backend:
    """Return the backend that claims ``device``, usable or not.

    Raises DeviceUnavailableError naming the known device types when no plugin
    claims it.
    """
    backend = plugins.get_backend(device)
    if backend is None:
        from precguard.suggest import did_you_mean

        known = sorted(plugins.registered("backends"))
        kind, sep, rest = device.partition(":")
        # suggest the device type, keeping what followed it: "nup:1" -> "npu:1"
        hint = did_you_mean(kind, known, n=1)
        if hint and sep:
            hint = did_you_mean(device, [f"{k}:{rest}" for k in known], n=1)
        raise DeviceUnavailableError(
            f"unknown device {device!r}{hint}: no plugin claims it (known device types: "
            f"{', '.join(known)})"
        )
    return backend


def resolve_backend(device: str) -> Backend:
    """Return the usable backend for ``device`` or raise DeviceUnavailableError saying why."""
    backend = find_backend(device)
    ok, reason = backend.availability()
    if not ok:
        raise DeviceUnavailableError(f"device {device!r} is unavailable: {reason}")
    return backend


def seed_everything(backend: Backend, seed: int) -> None:
    """Seed torch and the device (through the backend), Python's ``random`` and NumPy."""
    backend.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def construct_model(target: Target, backend: Backend) -> torch.nn.Module:
    """Seed everything, then build the target's model on the CPU (float32, not moved)."""
    seed_everything(backend, target.seed)
    try:
        return target.model()
    except (Exception, SystemExit) as exc:
        raise TargetError(f"target {target.name!r}: building the model {raised(exc)}") from exc


def build_model(target: Target, backend: Backend, dtype: torch.dtype) -> torch.nn.Module:
    """Seed, build the target's model on the CPU, then move it to the device and dtype.

    Initialising on the CPU gives identical weights on every device.
    """
    return construct_model(target, backend).to(device=backend.torch_device(), dtype=dtype)
