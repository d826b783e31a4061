"""Pair the records of two recordings.

First by key. Records left over (a renamed module, re-ordered calls, a
different number of calls) are paired by order within the same parent
module, phase and role, preferring a partner of the same shape and dtype,
then of the same shape. A record without a partner of the same shape stays
unmatched: it is reported, never dropped.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from precguard.dump.schema import Record


@dataclass
class Alignment:
    """The outcome of aligning one step of one rank."""

    pairs: list[tuple[Record, Record]] = field(default_factory=list)
    golden_only: list[Record] = field(default_factory=list)
    actual_only: list[Record] = field(default_factory=list)


def parent_module(module: str) -> str:
    """Return the qualified name of ``module``'s parent (``root`` for top-level modules)."""
    if module == "root" or "." not in module:
        return "root"
    return module.rsplit(".", 1)[0]


def _group(rec: Record) -> tuple[str, str, str]:
    return parent_module(rec.module), rec.phase, rec.role


def align(golden: list[Record], actual: list[Record]) -> Alignment:
    """Pair ``golden`` and ``actual`` records of one rank and step.

    Pairs come back in golden execution order (``seq``).

    >>> a = align(golden_records, actual_records)     # doctest: +SKIP
    >>> [(g.key, x.key) for g, x in a.pairs][:1]       # doctest: +SKIP
    [('model.embed_tokens.0.forward.param.0', 'model.embed_tokens.0.forward.param.0')]
    """
    by_key = {r.key: r for r in actual}
    result = Alignment()
    left_golden: list[Record] = []
    used: set[str] = set()
    for g in golden:
        a = by_key.get(g.key)
        if a is not None and a.key not in used:
            used.add(a.key)
            result.pairs.append((g, a))
        else:
            left_golden.append(g)
    left_actual = [a for a in actual if a.key not in used]
    if left_golden and left_actual:
        pending: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
        for a in left_actual:
            pending[_group(a)].append(a)
        still_golden = []
        for g in left_golden:
            candidates = pending.get(_group(g), [])
            partner = _pick(g, candidates)
            if partner is None:
                still_golden.append(g)
            else:
                candidates.remove(partner)
                result.pairs.append((g, partner))
        left_golden = still_golden
        left_actual = [a for group in pending.values() for a in group]
    result.pairs.sort(key=lambda pair: pair[0].seq)
    result.golden_only = sorted(left_golden, key=lambda r: r.seq)
    result.actual_only = sorted(left_actual, key=lambda r: r.seq)
    return result


def _pick(golden: Record, candidates: list[Record]) -> Record | None:
    """The first candidate (in execution order) of the same shape, same dtype preferred."""
    same_shape = [c for c in candidates if c.shape == golden.shape]
    for c in same_shape:
        if c.dtype == golden.dtype:
            return c
    return same_shape[0] if same_shape else None
