"""Which rank's shard holds the error: each rank's part against the matching part of the golden.

For a module named by compare (the first divergence, a suspect), every
failing record of that module call is looked at rank by rank:

- a split tensor (``{shard: D}``): rank r's shard against the golden's slice
  along D at the same offset (full tensors), or against the golden's rank r
  shard when the golden is itself a parallel recording (tensors or
  statistics); without golden tensors, a shard holding NaN/Inf the golden
  has not still names its rank;
- a replicated tensor: each rank's copy against the golden's whole tensor;
- a partial sum: no rank can be told from the sum (every rank's part is
  needed to form it); the rank stays undecided there.

The ranks whose part fails are named; the first of them becomes the
divergence's ``rank``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from precguard.compare.levels import StatsMetrics
from precguard.compare.metrics import precision, stats_metrics, tensor_metrics
from precguard.compare.report import FirstDivergence, Metrics, RecordResult, Suspect
from precguard.compare.tolerance import Profile, judge
from precguard.dump.reader import Run
from precguard.dump.schema import Record

if TYPE_CHECKING:
    from precguard.compare.report import Comparison
    from precguard.layout.gather import Gathered, Source

_BAD = ("fail", "nonfinite")
#: suspects whose rank is looked up (each costs a read of the ranks' records)
MAX_ATTRIBUTED = 10


class GatheredSides(Protocol):
    """What attribution needs of the two sides of a layout comparison (``LayoutViews`` is one).

    A protocol, so that this module and :mod:`precguard.layout.view`, which calls it,
    do not import each other.
    """

    golden_original: Run
    actual_original: Run
    golden: Run
    g: Gathered | None
    a: Gathered | None

    def source(self, step: int, key: str, *, golden: bool = False) -> Source | None:
        """The source of a gathered record (None when that side was not gathered)."""
        ...


def attribute(
    views: GatheredSides, result: Comparison, profile: Profile, tol_mode: str
) -> tuple[FirstDivergence | None, list[Suspect], list[str]]:
    """The first divergence and suspects of ``result`` with the rank holding each error."""
    first = result.first_divergence
    suspects = list(result.suspects)
    if views.a is None and views.g is None:
        return first, suspects, []
    targets = ([first] if first is not None else []) + suspects[:MAX_ATTRIBUTED]
    failing: dict[tuple[str, int, str], list[RecordResult]] = {}
    for t in targets:
        failing.setdefault((t.module, t.step, t.phase), [])
    for r in result.records:
        group = failing.get((r.module, r.step, r.phase))
        if group is not None and r.status in _BAD:
            group.append(r)
    reader = _ShardReader(views, [r for group in failing.values() for r in group])
    decided: dict[tuple[str, int, str], tuple[int, str] | None] = {}
    for target, group in failing.items():
        decided[target] = _decide(views, reader, group, profile, tol_mode)
    notes: list[str] = []
    if first is not None:
        group = _group_ranks(views, first.step, first.key, first.rank)
        d = decided[(first.module, first.step, first.phase)]
        if d is not None:
            rank, why = d
            first = first.model_copy(update={"rank": rank, "reason": f"{first.reason}; {why}"})
        elif len(group) > 1:
            why = (
                f"which of ranks {group} holds the error cannot be told here (partial sums, "
                "or statistics only: record the module with --tensors on both sides)"
            )
            first = first.model_copy(update={"rank": group[0], "reason": f"{first.reason}; {why}"})
            notes.append(f"{first.module}: {why}")
        else:
            first = first.model_copy(update={"rank": group[0]})
    out = []
    for s in suspects:
        d = decided.get((s.module, s.step, s.phase))
        if d is not None:
            s = s.model_copy(update={"rank": d[0], "reason": f"{s.reason}; {d[1]}"})
        else:
            s = s.model_copy(update={"rank": _group_ranks(views, s.step, s.key, s.rank)[0]})
        out.append(s)
    return first, out, notes


def _group_ranks(views: GatheredSides, step: int, key: str, default: int) -> list[int]:
    """The ranks that held the gathered record ``key`` of ``step``."""
    src = views.source(step, key) or views.source(step, key, golden=True)
    return list(src.ranks) if src is not None else [default]


class _ShardReader:
    """The per-rank records (and golden whole records) behind some gathered records."""

    def __init__(self, views: GatheredSides, results: list[RecordResult]) -> None:
        self.views = views
        self.actual: dict[tuple[int, int, str], Record] = {}
        self.golden: dict[tuple[int, int, str], Record] = {}
        a_want: dict[int, set[tuple[int, str]]] = {}
        g_want: dict[int, set[tuple[int, str]]] = {}
        for r in results:
            a_key = r.actual_key or r.key
            src = views.source(r.step, a_key)
            for rank in src.ranks if src is not None else (r.rank,):
                a_want.setdefault(rank, set()).add((r.step, a_key))
            g_src = views.source(r.step, r.key, golden=True)
            for rank in g_src.ranks if g_src is not None else (0,):
                g_want.setdefault(rank, set()).add((r.step, r.key))
        if views.a is not None:
            _collect(views.actual_original, a_want, self.actual)
        if views.g is not None:
            _collect(views.golden_original, g_want, self.golden)
        else:
            _collect(views.golden, g_want, self.golden)


def _collect(run: Run, want: dict[int, set[tuple[int, str]]], into: dict) -> None:
    for rank, keys in want.items():
        if rank not in run.ranks:
            continue
        last = max(s for s, _ in keys)
        for rec in run.records(rank):
            if rec.step > last:
                break
            if (rec.step, rec.key) in keys:
                into.setdefault((rank, rec.step, rec.key), rec)


def _tier(r: RecordResult) -> int | None:
    """0: the module's own state (parameters), 1: what it produced, None: what it consumed."""
    if r.role == "param":
        return 0
    if (r.phase, r.role) in (("forward", "output"), ("backward", "input"), ("backward", "grad")):
        return 1
    return None  # inputs (and incoming gradients) fail on every rank they came to


def _decide(
    views: GatheredSides,
    reader: _ShardReader,
    group: list[RecordResult],
    profile: Profile,
    tol_mode: str,
) -> tuple[int, str] | None:
    """The rank whose part the module's error is in: its parameters first, then its outputs."""
    undecided = False
    for tier in (0, 1):
        bad: dict[int, list[str]] = {}
        good: set[int] = set()
        for r in group:
            if _tier(r) != tier:
                continue
            verdicts = _per_rank(views, reader, r, profile, tol_mode)
            if verdicts is None:
                undecided = True
                continue
            for rank, ok in verdicts.items():
                if ok:
                    good.add(rank)
                else:
                    bad.setdefault(rank, []).append(_what(reader, r, rank))
        if bad:
            return _named(bad, good, undecided)
    return None


def _named(bad: dict[int, list[str]], good: set[int], undecided: bool) -> tuple[int, str]:
    ranks = sorted(bad)
    rank = ranks[0]
    whats = ", ".join(dict.fromkeys(bad[rank]))
    ok = sorted(good - set(ranks))
    why = (
        f"rank {rank}'s part of {whats} differs from the matching part of the golden"
        + (f" (also ranks {ranks[1:]})" if len(ranks) > 1 else "")
        + (f"; ranks {ok} match" if ok else "")
        + ("; partial sums elsewhere in the module could not be split by rank" if undecided else "")
    )
    return rank, why


def _what(reader: _ShardReader, r: RecordResult, rank: int) -> str:
    rec = reader.actual.get((rank, r.step, r.actual_key or r.key))
    if r.role in ("param", "grad"):
        name = rec.name if rec is not None and rec.name else r.key.rsplit(".", 1)[-1]
        return f"parameter {name}" if r.role == "param" else f"the gradient of {name}"
    return f"{r.phase} {r.role} {r.key.rsplit('.', 1)[-1]}"


def _per_rank(
    views: GatheredSides,
    reader: _ShardReader,
    r: RecordResult,
    profile: Profile,
    tol_mode: str,
) -> dict[int, bool] | None:
    """rank -> its part passes, for one failing gathered record (None: cannot tell)."""
    a_key = r.actual_key or r.key
    src = views.source(r.step, a_key)
    g_src = views.source(r.step, r.key, golden=True)
    placement = (src or g_src).placement if (src or g_src) is not None else "replicate"
    if placement == "partial":
        return None
    ranks = src.ranks if src is not None else (g_src.ranks if g_src is not None else ())
    if len(ranks) < 2:
        return None
    computes = (
        views.golden_original.manifest.compute_dtype,
        views.actual_original.manifest.compute_dtype,
    )
    out: dict[int, bool] = {}
    offset = 0
    for rank in ranks:
        a = reader.actual.get((rank, r.step, a_key)) if src is not None else None
        if views.g is not None:
            g = reader.golden.get((rank, r.step, r.key))
            whole = None
        else:
            g = None
            whole = reader.golden.get((0, r.step, r.key))
        if a is None:
            return None
        metrics = _part_metrics(views, placement, a, g, whole, offset, profile, tol_mode, computes)
        if placement.startswith("shard:"):
            offset += a.shape[int(placement.split(":")[1])]
        if metrics is None:
            return None
        out[rank] = judge(metrics, profile) == "pass"
    if all(out.values()):
        return None  # every part passing while the whole fails tells nothing of the rank
    if placement == "replicate" and not any(out.values()):
        return None  # the same wrong copy on every rank: it came from before the module
    return out


def _part_metrics(
    views: GatheredSides,
    placement: str,
    a: Record,
    g: Record | None,
    whole: Record | None,
    offset: int,
    profile: Profile,
    tol_mode: str,
    computes: tuple[str | None, str | None],
) -> Metrics | None:
    a_prec = precision(a.dtype, a.compute_dtype or computes[1])
    if g is not None:  # the golden is sharded the same way: part against part
        g_prec = precision(g.dtype, g.compute_dtype or computes[0])
        if g.tensor is not None and a.tensor is not None:
            return tensor_metrics(
                views.golden_original.tensor(g),
                views.actual_original.tensor(a),
                golden_dtype=g_prec,
                actual_dtype=a_prec,
                profile=profile,
                tol_mode=tol_mode,
            )
        return stats_metrics(g, a, dtype=a_prec) if g.stats and a.stats else None
    if whole is None:
        return None
    g_prec = precision(whole.dtype, whole.compute_dtype or computes[0])
    if placement == "replicate":
        if whole.tensor is not None and a.tensor is not None:
            return tensor_metrics(
                views.golden.tensor(whole),
                views.actual_original.tensor(a),
                golden_dtype=g_prec,
                actual_dtype=a_prec,
                profile=profile,
                tol_mode=tol_mode,
            )
        return stats_metrics(whole, a, dtype=a_prec) if whole.stats and a.stats else None
    dim = int(placement.split(":")[1])
    if whole.tensor is not None and a.tensor is not None:
        part = views.golden.tensor(whole).narrow(dim, offset, a.shape[dim])
        return tensor_metrics(
            part,
            views.actual_original.tensor(a),
            golden_dtype=g_prec,
            actual_dtype=a_prec,
            profile=profile,
            tol_mode=tol_mode,
        )
    return _nonfinite_only(whole, a, a_prec)


def _nonfinite_only(whole: Record, a: Record, dtype: str) -> Metrics | None:
    """Without golden tensors a shard is judged only by NaN/Inf the whole golden lacks."""
    if whole.stats is None or a.stats is None or whole.stats.nonfinite:
        return None
    return StatsMetrics(
        level="stats",
        dtype=dtype,
        error=0.0,
        nan_mismatch=a.stats.nan,
        inf_mismatch=a.stats.inf,
        note="shard judged on its NaN/Inf count only",
    )
