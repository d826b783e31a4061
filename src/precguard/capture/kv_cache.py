"""The tensors of a KV cache a module call reads or writes (``CaptureOptions(kv_cache=True)``).

A transformers ``Cache`` (``DynamicCache``, ``StaticCache``, ...; transformers
5) is not a container capture walks: it is a list of ``layers``, each holding
its ``keys`` and ``values`` tensors (and, for other layer kinds, other state
tensors), updated in place or replaced by ``torch.cat`` when an attention
calls ``cache.update``. An ``EncoderDecoderCache`` holds two such caches.

Each cache tensor is recorded once per state, at the innermost module call
that saw it: a tensor that changed during a call (a new object or a bumped
version counter) is an **output** of the innermost call whose post-hook sees
it first (children finish before their parents: the attention that called
``update``), named where the call held the cache
(``kwargs.cache.layers.1.values``); a cache handed in whose tensors
were never recorded (a prefilled cache from before the recording) is an
**input** of the first call that receives it. So a fault planted in the cache
is charged to the module that wrote it, and a later step's attention reading
a cache that differs shows it in its inputs' history.

Cost: one walk of the cache's layers per call that receives or returns it
(decoder layers, attentions, the model), and statistics of every written
layer: the whole cache layer after each write, which grows with the sequence
(off by default for that reason).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch

#: caches are passed by keyword or returned in a ModelOutput; a legacy tuple cache is
#: a plain container that capture already walks
_ENCODER_DECODER = ("self_attention_cache", "cross_attention_cache")


def is_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers-style cache: a ``...Cache`` with ``layers``."""
    return isinstance(getattr(value, "layers", None), list) and type(value).__name__.endswith(
        "Cache"
    )


def cache_tensors(value: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for each non-empty state tensor of the cache ``value``."""
    out: list[tuple[str, torch.Tensor]] = []
    if is_cache(value):
        for i, layer in enumerate(value.layers):
            for attr, t in vars(layer).items():
                if isinstance(t, torch.Tensor) and t.numel():
                    out.append((f"{path}.layers.{i}.{attr}", t))
        return out
    for attr in _ENCODER_DECODER:
        sub = getattr(value, attr, None)
        if sub is not None and is_cache(sub):
            out.extend(cache_tensors(sub, f"{path}.{attr}"))
    return out


def caches_in(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The caches among a call's arguments, with the name capture gives them."""
    found = [(f"args.{i}", a) for i, a in enumerate(args) if _any_cache(a)]
    found += [(f"kwargs.{k}", v) for k, v in kwargs.items() if _any_cache(v)]
    return found


def caches_out(output: Any) -> list[tuple[str, Any]]:
    """The caches a call returned (a ``ModelOutput``'s ``past_key_values``, a tuple element)."""
    if isinstance(output, Mapping):
        return [(f"output.{k}", v) for k, v in output.items() if _any_cache(v)]
    if isinstance(output, tuple):
        return [(f"output.{i}", v) for i, v in enumerate(output) if _any_cache(v)]
    return []


def _any_cache(value: Any) -> bool:
    return is_cache(value) or any(is_cache(getattr(value, a, None)) for a in _ENCODER_DECODER)


class CacheStates:
    """Which cache tensor states were recorded: each state once, at the innermost call."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}

    def unseen(self, caches: list[tuple[str, Any]]) -> list[tuple[str, torch.Tensor]]:
        """The tensors of ``caches`` not recorded in their present state; now marked recorded."""
        out = []
        for path, cache in caches:
            for name, t in cache_tensors(cache, path):
                key = id(t)
                seen = self._seen.get(key)
                if seen is not None and seen[0]() is t and seen[1] == t._version:
                    continue

                def forget(ref: weakref.ref[torch.Tensor], key: int = key) -> None:
                    entry = self._seen.get(key)
                    if entry is not None and entry[0] is ref:
                        del self._seen[key]

                self._seen[key] = (weakref.ref(t, forget), t._version)
                out.append((name, t))
        return out
