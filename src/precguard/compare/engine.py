"""``precguard.compare``: stream two recordings, pair their records, judge, localize.

Records are read one step at a time from both recordings (``records.jsonl``
is written in step order), so memory holds one step's metadata and one pair
of chunks of tensor data, whatever the size of the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from itertools import groupby
from typing import Any

from precguard._logging import get_logger
from precguard.compare.align import align
from precguard.compare.coverage import CoverageTracker, ensure_distinct, incomplete_note
from precguard.compare.divergence import (
    Candidate,
    Classification,
    fallback,
    rank_suspects,
    step_candidates,
)
from precguard.compare.metrics import golden_rms, stats_metrics, tensor_metrics, tolerance_dtype
from precguard.compare.report import (
    Comparison,
    Counts,
    Metrics,
    RecordResult,
    Status,
    Unmatched,
)
from precguard.compare.tensors import TensorStore
from precguard.compare.tolerance import Profile, get_profile, judge
from precguard.dump.reader import Run, load_run
from precguard.dump.schema import Record
from precguard.errors import DumpFormatError, PrecguardError, UsageError

logger = get_logger(__name__)

#: aligned pairs must number at least this share of the unmatched records of either
#: side, or the recordings are taken to be of different models
MIN_ALIGNED_SHARE = 0.5


class IncomparableRunsError(PrecguardError):
    """The two recordings are not of the same model (or share no rank or step)."""


def compare(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    *,
    profile: str | Profile = "default",
    rtol: float | None = None,
    atol: float | None = None,
    rank: int | None = None,
    step: int | None = None,
    suspects: int = 5,
    tolerance_dtype: str = "golden",
    on_step: Callable[[int, int], None] | None = None,
) -> Comparison:
    """Compare an ``actual`` recording with a ``golden`` one and name where they diverge.

    :param profile: tolerance profile name (``default``, ``strict``, ``msprobe``) or object.
    :param rtol: override the profile's relative tolerance for every dtype
        (``rel_l2`` keeps its ratio to ``rtol``).
    :param atol: override the absolute tolerance.
    :param rank: compare only this rank (default: every rank both recorded).
    :param step: compare only this step (default: every step).
    :param suspects: how many further suspects to list.
    :param tolerance_dtype: ``"golden"``: judge each pair by the golden's dtype
        (a bf16 run must match an fp32 golden to fp32 tolerances);
        ``"actual"``: by the less precise dtype (is the run as good as bf16 allows?).
    :param on_step: called as ``on_step(rank, step)`` after each step is compared
        (the CLI's progress bar).
    :raises IncomparableRunsError: the recordings are of different models.
    :raises DumpFormatError: a recording is missing, corrupt or of a newer schema.

    >>> result = precguard.compare("runs/cpu", "runs/npu")      # doctest: +SKIP
    >>> result.verdict, result.first_divergence.module          # doctest: +SKIP
    ('diverged', 'model.layers.3.mlp')
    """
    g_run = golden if isinstance(golden, Run) else load_run(golden)
    a_run = actual if isinstance(actual, Run) else load_run(actual)
    prof = get_profile(profile) if isinstance(profile, str) else profile
    prof = prof.with_overrides(rtol, atol)
    if tolerance_dtype not in ("golden", "actual"):
        raise UsageError(f"tolerance_dtype must be 'golden' or 'actual', got {tolerance_dtype!r}")
    ensure_distinct(g_run, a_run)
    warnings = _check_models(g_run, a_run)
    ranks = _ranks(g_run, a_run, rank, warnings)
    coverage = CoverageTracker(g_run, a_run, rank=rank, step=step)
    results: list[RecordResult] = []
    golden_only: list[str] = []
    actual_only: list[str] = []
    candidates: list[Candidate] = []
    firsts: list[Candidate] = []
    g_store, a_store = TensorStore(g_run.path), TensorStore(a_run.path)
    steps_seen = 0
    try:
        for r in ranks:
            for s, g_recs, a_recs in _paired_steps(g_run, a_run, r, step, warnings):
                steps_seen += 1
                g_recs, a_recs = coverage.pair(r, s, g_recs, a_recs)
                step_results = _compare_step(
                    g_recs, a_recs, g_store, a_store, prof, tolerance_dtype
                )
                classified: Classification = {}
                found = step_candidates(step_results.results, prof, classified)
                results.extend(_annotate(step_results.results, classified))
                golden_only.extend(step_results.golden_only)
                actual_only.extend(step_results.actual_only)
                candidates.extend(found)
                first = found[0] if found else fallback(step_results.results)
                if first is not None:
                    firsts.append(first)
                logger.debug("step_compared", rank=r, step=s, records=len(step_results.results))
                if on_step is not None:
                    on_step(r, s)
    finally:
        g_store.close()
        a_store.close()
    if step is not None and steps_seen == 0:
        raise UsageError(f"step {step} is in neither recording (or in only one of them)")
    if steps_seen == 0:
        raise IncomparableRunsError(
            f"{g_run.path} and {a_run.path} share no step of any rank: nothing to compare"
            + incomplete_note(g_run, a_run)
        )
    counts = _counts(results)
    matched = len(results) - counts.missing
    if matched < MIN_ALIGNED_SHARE * max(len(golden_only), len(actual_only)):
        raise IncomparableRunsError(
            f"{a_run.path} does not look like a recording of the same model as {g_run.path}: "
            f"only {matched} records align, {len(golden_only)} are only in golden and "
            f"{len(actual_only)} only in actual" + incomplete_note(g_run, a_run)
        )
    first = min(firsts, key=lambda c: c.order) if firsts else None
    if golden_only or actual_only:
        warnings.append(
            f"{len(golden_only)} golden and {len(actual_only)} actual records have no "
            "counterpart (listed under 'unmatched')"
        )
    return Comparison(
        golden=str(g_run.path),
        actual=str(a_run.path),
        devices=[g_run.manifest.device, a_run.manifest.device],
        dtypes=[g_run.manifest.dtype, a_run.manifest.dtype],
        profile=prof.name,
        tolerances={k: v.model_dump() for k, v in prof.dtypes.items()}
        | {"amplification": prof.amplification},
        verdict="diverged" if counts.failed or counts.nonfinite else "match",
        first_divergence=first.divergence() if first is not None else None,
        suspects=rank_suspects(candidates, first, suspects),
        counts=counts,
        records=results,
        unmatched=Unmatched(golden_only=golden_only, actual_only=actual_only),
        fingerprint_diff=fingerprint_diff(g_run.manifest.fingerprint, a_run.manifest.fingerprint),
        warnings=warnings,
        coverage=coverage.result(),
    )


def fingerprint_diff(golden: dict[str, Any], actual: dict[str, Any]) -> dict[str, list[Any]]:
    """Keys whose values differ between two environment fingerprints: key -> [golden, actual]."""
    out: dict[str, list[Any]] = {}
    for key in sorted(set(golden) | set(actual)):
        g, a = golden.get(key), actual.get(key)
        if g != a:
            out[key] = [g, a]
    return out


def _check_models(g_run: Run, a_run: Run) -> list[str]:
    warnings: list[str] = []
    gm, am = g_run.manifest, a_run.manifest
    if gm.model and am.model and gm.model != am.model:
        raise IncomparableRunsError(
            f"{a_run.path / 'manifest.json'}: recording of model {am.model!r}, but golden "
            f"{g_run.path} recorded {gm.model!r}"
        )
    return warnings  # an incomplete run is told first by the coverage (coverage.py)


def _ranks(g_run: Run, a_run: Run, rank: int | None, warnings: list[str]) -> list[int]:
    g_ranks, a_ranks = set(g_run.ranks), set(a_run.ranks)
    if rank is not None:
        for run, ranks in ((g_run, g_ranks), (a_run, a_ranks)):
            if rank not in ranks:
                raise UsageError(
                    f"{run.path}: has no rank {rank} (ranks: {sorted(ranks) or 'none'})"
                )
        return [rank]
    common = sorted(g_ranks & a_ranks)
    if not common:
        for run, ranks in ((g_run, g_ranks), (a_run, a_ranks)):
            if not ranks:
                raise DumpFormatError(f"{run.path}: no rank*/records.jsonl found; empty recording")
        raise IncomparableRunsError(
            f"the recordings share no rank: golden has {sorted(g_ranks)}, actual {sorted(a_ranks)}"
        )
    if g_ranks != a_ranks:
        warnings.append(
            f"ranks differ (golden {sorted(g_ranks)}, actual {sorted(a_ranks)}); comparing {common}"
        )
    return common


def _steps(run: Run, rank: int, only: int | None) -> Iterator[tuple[int, list[Record]]]:
    for s, group in groupby(run.records(rank), key=lambda rec: rec.step):
        if only is None or s == only:
            yield s, list(group)
        elif s > only:
            return


def _paired_steps(
    g_run: Run, a_run: Run, rank: int, only: int | None, warnings: list[str]
) -> Iterator[tuple[int, list[Record], list[Record]]]:
    """Yield (step, golden records, actual records) for steps both recorded, in order."""
    g_iter, a_iter = _steps(g_run, rank, only), _steps(a_run, rank, only)
    g_next, a_next = next(g_iter, None), next(a_iter, None)
    while g_next is not None and a_next is not None:
        if g_next[0] == a_next[0]:
            yield g_next[0], g_next[1], a_next[1]
            g_next, a_next = next(g_iter, None), next(a_iter, None)
        elif g_next[0] < a_next[0]:
            warnings.append(f"rank {rank} step {g_next[0]}: only in golden")
            g_next = next(g_iter, None)
        else:
            warnings.append(f"rank {rank} step {a_next[0]}: only in actual")
            a_next = next(a_iter, None)
    for rest, side in ((g_next, "golden"), (a_next, "actual")):
        if rest is not None:
            warnings.append(f"rank {rank}: steps from {rest[0]} on are only in {side}")


class _StepResults:
    def __init__(self) -> None:
        self.results: list[RecordResult] = []
        self.golden_only: list[str] = []
        self.actual_only: list[str] = []


def _compare_step(
    g_recs: list[Record],
    a_recs: list[Record],
    g_store: TensorStore,
    a_store: TensorStore,
    profile: Profile,
    tol_mode: str,
) -> _StepResults:
    out = _StepResults()
    alignment = align(g_recs, a_recs)
    for g, a in alignment.pairs:
        metrics = pair_metrics(g, a, g_store, a_store, profile, tol_mode)
        out.results.append(_result(g, a, judge(metrics, profile), metrics))
    for g in alignment.golden_only:
        out.golden_only.append(g.key)
        out.results.append(_result(g, None, "missing", None))
    for a in alignment.actual_only:
        out.actual_only.append(a.key)
        out.results.append(_result(a, None, "missing", None))
    out.results.sort(key=lambda x: (x.seq, x.status == "missing"))
    return out


def _annotate(results: list[RecordResult], classified: Classification) -> list[RecordResult]:
    """Copy the local/propagated decision onto the failing records it was made for."""
    out = []
    for r in results:
        decision = classified.get(r.key) if r.status in ("fail", "nonfinite") else None
        if decision is not None:
            r = r.model_copy(update={"local": decision[0], "amplification": decision[1]})
        out.append(r)
    return out


def _result(g: Record, a: Record | None, status: Status, metrics: Metrics | None) -> RecordResult:
    return RecordResult(
        key=g.key,
        actual_key=a.key if a is not None and a.key != g.key else None,
        module=g.module,
        module_type=g.module_type,
        golden_dtype=g.dtype,
        actual_dtype=a.dtype if a is not None else None,
        shape=list(g.shape),
        phase=g.phase,
        role=g.role,
        step=g.step,
        rank=g.rank,
        seq=g.seq,
        status=status,
        metrics=metrics,
    )


def pair_metrics(
    g: Record,
    a: Record,
    g_store: TensorStore,
    a_store: TensorStore,
    profile: Profile,
    tol_mode: str = "golden",
) -> Metrics:
    """Metrics for one aligned pair: full tensors when both were saved, else statistics."""
    dtype = tolerance_dtype(g.dtype, a.dtype, tol_mode)
    if g.role == "param" and g.shape != a.shape:
        raise IncomparableRunsError(
            f"{a_store.root / f'rank{a.rank}' / 'records.jsonl'}: a recording of a different "
            f"model: parameter {g.key} ({g.name}) has shape {a.shape}, golden {g.shape}"
        )
    if _squeezed(g.shape) != _squeezed(a.shape):
        return Metrics(
            level="none",
            dtype=dtype,
            error=math.inf,
            note=f"shapes differ: golden {g.shape}, actual {a.shape}",
        )
    if g.tensor is not None and a.tensor is not None:
        gt, at = g_store.tensor(g), a_store.tensor(a)
        g_release = g_store.releaser(g, gt.element_size())
        a_release = a_store.releaser(a, at.element_size())

        def release(start: int, end: int) -> None:
            g_release(start, end)
            a_release(start, end)

        return tensor_metrics(
            gt,
            at,
            golden_dtype=g.dtype,
            actual_dtype=a.dtype,
            profile=profile,
            tol_mode=tol_mode,
            golden_rms=golden_rms(g.stats),
            release=release,
        )
    return stats_metrics(g, a, dtype=dtype)


def _squeezed(shape: list[int]) -> list[int]:
    """The shape without size-1 dimensions: [1, 32, 16] and [32, 16] hold the same layout."""
    return [s for s in shape if s != 1]


def _counts(results: list[RecordResult]) -> Counts:
    c = {"pass": 0, "fail": 0, "nonfinite": 0, "missing": 0}
    full = stats = 0
    for r in results:
        c[r.status] += 1
        if r.metrics is not None:
            full += r.metrics.level in ("full", "exact")
            stats += r.metrics.level == "stats"
    return Counts(
        passed=c["pass"],
        failed=c["fail"],
        nonfinite=c["nonfinite"],
        missing=c["missing"],
        full=full,
        stats_only=stats,
    )
