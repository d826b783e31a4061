"""The arithmetic of the emulator: rounding to a storage dtype, low-precision accumulation,
a different reduction order.

Everything here takes and returns float32 tensors whose *values* follow the
emulated chip; the caller casts to the dtype the op would have returned.
Emulating this way (round inputs, compute in fp32, round the result) is what
accelerators do for fp16/bf16 storage with fp32 accumulation, and it needs no
native low-precision CPU kernels (once measured ~30× slower on CPUs without
fp16/bf16 support, see docs/emu.md; ``benchmarks/emu_speed.py`` measures both).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from precguard.backends.emu.fp8 import Fp8Recipe

_FLT_MAX = torch.finfo(torch.float32).max

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class OpNumerics:
    """The numeric rules for one op: storage dtype, overflow, accumulation, order."""

    storage: torch.dtype
    saturate: bool = False
    nan_to_zero: bool = False
    flush_to_zero: bool = False
    accumulate: torch.dtype = torch.float32
    block: int = 32
    shuffle_seed: int | None = None
    #: terms added one after another in index order (batch-invariant kernels)
    fixed_order: bool = False
    #: matmul splits its reduced dimension in two below this many rows (0: never)
    split_k_rows: int = 0
    #: 2-D GEMMs run with fp8 operands (None: at the storage dtype)
    fp8: Fp8Recipe | None = None

    @property
    def changes_reductions(self) -> bool:
        """True when matmul and sum/mean need the emulator's own implementation."""
        return (
            self.accumulate != torch.float32
            or self.shuffle_seed is not None
            or self.fixed_order
            or self.split_k_rows > 0
        )

    @property
    def changes_values(self) -> bool:
        """True when rounding a float32 tensor under these rules can change it."""
        return (
            self.storage != torch.float32
            or self.saturate
            or self.nan_to_zero
            or self.flush_to_zero
            or self.changes_reductions
            or self.fp8 is not None
        )


def to_storage(
    x: torch.Tensor, rules: OpNumerics, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Return ``x`` (float32) rounded as the chip would store it in ``dtype``, as float32.

    ``dtype`` defaults to the rules' storage dtype. Saturation clamps to the
    dtype's ±max *before* rounding (so ±inf becomes ±max as well); NaN stays
    NaN unless ``nan_to_zero``; flush-to-zero zeroes magnitudes below the
    dtype's smallest normal number. Exactly ±FLT_MAX (float32's
    ``finfo.min``/``max``, a common mask value) maps to the dtype's ±max.
    """
    dtype = dtype or rules.storage
    info = torch.finfo(dtype)
    if rules.saturate:
        x = x.clamp(-info.max, info.max)
    if rules.nan_to_zero:
        x = torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=float("-inf"))
    if dtype != torch.float32:
        y = x.to(dtype)
        rounded = y.to(torch.float32)
        # a finite float32 sum proves there is no inf (an inf or NaN term makes the sum
        # inf or NaN): one vectorized float32 pass instead of isinf on the low-precision
        # tensor, 4x the cost of the rounding itself on a CPU. A sum that is not finite
        # (an inf, a NaN, or huge bf16 values adding past float32's max) only sends the
        # tensor to the exact test below, so the result is the same either way.
        if not rules.saturate and not torch.isfinite(rounded.sum()):
            # ±FLT_MAX is torch.finfo(torch.float32).min/max, the mask value a float32
            # model uses; the same model at ``dtype`` would use finfo(dtype): map it there
            # rather than to inf, which a real low-precision run would not produce.
            overflow = torch.isinf(y)
            if overflow.any():
                sentinel = overflow & (x.abs() == _FLT_MAX)
                y = y.masked_fill(sentinel & (x > 0), info.max).masked_fill(
                    sentinel & (x < 0), -info.max
                )
                rounded = y.to(torch.float32)
        x = rounded
    if rules.flush_to_zero:
        x = x.masked_fill(x.abs() < info.tiny, 0.0)
    return x


@lru_cache(maxsize=256)
def _permutation(size: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + size)
    return torch.randperm(size, generator=gen)


def reduction_order(size: int, rules: OpNumerics) -> torch.Tensor | None:
    """Return the permutation applied to a reduced dimension of ``size``, or None."""
    if rules.shuffle_seed is None or size < 2:
        return None
    return _permutation(size, rules.shuffle_seed)


def _accumulate(parts: list[torch.Tensor], rules: OpNumerics) -> torch.Tensor:
    """Add block partial sums one after another, rounding the running sum each time."""
    acc = parts[0]
    if rules.accumulate == torch.float32:
        for p in parts[1:]:
            acc = acc + p
        return acc
    acc = to_storage(acc, rules, rules.accumulate)
    for p in parts[1:]:
        acc = to_storage(acc + p, rules, rules.accumulate)
    return acc


def matmul(a: torch.Tensor, b: torch.Tensor, rules: OpNumerics) -> torch.Tensor:
    """``a @ b`` (float32, batched or not) with the rules' accumulation dtype and order."""
    k = a.shape[-1]
    perm = reduction_order(k, rules)
    if perm is not None:
        a = a.index_select(-1, perm)
        b = b.index_select(-2, perm)
    if rules.fixed_order or rules.split_k_rows:
        rows = a.shape[:-1].numel()
        return fixed_order_matmul(a, b, 2 if rows < rules.split_k_rows and k > 1 else 1)
    if rules.accumulate == torch.float32:
        return torch.matmul(a, b)
    return _accumulate(_block_products(a, b, rules.block), rules)


_MAX_PARTIAL_ELEMENTS = 1 << 24  # ~64 MB of float32 partial products at a time


def _block_products(a: torch.Tensor, b: torch.Tensor, block: int) -> list[torch.Tensor]:
    """Return ``a[..., kb] @ b[..., kb, :]`` for each block ``kb`` of the inner dimension.

    Blocks are multiplied in batches (one batched matmul per group of blocks)
    rather than one small matmul each, which is many times faster on the CPU.
    """
    k = a.shape[-1]
    pad = (-k) % block
    if pad:
        a = torch.nn.functional.pad(a, (0, pad))
        b = torch.nn.functional.pad(b, (0, 0, 0, pad))
    blocks = (k + pad) // block
    a_blocks = a.unflatten(-1, (blocks, block)).movedim(-2, 0)  # (C, ..., M, B)
    b_blocks = b.unflatten(-2, (blocks, block)).movedim(-3, 0)  # (C, ..., B, N)
    out_numel = max(a.shape[:-1].numel() * b.shape[-1], 1)
    group = max(1, _MAX_PARTIAL_ELEMENTS // out_numel)
    parts: list[torch.Tensor] = []
    for c0 in range(0, blocks, group):
        parts.extend(torch.matmul(a_blocks[c0 : c0 + group], b_blocks[c0 : c0 + group]).unbind(0))
    return parts


def sequential_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over ``dim`` adding one term after another in index order (fp32).

    Every element's result depends only on its own terms, never on the other
    rows, and leading zeros (left padding) add nothing: ``0 + 0 + a == a``.
    """
    x = x.movedim(dim, -1)
    acc = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for i in range(x.shape[-1]):
        acc = acc + x[..., i]
    return acc


def fixed_order_matmul(a: torch.Tensor, b: torch.Tensor, splits: int = 1) -> torch.Tensor:
    """``a @ b`` whose every output adds its products in index order, in ``splits`` parts.

    With one split, a batch-invariant kernel: a row's result is the same whatever
    the other rows. With more, a split-K kernel: each part is summed in order and the
    partial sums are added after, which rounds differently than one pass.
    """
    k = a.shape[-1]
    size = -(-k // splits) if k else 1
    total: torch.Tensor | None = None
    for start in range(0, max(k, 1), size):
        stop = min(start + size, k)
        acc = torch.zeros((*a.shape[:-1], b.shape[-1]), dtype=torch.float32)
        for i in range(start, stop):
            acc = acc + a[..., i : i + 1] * b[..., i : i + 1, :]
        total = acc if total is None else total + acc
    assert total is not None
    return total


def fixed_order_softmax(x: torch.Tensor, dim: int, log: bool = False) -> torch.Tensor:
    """Softmax (or log-softmax) over ``dim`` whose normalizer is a :func:`sequential_sum`."""
    shifted = x - x.amax(dim, keepdim=True)
    e = shifted.exp()
    total = sequential_sum(e, dim).unsqueeze(dim)
    return shifted - total.log() if log else e / total


def addmm(
    bias: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    rules: OpNumerics,
    *,
    beta: float = 1,
    alpha: float = 1,
) -> torch.Tensor:
    """``beta * bias + alpha * (a @ b)`` (also baddbmm) under the rules."""
    product = matmul(a, b, rules)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return product + (bias if beta == 1 else bias * beta)


def reduce_sum(
    x: torch.Tensor,
    dims: list[int] | None,
    keepdim: bool,
    rules: OpNumerics,
    *,
    mean: bool = False,
) -> torch.Tensor:
    """Sum (or mean) of ``x`` over ``dims`` (None or [] = all) under the rules."""
    ndim = max(x.dim(), 1)
    reduced = sorted({d % ndim for d in dims}) if dims else list(range(x.dim()))
    if x.dim() == 0:
        return x.clone()
    kept = [d for d in range(x.dim()) if d not in reduced]
    moved = x.permute(*kept, *reduced)
    flat = moved.reshape(*[x.shape[d] for d in kept], -1)
    n = flat.shape[-1]
    perm = reduction_order(n, rules)
    if perm is not None:
        flat = flat.index_select(-1, perm)
    if rules.fixed_order:
        out = sequential_sum(flat, -1)
    elif rules.accumulate == torch.float32:
        out = flat.sum(-1)
    else:
        parts = [flat[..., i : i + rules.block].sum(-1) for i in range(0, n, rules.block)]
        out = _accumulate(parts, rules) if parts else flat.sum(-1)
    if mean:
        out = out / max(n, 1)
    if keepdim:
        for d in reduced:
            out = out.unsqueeze(d)
    return out
