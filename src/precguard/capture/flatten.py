"""Find the tensors inside a module's arguments or outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

_MAX_DEPTH = 6


def named_tensors(obj: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    """Return ``(path, tensor)`` for every tensor in ``obj``, in a stable order.

    Walks tuples, lists, mappings (including HF ``ModelOutput``, which is an
    ordered dict of its non-None fields) and dataclasses. Other objects (a
    KV cache, a config) are skipped: their contents are not a module's
    numeric input or output in the sense compare needs.

    >>> named_tensors((torch.ones(1), {"a": torch.zeros(2)}), "output")[1][0]
    'output.1.a'
    """
    out: list[tuple[str, torch.Tensor]] = []
    _walk(obj, prefix, out, 0)
    return out


def _walk(obj: Any, path: str, out: list[tuple[str, torch.Tensor]], depth: int) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return
    if depth >= _MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            _walk(item, f"{path}.{i}", out, depth + 1)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _walk(v, f"{path}.{k}", out, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name), f"{path}.{f.name}", out, depth + 1)
