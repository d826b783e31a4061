"""Find the tensors inside a module's arguments or outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
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
    if isinstance(obj, torch.Tensor):  # most modules' output: nothing to walk
        return [(prefix, obj)]
    out: list[tuple[str, torch.Tensor]] = []
    _walk(obj, prefix, out, 0)
    return out


#: never containers: skipped without further checks
_SCALARS = (str, bytes, int, float, bool, type(None))


def _walk(obj: Any, path: str, out: list[tuple[str, torch.Tensor]], depth: int) -> None:
    """Append the tensors inside container ``obj`` (not itself a tensor) to ``out``."""
    if depth >= _MAX_DEPTH or isinstance(obj, _SCALARS):
        return
    children: Iterable[tuple[Any, Any]]
    if isinstance(obj, (tuple, list)):
        children = enumerate(obj)
    elif isinstance(obj, (dict, Mapping)):
        children = obj.items()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    else:
        return
    for key, item in children:
        if isinstance(item, torch.Tensor):
            out.append((f"{path}.{key}", item))
        elif not isinstance(item, _SCALARS):
            _walk(item, f"{path}.{key}", out, depth + 1)
