"""The one walker of nested values: batches, module arguments, model outputs.

A model's batch or output is a tree whose leaves are tensors and whose
containers are any of: tuples (namedtuples too), lists, mappings (``dict``,
``collections.UserDict`` such as transformers' ``BatchEncoding``, a
``ModelOutput``, any ``collections.abc.Mapping``) and dataclass instances.
Everything else (a tensor, a number, a string, a KV-cache object) is a leaf.
Capture, the target convention, the checks, the oracle and op-check all walk
values through these functions, so they agree on what a container is.

:func:`map_tensors` rebuilds every container as its own type (a
``BatchEncoding`` stays one, so ``batch.input_ids`` and ``model(**batch)``
still work); :func:`leaves` lists ``(path, leaf)`` pairs in a stable order.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

import torch

#: never containers: skipped without further checks (the hot path of capture hooks)
_SCALARS = (str, bytes, int, float, bool, complex, type(None), torch.dtype, torch.device)
_LEAVES = (torch.Tensor, *_SCALARS)
_SEQUENCES = (tuple, list)

Key = str | int


def children(value: Any) -> Iterable[tuple[Key, Any]] | None:
    """The ``(key, child)`` pairs of a container, or None when ``value`` is a leaf."""
    if isinstance(value, _LEAVES):
        return None
    if isinstance(value, _SEQUENCES):
        return enumerate(value)
    if isinstance(value, Mapping):
        return value.items()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return None


def is_mapping(value: Any) -> bool:
    """True for a batch to be passed as keyword arguments (any Mapping, ``BatchEncoding`` too)."""
    return isinstance(value, Mapping)


def leaves(
    value: Any, *, max_depth: int = 32, sort_keys: bool = False
) -> list[tuple[tuple[Key, ...], Any]]:
    """Every leaf of ``value`` with the keys leading to it, depth first, in a stable order.

    Mappings keep their insertion order (``sort_keys``: sorted by ``str``);
    containers deeper than ``max_depth`` are left out.

    >>> leaves({"ids": 1, "mask": (2, 3)})
    [(('ids',), 1), (('mask', 0), 2), (('mask', 1), 3)]
    """
    found: list[tuple[tuple[Key, ...], Any]] = []
    _leaves(value, (), found, max_depth, sort_keys)
    return found


def _leaves(value: Any, keys: tuple[Key, ...], found: list, depth: int, sort_keys: bool) -> None:
    kids = children(value)
    if kids is None:
        found.append((keys, value))
        return
    if depth <= 0:
        return
    if sort_keys and isinstance(value, Mapping):
        kids = sorted(kids, key=lambda kv: str(kv[0]))
    for key, child in kids:
        _leaves(child, (*keys, key), found, depth - 1, sort_keys)


def named_tensors(value: Any, prefix: str, *, max_depth: int = 6) -> list[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in ``value``, paths dotted from ``prefix``.

    The names records carry (``output.1.a``, ``kwargs.attention_mask``). Containers
    deeper than ``max_depth`` are skipped: their contents are not a module's
    numeric input or output in the sense compare needs.

    >>> named_tensors((torch.ones(1), {"a": torch.zeros(2)}), "output")[1][0]
    'output.1.a'
    """
    if isinstance(value, torch.Tensor):  # most modules' output: nothing to walk
        return [(prefix, value)]
    out: list[tuple[str, torch.Tensor]] = []
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = _kind(type(value))
    if kind:
        _named(value, kind, prefix, out, max_depth)
    return out


#: how :func:`_named` walks a value of each type: a leaf (0), by position (1), by key (2),
#: by dataclass field (3) — :func:`children`'s rules, decided once per type, since this
#: runs in capture's hooks for every module call (an ABC's ``isinstance`` is a Python
#: call). A class registered as a ``Mapping`` after its first walk stays what it was.
_KINDS: dict[type, int] = {tuple: 1, list: 1, dict: 2, bool: 0, type(None): 0}


def _kind(tp: type) -> int:
    if issubclass(tp, _LEAVES) or issubclass(tp, type):
        kind = 0
    elif issubclass(tp, _SEQUENCES):
        kind = 1
    elif issubclass(tp, Mapping):
        kind = 2
    else:
        kind = 3 if dataclasses.is_dataclass(tp) else 0
    _KINDS[tp] = kind
    return kind


def _named(
    value: Any, kind: int, path: str, out: list[tuple[str, torch.Tensor]], depth: int
) -> None:
    if depth <= 0:
        return
    kids: Iterable[tuple[Key, Any]]
    if kind == 1:
        kids = enumerate(value)
    elif kind == 2:
        kids = value.items()
    else:
        kids = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    for key, item in kids:
        if isinstance(item, torch.Tensor):
            out.append((f"{path}.{key}", item))
        elif item is not None:
            sub = _KINDS.get(type(item))
            if sub is None:
                sub = _kind(type(item))
            if sub:
                _named(item, sub, f"{path}.{key}", out, depth - 1)


def tensors(value: Any, *, sort_keys: bool = False) -> list[torch.Tensor]:
    """The tensors of ``value``, in :func:`leaves` order."""
    found = leaves(value, sort_keys=sort_keys)
    return [leaf for _, leaf in found if isinstance(leaf, torch.Tensor)]


def first_tensor(
    value: Any, *, floating: bool = True, sort_keys: bool = False
) -> torch.Tensor | None:
    """The first (floating, unless ``floating=False``) tensor of ``value``, or None."""
    for t in tensors(value, sort_keys=sort_keys):
        if not floating or t.is_floating_point():
            return t
    return None


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor of ``value``; containers keep their type, other leaves stay.

    A namedtuple, a ``BatchEncoding`` or a ``ModelOutput`` comes back as one
    (a mapping is shallow-copied and its values replaced, so the attributes it
    carries beside them survive); a dataclass through ``dataclasses.replace``.

    >>> map_tensors({"x": torch.ones(1)}, lambda t: t * 2)["x"]
    tensor([2.])
    """
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, tuple):
        mapped = [map_tensors(v, fn) for v in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else type(value)(mapped)
    if isinstance(value, list):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, Mapping):
        items = {k: map_tensors(v, fn) for k, v in value.items()}
        return _rebuild_mapping(value, items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: map_tensors(getattr(value, f.name), fn)
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    return value


def _rebuild_mapping(value: Mapping, items: dict[Any, Any]) -> Mapping:
    if type(value) is dict:
        return items
    if isinstance(value, MutableMapping):
        try:
            new = copy.copy(value)  # UserDict copies its data; extra attributes stay
            for key, item in items.items():
                new[key] = item
            return new
        except Exception:  # a mapping that refuses copying or assignment
            pass
    try:
        return type(value)(items)  # type: ignore[call-arg]
    except Exception:
        return items
