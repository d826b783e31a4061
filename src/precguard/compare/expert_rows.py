"""Which rows of two runs' records belong to the same (token, expert), on index tensors
(docs/compare.md, "Mixture of experts"); a router's margins are the gaps of its scores.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def routed_alike(golden: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Per token (row of top-k indices): whether both runs chose the same experts, in any
    order (the order is how a kernel lists them: an unsorted top-k, a near-tie).

    >>> routed_alike(torch.tensor([[2, 0], [1, 3]]), torch.tensor([[0, 2], [1, 2]])).tolist()
    [True, False]
    """
    return (golden.sort(dim=1).values == actual.sort(dim=1).values).all(dim=1)


def rows_of(shape: list[int]) -> int:
    """Rows of a record: every dimension but the last."""
    return math.prod(shape[:-1]) if len(shape) > 1 else (shape[0] if shape else 1)


def ranks(scores: torch.Tensor, idx: torch.Tensor) -> bool:
    """Whether ``idx`` is the top-k of ``scores`` in order, for every token (exact ties aside)."""
    if idx.numel() == 0 or int(idx.max()) >= scores.shape[1] or int(idx.min()) < 0:
        return False
    chosen = scores.gather(1, idx)
    if (chosen[:, :-1] < chosen[:, 1:]).any():
        return False
    rest = scores.clone()
    rest.scatter_(1, idx, -math.inf)
    return bool((chosen[:, -1] >= rest.max(dim=1).values).all())


def gaps(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per token: the smallest gap between neighbouring scores among the top k + 1 (the
    margin rounding must cross to swap two chosen experts or exchange the k-th)."""
    top = scores.topk(min(k + 1, scores.shape[1]), dim=1).values
    return (top[:, :-1] - top[:, 1:]).min(dim=1).values


def crossed(scores: torch.Tensor, golden: torch.Tensor, actual: torch.Tensor) -> float:
    """The largest golden margin the actual's ranking crossed for one token.

    An expert ranks at its place in the index row, unchosen ones after every chosen one;
    for each pair the actual ranks in the opposite order from the golden, the golden's
    score difference is a margin rounding had to cross.
    """
    k = golden.numel()
    rank_g = {int(e): i for i, e in enumerate(golden.tolist())}
    rank_a = {int(e): i for i, e in enumerate(actual.tolist())}
    experts = set(rank_g) | set(rank_a)
    worst = 0.0
    for x in experts:
        for y in experts:
            if rank_a.get(x, k) < rank_a.get(y, k) and rank_g.get(y, k) < rank_g.get(x, k):
                worst = max(worst, float(scores[y] - scores[x]))
    return worst


def pair_layouts(idx: torch.Tensor, call_index: int, rows: int) -> dict[str, list[tuple[int, int]]]:
    """The (token, expert) key of each row in the layouts experts implementations use, for
    those whose row count fits: ``token-major`` (batched: each token's k rows in turn),
    ``per-expert`` (the eager loop: one call per expert hit, in expert order, rows by
    top-k slot then token). Rows sorted by expert are routing_rows.py's
    ``RowsRemeasure._grouped_rows``'."""
    import torch

    t, k = idx.shape
    flat = idx.reshape(-1)
    out: dict[str, list[tuple[int, int]]] = {}
    if rows == t * k:
        out["token-major"] = [(p // k, int(flat[p])) for p in range(t * k)]
    hit = sorted(set(flat.tolist()))
    if call_index < len(hit):
        e = hit[call_index]
        slot, token = torch.where(idx.T.eq(e))
        if slot.numel() == rows:
            out["per-expert"] = [(int(tok), e) for tok in token.tolist()]
    return out


def common_rows(
    g_keys: list[tuple[int, int]], a_keys: list[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row numbers of the keys both sides hold, in the golden's order."""
    import torch

    where = {key: i for i, key in enumerate(a_keys)}
    g_rows = [i for i, key in enumerate(g_keys) if key in where]
    a_rows = [where[g_keys[i]] for i in g_rows]
    return torch.tensor(g_rows, dtype=torch.long), torch.tensor(a_rows, dtype=torch.long)
