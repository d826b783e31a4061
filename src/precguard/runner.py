"""Run a target on a device under ``monitor``: what ``precguard record`` does."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from precguard import plugins
from precguard._logging import get_logger
from precguard.backend import Backend
from precguard.capture.api import monitor
from precguard.dump.vendor import record_vendor_state
from precguard.errors import DeviceUnavailableError, PrecguardError, TargetError, UsageError
from precguard.target import Target, call_model, load_target, move_batch, raised

logger = get_logger(__name__)

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
    """Return the torch dtype for ``name`` (``float32``, ``bf16``, ...)."""
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


def find_backend(device: str) -> Backend:
    """Return the backend that claims ``device``, usable or not.

    Raises DeviceUnavailableError naming the known device types when no plugin
    claims it.
    """
    backend = plugins.get_backend(device)
    if backend is None:
        from precguard.suggest import did_you_mean

        known = sorted({t for types in plugins.device_types().values() for t in types})
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


class _TargetCode:
    """Which part of the user's code a step is running, to name it if it raises.

    The exception itself travels up unchanged through the recording (whose
    manifest then names the user's own exception type); :meth:`error` turns
    it into the target's error for the CLI afterwards.
    """

    def __init__(self, target: Target) -> None:
        self.target = target
        self.doing: str | None = None  # None: precguard's own code is running

    def error(self, exc: BaseException) -> TargetError:
        """The target's error for ``exc``, raised while running :attr:`doing`."""
        return TargetError(f"target {self.target.name!r}: {self.doing} {raised(exc)}")


def record_target(
    target: str | Target,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    out: str | os.PathLike[str],
    steps: int = 1,
    train: bool = False,
    tensors: bool | list[str] = False,
    overwrite: bool = False,
    on_step: Callable[[int], None] | None = None,
    prepare: Callable[[torch.nn.Module], Any] | None = None,
) -> Path:
    """Record ``steps`` steps of ``target`` on ``device`` into ``out`` and return the path.

    Forward only by default; with ``train`` each step is forward, backward and
    an optimizer step. ``prepare(model)`` may alter the built model before
    recording (tests and the demo use it to plant faults). ``dtype`` None means
    float32, or the storage dtype of a mixed-precision device (``emu:fp16-mixed``).
    """
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    requested = parse_dtype(dtype) if dtype is not None else None
    target_obj = load_target(target)
    if train and target_obj.loss is None:
        raise UsageError(f"target {target_obj.name!r} has no loss; --train needs one")
    backend = resolve_backend(device)
    torch_dtype = requested or backend.model_dtype() or torch.float32
    model = build_model(target_obj, backend, torch_dtype)
    if prepare is not None:
        prepare(model)
    tdev = backend.torch_device()
    optimizer = None
    if train:
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = (
            target_obj.optimizer(params)
            if target_obj.optimizer
            else torch.optim.SGD(params, lr=1e-3)
        )
    else:
        model.eval()
    fingerprint = plugins.fingerprint(device)
    compute = backend.compute_dtype()
    grad_ctx = contextlib.nullcontext() if train else torch.no_grad()
    handle = monitor(
        model,
        out,
        tensors=tensors,
        backward=train,
        params="every_step" if train else "first_step",
        overwrite=overwrite,
        device=device,
        target=_target_spec(target, target_obj),
        fingerprint=fingerprint,
        auto_step=False,
        compute_dtype=str(compute).removeprefix("torch.") if compute is not None else None,
    )
    user = _TargetCode(target_obj)
    try:
        with handle, backend.numerics(), grad_ctx:
            for step in range(steps):
                user.doing = f"batch({step})"
                batch = move_batch(target_obj.batch(step), tdev)
                user.doing = f"step {step}: the model"
                output = call_model(model, batch)
                if train:
                    assert optimizer is not None and target_obj.loss is not None
                    user.doing = f"step {step}: loss()"
                    loss = target_obj.loss(output, batch)
                    user.doing = f"step {step}: backward"
                    loss.backward()
                    user.doing = f"step {step}: the optimizer"
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                user.doing = None
                backend.synchronize()
                record_vendor_state(backend, out, step, rank=handle.recording.rank)
                handle.step()
                if on_step is not None:
                    on_step(step)
    except PrecguardError:
        raise
    except (Exception, SystemExit) as exc:  # a target's sys.exit() is its error too
        if user.doing is None:
            raise  # ours, not the target's: the CLI reports it as an internal error
        raise user.error(exc) from exc
    logger.info("recording_written", path=str(out), steps=steps, device=device)
    return Path(out)


def _target_spec(spec: str | Target, target: Target) -> str:
    """What the manifest names as the target: a spec ``--target`` accepts, not a label.

    A file path is made absolute, so a replay command printed from another
    directory still finds it.
    """
    if not isinstance(spec, str):
        return target.name
    path, sep, func = spec.partition(":")
    if path.endswith(".py") and Path(path).is_file():
        return str(Path(path).resolve()) + sep + func
    return spec
