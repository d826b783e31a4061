"""Error metrics for one pair of records: compare's reading of the one measure.

Full tensors are measured by :func:`precguard.difference.accumulate` (the sums
:func:`precguard.numerics.measure` reads too, chunk by chunk in bounded memory);
this module turns the sums into :class:`~precguard.compare.levels.FullMetrics`: the
error norms, the relative-error bands, the worst slice, and the least-squares scale of
actual on golden with its cluster-robust standard error. Statistics-only pairs are
measured from their recorded statistics and sampled elements (:func:`stats_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from precguard.compare.levels import (
    ExactMetrics,
    FullMetrics,
    Metrics,
    StatsMetrics,
    UnmeasuredMetrics,
)
from precguard.compare.sampled import position_evidence, sample_evidence
from precguard.compare.tolerance import Profile
from precguard.difference import (
    CHUNK,
    REL_BANDS,
    Plan,
    Sums,
    accumulate,
    blocks,
    raw,
    sliced_dims,
)
from precguard.difference import rms as finite_rms
from precguard.difference import ulp_dtype as ulp_precision
from precguard.dump.schema import STAT_FIELDS, Record, Stats
from precguard.numerics import (
    COMPLEX_PARTS,
    SIGNIFICAND_BITS,
    SLICE_FLOOR,
    less_precise,
    mask_floor,
    relative_l2,
)

if TYPE_CHECKING:
    import torch

#: guard for relative errors: the denominator is at least this share of rms(golden)
REL_FLOOR = 1e-3
#: a dimension with at least this many indices is also a clustering of the scale's
#: standard error (each index one cluster: a channel's rounded weights, a repeated row)
BIAS_MIN_CLUSTERS = 16

STATS_NOTE = (
    "statistics only, a weaker test: equal statistics do not prove equal tensors; record full "
    "tensors (--tensors) of this module for a conclusive test"
)

#: accepted values of ``tolerance_dtype`` besides a float dtype name
TOLERANCE_MODES = ("auto", "actual", "golden")


def tolerance_dtype(golden: str, actual: str, mode: str = "auto") -> str:
    """The dtype whose tolerances judge a pair, from each side's compute precision
    (:func:`precision`): with ``mode="auto"`` (also ``"actual"``) the less precise of the
    two, with ``"golden"`` the golden's (a bf16 run held to its fp32 reference), with a
    float dtype name that dtype."""
    if is_float_dtype(mode):
        return mode
    if mode == "golden" and is_float_dtype(golden):
        return golden
    return less_precise(golden, actual)


def precision(stored: str, compute: str | None) -> str:
    """The precision a recorded value carries: its stored dtype, or the dtype it was
    computed in when that is less precise (an ``emu:bf16`` value stored as float32)."""
    if compute is None or not is_float_dtype(stored):
        return stored
    return less_precise(stored, compute)


def is_float_dtype(name: str) -> bool:
    """True for the floating dtypes compare measures with error metrics."""
    return name in SIGNIFICAND_BITS


def golden_rms(stats: Stats | None) -> float | None:
    """Root mean square of a tensor from its recorded statistics (None if they cannot say)."""
    if stats is None or not stats.numel or stats.l2 is None or not math.isfinite(stats.l2):
        return None
    return stats.l2 / math.sqrt(stats.numel)


def tensor_metrics(
    golden: torch.Tensor,
    actual: torch.Tensor,
    *,
    golden_dtype: str,
    actual_dtype: str,
    profile: Profile,
    tol_mode: str = "golden",
    golden_rms: float | None = None,
    release: Callable[[int, int], None] | None = None,
) -> Metrics:
    """Compare two full tensors as compare and replay do: error metrics under the tolerance
    of :func:`tolerance_dtype` (``tol_mode``: compare passes ``"auto"``, replay the default
    ``"golden"``) when either side is a float, equality otherwise; ULPs are counted in the
    actual's precision (:func:`precision`). A complex tensor is measured as its real view."""
    import torch

    if golden.is_complex() and actual.is_complex():
        # each part measured as a float of the part's precision, not equality of the pairs
        golden, actual = torch.view_as_real(golden), torch.view_as_real(actual)
        golden_dtype = COMPLEX_PARTS.get(golden_dtype, golden_dtype)
        actual_dtype = COMPLEX_PARTS.get(actual_dtype, actual_dtype)
    if not (is_float_dtype(golden_dtype) or is_float_dtype(actual_dtype)):
        return exact_metrics(golden, actual)
    dtype = tolerance_dtype(golden_dtype, actual_dtype, tol_mode)
    tol = profile.for_dtype(dtype)
    return full_metrics(
        golden,
        actual,
        dtype=dtype,
        rtol=tol.rtol,
        atol=tol.atol,
        ulp_dtype=actual_dtype if actual_dtype in _ULP_DTYPES else None,
        golden_rms=golden_rms,
        release=release,
    )


_ULP_DTYPES = ("float16", "bfloat16", "float32", "float64")


def full_metrics(
    golden: torch.Tensor,
    actual: torch.Tensor,
    *,
    dtype: str,
    rtol: float,
    atol: float,
    ulp_dtype: str | None = None,
    golden_rms: float | None = None,
    chunk: int = CHUNK,
    release: Callable[[int, int], None] | None = None,
) -> Metrics:
    """Compare two full tensors of equal element count, chunk by chunk.

    ``dtype`` names the dtype whose tolerances apply; ULPs are counted in ``ulp_dtype``
    (default: the actual's float dtype); ``rtol``/``atol`` define ``close_share``'s test;
    ``golden_rms`` (from the recorded statistics) spares a pass; ``release`` is
    :func:`~precguard.difference.accumulate`'s.
    """
    import torch

    numel = golden.numel()
    if golden_rms is None or not math.isfinite(golden_rms):
        golden_rms = finite_rms(golden.reshape(-1), chunk)
    ulps = ulp_precision(ulp_dtype, actual.dtype, golden.dtype)
    plan = Plan(
        floor=max(REL_FLOOR * golden_rms, torch.finfo(torch.float64).tiny),
        rtol=rtol,
        atol=max(atol, rtol * golden_rms),
        ulp_dtype=ulps,
        slices=sliced_dims(tuple(golden.shape), numel),
        mask_floor=mask_floor(str(ulps).removeprefix("torch.")),
        **blocks(numel),
    )
    sums = accumulate(golden, actual, plan, chunk=chunk, release=release)
    return _finish(sums, dtype, numel, golden_rms, plan.slices)


def _worst_slice(
    acc: Sums, rms: float, numel: int, slices: tuple[tuple[int, int, int], ...]
) -> tuple[float | None, int | None, int | None]:
    """The worst slice's relative L2 error, its dimension and index (None: not sliced),
    each slice's golden norm floored at :data:`SLICE_FLOOR` times the typical slice's."""
    if not slices or not acc.slice_dd:
        return (0.0, None, None) if slices and acc.sum_sq == 0 else (None, None, None)
    worst, where = 0.0, (None, None)
    for dim, size, _ in slices:
        dd, gg = acc.slice_dd.get(dim), acc.slice_gg.get(dim)
        if dd is None or gg is None:
            continue
        per = numel / size
        den = np.maximum(gg, (SLICE_FLOOR * rms) ** 2 * per)
        with np.errstate(all="ignore"):
            err = np.sqrt(dd / np.maximum(den, np.finfo(np.float64).tiny))
        i = int(np.argmax(err))
        if err[i] > worst:
            worst, where = float(err[i]), (dim, i)
    return worst, where[0], where[1]


def _finish(
    acc: Sums,
    dtype: str,
    numel: int,
    rms: float = 0.0,
    slices: tuple[tuple[int, int, int], ...] = (),
) -> Metrics:
    n = max(acc.n, 1)
    # <a,a> comes from <g,g> + 2<g,d> + <d,d>: where a is close to -g that sum cancels
    # and rounding can leave it a hair below zero
    g_norm, a_norm = math.sqrt(acc.gg), math.sqrt(max(acc.aa, 0.0))
    err_norm = math.sqrt(acc.sum_sq)
    rel_l2 = relative_l2(err_norm, g_norm)  # the one definition (precguard.numerics)
    if g_norm > 0 and a_norm > 0:
        cosine = max(-1.0, min(1.0, acc.ga / (g_norm * a_norm)))
    else:
        cosine = 1.0 if g_norm == a_norm else 0.0
    total = max(numel, 1)
    last = next(((dim, size) for dim, size, stride in slices if stride == 1), None)
    u = 2.0 ** -SIGNIFICAND_BITS.get(dtype, SIGNIFICAND_BITS["float32"])
    rows = numel // last[1] if last is not None else numel
    blocks = acc.block_gg.size if acc.block_gg is not None else 1
    scale, scale_se = _scale(acc, u, None if last is None else last[0], max(1.0, rows / blocks))
    slice_error, slice_dim, slice_index = _worst_slice(acc, rms, numel, slices)
    peak = acc.max_abs / acc.g_absmax if acc.g_absmax > 0 else (0.0 if acc.max_abs == 0 else None)
    note = None
    if acc.nan_mismatch or acc.inf_mismatch:
        # the NaN/Inf mismatch is the error; the norms above are the finite elements' only
        note = (
            f"{acc.nan_mismatch} NaN and {acc.inf_mismatch} Inf on one side only; the error "
            f"metrics are measured over the {acc.n - acc.nonfinite} elements finite "
            "on both sides"
        )
    return FullMetrics(
        level="full",
        dtype=dtype,
        error=rel_l2,
        max_abs_err=acc.max_abs,
        mean_abs_err=acc.sum_abs / n,
        max_rel_err=acc.max_rel,
        rmse=math.sqrt(acc.sum_sq / n),
        rel_l2=rel_l2,
        cosine=cosine,
        max_ulp=float(acc.max_ulp),
        rel_err_share={
            f"{band:.0e}".replace("e-0", "e-"): c / total
            for band, c in zip(REL_BANDS, acc.bands, strict=True)
        },
        close_share=acc.not_close / total,
        nan_mismatch=acc.nan_mismatch,
        inf_mismatch=acc.inf_mismatch,
        scale=scale,
        scale_se=scale_se,
        mean_rel_err=acc.sum_signed_rel / n,
        peak_error=peak,
        slice_error=slice_error,
        slice_dim=slice_dim,
        slice_index=slice_index,
        note=note,
    )


def _scale(
    acc: Sums, u: float = 0.0, channels: int | None = None, rows_per_block: float = 1.0
) -> tuple[float | None, float | None]:
    """Least-squares scale of actual on golden and its cluster-robust standard error over
    the tensor's blocks and the indices of every dimension with :data:`BIAS_MIN_CLUSTERS`,
    at least ``u / sqrt(3 n_eff)`` (one rounding shared per row, ``rows_per_block`` to a
    block, or per index of ``channels``): docs/compare.md, "Systematic bias"."""
    if acc.block_gd is None or acc.block_gg is None or not acc.gg > 0:
        return None, None
    total = float(acc.block_gg.sum())
    if not (total > 0 and math.isfinite(total)):
        return None, None
    bias = float(acc.block_gd.sum()) / total
    se: float | None = None
    clusters = [(acc.block_gd, acc.block_gg)]
    clusters += [
        (acc.slice_gd[dim], acc.slice_gg[dim])
        for dim in acc.slice_gd
        if acc.slice_gd[dim].size >= BIAS_MIN_CLUSTERS
    ]
    for c, q in clusters:
        used = int(np.count_nonzero(q))
        if used < 2:
            continue
        resid = c - bias * q
        one = math.sqrt(used / (used - 1) * float(np.dot(resid, resid))) / total
        se = one if se is None else max(se, one)
    if se is None:  # one element or one cluster: no spread to measure
        return 1.0 + bias, None
    shared = [(acc.block_gg, rows_per_block)]
    if channels is not None and channels in acc.slice_gg:
        shared.append((acc.slice_gg[channels], 1.0))
    for q, per in shared:
        n_eff = per * total**2 / float(np.dot(q, q))
        se = max(se, u / math.sqrt(3.0 * n_eff))
    return 1.0 + bias, se


def exact_metrics(golden: torch.Tensor, actual: torch.Tensor, *, chunk: int = CHUNK) -> Metrics:
    """Compare integer or boolean tensors element by element for equality."""
    g_flat, a_flat = golden.reshape(-1), actual.reshape(-1)
    mismatched = 0
    for start in range(0, g_flat.numel(), chunk):
        g = raw(g_flat[start : start + chunk])
        a = raw(a_flat[start : start + chunk])
        mismatched += int(np.count_nonzero(g != a))
    total = max(g_flat.numel(), 1)
    return ExactMetrics(
        level="exact",
        dtype=str(golden.dtype).removeprefix("torch."),
        error=mismatched / total,
        mismatched=mismatched,
    )


def stats_metrics(golden: Record, actual: Record, *, dtype: str) -> Metrics:
    """Compare the recorded statistics of two records (the weaker, stats-only test), each
    statistic's difference over ``max(|golden value|, rms(golden))`` (:func:`_stat_diffs`)
    and the sampled elements and per-position norms they keep."""
    gs, as_ = golden.stats, actual.stats
    if gs is None or as_ is None:
        return UnmeasuredMetrics(
            level="none", dtype=dtype, error=0.0, note="no statistics recorded"
        )
    rms = golden_rms(gs) or 0.0
    # a causal mask: the golden holds another precision's stand-in for -inf (fp32's
    # finfo.min where the actual has bf16's); the statistics they dominate say nothing,
    # the sample (stand-ins on both sides equal) and the max do
    floor = mask_floor(dtype)
    masked = floor > -math.inf and gs.min is not None and gs.min <= floor
    compared = ("max",) if masked else ("min", "max", "mean", "std", "absmax", "l2")
    diffs = _stat_diffs(gs, as_, compared, rms)
    error = max(diffs.values()) if diffs else 0.0
    level_note = STATS_NOTE
    if not is_float_dtype(golden.dtype) and not is_float_dtype(actual.dtype):
        level_note = "statistics only (integer tensor): equal statistics suggest equal values"
    if masked:
        evidence, peak = sample_evidence(golden, actual, 0.0, mask_floor=floor)
    else:
        evidence, peak = sample_evidence(golden, actual, rms)
        evidence |= position_evidence(golden, actual)
    if evidence.get("sample_rel_l2") is not None:
        # an estimate of rel_l2, never below what the norms prove: |l2_a - l2_g| / l2_g
        # and the per-position norms' difference are lower bounds on it
        pos = evidence.get("pos_rel_l2") or 0.0
        error = max(evidence["sample_rel_l2"], pos, diffs.get("l2", 0.0))
        level_note = SAMPLE_NOTE
    evidence |= concentrated_evidence(evidence, peak)
    nan = _count_mismatch(gs.nan, as_.nan, gs.has_nan, as_.has_nan)
    inf = _count_mismatch(gs.inf, as_.inf, gs.has_inf, as_.has_inf)
    if nan or inf:
        level_note = (
            f"{nan} NaN and {inf} Inf on one side only; the sampled error is over the "
            f"sampled elements finite on both sides. {level_note}"
        )
    return StatsMetrics(
        level="stats",
        dtype=dtype,
        error=error,
        stat_rel_diff=diffs,
        nan_mismatch=nan,
        inf_mismatch=inf,
        note=level_note,
        **evidence,
    )


def _stat_diffs(gs: Stats, as_: Stats, compared: tuple[str, ...], rms: float) -> dict[str, float]:
    """Each statistic's difference over ``max(|golden value|, rms(golden))``, and the zero
    counts' over the element count (a statistic one side did not record is left out: an
    imported msprobe dump)."""
    diffs: dict[str, float] = {}
    for name in compared:
        gv, av = getattr(gs, name), getattr(as_, name)
        if gv is None or av is None:
            continue
        if not (math.isfinite(gv) and math.isfinite(av)):
            diffs[name] = 0.0 if (gv == av or (math.isnan(gv) and math.isnan(av))) else math.inf
            continue
        den = max(abs(gv), rms, 1e-30)
        diffs[name] = abs(av - gv) / den
    if gs.numel and as_.numel and gs.zeros is not None and as_.zeros is not None:
        diffs["zeros"] = abs(as_.zeros - gs.zeros) / max(gs.numel, 1)
    return diffs


SAMPLE_NOTE = (
    "statistics and sampled elements only, a weaker test: the error is an estimate from the "
    "sample; record full tensors (--tensors) of this module for a conclusive test"
)


def concentrated_evidence(evidence: dict[str, Any], peak: float | None) -> dict[str, Any]:
    """The full level's concentrated-error fields, as far as the sample and norms show them:
    ``peak_error`` the sampled elements' largest error over their largest golden value
    (:func:`precguard.compare.sampled.sample_evidence`), ``slice_error`` the worst
    position's norm difference (a lower bound on that position's relative error)."""
    out: dict[str, Any] = {}
    if peak is not None and math.isfinite(peak):
        out["peak_error"] = peak
    if evidence.get("pos_worst_err") is not None:
        out |= {
            "slice_error": evidence["pos_worst_err"],
            "slice_dim": evidence.get("pos_dim"),
            "slice_index": evidence.get("pos_worst"),
        }
    return out


def _count_mismatch(g: int | None, a: int | None, g_has: bool, a_has: bool) -> int:
    """How many more NaN (or Inf) one side has; 1 or 0 from presence where a count is unknown."""
    if g is not None and a is not None:
        return abs(a - g)
    return int(g_has != a_has)


assert set(STAT_FIELDS) >= {"min", "max", "mean", "std", "absmax", "l2", "nan", "inf", "zeros"}
