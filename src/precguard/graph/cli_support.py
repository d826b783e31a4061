"""Build a target's model on a device and take its graph: what ``graph export`` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from precguard.graph.build import Prefer, model_graph
from precguard.graph.model import Level, OpGraph


def _prepared(target: str, device: str, dtype: str | None) -> tuple[Any, Any, tuple, dict]:
    from precguard.devices import build_model, parse_dtype, resolve_backend
    from precguard.target import load_target, move_batch

    target_obj = load_target(target)
    backend = resolve_backend(device)
    torch_dtype = (parse_dtype(dtype) if dtype else None) or backend.model_dtype() or torch.float32
    model = build_model(target_obj, backend, torch_dtype).eval()
    batch = move_batch(target_obj.batch(0), backend.torch_device())
    if isinstance(batch, dict):
        return backend, model, (), batch
    if isinstance(batch, tuple):
        return backend, model, batch, {}
    return backend, model, (batch,), {}


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
