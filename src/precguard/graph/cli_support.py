"""Build a target's model on a device and take its graph: what ``graph export`` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from precguard.graph.build import Prefer, model_graph
from precguard.graph.model import Level, OpGraph


def _prepared(target: str, device: str, dtype: str | None) -> tuple[Any, Any, tuple, dict]:
    """The backend, the model built on ``device`` (eval mode) and batch 0 split as the
    Target convention calls it (:func:`precguard.target.call_model`): args, kwargs."""
    from precguard import tree
    from precguard.target_run import TargetRun

    run = TargetRun.open(target, device, dtype or None)
    model = run.build_model().eval()
    batch = run.device_batch(0)
    if tree.is_mapping(batch):
        return run.backend, model, (), dict(batch)
    if isinstance(batch, tuple):
        return run.backend, model, batch, {}
    return run.backend, model, (batch,), {}


def target_graph(
    target: str, *, device: str, dtype: str | None, prefer: Prefer, level: Level
) -> OpGraph:
    """The op graph of ``target``'s model on ``device`` for its first batch.

    ``emu:`` devices are always traced: the emulator is a dispatch mode that runs
    real ops, which ``torch.export``'s fake-tensor tracing neither sees nor needs.
    """
    from precguard.errors import UsageError

    if device.startswith("emu:"):
        if prefer == "export":
            raise UsageError(
                f"--source export: {device} emulates numerics while ops run, which "
                "torch.export does not run; use --source trace (or auto)"
            )
        prefer = "trace"
    backend, model, args, kwargs = _prepared(target, device, dtype)
    return model_graph(
        model, args, kwargs, prefer=prefer, level=level, device=device, numerics=backend.numerics
    )


def target_onnx(target: str, *, device: str, dtype: str | None, out: Path) -> None:
    """Export ``target``'s model with torch's ONNX exporter (needs ``onnx`` installed)."""
    _, model, args, kwargs = _prepared(target, device, dtype)
    with torch.no_grad():
        torch.onnx.export(model, args, str(out), kwargs=kwargs)
