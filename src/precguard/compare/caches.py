"""The KV cache a module read, named in the why line when it differs from golden.

With ``kv_cache=True`` (:mod:`precguard.capture.kv_cache`) each cache tensor is
recorded at the call that saw it, as an output named where the call held the cache
(``kwargs.cache.layers.0.keys``). When an attention whose inputs match makes an error
and its cache state differs from golden's, the why line names the cache as what it
consumed besides its arguments and weights: the layer, keys or values, the error, the
dtype it was stored in where that is not golden's, and the remedy. A failing record
that is itself a cache state wrote the cache wrong; its why line says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

from precguard.compare.report import RecordResult
from precguard.compare.rule import BaseRule, Explanations, StepContext
from precguard.dump.schema import Record

#: the name capture gives a cache tensor: ``{where the call held it}.layers.{i}.{state}``,
#: where an encoder-decoder cache adds ``.self_attention_cache``/``.cross_attention_cache``
_CACHE_NAME = re.compile(
    r"^(?:args|kwargs|output)\.\w+(?:\.(?:self|cross)_attention_cache)?\.layers\.(\d+)\.(\w+)$"
)


def cache_entry(name: str) -> tuple[int, str] | None:
    """``(layer, state)`` of a cache tensor's recorded name (``keys``, ``values``), else None."""
    m = _CACHE_NAME.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def cache_names(records: Iterable[Record]) -> dict[str, str]:
    """The recorded names of the cache tensors among ``records``, by key."""
    return {r.key: r.name for r in records if r.phase == "forward" and cache_entry(r.name)}


class CacheRule(BaseRule):
    """The KV cache as a rule of compare's one pass (compare/rules.py): in the explain
    phase, the recorded names of the step's cache tensors, which the why line of an
    attention that read one names."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records

    @classmethod
    def for_step(cls, ctx: StepContext) -> CacheRule:
        """The rule, over the golden's records of the step."""
        return cls(ctx.g_recs)

    def explain(self, why: Explanations) -> None:
        """Name the cache records (the ones a caller named stay)."""
        why.cache_names = {**cache_names(self.records), **why.cache_names}


def _error(r: RecordResult) -> float:
    m = r.metrics
    if m is None:
        return 0.0
    return m.error if math.isfinite(m.error) else math.inf


def stored_as(r: RecordResult) -> str:
    """``", stored as A where golden has G"`` when ``r``'s dtype differs, else empty."""
    if r.actual_dtype and r.actual_dtype != r.golden_dtype:
        return f", stored as {r.actual_dtype} where golden has {r.golden_dtype}"
    return ""


def _what(entries: list[RecordResult], names: dict[str, str]) -> str:
    """``layer 0 keys (error 0.000201, stored as float16 where golden has float32), ...``."""
    parts = []
    for r in entries[:2]:
        layer, state = cache_entry(names[r.key]) or (-1, "?")
        parts.append(f"layer {layer} {state} (error {_error(r):.3g}{stored_as(r)})")
    more = f" and {len(entries) - 2} more" if len(entries) > 2 else ""
    return ", ".join(parts) + more


def _remedy(entries: list[RecordResult]) -> str:
    cast = next((r for r in entries if stored_as(r)), None)
    if cast is None:
        return ""
    return (
        f"; keep the KV cache in the model's dtype ({cast.golden_dtype}): a cache stored in "
        f"{cast.actual_dtype} rounds every key and value it holds, and every later step reads "
        "them"
    )


class Read(NamedTuple):
    """What a call read besides its arguments and weights (a buffer, the KV cache) that
    differs from golden, as its why line tells it."""

    #: told inside "its inputs match (error e) but ...": the likely cause
    inline: str
    #: told as a clause of its own where the line has no such phrase
    alone: str
    #: its remedy, ``"; ..."`` (empty: none to give)
    remedy: str


def cache_read(
    records: list[RecordResult], first: RecordResult, names: dict[str, str]
) -> Read | None:
    """How a why line tells the KV cache a call read, where it differs from golden.

    ``records``: the call's records; ``first``: its failing record (a cache itself:
    :func:`cache_written` tells it instead); ``names``: :func:`cache_names` of the golden's
    records.
    """
    if not names or first.key in names:
        return None
    differ = sorted(
        (e for e in records if e.key in names and (stored_as(e) or _error(e) > 0)),
        key=lambda e: (not stored_as(e), -_error(e)),
    )
    if not differ:
        return None
    what = _what(differ, names)
    return Read(
        f"the KV cache it reads does not: {what}; and",
        f"the KV cache it reads differs: {what}",
        _remedy(differ),
    )


def cache_written(first: RecordResult, names: dict[str, str]) -> str:
    """``"; that record is the KV cache it wrote (...)"`` and its remedy when the failing
    record ``first`` is a cache state (the call wrote the cache wrong), else empty."""
    if first.key not in names:
        return ""
    layer, state = cache_entry(names[first.key]) or (-1, "?")
    return f"; that record is the KV cache it wrote (layer {layer} {state})" + _remedy([first])
