"""The KV cache a module read, named in the why line when it differs from golden.

With ``kv_cache=True`` (:mod:`precguard.capture.kv_cache`) each cache tensor is
recorded at the call that saw it: the attention whose ``cache.update`` wrote it,
as an output named where the call held the cache
(``kwargs.cache.layers.0.keys``). That state holds every position the call
attended to: what earlier steps wrote, which it read, and its own new one. So
when an attention whose inputs match makes an error, and its cache state
differs from golden's, the cache is what it consumed besides its arguments and
weights — as a buffer is (``inv_freq``, :mod:`precguard.compare.divergence`) —
and the why line names it: the layer, keys or values, the error, and the dtype
it was stored in where that is not golden's, with the remedy ("keep the KV
cache in float32").

A candidate whose failing record is itself a cache state wrote the cache wrong;
its why line says that record is the cache it wrote.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from precguard.compare.calls import StepCalls
from precguard.compare.divergence import Candidate
from precguard.compare.report import RecordResult
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


def _error(r: RecordResult) -> float:
    m = r.metrics
    if m is None:
        return 0.0
    return m.error if math.isfinite(m.error) else math.inf


def _cast(r: RecordResult) -> bool:
    return r.actual_dtype is not None and r.actual_dtype != r.golden_dtype


def _differs(r: RecordResult) -> bool:
    return _cast(r) or _error(r) > 0


def _what(entries: list[RecordResult], names: dict[str, str]) -> str:
    """``layer 0 keys (error 0.000201, stored as float16 where golden has float32), ...``."""
    parts = []
    for r in entries[:2]:
        layer, state = cache_entry(names[r.key]) or (-1, "?")
        cast = f", stored as {r.actual_dtype} where golden has {r.golden_dtype}" if _cast(r) else ""
        parts.append(f"layer {layer} {state} (error {_error(r):.3g}{cast})")
    more = f" and {len(entries) - 2} more" if len(entries) > 2 else ""
    return ", ".join(parts) + more


def _remedy(entries: list[RecordResult]) -> str:
    cast = next((r for r in entries if _cast(r)), None)
    if cast is None:
        return ""
    return (
        f"; keep the KV cache in the model's dtype ({cast.golden_dtype}): a cache stored in "
        f"{cast.actual_dtype} rounds every key and value it holds, and every later step reads "
        "them"
    )


def name_cache_reads(candidates: list[Candidate], calls: StepCalls, names: dict[str, str]) -> None:
    """Add the KV cache each forward candidate read, where it differs, to its why line.

    ``names`` are :func:`cache_names` of the golden's records; ``calls`` the step's
    calls as the one pass settled them (compare/verdict.py). Reasons are changed in place.
    """
    if not names:
        return
    for c in candidates:
        r = c.result
        if r.phase != "forward":
            continue
        entries = [e for e in calls.forward_call((r.module, r.call)) if e.key in names]
        if r.key in names:  # the failing record is the cache this call wrote
            layer, state = cache_entry(names[r.key]) or (-1, "?")
            c.reason += f"; that record is the KV cache it wrote (layer {layer} {state})"
            c.reason += _remedy([r])
            continue
        differ = sorted(
            (e for e in entries if _differs(e)), key=lambda e: (not _cast(e), -_error(e))
        )
        if not differ:
            continue
        what = _what(differ, names)
        reason, n = re.subn(
            r"its inputs match \(error ([^)]*)\) but",
            lambda m, what=what: (
                f"its inputs match (error {m.group(1)}) but the KV cache it reads does not: "
                f"{what}; and"
            ),
            c.reason,
            count=1,
        )
        if not n:
            reason += f"; the KV cache it reads differs: {what}"
        c.reason = reason + _remedy(differ)
