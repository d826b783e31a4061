"""Two tensors' difference, accumulated chunk by chunk in bounded memory: the one measure.

:func:`precguard.numerics.measure` and compare's metrics
(:func:`precguard.compare.metrics.full_metrics`) both run :func:`accumulate`, so
every tool that measures an error (compare, replay, bisect, impact, op-check,
generate-diff) sums the same squares in the same order.

The flattened tensors are walked in chunks of :data:`CHUNK` elements: each chunk is
upcast to float64 (exactly: every float16/bf16/float32 value is a float64),
differenced and reduced, and only running sums survive between chunks. Every
reduction accumulates in float64, so a sum does not depend on the chunk size, the
thread count or the BLAS build beyond float64 rounding (~1e-16 relative per term).
Memory-mapped inputs are read once, and memory stays bounded by the chunk.

Besides the error norms, the chunks accumulate the systematic part of the error:
``<g, a - g>`` and ``<g, g>`` per contiguous block of the flattened tensor and per
index of each sliced dimension (compare's least-squares scale and its cluster-robust
standard error are built from them).

It imports nothing of precguard: :mod:`precguard.numerics` asks it.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: elements per chunk: 256 KiB of float32 keeps the working set in cache
CHUNK = 1 << 16
#: relative-error bands reported as shares (msprobe's 1% / 0.1% / 0.01%)
REL_BANDS: tuple[float, ...] = (1e-2, 1e-3, 1e-4)
#: contiguous blocks of the flattened tensor over which the scale's standard error is
#: estimated (fewer when the tensor has fewer elements)
BIAS_BLOCKS = 64
#: dimensions longer than this are not sliced (one accumulator entry per index)
MAX_SLICED = 1 << 18

#: the float dtypes whose ULPs are counted from their bit patterns, by name
FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


@functools.cache
def _floats() -> tuple[torch.dtype, ...]:
    """The dtypes of :data:`FLOAT_NAMES` (torch imported when a tensor is measured)."""
    import torch

    return tuple(getattr(torch, name) for name in FLOAT_NAMES)


@functools.cache
def _int_views() -> dict[torch.dtype, tuple[torch.dtype, type, int]]:
    """float dtype -> (same-size int dtype, wider numpy int for differences, bits below the
    sign)."""
    import torch

    return {
        torch.float32: (torch.int32, np.int64, 0x7FFFFFFF),
        torch.float16: (torch.int16, np.int32, 0x7FFF),
        torch.bfloat16: (torch.int16, np.int32, 0x7FFF),
        torch.float64: (torch.int64, np.float64, 0x7FFFFFFFFFFFFFFF),
    }


@dataclass
class Sums:
    """The running sums and extremes of one pair's difference ``d = a - g`` (float64)."""

    n: int = 0
    sum_abs: float = 0.0
    sum_sq: float = 0.0
    gg: float = 0.0
    aa: float = 0.0
    ga: float = 0.0
    max_abs: float = 0.0
    #: max |d| / max(|g|, floor) and the signed sum of (a-g)/g over the elements
    max_rel: float = 0.0
    sum_signed_rel: float = 0.0
    #: max distance in representable values of :attr:`Plan.ulp_dtype`
    max_ulp: int = 0
    #: max |d| in units of :attr:`Plan.spacing`'s spacing at golden
    max_spacing: float = 0.0
    not_close: int = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    #: elements NaN or Inf on either side (left out of every error metric)
    nonfinite: int = 0
    golden_nan: int = 0
    golden_inf: int = 0
    actual_nan: int = 0
    actual_inf: int = 0
    bands: list[int] = field(default_factory=lambda: [0] * len(REL_BANDS))
    g_absmax: float = 0.0
    sum_gabs: float = 0.0
    #: per bias block: <g, a-g> and <g, g>
    block_gd: np.ndarray | None = None
    block_gg: np.ndarray | None = None
    #: per sliced dimension: sum of (a-g)^2 and of g^2 over each index of that dimension
    slice_dd: dict[int, np.ndarray] = field(default_factory=dict)
    slice_gg: dict[int, np.ndarray] = field(default_factory=dict)
    #: per sliced dimension: <g, a-g> over each index (the scale's clusters along it)
    slice_gd: dict[int, np.ndarray] = field(default_factory=dict)

    def merge(self, part: Sums) -> None:
        """Add the sums of the next chunk (chunks merge in order: the sums do not depend on
        the thread count)."""
        own, other = vars(self), vars(part)  # the fields by name (plain data, no hook)
        for name in _SUMMED:
            own[name] += other[name]
        for name in _MAXED:
            own[name] = max(own[name], other[name])
        self.bands = [x + y for x, y in zip(self.bands, part.bands, strict=True)]
        for mine, theirs in (
            (self.slice_dd, part.slice_dd),
            (self.slice_gg, part.slice_gg),
            (self.slice_gd, part.slice_gd),
        ):
            for dim, values in theirs.items():
                if dim in mine:
                    mine[dim] += values
                else:
                    mine[dim] = values.copy()
        if part.block_gd is not None and part.block_gg is not None:
            if self.block_gd is None or self.block_gg is None:
                self.block_gd, self.block_gg = part.block_gd.copy(), part.block_gg.copy()
            else:
                self.block_gd += part.block_gd
                self.block_gg += part.block_gg


_MAXED = ("max_abs", "max_rel", "max_ulp", "max_spacing", "g_absmax")
#: the scalar fields a chunk adds to the total: every other number
_SUMMED = tuple(f.name for f in fields(Sums) if f.default == 0 and f.name not in _MAXED)


@dataclass(frozen=True)
class Plan:
    """What the chunks measure besides the norms."""

    #: relative errors divide by max(|g|, floor)
    floor: float
    #: element-wise closeness: |d| <= atol + rtol |g| (atol inf: not counted)
    rtol: float = 0.0
    atol: float = math.inf
    #: the contiguous blocks of the scale's clusters (:func:`blocks`)
    block_size: int = 1
    blocks: int = 1
    #: the precision whose representable values count ULPs (None: not counted)
    ulp_dtype: torch.dtype | None = None
    #: the precision whose spacing at golden counts :attr:`Sums.max_spacing` (None: not)
    spacing: torch.dtype | None = None
    #: (dimension, its size, its stride in the flattened tensor) for each sliced dimension
    slices: tuple[tuple[int, int, int], ...] = ()
    #: the most negative finite value of the actual's precision: an element at or below it
    #: on both sides is each side's stand-in for -inf (a causal mask's finfo(dtype).min)
    mask_floor: float = -math.inf


def blocks(numel: int) -> dict[str, int]:
    """The :class:`Plan` fields of :data:`BIAS_BLOCKS` contiguous blocks of ``numel``."""
    count = max(1, min(BIAS_BLOCKS, numel))
    return {"block_size": -(-numel // count), "blocks": count}


def accumulate(
    golden: torch.Tensor,
    actual: torch.Tensor,
    plan: Plan,
    *,
    chunk: int = CHUNK,
    release: Callable[[int, int], None] | None = None,
) -> Sums:
    """The sums of ``actual - golden`` (CPU tensors of equal element count), chunk by chunk.

    Chunks run on one thread, or on ``PRECGUARD_COMPARE_THREADS`` threads (numpy
    releases the GIL); ``release(start, end)``, if given, is called once each chunk's
    elements are no longer needed (the tensor store gives their pages back).
    """
    g_flat, a_flat = golden.reshape(-1), actual.reshape(-1)
    numel = g_flat.numel()
    sums = Sums()
    pool = _pool() if numel > 2 * chunk else None

    def one(start: int) -> Sums:
        part = _chunk(g_flat[start : start + chunk], a_flat[start : start + chunk], start, plan)
        if release is not None:
            release(start, min(start + chunk, numel))
        return part

    starts = range(0, numel, chunk)
    for part in map(one, starts) if pool is None else pool.map(one, starts):
        sums.merge(part)
    return sums


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


def sliced_dims(shape: tuple[int, ...], numel: int) -> tuple[tuple[int, int, int], ...]:
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


def ulp_dtype(name: str | None, actual: torch.dtype, golden: torch.dtype) -> torch.dtype:
    """The dtype named ``name``, else the stored dtype whose representable values count ULPs."""
    import torch

    chosen = getattr(torch, name, None) if name is not None else None
    if isinstance(chosen, torch.dtype):
        return chosen
    # a compute precision that is no storage dtype (tfloat32, hfloat32): ULPs of the
    # stored values
    return actual if actual in _floats() else (golden if golden in _floats() else torch.float32)


# The hot loop stays in numpy: a torch kernel on a 64 Ki chunk wakes torch's
# intra-op threads, which on a busy 2-core machine cost 20x more than the work.


def raw(t: torch.Tensor) -> np.ndarray:
    """The elements of ``t`` as numpy without running a torch kernel (bf16 as uint16 bits)."""
    import torch

    if t.dtype is torch.bfloat16:
        bits: np.ndarray = t.view(torch.int16).numpy().view(np.uint16)
        return bits
    if t.dtype.itemsize == 1 and t.dtype.is_floating_point:  # float8: numpy has none
        return t.float().numpy()  # exact: every float8 value is a float32
    return t.numpy()


def _as_numpy(t: torch.Tensor, work: torch.dtype | None = None) -> np.ndarray:
    """``t`` as a numpy array of ``work`` (float32, or float64 as by default), exact upcasts
    only."""
    import torch

    target = np.float64 if work is None or work is torch.float64 else np.float32
    values = raw(t)
    if t.dtype is torch.bfloat16:
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(target, copy=False)


def rms(flat: torch.Tensor, chunk: int) -> float:
    """Root mean square of the finite elements, in float64 (masks hold float32's min)."""
    import torch

    total = 0.0
    for start in range(0, flat.numel(), chunk):
        c = _as_numpy(flat[start : start + chunk], torch.float64)
        # in place on a fresh upcast; copy when c still views the recording
        c = np.nan_to_num(c, copy=c.base is not None, nan=0.0, posinf=0.0, neginf=0.0)
        total += float(np.dot(c, c))
    return math.sqrt(total / max(flat.numel(), 1))


def _bits(x: np.ndarray, original: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """Bit patterns of ``x`` rounded (to nearest even) to ``dtype``, as signed integers."""
    import torch

    if dtype is torch.bfloat16:
        if original.dtype is torch.bfloat16:
            bf: np.ndarray = raw(original).view(np.int16)
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
    _, np_int, mask = _int_views()[dtype]
    bits = _bits(x, original, dtype)
    sign = bits >> (bits.itemsize * 8 - 1)  # -1 for negative values, 0 otherwise
    ordered = ((bits & mask) ^ sign) - sign  # no overflow: |magnitude| < 2**(width-1)
    wide: np.ndarray = ordered.astype(np_int)
    return wide


def _max_ulp(
    g: np.ndarray, a: np.ndarray, g_t: torch.Tensor, a_t: torch.Tensor, dtype: torch.dtype
) -> int:
    import torch

    if dtype is torch.float32 and g_t.dtype is torch.float32 is a_t.dtype:
        # Same sign (the common case): the bit patterns are ordered like the values, so
        # their int32 difference is the ULP distance and cannot overflow.
        gi, ai = g_t.numpy().view(np.int32), a_t.numpy().view(np.int32)
        if (gi ^ ai).min() >= 0:  # no sign bit differs
            diff = ai.astype(np.int64) - gi
            np.abs(diff, out=diff)
            return int(diff.max())
    ulp = _ordered_bits(a, a_t, dtype) - _ordered_bits(g, g_t, dtype)
    return int(max(ulp.max(), -ulp.min()))


def spacing(g: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The spacing of ``dtype`` at each of ``g`` (float64; subnormal spacing below tiny)."""
    import torch

    info = torch.finfo(dtype)
    bits = -round(math.log2(info.eps))  # significand bits after the point
    lowest = round(math.log2(info.tiny)) + 1
    _, exponent = np.frexp(np.abs(g))
    return np.ldexp(1.0, np.maximum(exponent, lowest) - 1 - bits)


def _block_dots(x: np.ndarray, y: np.ndarray, start: int, p: Plan) -> np.ndarray:
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


def _chunk(g_t: torch.Tensor, a_t: torch.Tensor, start: int, p: Plan) -> Sums:
    import torch

    acc = Sums()
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
            acc.golden_nan, acc.actual_nan = int(g_nan.sum()), int(a_nan.sum())
            acc.golden_inf, acc.actual_inf = int(g_inf.sum()), int(a_inf.sum())
            g = np.where(both, g, 0.0)
            a = np.where(both, a, 0.0)
            g_t = torch.from_numpy(g).to(g_t.dtype)
            a_t = torch.from_numpy(a).to(a_t.dtype)
            d = a - g
            acc.sum_sq = float(np.dot(d, d))
        acc.n = d.size
        gabs = np.abs(g)
        acc.g_absmax = float(gabs.max())
        acc.sum_gabs = float(gabs.sum())
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
        if p.ulp_dtype is not None:
            acc.max_ulp = _max_ulp(g, a, g_t, a_t, p.ulp_dtype)
        rel = d / np.maximum(gabs, p.floor)
        # signed relative error (a-g)/g, |g| floored: a scale fault s gives s-1 everywhere
        acc.sum_signed_rel = float(np.dot(rel, np.sign(g)))
        np.abs(rel, out=rel)
        acc.max_rel = float(rel.max())
        np.abs(d, out=d)
        acc.max_abs = float(d.max())
        acc.sum_abs = float(d.sum())
        if p.spacing is not None:
            acc.max_spacing = float((d / spacing(g, p.spacing)).max())
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
