"""Error metrics for one pair of records, computed in bounded memory.

Full tensors are walked in chunks of :data:`CHUNK` elements: each chunk is
upcast to float64 (exactly: every float16/bf16/float32 value is a float64),
differenced and reduced, and only running sums survive between chunks. Every
reduction accumulates in float64, so a metric does not depend on the chunk
size, the thread count or the BLAS build beyond float64 rounding (~1e-16
relative per term). The inputs are memory-mapped views, so the pages of a
tensor are read once and memory stays bounded by the chunk.

Besides the error norms, the chunks accumulate the systematic part of the
error: the least-squares scale of actual on golden, ``s = <a,g>/<g,g>``, and
its standard error, estimated from :data:`BIAS_BLOCKS` contiguous blocks of
the flattened tensor (a cluster-robust estimate: rounding errors that are
correlated within a row, such as a normalization's per-row scale, widen it
instead of passing for a bias).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from precguard.compare.levels import (
    ExactMetrics,
    FullMetrics,
    Metrics,
    StatsMetrics,
    UnmeasuredMetrics,
)
from precguard.compare.sampled import position_evidence, sample_evidence
from precguard.compare.tolerance import Profile
from precguard.dump.schema import STAT_FIELDS, Record, Stats
from precguard.numerics import SIGNIFICAND_BITS, SLICE_FLOOR, less_precise, relative_l2

#: elements per chunk: 256 KiB of float32 keeps the working set in cache
CHUNK = 1 << 16
#: relative-error bands reported as shares (msprobe's 1% / 0.1% / 0.01%)
REL_BANDS: tuple[float, ...] = (1e-2, 1e-3, 1e-4)
#: guard for relative errors: the denominator is at least this share of rms(golden)
REL_FLOOR = 1e-3
#: contiguous blocks of the flattened tensor over which the scale's standard error is
#: estimated (fewer when the tensor has fewer elements)
BIAS_BLOCKS = 64
#: a dimension with at least this many indices is also a clustering of the scale's
#: standard error (each index one cluster: a channel's rounded weights, a repeated row)
BIAS_MIN_CLUSTERS = 16
#: dimensions longer than this are not sliced (one accumulator entry per index)
MAX_SLICED = 1 << 18

STATS_NOTE = (
    "statistics only, a weaker test: equal statistics do not prove equal tensors; record full "
    "tensors (--tensors) of this module for a conclusive test"
)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# float dtype -> (same-size int dtype, wider numpy int for differences, bits below the sign)
_BITS = {
    torch.float32: (torch.int32, np.int64, 0x7FFFFFFF),
    torch.float16: (torch.int16, np.int32, 0x7FFF),
    torch.bfloat16: (torch.int16, np.int32, 0x7FFF),
    torch.float64: (torch.int64, np.float64, 0x7FFFFFFFFFFFFFFF),
}


#: accepted values of ``tolerance_dtype`` besides a float dtype name
TOLERANCE_MODES = ("auto", "actual", "golden")


def tolerance_dtype(golden: str, actual: str, mode: str = "auto") -> str:
    """The dtype whose tolerances judge a pair, from each side's compute precision.

    ``golden`` and ``actual`` are the precisions the two values were computed in
    (see :func:`precision`). ``mode="auto"`` (default, also spelled ``"actual"``):
    the less precise of the two, since a value computed in bf16 cannot be asked to
    match beyond bf16's rounding. ``mode="golden"``: the golden's precision, holding a
    bf16 run to its fp32 reference. A float dtype name (``"bfloat16"``) judges every
    pair by that dtype.
    """
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
    of :func:`tolerance_dtype` when either side is a float, equality otherwise.

    ``golden_dtype``/``actual_dtype`` are the precisions each side computed in
    (:func:`precision`); ULPs are counted in the actual's. ``tol_mode`` is that of
    :func:`tolerance_dtype` (compare passes ``"auto"``; the default ``"golden"`` holds a
    replay in another dtype to the golden's precision). ``golden_rms`` and ``release``
    are passed on to :func:`full_metrics`.
    """
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


@dataclass
class _Acc:
    n: int = 0
    sum_abs: float = 0.0
    sum_sq: float = 0.0
    gg: float = 0.0
    aa: float = 0.0
    ga: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: int = 0
    not_close: int = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    #: elements NaN or Inf on either side (left out of every error metric)
    nonfinite: int = 0
    sum_signed_rel: float = 0.0
    bands: list[int] = field(default_factory=lambda: [0] * len(REL_BANDS))
    g_absmax: float = 0.0
    #: per bias block: <g, a-g> and <g, g>
    block_gd: np.ndarray | None = None
    block_gg: np.ndarray | None = None
    #: per sliced dimension: sum of (a-g)^2 and of g^2 over each index of that dimension
    slice_dd: dict[int, np.ndarray] = field(default_factory=dict)
    slice_gg: dict[int, np.ndarray] = field(default_factory=dict)
    #: per sliced dimension: <g, a-g> over each index (the scale's clusters along it)
    slice_gd: dict[int, np.ndarray] = field(default_factory=dict)

    def merge(self, part: _Acc) -> None:
        self.n += part.n
        self.sum_abs += part.sum_abs
        self.sum_sq += part.sum_sq
        self.gg += part.gg
        self.aa += part.aa
        self.ga += part.ga
        self.max_abs = max(self.max_abs, part.max_abs)
        self.max_rel = max(self.max_rel, part.max_rel)
        self.max_ulp = max(self.max_ulp, part.max_ulp)
        self.not_close += part.not_close
        self.nan_mismatch += part.nan_mismatch
        self.inf_mismatch += part.inf_mismatch
        self.nonfinite += part.nonfinite
        self.sum_signed_rel += part.sum_signed_rel
        self.bands = [x + y for x, y in zip(self.bands, part.bands, strict=True)]
        self.g_absmax = max(self.g_absmax, part.g_absmax)
        for dim, dd in part.slice_dd.items():
            if dim in self.slice_dd:
                self.slice_dd[dim] += dd
                self.slice_gg[dim] += part.slice_gg[dim]
                self.slice_gd[dim] += part.slice_gd[dim]
            else:
                self.slice_dd[dim] = dd.copy()
                self.slice_gg[dim] = part.slice_gg[dim].copy()
                self.slice_gd[dim] = part.slice_gd[dim].copy()
        if part.block_gd is not None and part.block_gg is not None:
            if self.block_gd is None or self.block_gg is None:
                self.block_gd, self.block_gg = part.block_gd.copy(), part.block_gg.copy()
            else:
                self.block_gd += part.block_gd
                self.block_gg += part.block_gg


@dataclass(frozen=True)
class _Params:
    ulp_dtype: torch.dtype
    floor: float
    rtol: float
    atol: float
    block_size: int
    blocks: int
    #: (dimension, its size, its stride in the flattened tensor) for each sliced dimension
    slices: tuple[tuple[int, int, int], ...] = ()
    #: the most negative finite value of the actual's precision: an element at or below it
    #: on both sides is each side's stand-in for -inf (a causal mask's finfo(dtype).min)
    mask_floor: float = -math.inf


def _pool() -> ThreadPoolExecutor | None:
    """A thread pool when ``PRECGUARD_COMPARE_THREADS`` asks for more than one thread.

    One thread is the default: each chunk is ~30 short numpy calls, and on a
    busy machine a thread descheduled while it holds the GIL stalls the others
    for a whole time slice (measured: 1.5 GB/s on one thread, 0.05-0.1 GB/s on
    two threads of a loaded 2-core machine). On a quiet many-core host, threads
    pay off.
    """
    global _POOL
    try:
        workers = int(os.environ.get("PRECGUARD_COMPARE_THREADS", "1"))
    except ValueError:
        workers = 1
    workers = max(1, min(workers, 64))
    if workers == 1:
        return None
    if _POOL is None or _POOL[0] != workers:
        _POOL = (workers, ThreadPoolExecutor(workers, thread_name_prefix="precguard-compare"))
    return _POOL[1]


_POOL: tuple[int, ThreadPoolExecutor] | None = None


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
    shape: tuple[int, ...] | list[int] | None = None,
) -> Metrics:
    """Compare two full tensors of equal element count, chunk by chunk.

    ``dtype`` names the dtype whose tolerances apply (reported on the metrics);
    ULPs are counted in ``ulp_dtype`` (default: the actual tensor's float dtype,
    golden rounded to it first); ``rtol``/``atol`` define the element-wise
    closeness test reported as ``close_share``; ``golden_rms`` (from the recorded
    statistics) sets the relative-error floor without an extra pass. Chunks run on
    one thread, or on ``PRECGUARD_COMPARE_THREADS`` threads (numpy releases the GIL);
    ``release(start, end)``, if given, is called once each chunk's elements
    are no longer needed (the tensor store gives their pages back).

    Along each dimension of ``shape`` (default: the golden's), the chunks also
    accumulate the error of every slice (one position, one channel, one head when
    heads have a dimension of their own): ``slice_error`` is the worst slice's
    relative L2 error, so an error confined to late positions or a few channels is
    seen although the tensor's global ``rel_l2`` is small.
    """
    g_flat = golden.reshape(-1)
    a_flat = actual.reshape(-1)
    numel = g_flat.numel()
    if golden_rms is None or not math.isfinite(golden_rms):
        golden_rms = _rms(g_flat, chunk)
    blocks = max(1, min(BIAS_BLOCKS, numel))
    params = _Params(
        ulp_dtype=_ulp_dtype(ulp_dtype, actual.dtype, golden.dtype),
        floor=max(REL_FLOOR * golden_rms, torch.finfo(torch.float64).tiny),
        rtol=rtol,
        atol=max(atol, rtol * golden_rms),
        block_size=-(-numel // blocks),
        blocks=blocks,
        slices=_sliced_dims(tuple(golden.shape) if shape is None else tuple(shape), numel),
        mask_floor=_mask_floor(_ulp_dtype(ulp_dtype, actual.dtype, golden.dtype)),
    )
    acc = _Acc()
    starts = range(0, numel, chunk)
    pool = _pool() if numel > 2 * chunk else None

    def one(start: int) -> _Acc:
        part = _chunk(g_flat[start : start + chunk], a_flat[start : start + chunk], start, params)
        if release is not None:
            release(start, min(start + chunk, numel))
        return part

    parts = map(one, starts) if pool is None else pool.map(one, starts)
    for part in parts:
        acc.merge(part)
    return _finish(acc, dtype, numel, golden_rms, params.slices)


def _mask_floor(dtype: torch.dtype) -> float:
    """Values at or below this are a precision's stand-in for -inf (None: no such floor)."""
    if dtype in (torch.float16, torch.bfloat16):
        return float(torch.finfo(dtype).min)
    return -math.inf


def _sliced_dims(shape: tuple[int, ...], numel: int) -> tuple[tuple[int, int, int], ...]:
    """The dimensions whose slices are measured: size > 1 and not one element per slice."""
    if math.prod(shape) != numel or len(shape) < 2:
        return ()
    out = []
    stride = 1
    for dim in range(len(shape) - 1, -1, -1):
        size = shape[dim]
        if 1 < size <= MAX_SLICED and size < numel:
            out.append((dim, size, stride))
        stride *= size
    return tuple(out)


def _slice_sums(x: np.ndarray, start: int, size: int, stride: int) -> np.ndarray:
    """Sum of ``x`` (elements ``start...`` of the flattened tensor) per index of one dim."""
    n = x.size
    if stride == 1 and start % size == 0 and n % size == 0:
        summed: np.ndarray = x.reshape(-1, size).sum(axis=0)
        return summed
    first, last = start // stride, (start + n - 1) // stride
    if last - first < 64:  # a few runs of consecutive elements share an index
        edges = [0, *(i * stride - start for i in range(first + 1, last + 1))]
        runs = np.add.reduceat(x, edges)
        out = np.zeros(size, dtype=np.float64)
        np.add.at(out, np.arange(first, last + 1) % size, runs)
        return out
    idx = (np.arange(start, start + n) // stride) % size
    counted: np.ndarray = np.bincount(idx, weights=x, minlength=size)
    return counted


def _ulp_dtype(name: str | None, actual: torch.dtype, golden: torch.dtype) -> torch.dtype:
    chosen = getattr(torch, name, None) if name is not None else None
    if isinstance(chosen, torch.dtype):
        return chosen
    # a compute precision that is no storage dtype (tfloat32, hfloat32): ULPs of the
    # stored values
    return actual if actual in _FLOATS else (golden if golden in _FLOATS else torch.float32)


# The hot loop stays in numpy: a torch kernel on a 64 Ki chunk wakes torch's
# intra-op threads, which on a busy 2-core machine cost 20x more than the work.


def _raw(t: torch.Tensor) -> np.ndarray:
    """The elements of ``t`` as numpy without running a torch kernel (bf16 as uint16 bits)."""
    if t.dtype is torch.bfloat16:
        raw: np.ndarray = t.view(torch.int16).numpy().view(np.uint16)
        return raw
    if t.dtype.itemsize == 1 and t.dtype.is_floating_point:  # float8: numpy has none
        return t.float().numpy()  # exact: every float8 value is a float32
    return t.numpy()


def _as_numpy(t: torch.Tensor, work: torch.dtype = torch.float64) -> np.ndarray:
    """``t`` as a numpy array of ``work`` (float32 or float64), exact upcasts only."""
    target = np.float64 if work is torch.float64 else np.float32
    raw = _raw(t)
    if t.dtype is torch.bfloat16:
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(target, copy=False)


def _rms(flat: torch.Tensor, chunk: int) -> float:
    """Root mean square of the finite elements, in float64 (masks hold float32's min)."""
    total = 0.0
    for start in range(0, flat.numel(), chunk):
        c = _as_numpy(flat[start : start + chunk], torch.float64)
        # in place on a fresh upcast; copy when c still views the recording
        c = np.nan_to_num(c, copy=c.base is not None, nan=0.0, posinf=0.0, neginf=0.0)
        total += float(np.dot(c, c))
    return math.sqrt(total / max(flat.numel(), 1))


def _bits(x: np.ndarray, original: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """Bit patterns of ``x`` rounded (to nearest even) to ``dtype``, as signed integers."""
    if dtype is torch.bfloat16:
        if original.dtype is torch.bfloat16:
            bf: np.ndarray = _raw(original).view(np.int16)
            return bf
        f = x.astype(np.float32, copy=False).view(np.uint32)
        rounded = (f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        out: np.ndarray = rounded.astype(np.uint16).view(np.int16)
        return out
    if dtype is torch.float16:
        return x.astype(np.float16, copy=False).view(np.int16)
    if dtype is torch.float64:
        return x.astype(np.float64, copy=False).view(np.int64)
    return x.astype(np.float32, copy=False).view(np.int32)


def _ordered_bits(x: np.ndarray, original: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """Map floats to integers whose differences count representable values between them.

    The bit patterns are sign-magnitude; negating the magnitude of negative values
    turns them into ordered integers on which -0.0 and +0.0 coincide.
    """
    _, np_int, mask = _BITS[dtype]
    bits = _bits(x, original, dtype)
    sign = bits >> (bits.itemsize * 8 - 1)  # -1 for negative values, 0 otherwise
    ordered = ((bits & mask) ^ sign) - sign  # no overflow: |magnitude| < 2**(width-1)
    wide: np.ndarray = ordered.astype(np_int)
    return wide


def _max_ulp(g: np.ndarray, a: np.ndarray, g_t: torch.Tensor, a_t: torch.Tensor, p: _Params) -> int:
    if p.ulp_dtype is torch.float32 and g_t.dtype is torch.float32 is a_t.dtype:
        # Same sign (the common case): the bit patterns are ordered like the values, so
        # their int32 difference is the ULP distance and cannot overflow.
        gi, ai = g_t.numpy().view(np.int32), a_t.numpy().view(np.int32)
        if (gi ^ ai).min() >= 0:  # no sign bit differs
            diff = ai.astype(np.int64) - gi
            np.abs(diff, out=diff)
            return int(diff.max())
    ulp = _ordered_bits(a, a_t, p.ulp_dtype) - _ordered_bits(g, g_t, p.ulp_dtype)
    return int(max(ulp.max(), -ulp.min()))


def _block_dots(x: np.ndarray, y: np.ndarray, start: int, p: _Params) -> np.ndarray:
    """``<x, y>`` per bias block over elements ``start...`` of the tensor, as a full array.

    A chunk lies in one block for large tensors: one fp64 dot product, no temporary.
    """
    out = np.zeros(p.blocks, dtype=np.float64)
    first = start // p.block_size
    last = (start + x.size - 1) // p.block_size
    if first == last:
        out[first] = float(np.dot(x, y))
        return out
    edges = [0, *(b * p.block_size - start for b in range(first + 1, last + 1))]
    out[first : last + 1] = np.add.reduceat(x * y, edges)
    return out


def _chunk(g_t: torch.Tensor, a_t: torch.Tensor, start: int, p: _Params) -> _Acc:
    acc = _Acc()
    g, a = _as_numpy(g_t), _as_numpy(a_t)
    if g.size == 0:
        return acc
    with np.errstate(all="ignore"):
        if p.mask_floor > -math.inf and float(g.min()) <= p.mask_floor:
            # -inf stand-ins (finfo(dtype).min of each side's precision) are equal
            masked = (g <= p.mask_floor) & (a <= p.mask_floor)
            a = np.where(masked, g, a)
        d = a - g  # exact in float64 for float32 and narrower inputs
        acc.sum_sq = float(np.dot(d, d))
        if not math.isfinite(acc.sum_sq):
            # Slow path, only for chunks holding NaN/Inf (or overflowing):
            # count mismatches, then measure the elements finite on both sides.
            g_nan, a_nan = np.isnan(g), np.isnan(a)
            acc.nan_mismatch = int(np.count_nonzero(g_nan != a_nan))
            g_inf, a_inf = np.isinf(g), np.isinf(a)
            acc.inf_mismatch = int(np.count_nonzero((g_inf | a_inf) & (g != a) & ~(g_nan | a_nan)))
            both = np.isfinite(g) & np.isfinite(a)
            acc.nonfinite = int(both.size - np.count_nonzero(both))
            g = np.where(both, g, 0.0)
            a = np.where(both, a, 0.0)
            g_t = torch.from_numpy(g).to(g_t.dtype)
            a_t = torch.from_numpy(a).to(a_t.dtype)
            d = a - g
            acc.sum_sq = float(np.dot(d, d))
        acc.n = d.size
        acc.g_absmax = float(np.abs(g).max())
        acc.block_gg = _block_dots(g, g, start, p)
        acc.gg = float(acc.block_gg.sum())
        if acc.sum_sq == 0 and not np.any(d):
            # Bitwise equal chunk (weights, exact layers): nothing else to measure.
            acc.aa = acc.ga = acc.gg
            acc.block_gd = np.zeros(p.blocks, dtype=np.float64)
            if p.slices:
                g2 = g * g
                for dim, size, stride in p.slices:
                    acc.slice_gg[dim] = _slice_sums(g2, start, size, stride)
                    acc.slice_dd[dim] = np.zeros(size, dtype=np.float64)
                    acc.slice_gd[dim] = np.zeros(size, dtype=np.float64)
            return acc
        acc.block_gd = _block_dots(g, d, start, p)
        if p.slices:
            g2, d2, gd2 = g * g, d * d, g * d
            for dim, size, stride in p.slices:
                acc.slice_dd[dim] = _slice_sums(d2, start, size, stride)
                acc.slice_gg[dim] = _slice_sums(g2, start, size, stride)
                acc.slice_gd[dim] = _slice_sums(gd2, start, size, stride)
        gd = float(acc.block_gd.sum())
        # <g,a> and <a,a> from <g,g>, <g,d>, <d,d>: a = g + d
        acc.ga = acc.gg + gd
        acc.aa = acc.gg + 2.0 * gd + acc.sum_sq
        acc.max_ulp = _max_ulp(g, a, g_t, a_t, p)
        gabs = np.abs(g)
        rel = d / np.maximum(gabs, p.floor)
        # signed relative error (a-g)/g, |g| floored: a scale fault s gives s-1 everywhere
        acc.sum_signed_rel = float(np.dot(rel, np.sign(g)))
        np.abs(rel, out=rel)
        acc.max_rel = float(rel.max())
        np.abs(d, out=d)
        acc.max_abs = float(d.max())
        acc.sum_abs = float(d.sum())
        if acc.max_abs == 0:
            return acc
        if acc.max_abs > p.atol:  # otherwise every element is within atol: none is "not close"
            gabs *= p.rtol
            gabs += p.atol
            acc.not_close = int(np.count_nonzero(d > gabs))
        # bands are nested (1e-2 > 1e-3 > 1e-4): stop at the first that no element exceeds
        for i, band in sorted(enumerate(REL_BANDS), key=lambda ib: ib[1]):
            if acc.max_rel <= band:
                break
            acc.bands[i] = int(np.count_nonzero(rel > band))
    return acc


def _worst_slice(
    acc: _Acc, rms: float, numel: int, slices: tuple[tuple[int, int, int], ...]
) -> tuple[float | None, int | None, int | None]:
    """The worst slice's relative L2 error, its dimension and index (None: not sliced).

    A slice's golden norm is floored at :data:`SLICE_FLOOR` times the typical slice's
    (rms(golden) per element: a slice below it is judged by its share of the tensor's
    error, the constant's comment derives it); an exactly equal tensor has no slice
    error.
    """
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
    acc: _Acc,
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
    acc: _Acc, u: float = 0.0, channels: int | None = None, rows_per_block: float = 1.0
) -> tuple[float | None, float | None]:
    """Least-squares scale of actual on golden and its cluster-robust standard error.

    ``s - 1 = sum_b c_b / sum_b q_b`` with ``c_b = <g_b, a_b - g_b>`` and
    ``q_b = <g_b, g_b>`` over clusters ``b``; the standard error linearizes that
    ratio: ``sqrt(B/(B-1) * sum_b (c_b - (s-1) q_b)^2) / sum_b q_b``. Two kinds of
    clusters, the larger standard error wins: the :data:`BIAS_BLOCKS` contiguous
    blocks of the flattened tensor (a row's shared rounding, such as a norm's rounded
    per-row scale) and the indices of every dimension with at least
    :data:`BIAS_MIN_CLUSTERS` of them (a rounding shared across rows: a channel's
    rounded weights, rows that repeat one another), so an error pattern the rows
    share widens it instead of passing for a bias.

    Where a few clusters hold most of ``<g, g>`` (an outlier channel, a few long
    rows) their spread says little, so the standard error is at least that of one
    rounding of unit roundoff ``u`` (uniform: standard deviation ``u / sqrt(3)``)
    shared within each row (a block holds ``rows_per_block`` of them), or within each
    index of the ``channels`` dimension (the last one), averaged over the effective
    number of such clusters ``n_eff = (sum_b q_b)^2 / sum_b q_b^2``:
    ``u / sqrt(3 n_eff)``.
    """
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
        g = _raw(g_flat[start : start + chunk])
        a = _raw(a_flat[start : start + chunk])
        mismatched += int(np.count_nonzero(g != a))
    total = max(g_flat.numel(), 1)
    return ExactMetrics(
        level="exact",
        dtype=str(golden.dtype).removeprefix("torch."),
        error=mismatched / total,
        mismatched=mismatched,
    )


def stats_metrics(golden: Record, actual: Record, *, dtype: str) -> Metrics:
    """Compare the recorded statistics of two records (the weaker, stats-only test).

    Each statistic's difference is divided by ``max(|golden value|, rms(golden))``
    so that statistics near zero (a mean of a centred tensor) are judged against
    the tensor's scale rather than blowing up.
    """
    gs, as_ = golden.stats, actual.stats
    if gs is None or as_ is None:
        return UnmeasuredMetrics(
            level="none", dtype=dtype, error=0.0, note="no statistics recorded"
        )
    rms = golden_rms(gs) or 0.0
    # a causal mask: the golden holds another precision's stand-in for -inf (fp32's
    # finfo.min where the actual has bf16's); the statistics they dominate say nothing,
    # the sample (stand-ins on both sides equal) and the max do
    chosen = getattr(torch, dtype, None)
    floor = _mask_floor(chosen) if isinstance(chosen, torch.dtype) else -math.inf
    masked = floor > -math.inf and gs.min is not None and gs.min <= floor
    compared = ("max",) if masked else ("min", "max", "mean", "std", "absmax", "l2")
    diffs = _stat_diffs(gs, as_, compared, rms)
    error = max(diffs.values()) if diffs else 0.0
    if not is_float_dtype(golden.dtype) and not is_float_dtype(actual.dtype):
        level_note = "statistics only (integer tensor): equal statistics suggest equal values"
    else:
        level_note = STATS_NOTE
    if masked:
        evidence, peak = sample_evidence(golden, actual, 0.0, mask_floor=floor)
    else:
        evidence, peak = sample_evidence(golden, actual, rms)
        evidence |= position_evidence(golden, actual)
    if evidence.get("sample_rel_l2") is not None:
        # an estimate of rel_l2, never below what the norms prove: |l2_a - l2_g| / l2_g
        # and the per-position norms' difference are lower bounds on it
        bounds = [evidence["sample_rel_l2"], evidence.get("pos_rel_l2") or 0.0]
        if "l2" in diffs:
            bounds.append(diffs["l2"])
        error = max(bounds)
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
    """The full level's concentrated-error fields, as far as the sample and norms show them.

    ``peak_error``: the sampled elements' largest error over their largest golden
    value (:func:`precguard.compare.sampled.sample_evidence`), judged like the full
    level's against ``u * max|golden|``; ``slice_error``: the worst position's norm
    difference, a lower bound on that position's relative error. So the
    expected-error judge sees an error confined to late positions in a
    statistics-only actual too.
    """
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
