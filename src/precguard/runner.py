"""Run a target on a device under ``monitor``: what ``precguard record`` does.

This module only orchestrates a recording; the device services it uses
(dtypes, backends, seeding, building the model) live in :mod:`precguard.devices`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from precguard import plugins
from precguard._logging import get_logger
from precguard.capture.api import capture_options, monitor
from precguard.capture.options import CaptureOptions
from precguard.dump.vendor import record_vendor_state
from precguard.errors import PrecguardError, UsageError
from precguard.target import Target, call_model
from precguard.target_run import Side, one_side

logger = get_logger(__name__)


def record_target(
    target: str | Target | Side,
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    out: str | os.PathLike[str],
    steps: int = 1,
    train: bool = False,
    options: CaptureOptions | None = None,
    overwrite: bool = False,
    on_step: Callable[[int], None] | None = None,
    prepare: Callable[[torch.nn.Module], Any] | None = None,
    **overrides: Any,
) -> Path:
    """Record ``steps`` steps of ``target`` on ``device`` into ``out`` and return the path.

    ``target`` is a :class:`~precguard.Side` (the one way: ``record_target(Side("tiny-llama",
    "emu:bf16"), out=...)``), or a target spec with the side's ``device`` (None: ``"cpu"``),
    ``dtype`` and ``prepare`` as keywords. Forward only by default; with ``train`` each
    step is forward, backward and an optimizer step. ``prepare(model)`` may alter the
    built model before recording (tests and the demo use it to plant faults). ``dtype``
    None means float32, or the storage dtype of a mixed-precision device
    (``emu:fp16-mixed``).

    What to capture is a :class:`CaptureOptions` (``options``) and/or its fields
    as keyword arguments (``tensors=True``), as for :func:`~precguard.monitor`;
    unless set there, gradients are recorded with ``train`` and parameter
    statistics at every step of training (at the first step otherwise).
    """
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    side = one_side(target, "record_target", device=device, dtype=dtype, prepare=prepare)
    device = side.device
    run = side.open()
    target_obj, backend = run.target, run.backend
    if train and target_obj.loss is None:
        raise UsageError(f"target {target_obj.name!r} has no loss; --train needs one")
    model = run.prepared(run.build_model())
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
        _record_options(train, options, overrides),
        overwrite=overwrite,
        device=device,
        target=_target_spec(side.target, target_obj),
        fingerprint=fingerprint,
        auto_step=False,
        compute_dtype=str(compute).removeprefix("torch.") if compute is not None else None,
    )
    # the target's exceptions travel up unchanged through the recording (whose manifest
    # then names their type); run.running says afterwards which part of its code raised
    try:
        with handle, backend.numerics(), grad_ctx:
            for step in range(steps):
                with run.doing(f"batch({step})"):
                    batch = run.move(target_obj.batch(step))
                with run.doing(f"step {step}: the model"):
                    output = call_model(model, batch)
                if train:
                    assert optimizer is not None and target_obj.loss is not None
                    with run.doing(f"step {step}: loss()"):
                        loss = target_obj.loss(output, batch)
                    with run.doing(f"step {step}: backward"):
                        loss.backward()
                    with run.doing(f"step {step}: the optimizer"):
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                backend.synchronize()
                record_vendor_state(backend, out, step, rank=handle.recording.rank)
                handle.step()
                if on_step is not None:
                    on_step(step)
    except PrecguardError:
        raise
    except (Exception, SystemExit) as exc:  # a target's sys.exit() is its error too
        if run.running is None:
            raise  # ours, not the target's: the CLI reports it as an internal error
        raise run.error(exc) from exc
    logger.info("recording_written", path=str(out), steps=steps, device=device)
    return Path(out)


def _record_options(
    train: bool, options: CaptureOptions | None, overrides: dict[str, Any]
) -> CaptureOptions:
    """The capture options of a recorded target: ``train`` decides what the user left unset."""
    by_mode = CaptureOptions(backward=train, params="every_step" if train else "first_step")
    given = options.model_dump(exclude_unset=True) if options is not None else {}
    return capture_options(by_mode, **{**given, **overrides})


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
