"""KV-cache consistency: the caches compared across the sides, and cached vs cache-free.

Across the sides each layer's keys and values are compared in order (compare's
local-error rule along the layers); on each side the cached decoding's logits are
compared with one cache-free forward over the same tokens. Either can name the cache
as the cause (docs/generate.md, "KV cache").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from precguard.devices import dtype_name
from precguard.generation.decode import Decoding
from precguard.generation.judge import rel_l2
from precguard.generation.report import (
    CacheConsistency,
    CacheEntry,
    CacheSnapshot,
    CacheStatus,
    KVCache,
)
from precguard.numerics import LOGITS_SLACK, MIN_LOCAL_GROWTH, status


@dataclass(frozen=True)
class EntryMeasure:
    """One cache tensor's pair as the status ladder reads it (:class:`numerics.Measured`):
    the elements the golden holds finite and the actual does not, NaN and Inf apart, and
    the relative L2 error (0 where none is defined: the verdict is then the ladder's)."""

    nan_mismatch: int
    inf_mismatch: int
    error: float
    level: str = "full"


def entry_status(m: EntryMeasure | None, allowed: float | None) -> CacheStatus:
    """A cache entry's status, the one place kvcache settles one: 'missing' when nothing
    was measured, else the one :func:`precguard.numerics.status` call against the error
    ``allowed`` (None: no threshold applies)."""
    return "missing" if m is None else status(m, allowed)


def compare_entry(
    name: str, golden: torch.Tensor | None, actual: torch.Tensor | None
) -> tuple[dict[str, Any], EntryMeasure | None]:
    """Measure one cache tensor across the sides: its report fields (all but the status,
    which the caller settles by :func:`entry_status`) and what the ladder reads (None:
    one side lacks it or the shapes differ)."""
    ref = golden if golden is not None else actual
    assert ref is not None
    fields: dict[str, Any] = {
        "name": name,
        "golden_dtype": dtype_name(golden.dtype) if golden is not None else "-",
        "actual_dtype": dtype_name(actual.dtype) if actual is not None else "-",
        "shape": list(ref.shape),
    }
    if golden is None or actual is None or golden.shape != actual.shape:
        return {
            **fields,
            "rel_l2": None,
            "max_abs_err": None,
            "golden_absmax": 0.0,
            "nonfinite": 0,
            "first_nonfinite_position": None,
        }, None
    g = golden.double()
    a = actual.double()
    g_fin = torch.isfinite(g)
    only_actual = g_fin & ~torch.isfinite(a)
    count = int(only_actual.sum())
    nan = int((only_actual & torch.isnan(a)).sum()) if count else 0
    position = None
    if count and a.dim() >= 2:
        position = int(only_actual.nonzero()[0][-2])
    both = g_fin & torch.isfinite(a)
    err = rel_l2(a.where(both, 0), g.where(both, 0)) if count else rel_l2(a, g)
    diff = (a - g).abs()[both]
    fields |= {
        "rel_l2": err,
        "max_abs_err": float(diff.max()) if diff.numel() else 0.0,
        "golden_absmax": float(g.abs()[g_fin].max()) if bool(g_fin.any()) else 0.0,
        "nonfinite": count,
        "first_nonfinite_position": position,
    }
    # no error defined (both sides non-finite alike): no threshold, the ladder decides
    measured = EntryMeasure(nan, count - nan, err if err is not None else 0.0)
    return fields, measured


def compare_snapshot(
    after: str,
    golden: dict[str, torch.Tensor],
    actual: dict[str, torch.Tensor],
    explained: float,
) -> CacheSnapshot:
    """Compare one snapshot's entries in layer order; name the first that is not 'pass'."""
    names = list(golden) + [n for n in actual if n not in golden]
    entries: list[CacheEntry] = []
    worst = 0.0
    for name in names:
        fields, m = compare_entry(name, golden.get(name), actual.get(name))
        err = fields["rel_l2"]
        # where the caches start to differ: past the explained error, and at least
        # MIN_LOCAL_GROWTH times the largest error of the entries before it
        scored = m is not None and not (m.nan_mismatch or m.inf_mismatch) and err is not None
        allowed = max(LOGITS_SLACK * explained, MIN_LOCAL_GROWTH * worst) if scored else None
        entries.append(CacheEntry(**fields, status=entry_status(m, allowed)))
        if scored and err is not None:
            worst = max(worst, err)
    first = next((e.name for e in entries if e.status != "pass"), None)
    return CacheSnapshot(after=after, entries=entries, first_divergence=first)


def self_error(decoding: Decoding) -> float | None:
    """Largest relative L2 error over steps of cached logits against cache-free ones."""
    if decoding.free_scores is None:
        return None
    worst = 0.0
    for cached, free in zip(decoding.scores, decoding.free_scores, strict=False):
        e = rel_l2(cached, free)
        if e is None:
            return math.inf if torch.isfinite(free).all() else None
        worst = max(worst, e)
    return worst


def kv_cache_result(golden: Decoding, actual: Decoding, explained: float) -> KVCache | None:
    """The KV-cache evidence for one prompt, or None when neither side kept a cache."""
    if not any(golden.caches.values()) and not any(actual.caches.values()):
        return None
    snapshots = [
        compare_snapshot(
            after, golden.caches.get(after, {}), actual.caches.get(after, {}), explained
        )
        for after in golden.caches
    ]
    consistency = None
    g_err, a_err = self_error(golden), self_error(actual)
    threshold = LOGITS_SLACK * explained
    if golden.free_scores is not None and actual.free_scores is not None:
        consistency = CacheConsistency(
            golden_error=g_err if g_err is None or math.isfinite(g_err) else None,
            actual_error=a_err if a_err is None or math.isfinite(a_err) else None,
            threshold=threshold,
            golden_consistent=g_err is not None and g_err <= threshold,
            actual_consistent=a_err is not None and a_err <= threshold,
        )
    fault = _nonfinite_fault(snapshots) or _inconsistent_fault(snapshots, consistency, a_err)
    if fault is not None:
        (where, reason), verdict = fault, "cache"
    else:
        where, verdict = None, "consistent"
        reason = "both sides' cached decoding agrees with their cache-free forward"
        if consistency is None:
            reason = "no cache-free forward to check the cache path against; no non-finite entry"
    return KVCache(
        snapshots=snapshots, consistency=consistency, where=where, verdict=verdict, reason=reason
    )


def _nonfinite_fault(snapshots: list[CacheSnapshot]) -> tuple[str | None, str] | None:
    """The first entry the actual holds non-finite where the golden does not, and why."""
    for snap in snapshots:
        for entry in snap.entries:
            if entry.status != "nonfinite":
                continue
            position = entry.first_nonfinite_position
            at = f" from position {position}" if position is not None else ""
            return entry.name, (
                f"after {snap.after}, the actual's {entry.name} ({entry.actual_dtype}) holds "
                f"{entry.nonfinite} non-finite value(s){at} where the golden's "
                f"({entry.golden_dtype}) holds finite ones up to {entry.golden_absmax:.4g}"
            )
    return None


def _inconsistent_fault(
    snapshots: list[CacheSnapshot], consistency: CacheConsistency | None, a_err: float | None
) -> tuple[str | None, str] | None:
    """The actual's cache path against its own cache-free forward, when only it disagrees."""
    c = consistency
    if c is None or not c.golden_consistent or c.actual_consistent:
        return None
    shown = "non-finite" if a_err is None or not math.isfinite(a_err) else f"{a_err:.3g}"
    first = next((s.first_divergence for s in snapshots if s.first_divergence), None)
    at = f"; the caches first differ at {first}" if first else ""
    return first, (
        f"the actual's cached decoding differs from its own cache-free forward by {shown} "
        f"(relative L2; {c.threshold:.3g} explained), the golden's by {c.golden_error:.3g}{at}"
    )
