"""Put a tensor's shards back together: saved tensors, and statistics where the math allows.

Concatenated shards (``{shard: D}``) combine every recorded statistic exactly,
up to fp64 rounding: counts (``numel``, ``nan``, ``inf``, ``zeros``) add,
``min``/``max``/``absmax`` are the extremes of the shards', the sum is
``sum(mean_i * n_i)``, ``l2 = sqrt(sum(l2_i^2))``, and the standard deviation
follows from the shards' means, deviations and counts (Chan et al.'s pairwise
update, the exact identity ``M2 = sum(M2_i + n_i (mean_i - mean)^2)``).

Partial sums (``partial``) combine no statistic: the statistics of a sum are not
a function of the summands' statistics. Their whole tensor is the element-wise
sum of the saved shards, added in fp64 and rounded once to the stored dtype;
without saved tensors the record is *not combinable* and is not compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from precguard.dump.schema import Stats

if TYPE_CHECKING:
    import torch


def concat_stats(parts: Sequence[Stats]) -> Stats:
    """Statistics of the concatenation of tensors whose statistics are ``parts``.

    >>> a = Stats(min=1, max=2, mean=1.5, std=0.7071067811865476, absmax=2, l2=5**0.5,
    ...           nan=0, inf=0, zeros=0, numel=2)
    >>> concat_stats([a, a]).std  # doctest: +ELLIPSIS
    0.577...
    """
    n = sum(p.numel for p in parts)
    nan = sum(p.nan for p in parts)
    inf = sum(p.inf for p in parts)
    zeros = sum(p.zeros for p in parts)
    if nan:
        return _nan_stats(nan, inf, zeros, n)
    total = math.fsum(p.mean * p.numel for p in parts)
    mean = total / n if n else 0.0
    if math.isfinite(mean):
        m2 = math.fsum(
            p.std * p.std * max(p.numel - 1, 0) + p.numel * (p.mean - mean) ** 2 for p in parts
        )
        std = math.sqrt(max(m2, 0.0) / max(n - 1, 1))
    else:
        std = math.nan
    return Stats(
        min=min(p.min for p in parts),
        max=max(p.max for p in parts),
        mean=mean,
        std=std,
        absmax=max(p.absmax for p in parts),
        l2=math.sqrt(math.fsum(p.l2 * p.l2 for p in parts)),
        nan=nan,
        inf=inf,
        zeros=zeros,
        numel=n,
    )


def _nan_stats(nan: int, inf: int, zeros: int, numel: int) -> Stats:
    """A tensor holding NaN: the recorder writes every float statistic of it as NaN."""
    return Stats(
        min=math.nan,
        max=math.nan,
        mean=math.nan,
        std=math.nan,
        absmax=math.nan,
        l2=math.nan,
        nan=nan,
        inf=inf,
        zeros=zeros,
        numel=numel,
    )


def tensor_stats(t: torch.Tensor) -> Stats:
    """Statistics of a whole (gathered) tensor, computed in fp64 like the recorder's.

    The combined tensor of partial sums needs them: its statistics cannot be
    combined from the shards'.
    """
    import torch

    x = t.detach().to(torch.float64)
    n = x.numel()
    nan = int(torch.isnan(x).sum())
    inf = int(torch.isinf(x).sum())
    zeros = int((x == 0).sum())
    if nan:
        return _nan_stats(nan, inf, zeros, n)
    mn, mx = (v.item() for v in torch.aminmax(x))
    return Stats(
        min=mn,
        max=mx,
        mean=x.mean().item(),
        std=x.std(correction=1 if n > 1 else 0).item(),
        absmax=max(abs(mn), abs(mx)),
        l2=torch.linalg.vector_norm(x).item(),
        nan=nan,
        inf=inf,
        zeros=zeros,
        numel=n,
    )


def concat_shape(shapes: Sequence[Sequence[int]], dim: int) -> list[int] | None:
    """The shape of the shards concatenated along ``dim``; None when they cannot be."""
    first = list(shapes[0])
    if not first:
        return None
    d = dim % len(first) if -len(first) <= dim < len(first) else None
    if d is None:
        return None
    for s in shapes[1:]:
        if len(s) != len(first):
            return None
        if any(a != b for i, (a, b) in enumerate(zip(s, first, strict=True)) if i != d):
            return None
    return [*first[:d], sum(s[d] for s in shapes), *first[d + 1 :]]


def sum_partials(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The whole tensor of partial sums: added in fp64, rounded once to the shards' dtype."""
    import torch

    acc = parts[0].to(torch.float64).clone()
    for p in parts[1:]:
        acc += p.to(torch.float64)
    return acc.to(parts[0].dtype)
