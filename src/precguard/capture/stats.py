"""Tensor statistics without a host sync per tensor.

On accelerators every statistic (``var_mean``, ``aminmax``, ``count_nonzero``,
NaN and Inf counts; l2 from the variance and mean) stays on the device, stacked
into two small tensors per tensor, and all tensors' statistics of a step come
to the host in one transfer.

On the CPU, reading a scalar is free, so the code branches (see
:func:`_host_stats`). A contiguous float32/float64 tensor goes through the
compiled kernel (``_fused.cpp``, :func:`_fused_stats`): one read of its memory
gives min, max, the zero count, the float64 sum and sum of squares, the
evidence's sample and per-position norms; the spread about the mean is a
second read only where ``sum x^2 - n mean^2`` could lose float32 accuracy.
Without the kernel (an install without a C++ compiler), and for strided
tensors: min and max through NumPy on the tensor's memory, torch's float32
sums of the rows added in float64, the squares once by rows (``vector_norm``
along the last dimension, the squared row norms summed in float64), zeros
counted only when
``min <= 0 <= max``, std from ``sum x^2 - n mean^2`` where that cancellation at
most doubles the rounding, else from the spread about the mean as a second
pass; large contiguous tensors chunk by chunk. NaN/Inf counts only when a sum
(or min or max) is not finite. All paths agree within float32 rounding, also
for tensors whose |mean| is far above their std.

This runs for every tensor of every module call, so it is written for the
interpreter as much as for the machine: no context manager per tensor (the
tensor is detached, so no graph is built without ``torch.no_grad()``), one
dictionary lookup for everything precguard needs to know about a dtype.
"""

from __future__ import annotations

import ctypes
import math
import os
import weakref
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import torch

# in backend.py (below the emulator, which asks it); re-exported here for capture's callers
from precguard.backend import CAPTURE_DEPTH as _STATE
from precguard.backend import capture_scope, in_capture  # noqa: F401
from precguard.capture import evidence as _evidence
from precguard.capture.evidence import _PLANS

try:  # the one-read kernel (capture/_fused.cpp), built when the package is installed
    from precguard.capture import _fused
except ImportError:  # installed without a C++ compiler: NumPy's and torch's passes
    _fused = None  # type: ignore[assignment]

#: which kernel computes CPU statistics here: ``"avx2"`` or ``"baseline"`` (the
#: compiled one-read scan) or ``None`` (NumPy's and torch's passes, :func:`_host_stats`)
FUSED_KERNELS: str | None = None if _fused is None else _fused.kernels

_FLOAT_TYPES = (torch.float32, torch.float64)
_F32, _F64 = _FLOAT_TYPES
_CPU = torch.device("cpu")
_NUMPY_TYPES = {torch.float32: np.float32, torch.float64: np.float64}
_F32_MAX = float(torch.finfo(torch.float32).max)
#: unit roundoffs: of float64, and of the statistics' target (a float32 tensor's
#: statistics to float32 rounding, a float64 tensor's to float64 rounding)
_U64 = 2.0**-53
_UNIT = {torch.float32: 2.0**-24, torch.float64: _U64}
#: the smallest normal number of the precision each path squares a dtype's elements in
#: (torch's float32 ``vector_norm`` for float32 tensors; float64 for float64 ones): see
#: :func:`_sums_are_exact`
_TINY = {torch.float32: float(torch.finfo(torch.float32).tiny), torch.float64: 2.0**-1022}


def _openmp_runtimes() -> set[str]:
    """The OpenMP runtimes (shared libraries) this process has loaded; empty where
    ``/proc/self/maps`` cannot tell (not Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "omp" in line}
    except OSError:
        return set()
    names = ("libgomp", "libiomp", "libomp")
    return {p for p in paths if os.path.basename(p).startswith(names)}


#: a split scan runs on torch's own OpenMP threads: the kernel was built with OpenMP and
#: the process holds one OpenMP runtime (the kernel bound to torch's libgomp). Those
#: threads are awake between torch's ops, so splitting pays from 32 Ki elements (a
#: LLaMA's activations at hidden 256: 0.87 -> 0.55 ms a forward for 63 tensors, two
#: threads); a runtime of the kernel's own would start its threads cold and keep them
#: spinning beside torch's, so then only tensors of 1 Mi elements or more are split.
SHARED_POOL = bool(_fused is not None and _fused.OPENMP and len(_openmp_runtimes()) == 1)
#: tensors of this many elements or more are scanned on torch's number of threads
#: (``torch.get_num_threads()``, at most one per :data:`_FUSED_MIN_RUN` elements), their
#: rows split evenly
FUSED_SPLIT = 1 << 15 if SHARED_POOL else 1 << 20
#: the fewest elements one thread of the kernel scans
_FUSED_MIN_RUN = 1 << 14 if SHARED_POOL else 1 << 18
#: the most threads the kernel's ``scan()`` takes (it refuses more)
FUSED_MAX_THREADS = 1024


class DtypeInfo(NamedTuple):
    """What the capture path needs to know about a dtype, looked up once per tensor."""

    #: the name records carry (``float32``: torch's name without ``torch.``)
    name: str
    #: statistics are recorded for non-empty tensors of this dtype
    has_stats: bool
    is_floating_point: bool


_DTYPE_INFO: dict[torch.dtype, DtypeInfo] = {}


def dtype_info(dtype: torch.dtype) -> DtypeInfo:
    """The :class:`DtypeInfo` of ``dtype`` (computed on first use, then a dict lookup)."""
    info = _DTYPE_INFO.get(dtype)
    if info is None:
        info = DtypeInfo(
            str(dtype).removeprefix("torch."),
            not dtype.is_complex and dtype not in (torch.quint8, torch.qint8),
            dtype.is_floating_point,
        )
        _DTYPE_INFO[dtype] = info
    return info


def has_stats(t: torch.Tensor) -> bool:
    """Return True for tensors whose statistics precguard records (real, non-empty)."""
    return dtype_info(t.dtype).has_stats and t.numel() > 0


class StatsBuffer:
    """Accumulates statistics of many tensors and materializes them in one transfer.

    ``add`` returns a slot; a tensor seen again unchanged (same object, same
    version counter) reuses its slot, so a module's input that is the
    previous module's output costs nothing.

    On the CPU a slot holds Python numbers (reading a CPU scalar costs no
    sync); on accelerators it holds two small device tensors, fetched for
    all slots together in :meth:`materialize`. ``defer=True`` takes the
    accelerator path on any device (tests run it on the CPU).

    With ``evidence=True`` (default) each floating tensor also leaves its
    sampled elements and per-position norms (:mod:`precguard.capture.evidence`),
    gathered on its device and transferred with the statistics.
    """

    # Entries hold weak references: the cache must never keep an activation
    # alive (on a 70B model one activation can be hundreds of MB of device memory).
    _CACHE_SIZE = 256

    def __init__(self, *, defer: bool = False, evidence: bool = True) -> None:
        self._defer = defer
        self._evidence_on = evidence
        # per slot: (plan, gathered values: numpy on the host, a tensor on devices), the
        # record's evidence fields themselves (the compiled kernel's), or None
        self._evidence: list[tuple[_evidence.EvidencePlan, Any] | dict[str, Any] | None] = []
        # per slot: (min, max, mean, std, l2, nonzero, nan, inf) as numbers, the record's
        # stats dict itself (the compiled kernel's), or None (a device slot)
        self._host: list[tuple[float, ...] | dict[str, Any] | None] = []
        # per device slot: [min, max, mean, std, l2] and [nonzero, nan, inf]
        self._dev_floats: list[torch.Tensor] = []
        self._dev_counts: list[torch.Tensor] = []
        self._dev_slots: list[int] = []
        #: per device slot: the largest std and l2 its dtype holds (beyond: inf)
        self._dev_limit: list[float] = []
        self._numel: list[int] = []
        #: the reuse cache: ``(id(t), t._version)`` -> ``(weakref to t, slot, finite)``,
        #: most recently used last; a caller may look a tensor up here itself (the
        #: recording does, once per tensor) and call :meth:`add` only on a miss
        self.reuse: OrderedDict[
            tuple[int, int], tuple[weakref.ref[torch.Tensor], int, bool | None]
        ] = OrderedDict()
        #: per float8 slot: its saturated share, scale and amax (fp8_statistics)
        self._fp8: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._numel)

    def add(
        self, t: torch.Tensor, *, need_finite: bool = False, positions: bool = False
    ) -> tuple[int, bool | None]:
        """Queue statistics of ``t``; return ``(slot, finite)``.

        ``finite`` is True/False when known without a host sync (always on
        the CPU, or when ``need_finite`` forces the sync), else None.
        ``positions``: keep per-position norms if ``t`` is sequence-shaped (forward
        inputs and outputs; not parameters).
        """
        cache_key = (id(t), t._version)
        hit = self.reuse.get(cache_key)
        if hit is not None and hit[0]() is t:
            self.reuse.move_to_end(cache_key)
            slot, finite = hit[1], hit[2]
            if finite is None and need_finite:
                finite = self.finite(slot)
            return slot, finite
        return self.add_new(t, cache_key, need_finite, positions)

    def add_new(
        self, t: torch.Tensor, cache_key: tuple[int, int], need_finite: bool, positions: bool
    ) -> tuple[int, bool | None]:
        """:meth:`add` of a tensor the reuse cache does not hold; ``cache_key`` is
        ``(id(t), t._version)``. The recording calls it after its own cache lookup."""
        cache = self.reuse
        state = _STATE
        state.depth += 1  # also around detach and the dtype cast: emu lets them through
        try:
            # Detached, the reductions build no graph: no torch.no_grad() needed (a
            # plain tensor that does not require grad builds none: detach() costs 1 us;
            # a Parameter is detached to a plain tensor, which takes the fast path)
            x = t if type(t) is torch.Tensor and not t.requires_grad else t.detach()
            fp8_max = None
            dtype = x.dtype
            if dtype is not _F32 and dtype is not _F64:
                fp8_max = _FP8_MAX.get(dtype)  # fp8's own statistics (fp8_statistics)
                # low-precision floats in fp32; integers and bools exactly in fp64
                x = x.float() if x.is_floating_point() else x.double()
                dtype = x.dtype
            n = x.numel()
            slot = len(self._numel)
            deferred = self._defer or not x.is_cpu
            ev: tuple[_evidence.EvidencePlan, Any] | dict[str, Any] | None = None
            plan = None
            if self._evidence_on and t.is_floating_point():
                # plan_for's cache hit, inlined (once per tensor); the LRU order is kept
                # (a torch.Size is a tuple: the same key as plan_for's)
                device = x.device if deferred else _CPU
                key = (x.shape, device, positions)
                plan = _PLANS.get(key)
                if plan is None:
                    plan = _evidence.plan_for(tuple(x.shape), device, positions)
                else:
                    _PLANS.move_to_end(key)
            if deferred:
                if plan is not None:
                    ev = (plan, _evidence.gather(x, plan))
                finite = self._add_device(x, n, slot, need_finite)
            elif type(x) is torch.Tensor and not x.is_neg():
                done = None
                if _fused is not None and x.is_contiguous():
                    # the compiled kernel's one read, finished in C: the record's stats
                    # dict and evidence fields; False for a NaN or an Inf (the passes count
                    # them: no second read), None where the Python tail decides (sums out
                    # of the range the C tail decides in)
                    threads = 1 if n < FUSED_SPLIT else _scan_threads(n)
                    try:
                        done = _fused.stats(
                            x.data_ptr(),
                            n,
                            x.shape[-1] if x.dim() else 1,
                            dtype is _F64,
                            plan,
                            threads,
                            _TINY[dtype],
                            _UNIT[dtype],
                        )
                    except ValueError:  # a layout the kernel refuses: the passes
                        done = None
                if done:  # finished, so finite
                    self._host.append(done[0])
                    ev = done[1]
                    finite = True
                else:
                    row, values = _host_stats(x, n, plan, done is None)
                    if plan is not None:
                        ev = (plan, values)
                    self._host.append(row)
                    finite = row[6] == 0 and row[7] == 0
            else:  # a subclass (or a lazily negated view): torch's own ops
                row = _subclass_stats(x, n)
                if plan is not None:
                    ev = (plan, _evidence.gather(x, plan).numpy())
                self._host.append(row)
                finite = row[6] == 0 and row[7] == 0
            if fp8_max is not None:
                extremes = None
                if not deferred:  # the kernel's stats dict, or the Python tail's row
                    last: Any = self._host[-1]
                    extremes = (last["min"], last["max"]) if type(last) is dict else last[:2]
                self._fp8[slot] = fp8_statistics(t, x, fp8_max, extremes)
        finally:
            state.depth -= 1
        # appended last: a reduction that raised leaves the slots consistent
        self._evidence.append(ev)
        self._numel.append(n)
        cache[cache_key] = (weakref.ref(t), slot, finite)
        if len(cache) > self._CACHE_SIZE:
            cache.popitem(last=False)
        return slot, finite

    def _add_device(self, x: torch.Tensor, n: int, slot: int, need_finite: bool) -> bool | None:
        mn, mx = torch.aminmax(x)
        # var_mean of x / 2^k, k the exponent of max |x|: scaling by a power of two is
        # exact, so ordinary tensors get the very numbers var_mean(x) gives, while
        # subnormal values (whose squares underflow to 0) and float64 values near
        # overflow (whose sums overflow) keep every digit: the host paths' numbers
        scale = _power_of_two_scale(torch.maximum(mn.abs(), mx.abs()))
        var, mean = _scaled_var_mean(x, scale, n)
        counts = torch.stack([torch.count_nonzero(x), torch.isnan(x).sum(), torch.isinf(x).sum()])
        # var_mean is Welford's (stable); l2 from it adds two positive terms, where
        # float32 vector_norm rounds ~1e-5 on 1M elements on the CPU. An Inf without
        # NaN makes var NaN but l2 Inf, as on the CPU path.
        l2 = (var * max(n - 1, 1) + mean * mean * n).sqrt()
        l2 = torch.where((counts[2] > 0) & (counts[1] == 0), math.inf, l2)
        # scaled back on the host, in float64: mean, std and l2 of subnormal values are
        # themselves subnormal, with fewer digits in the tensor's dtype than on the host paths
        floats = torch.stack([mn, mx, mean, var.sqrt(), l2, scale])
        self._host.append(None)
        self._dev_limit.append(_F32_MAX if x.dtype is torch.float32 else math.inf)
        self._dev_slots.append(slot)
        self._dev_floats.append(floats)
        self._dev_counts.append(counts)
        return int(counts[1:].sum().item()) == 0 if need_finite else None

    def finite(self, slot: int) -> bool:
        """Return whether the tensor in ``slot`` was all finite (syncs on accelerators)."""
        host = self._host[slot]
        if type(host) is dict:  # the compiled kernel's: finite
            return True
        if host is not None:
            return host[6] == 0 and host[7] == 0
        counts = self._dev_counts[self._dev_slots.index(slot)]
        return int(counts[1:].sum().item()) == 0

    def materialize(self) -> list[dict[str, Any]]:
        """Return the statistics of every slot, in slot order, and empty the buffer.

        One transfer per device holding statistics.
        """
        return self.materialize_with_evidence()[0]

    def materialize_with_evidence(
        self,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None]]:
        """Like :meth:`materialize`, with each slot's evidence record fields (or None).

        The evidence (``sample`` and ``positions``, see
        :func:`precguard.capture.evidence.record_fields`) comes in one more transfer
        per device.
        """
        # precguard's own ops (stacks, transfers): op-level capture must not record them
        with capture_scope():
            evidence = self._evidence_fields()
            rows = list(self._host)
            if self._dev_slots:
                floats = _gather(self._dev_floats, torch.float64).tolist()
                counts = _gather(self._dev_counts, torch.int64).tolist()
                for i, slot in enumerate(self._dev_slots):
                    mn, mx, mean, std, l2, scale = floats[i]
                    std, l2, limit = std * scale, l2 * scale, self._dev_limit[i]
                    std = math.inf if std > limit else std
                    l2 = math.inf if l2 > limit else l2
                    rows[slot] = (mn, mx, mean * scale, std, l2, *counts[i])
        out = []
        fp8 = self._fp8
        for row, numel in zip(rows, self._numel, strict=True):
            assert row is not None
            if type(row) is dict:  # the compiled kernel's, ready
                out.append(row)
                continue
            mn, mx, mean, std, l2, nonzero, nan, inf = row
            out.append(
                {
                    "min": mn,
                    "max": mx,
                    "mean": mean,
                    "std": std,
                    "absmax": max(abs(mn), abs(mx)) if mn == mn and mx == mx else math.nan,
                    "l2": l2,
                    "nan": int(nan),
                    "inf": int(inf),
                    "zeros": numel - int(nonzero),
                    "numel": numel,
                }
            )
        for slot, extra in fp8.items():
            # what fp8 flushed reads as zero: the stored tensor's zero share
            stats = out[slot]
            stats["fp8"] = {**extra, "underflow": stats["zeros"] / max(stats["numel"], 1)}
        self.clear()
        return out, evidence

    def _evidence_fields(self) -> list[dict[str, Any] | None]:
        """Each slot's evidence as record fields; device values fetched once per device."""
        host: list[np.ndarray | None] = [None] * len(self._evidence)
        groups: dict[torch.device, list[int]] = {}
        ready: list[tuple[int, dict[str, Any]]] = []  # the compiled kernel's, by slot
        encode = False  # whether any slot holds values still to encode
        for slot, ev in enumerate(self._evidence):
            if ev is None:
                continue
            if type(ev) is dict:  # the compiled kernel's record fields
                ready.append((slot, ev))
                continue
            encode = True
            if isinstance(ev[1], np.ndarray):
                host[slot] = ev[1]
            else:
                groups.setdefault(ev[1].device, []).append(slot)
        for slots in groups.values():
            parts = [self._evidence[s][1] for s in slots]  # type: ignore[index]
            flat = torch.cat([p.to(torch.float64) for p in parts]).to("cpu").numpy()
            start = 0
            for slot, part in zip(slots, parts, strict=True):
                size = part.numel()
                chunk = flat[start : start + size]
                host[slot] = chunk if part.dtype == torch.float64 else chunk.astype(np.float32)
                start += size
        out: list[dict[str, Any] | None]
        if not encode:  # the compiled kernel's fields, and slots without evidence
            out = [None] * len(host)
        else:
            out = _evidence.all_record_fields(
                [
                    None if values is None else (ev[0], values)  # type: ignore[index]
                    for ev, values in zip(self._evidence, host, strict=True)
                ]
            )
        for slot, fields in ready:
            out[slot] = fields
        return out

    def clear(self) -> None:
        """Drop everything queued, including the reuse cache."""
        self._host.clear()
        self._dev_floats.clear()
        self._dev_counts.clear()
        self._dev_slots.clear()
        self._dev_limit.clear()
        self._numel.clear()
        self._evidence.clear()
        self.reuse.clear()
        self._fp8.clear()


# -- float8 tensors (issue 40) ------------------------------------------------------------
#: the float8 dtypes this torch has, by their largest finite value
_FP8_MAX: dict[torch.dtype, float] = {
    getattr(torch, name): float(torch.finfo(getattr(torch, name)).max)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name)
}


def fp8_statistics(
    t: torch.Tensor, x: torch.Tensor, fmax: float, extremes: tuple[float, ...] | None = None
) -> dict[str, Any]:
    """A float8 tensor's saturated share, scale and amax (its underflow share, the share
    of zeros, comes from the ordinary statistics at materialize).

    Called only for float8 tensors, with ``x`` the float32 copy :meth:`StatsBuffer.add`
    already made. The saturated share (elements at the format's ±max) is counted only
    when the tensor's largest magnitude reaches the max, which its ordinary statistics'
    ``extremes`` (min, max) already tell on the host (on a device, ``aminmax``);
    otherwise it is 0 with no pass of its own. ``scale`` is the tensor's own when it
    carries one (a scaled float8 tensor subclass's ``_scale``), else None; ``amax`` is
    then the largest magnitude it stands for.
    """
    n = max(x.numel(), 1)
    if extremes is None:
        extremes = tuple(float(v) for v in torch.aminmax(x)) if x.numel() else (0.0, 0.0)
    absmax = max(abs(extremes[0]), abs(extremes[1]))
    saturated = float((x.abs() >= fmax).sum()) / n if absmax >= fmax else 0.0
    scale = getattr(t, "_scale", None)
    scale_value = float(scale.float().max()) if isinstance(scale, torch.Tensor) else None
    return {
        "saturated": saturated,
        "scale": scale_value,
        "amax": absmax * scale_value if scale_value is not None else absmax,
    }


#: the longest run of elements one ``vector_norm`` sums on the CPU: longer rows are
#: split (its float32 rounding grows with the length: ~10 unit roundoffs at 16384)
MAX_ROW = 16384
#: elements per chunk of a large contiguous CPU tensor (1 MiB of float32): all passes
#: over one chunk run while it sits in the core's cache, then the next chunk
CHUNK = 1 << 18
#: with more than one torch thread, tensors of this many elements or more take torch's
#: multi-threaded reductions (``aminmax``, ``count_nonzero``) and no chunk loop
PARALLEL = 1 << 17


def _host_stats(
    x: torch.Tensor, n: int, plan: _evidence.EvidencePlan | None, fused: bool = True
) -> tuple[tuple[float, ...], np.ndarray | None]:
    """``(min, max, mean, std, l2, nonzero, nan, inf)`` of a float32/float64 CPU tensor.

    Also the evidence values of ``plan`` (sampled elements, then per-position
    norms), or None without a plan. ``x`` is a plain ``torch.Tensor``. ``fused``:
    False when the caller already tried the compiled kernel. A
    contiguous one without NaN or Inf goes through the compiled kernel
    (:func:`_fused_stats`) when it is built; otherwise, the passes over the
    tensor, each a fast vectorized kernel:

    * min and max (NumPy's, on the same memory: half of ``aminmax``'s time);
    * the sum (torch's float32 sums of the rows, added in float64: :func:`_sum`);
    * the squares by rows: ``vector_norm`` along the last dimension (no tensor
      allocated), rows longer than :data:`MAX_ROW` split; the squared row norms
      are summed in float64. They give ``l2`` (positive terms, no cancellation)
      and the per-position norms of the evidence, both from the same pass;
    * zeros only when ``min <= 0 <= max`` (NumPy's ``== 0``, counted as bools:
      a third of ``count_nonzero``'s time; ``-0.0 == 0``).

    With more than one torch thread, a tensor of :data:`PARALLEL` elements or more
    takes torch's multi-threaded ``aminmax`` and ``count_nonzero`` instead (the
    same exact numbers). Otherwise a contiguous tensor of more than two
    :data:`CHUNK` runs them chunk by chunk
    (whole rows each), so only the first pass over a chunk reads memory: the
    logits of a 32k vocabulary cost half.

    ``std`` comes from ``sum x^2 - n mean^2`` when ``2 n mean^2 <= sum x^2``: the
    cancellation at most doubles the relative rounding of ``sum x^2``. Otherwise
    (|mean| comparable to or above the std: norm weights) from the second pass
    ``sum (x - mean)^2`` in float64, exact to float32 rounding whatever
    |mean|/std. NaN/Inf counts, ``vector_norm`` and ``std`` run only when min or
    max is not finite.
    """
    if fused and _fused is not None and x.is_contiguous():  # False: the caller tried it
        try:
            fused = _fused_stats(x, n, plan)
        except ValueError:  # a layout the kernel refuses: the passes, never a lost record
            fused = None
        if fused is not None:
            return fused
    a = host_view(x)
    row = _row_length(x)
    if n >= PARALLEL and torch.get_num_threads() > 1:
        # NumPy's passes and the chunk loop run on one core: torch's own spread over all
        mn_t, mx_t = torch.aminmax(x)
        mn, mx = mn_t.item(), mx_t.item()
        total = _sum(x, mn, mx)
        nonzero = n if mn > 0.0 or mx < 0.0 else torch.count_nonzero(x).item()
        rows = _row_squares(x, row)
    elif row and n > 2 * CHUNK and x.is_contiguous():
        mn, mx, total, nonzero, norms = _scan_chunks(x, a, n, row)
        norms = norms.astype(np.float64)
        rows = (norms * norms).reshape(*x.shape[:-1], -1).sum(-1)
    else:
        mn, mx = float(a.min()), float(a.max())
        total = _sum(x, mn, mx)
        nonzero = n if mn > 0.0 or mx < 0.0 else n - int(np.count_nonzero(a == 0))
        rows = _row_squares(x, row)
    mean = total / n
    values = None
    if plan is not None:
        sample = np.take(a, plan.host_index)
        if plan.seq_dim is None:
            values = sample
        else:
            seq = plan.seq_dim
            per = rows.sum(axis=tuple(range(seq))) if seq else rows
            sumsq = float(per.sum())
            values = np.concatenate([sample, _evidence.binned_norms(per, plan, a.dtype)])
    if plan is None or plan.seq_dim is None:
        sumsq = float(rows.sum())
    if not (math.isfinite(mn) and math.isfinite(mx)):
        return _nonfinite_row(x, n, mn, mx, mean, nonzero), values
    if not _sums_in_range(x, n, total, sumsq):
        return _scaled_row(x, n, mn, mx, nonzero), values
    square_mean = n * mean * mean
    # |mean| >= std / 1.4, or squares beyond float32: the spread as its own pass
    one_pass = 2.0 * square_mean <= sumsq < math.inf
    spread = sumsq - square_mean if one_pass else _spread(x, mean)
    return _row(x, n, mn, mx, mean, nonzero, sumsq, spread), values


def _scan_threads(n: int) -> int:
    """The threads the kernel splits a scan of ``n`` >= :data:`FUSED_SPLIT` elements over:
    torch's number, each a run of at least :data:`_FUSED_MIN_RUN` elements, and no more
    than the kernel takes (``torch.set_num_threads(1100)`` is the user's to set)."""
    return max(1, min(torch.get_num_threads(), n // _FUSED_MIN_RUN, FUSED_MAX_THREADS))


def _fused_stats(
    x: torch.Tensor, n: int, plan: _evidence.EvidencePlan | None
) -> tuple[tuple[float, ...], np.ndarray | None] | None:
    """:func:`_host_stats` of contiguous ``x`` through the compiled one-read scan.

    One read (``capture/_fused.cpp``) gives min, max, the zero count, the sum and
    the sum of squares (in float64; a float32's square is exact there) and writes
    the plan's sample and per-position norms. None when ``x`` holds a NaN or an
    Inf (a sum is then not finite): the caller's passes count them.

    ``std`` comes from ``sum x^2 - n mean^2`` where the worst-case rounding of that
    difference, ``3 (b / 16 + 22)`` double roundings of ``sum x^2`` for blocks of
    ``b = min(row, 4096)`` elements (the kernel's summation), is at most a quarter
    of the tensor dtype's unit roundoff of the spread; else (|mean| far above the
    std, and always for float64 tensors) from the spread about the mean, a second read.

    ``_fused.stats()`` (``finish()`` in ``_fused.cpp``) is this tail in C, taken for
    every tensor it can finish; this one is left the out-of-range sums it hands back.
    Change the rule in both: tests/capture/test_fused_kernel.py holds their records equal.
    """
    dtype = x.dtype
    double = dtype is torch.float64
    row = x.shape[-1] if x.dim() else 1
    address = x.data_ptr()
    threads = 1 if n < FUSED_SPLIT else _scan_threads(n)
    if plan is None:
        mn, mx, zeros, total, sumsq = _fused.scan(
            address, n, row, double, None, None, 0, 1, threads
        )
        values = None
    else:
        seq = 0 if plan.seq_dim is None else plan.length
        values = np.empty(plan.host_index.size + plan.bins, np.float64 if double else np.float32)
        mn, mx, zeros, total, sumsq = _fused.scan(
            address, n, row, double, plan.host_index, values, seq, plan.bin, threads
        )
    if not (math.isfinite(total) and math.isfinite(sumsq)):
        return None  # a NaN or an Inf (the passes count them), or float64 sums overflowed
    # _sums_in_range, inlined (once per tensor); total is finite here
    if not n * _TINY[dtype] <= sumsq < math.inf:
        return _scaled_row(x, n, mn, mx, n - zeros), values
    mean = total / n
    spread = sumsq - total * mean
    bound = sumsq * _U64 * 3.0 * (min(row, _fused.BLOCK) / 16 + 22)
    if spread * _UNIT[dtype] < 4.0 * bound:
        spread = _fused.spread(address, n, double, mean)
    # _row, inlined (once per tensor): beyond float32's range it decides
    std = math.sqrt(max(spread, 0.0) / (n - 1)) if n > 1 else 0.0
    l2 = math.sqrt(sumsq)
    if std > _F32_MAX or l2 > _F32_MAX:
        return _row(x, n, mn, mx, mean, n - zeros, sumsq, spread), values
    return (mn, mx, mean, std, l2, n - zeros, 0, 0), values


def _row(
    x: torch.Tensor,
    n: int,
    mn: float,
    mx: float,
    mean: float,
    nonzero: int,
    sumsq: float,
    spread: float,
) -> tuple[float, ...]:
    """The statistics row of finite ``x`` from its sum of squares and its spread.

    See :func:`_in_range` for a float32 tensor's ``l2`` and ``std`` beyond its range.
    """
    std = math.sqrt(max(spread, 0.0) / (n - 1)) if n > 1 else 0.0
    l2 = math.sqrt(sumsq)
    if std > _F32_MAX or l2 > _F32_MAX:  # only then can a float32's be beyond its range
        return _in_range(x, (mn, mx, mean, std, l2, nonzero, 0, 0))
    return (mn, mx, mean, std, l2, nonzero, 0, 0)


def _in_range(x: torch.Tensor, row: tuple[float, ...]) -> tuple[float, ...]:
    """``row`` with a float32 tensor's ``std`` and ``l2`` beyond float32's range as inf.

    As the accelerator path has them: its float32 ``var_mean`` of the scaled tensor
    (:func:`_power_of_two_scale`), scaled back in float32 (the host paths sum in float64).
    """
    if x.dtype is torch.float32 and (row[3] > _F32_MAX or row[4] > _F32_MAX):
        std = math.inf if row[3] > _F32_MAX else row[3]
        l2 = math.inf if row[4] > _F32_MAX else row[4]
        return (*row[:3], std, l2, *row[5:])
    return row


def _sums_in_range(x: torch.Tensor, n: int, total: float, sumsq: float) -> bool:
    """Whether the sum and the sum of squares of finite ``x`` kept their precision.

    Not when a float64 sum overflowed (float64 values near 1e308), and not when the
    squares underflowed: each square below the smallest normal number ``tiny`` of the
    precision it was taken in is rounded by up to ``tiny * u`` absolutely (the
    subnormals' spacing, half of it), so ``n`` of them cost at most ``n tiny u``, which
    is within the unit roundoff ``u`` of the sum of squares only when that sum is at
    least ``n tiny`` (float32's ``vector_norm`` of 1e-45..1e-39 gave l2 0).
    """
    return math.isfinite(total) and n * _TINY[x.dtype] <= sumsq < math.inf


def _scaled_row(x: torch.Tensor, n: int, mn: float, mx: float, nonzero: int) -> tuple[float, ...]:
    """The statistics row of finite ``x`` whose sums left float64's or the squares' range.

    The tensor divided by ``2^e`` (``max |x| = m 2^e``, ``m`` in [0.5, 1): exact, a
    power of two), summed and squared in float64 with the spread about the mean as
    its own pass, and the results multiplied back by ``2^e``: every digit of
    subnormal values, and no overflow of float64 values near 1e308, whose std and
    l2 are finite when they are within float64's range (inf, never NaN, beyond it).
    """
    absmax = max(-mn, mx)
    if absmax == 0.0:
        return (mn, mx, 0.0, 0.0, 0.0, nonzero, 0, 0)
    e = math.frexp(absmax)[1]
    y = _times_power_of_two(x.double(), -e)
    mean_y = y.sum().item() / n
    spread_y = _spread(y, mean_y)
    sumsq_y = y.square().sum().item()
    std_y = math.sqrt(max(spread_y, 0.0) / (n - 1)) if n > 1 else 0.0
    row = (mn, mx, _ldexp(mean_y, e), _ldexp(std_y, e), _ldexp(math.sqrt(sumsq_y), e))
    return _in_range(x, (*row, nonzero, 0, 0))


def _times_power_of_two(t: torch.Tensor, k: int) -> torch.Tensor:
    """``t * 2^k`` for float64 ``t``, exact; in steps where ``2^k`` itself is not a float64."""
    while abs(k) > 1000:
        step = 1000 if k > 0 else -1000
        t = t * math.ldexp(1.0, step)
        k -= step
    return t * math.ldexp(1.0, k)


def _ldexp(v: float, e: int) -> float:
    """``v * 2^e``; beyond float64's range, inf of ``v``'s sign."""
    try:
        return math.ldexp(v, e)
    except OverflowError:
        return math.copysign(math.inf, v)


#: elements of a contiguous device tensor divided by its scale at a time (16 MiB of
#: float32): the scaled copy ``var_mean`` reads is never larger than that
DEVICE_CHUNK = 1 << 22


def _scaled_var_mean(x: torch.Tensor, scale: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """``var_mean(x / scale)`` (correction 1, or 0 for one element), on ``x``'s device.

    A contiguous tensor of more than :data:`DEVICE_CHUNK` elements is scaled and
    reduced chunk by chunk, the chunks' means and squared deviations combined by Chan
    et al.'s pairwise update, so the temporary stays one chunk, not a second copy
    of a large activation.
    """
    correction = 1 if n > 1 else 0
    if n <= DEVICE_CHUNK or not x.is_contiguous():
        return torch.var_mean(x / scale, correction=correction)
    flat = x.reshape(-1)
    count, mean, m2 = 0, None, None
    for start in range(0, n, DEVICE_CHUNK):
        part = flat[start : start + DEVICE_CHUNK] / scale
        k = part.numel()
        var_k, mean_k = torch.var_mean(part, correction=0)
        if mean is None or m2 is None:
            count, mean, m2 = k, mean_k, var_k * k
            continue
        total = count + k
        delta = mean_k - mean
        mean = mean + delta * (k / total)
        m2 = m2 + var_k * k + delta * delta * (count * k / total)
        count = total
    assert mean is not None and m2 is not None
    return m2 / (n - correction), mean


def _power_of_two_scale(absmax: torch.Tensor) -> torch.Tensor:
    """``2^(e - 1)`` for ``absmax = m 2^e`` (``m`` in [0.5, 1)), on its device; 1 where
    ``absmax`` is 0, Inf or NaN. ``x / scale`` then lies in (-2, 2), and ``2^(e - 1)``
    is a number of ``absmax``'s dtype also for float32's largest values (``e`` = 128)."""
    _mantissa, e = torch.frexp(absmax)
    scale = torch.pow(2.0, (e - 1).to(absmax.dtype))
    keep = torch.isfinite(absmax) & (absmax > 0)
    return torch.where(keep, scale, torch.ones_like(absmax))


def _nonfinite_row(
    x: torch.Tensor, n: int, mn: float, mx: float, mean: float, nonzero: int
) -> tuple[float, ...]:
    """The statistics row of ``x`` holding a NaN or an Inf: its counts, torch's l2 and std."""
    nan = int(torch.isnan(x).sum().item())
    inf = int(torch.isinf(x).sum().item())
    l2 = torch.linalg.vector_norm(x).item()
    std = torch.std(x, correction=1 if n > 1 else 0).item()
    return (mn, mx, mean, std, l2, nonzero, nan, inf)


def host_view(x: torch.Tensor) -> np.ndarray:
    """A read-only NumPy view of CPU float32/float64 tensor ``x``'s memory.

    Not ``x.numpy()``: that marks the tensor's storage non-resizable for good, so
    capture would change what the user's program can do (FSDP2 frees an unsharded
    parameter with ``storage.resize_(0)``: "Trying to resize storage that is not
    resizable"). The view lives only while ``x`` is held.
    """
    dtype = _NUMPY_TYPES[x.dtype]
    shape = tuple(x.shape)
    if x.numel() == 0:
        return np.empty(shape, dtype)
    item = x.element_size()
    strides = x.stride()
    extent = 1 + sum((size - 1) * step for size, step in zip(shape, strides, strict=True))
    buffer = (ctypes.c_char * (extent * item)).from_address(x.data_ptr())
    flat = np.frombuffer(buffer, dtype=dtype, count=extent)
    flat.flags.writeable = False
    if x.is_contiguous():
        return flat.reshape(shape)
    return np.lib.stride_tricks.as_strided(
        flat, shape=shape, strides=tuple(step * item for step in strides), writeable=False
    )


def _scan_chunks(
    x: torch.Tensor, a: np.ndarray, n: int, row: int
) -> tuple[float, float, float, int, np.ndarray]:
    """Min, max, sum, nonzero count and row norms of contiguous ``x``, chunk by chunk.

    ``a`` is ``x``'s memory as NumPy; rows are ``row`` consecutive elements.
    """
    rows = x.view(-1, row)
    flat = a.reshape(-1)
    per = max(1, CHUNK // row)
    mins, maxs, norms = [], [], []
    total, nonzero = 0.0, n
    for start in range(0, rows.shape[0], per):
        part = flat[start * row : (start + per) * row]
        lo, hi = part.min(), part.max()
        mins.append(lo)
        maxs.append(hi)
        total += _sum(rows[start : start + per], lo, hi)
        if not (lo > 0.0 or hi < 0.0):
            nonzero -= int(np.count_nonzero(part == 0))
        norms.append(torch.linalg.vector_norm(rows[start : start + per], dim=-1).numpy())
    # NumPy's min and max of the chunks' propagate a NaN, as the whole tensor's would
    return float(np.min(mins)), float(np.max(maxs)), total, nonzero, np.concatenate(norms)


def _row_length(x: torch.Tensor) -> int:
    """The length of the rows ``vector_norm`` sums: the last dimension, split when longer
    than :data:`MAX_ROW`; 0 when it is not contiguous or does not split evenly."""
    length = x.shape[-1] if x.dim() else 1
    if x.dim() and x.stride(-1) != 1 and length > 1:
        return 0
    least = -(-length // MAX_ROW)
    for parts in range(least, 4 * least + 1):
        if length % parts == 0:
            return length // parts
    return 0


def _row_squares(x: torch.Tensor, row: int) -> np.ndarray:
    """The sum of squares along the last dimension of ``x``, in float64 (shape ``x.shape[:-1]``).

    Rows of length ``row`` (:func:`_row_length`) go through ``vector_norm``;
    without one (0), torch's cascaded ``sum`` of the squares, allocated.
    """
    if x.dim() == 0:
        x = x.reshape(1)
    if not row:
        return x.square().sum(-1).numpy().astype(np.float64)
    length = x.shape[-1]
    split = x if row == length else x.view(*x.shape[:-1], length // row, row)
    norms = torch.linalg.vector_norm(split, dim=-1).numpy().astype(np.float64)
    with np.errstate(over="ignore"):  # float64 squares past 1e308: inf, then rescaled
        squares = norms * norms
    return squares if row == length else squares.sum(-1)


def _sum(x: torch.Tensor, mn: float, mx: float) -> float:
    """The sum of ``x`` (whose min and max are ``mn`` and ``mx``): torch's float32 sums of
    its rows (the last dimension), added in float64; where a float32 sum overflowed (a
    mask's -3.4e38 entries: finite elements, a sum that is not), again in float64 by chunks.

    Not ``x.sum(dtype=torch.float64)``: on the CPU that is ~30x slower than float32's.
    """
    total = x.sum(-1).double().sum().item() if x.dim() > 1 else x.sum().item()
    if not math.isfinite(total) and math.isfinite(mn) and math.isfinite(mx):
        flat = x.reshape(-1)
        total = sum(
            flat[i : i + CHUNK].double().sum().item() for i in range(0, flat.numel(), CHUNK)
        )
    return total


def _spread(x: torch.Tensor, mean: float) -> float:
    """``sum (x - mean)^2``, in float64, corrected for the error of ``mean``.

    The corrected two-pass form ``sum d^2 - (sum d)^2 / n`` with ``d = x - mean``:
    a mean from float32 sums can be off by more than the std when |mean| is far
    above it (|mean| / std = 1e7: the plain spread was 5e-5 too large); the
    correction takes that error out.
    """
    dev = x.double() - mean
    shift = dev.sum().item()
    dev.mul_(dev)
    return dev.sum().item() - shift * shift / x.numel()


def _subclass_stats(x: torch.Tensor, n: int) -> tuple[float, ...]:
    """The statistics row of a tensor subclass's CPU tensor, through torch's own ops.

    Two passes for the spread (``sum (x - mean)^2``) and ``l2`` from it: the same
    numbers as :func:`_host_stats` within float32 rounding.
    """
    mn_t, mx_t = torch.aminmax(x)
    mn, mx = mn_t.item(), mx_t.item()
    total = _sum(x, mn, mx)
    nonzero = torch.count_nonzero(x).item()
    mean = total / n
    if not (math.isfinite(mn) and math.isfinite(mx)):
        return _nonfinite_row(x, n, mn, mx, mean, nonzero)
    spread = _spread(x, mean)
    sumsq = spread + n * mean * mean
    if not _sums_in_range(x, n, total, sumsq):
        return _scaled_row(x, n, mn, mx, nonzero)
    return _row(x, n, mn, mx, mean, nonzero, sumsq, spread)


def _gather(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Stack equally shaped small tensors living on any devices into one CPU tensor.

    One transfer per (device, dtype) group, so a step costs one sync per device.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, p in enumerate(parts):
        groups.setdefault((p.device, p.dtype), []).append(i)
    if len(groups) == 1:
        return torch.stack(parts).to("cpu", dtype)
    out = torch.empty((len(parts), *parts[0].shape), dtype=dtype)
    for idx in groups.values():
        out[idx] = torch.stack([parts[i] for i in idx]).to("cpu", dtype)
    return out
